package fraud

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
)

// ClickLog is what the detector reads from CLICKS besides the batches the
// runtime hands it.
type ClickLog interface {
	// Click returns the event stored at seq, or an error wrapping ErrNotInLog.
	Click(ctx context.Context, seq uint64) (reader.Event, error)
	// StoredAt returns when the event at seq (of any partition) was stored,
	// or an error wrapping ErrNotInLog.
	StoredAt(ctx context.Context, seq uint64) (time.Time, error)
	// Scan calls fn, in order, for each valid event of partition stored at
	// or after from with a sequence before until, and returns how many.
	Scan(ctx context.Context, partition int, from time.Time, until uint64, fn func(reader.Event)) (int, error)
}

// Publisher publishes alerts on FRAUD and verdict messages on
// FRAUD_VERDICTS with their IDs as Nats-Msg-Id, all at once within its
// window of unacknowledged publishes, and returns once every one is
// acknowledged.
type Publisher interface {
	// Publish returns how many the streams reported as duplicates.
	Publish(ctx context.Context, alerts []events.FraudAlert, verdicts []events.FraudVerdictBatch) (duplicates int, err error)
}

// Store keeps what the API serves: per-link totals and flagged counts, and
// each owner's recent alerts. Apply must be idempotent: applying judgements
// of events it has applied before changes nothing.
type Store interface {
	Apply(ctx context.Context, partition int, js []Judgement) error
}

// LinkStats is the flagged share of one link.
type LinkStats struct {
	Code  string `json:"code"`
	Owner string `json:"-"`
	// Total counts every click judged; Flagged those labelled bot, by the
	// redirect (rule source_bot) or by a rule here.
	Total   int64            `json:"total"`
	Flagged int64            `json:"flagged"`
	Share   float64          `json:"flagged_share"`
	ByRule  map[string]int64 `json:"flagged_by_rule"`
}

// Reader runs the detector on the reader runtime: its methods are the
// Handler and the OnAssign, OnRevoke and OnRewind hooks of reader.Config.
//
// Per batch it judges each event, reads back from CLICKS the earlier clicks a
// rule labelled, publishes alerts and the batch's verdict messages (every
// label of the batch in one message, or a few when over the message bounds
// of events.SplitVerdicts) and waits for their acks,
// writes the API's statistics, and only then returns nil so the runtime acks
// the batch. Any failure returns an error: the runtime retries the batch,
// the events already judged are not judged again (their sequences are not
// after Partition.Last), and what they decided is published and stored again
// from memory. Deterministic IDs make the repeats harmless: at-least-once
// plus idempotent writes is effectively once.
type Reader struct {
	d       *Detector
	clicks  ClickLog
	pub     Publisher
	store   Store
	log     *slog.Logger
	metrics *Metrics

	mu    sync.Mutex
	parts map[int]*partState
}

// partState is one assigned partition: the detector's state and what it
// decided that is not yet published and stored.
type partState struct {
	p        *Partition
	pending  []Judgement
	alerts   []events.FraudAlert
	verdicts []events.FraudVerdictBatch
	labels   int  // labels in verdicts
	resolved bool // verdicts built for pending
	sent     bool // alerts and verdicts acknowledged by FRAUD
}

// isPending reports whether the event at seq was judged and its decisions
// are not yet published and stored (pending is in sequence order).
func (ps *partState) isPending(seq uint64) bool {
	_, ok := slices.BinarySearchFunc(ps.pending, seq, func(j Judgement, s uint64) int { return cmp.Compare(j.Seq, s) })
	return ok
}

// NewReader wires a detector to its log, publisher and store.
func NewReader(d *Detector, clicks ClickLog, pub Publisher, store Store, log *slog.Logger, m *Metrics) *Reader {
	if m == nil {
		m = NewMetrics(nil)
	}
	return &Reader{d: d, clicks: clicks, pub: pub, store: store, log: log, metrics: m, parts: map[int]*partState{}}
}

// OnAssign rebuilds the partition's state from the log before it judges
// anything: the events stored in the Memory before resumeSeq are fed
// without decisions (their owner published those), so the windows are
// what an uninterrupted member would have at resumeSeq.
func (r *Reader) OnAssign(ctx context.Context, partition int, resumeSeq uint64) error {
	p, err := r.rebuild(ctx, partition, resumeSeq)
	if err != nil {
		return fmt.Errorf("assign partition %d: %w", partition, err)
	}
	r.mu.Lock()
	r.parts[partition] = &partState{p: p}
	r.mu.Unlock()
	r.metrics.observe(partition, p.Stats())
	return nil
}

// OnRevoke drops the partition's state; a later owner rebuilds its own.
func (r *Reader) OnRevoke(partition int) {
	r.mu.Lock()
	delete(r.parts, partition)
	r.mu.Unlock()
	r.metrics.forget(partition)
}

// OnRewind starts the partition's state again at the replay's first event,
// rebuilt from the log before it, so the replay judges every event exactly
// as the first pass did and raises the same alert IDs (which FRAUD then
// drops as duplicates).
func (r *Reader) OnRewind(ctx context.Context, partition int, info reader.RewindInfo) error {
	r.mu.Lock()
	cur := r.parts[partition]
	r.mu.Unlock()
	if info.From == 0 || info.From > info.Until || (cur != nil && info.From > cur.p.Last()+1) {
		// Nothing this partition judged is replayed (the runtime will not
		// move the consumer back): keep the state, or the events between
		// what was judged and From would be skipped.
		return nil
	}
	p, err := r.rebuild(ctx, partition, info.From)
	if err != nil {
		return fmt.Errorf("rewind partition %d to %d: %w", partition, info.From, err)
	}
	r.mu.Lock()
	r.parts[partition] = &partState{p: p}
	r.mu.Unlock()
	r.log.Info("partition rewound", "partition", partition, "from", info.From, "replay", info.ID)
	return nil
}

// rebuild returns state for a partition whose next event is resume.
func (r *Reader) rebuild(ctx context.Context, partition int, resume uint64) (*Partition, error) {
	p := r.d.NewPartition()
	if resume <= 1 {
		return p, nil
	}
	started := time.Now()
	anchor, err := r.clicks.StoredAt(ctx, resume-1)
	if errors.Is(err, ErrNotInLog) {
		// The event before resume is gone (retention): so is everything a
		// window could need. Start empty.
		r.log.Warn("nothing to rebuild from", "partition", partition, "resume_seq", resume)
		return p, nil
	}
	if err != nil {
		return nil, fmt.Errorf("rebuild: %w", err)
	}
	// Read from a bucket boundary: the rebuilt state watches whole buckets.
	from := anchor.Add(-r.d.Memory()).Truncate(r.d.rules.FloodWindow)
	n, err := r.clicks.Scan(ctx, partition, from, resume, func(ev reader.Event) { p.Feed(ev) })
	if err != nil {
		return nil, fmt.Errorf("rebuild: %w", err)
	}
	took := time.Since(started)
	r.metrics.rebuilds.Observe(took.Seconds())
	r.metrics.rebuildRead.Observe(float64(n))
	r.metrics.observe(partition, p.Stats())
	r.log.Info("partition rebuilt from the log", "partition", partition, "resume_seq", resume,
		"from", from, "events", n, "took", took.Round(time.Millisecond))
	return p, nil
}

// Handle is the reader.Handler.
func (r *Reader) Handle(ctx context.Context, partition int, batch []reader.Event) error {
	if len(batch) == 0 {
		return nil
	}
	r.mu.Lock()
	ps := r.parts[partition]
	r.mu.Unlock()
	if ps == nil {
		// No OnAssign (a runtime without the hook): rebuild now.
		if err := r.OnAssign(ctx, partition, batch[0].Seq); err != nil {
			return err
		}
		r.mu.Lock()
		ps = r.parts[partition]
		r.mu.Unlock()
	}
	for _, ev := range batch {
		j, ok := ps.p.Judge(ev)
		if !ok {
			// The runtime retries a batch that failed after it was judged
			// with the same events, still first deliveries: those are
			// pending here, judged and waiting to be published and stored.
			if ev.Deliveries <= 1 && !ps.isPending(ev.Seq) {
				// A first delivery behind the state's position was never
				// judged and now never will be: say so loudly.
				r.metrics.behind.Inc()
				r.log.Warn("event delivered behind the partition's position; not judged",
					"partition", partition, "seq", ev.Seq, "last_judged", ps.p.Last())
			}
			continue
		}
		ps.pending = append(ps.pending, j)
		ps.resolved, ps.sent = false, false
		r.metrics.judged.Inc()
	}
	if len(ps.pending) == 0 {
		return nil // a redelivery of what was handled
	}
	if err := r.flush(ctx, partition, ps, batch); err != nil {
		return fmt.Errorf("handle partition %d: %w", partition, err)
	}
	r.metrics.observe(partition, ps.p.Stats())
	return nil
}

// flush publishes and stores what is pending, in that order: the API's
// statistics never show an alert that FRAUD does not have.
func (r *Reader) flush(ctx context.Context, partition int, ps *partState, batch []reader.Event) error {
	if !ps.resolved {
		alerts, labels, err := r.decisions(ctx, partition, ps.pending, batch)
		if err != nil {
			return err
		}
		// The messages' IDs come from the sequences judged: a retry of this
		// flush re-sends these very messages, from memory.
		first, last := ps.pending[0].Seq, ps.pending[len(ps.pending)-1].Seq
		ps.alerts, ps.labels, ps.resolved = alerts, len(labels), true
		ps.verdicts = events.SplitVerdicts(partition, first, last, labels)
	}
	if !ps.sent {
		dups, err := r.pub.Publish(ctx, ps.alerts, ps.verdicts)
		if err != nil {
			return fmt.Errorf("publish %d alerts and %d verdict messages (%d labels): %w", len(ps.alerts), len(ps.verdicts), ps.labels, err)
		}
		ps.sent = true
		r.metrics.duplicates.Add(float64(dups))
		for _, a := range ps.alerts {
			r.metrics.alerts.WithLabelValues(a.Rule).Inc()
		}
		for _, v := range ps.verdicts {
			for _, l := range v.Labels {
				r.metrics.verdicts.WithLabelValues(l.Rule).Inc()
			}
		}
	}
	if err := r.store.Apply(ctx, partition, ps.pending); err != nil {
		return fmt.Errorf("store statistics: %w", err)
	}
	ps.pending, ps.alerts, ps.verdicts = ps.pending[:0], nil, nil
	return nil
}

// decisions turns judgements into the alerts and labels to publish. A label
// of an earlier click needs that click's fields: it is in the batch, or read
// back from CLICKS by its sequence.
//
// An earlier click no longer in CLICKS (retention took it: a reader lagging
// near MaxAge or MaxBytes) gets no verdict. The state keeps only its
// sequence, and the click counter cannot apply a label without the click's
// ID and time; returning the error instead would retry the batch forever and
// stop the partition. The skipped labels are counted.
func (r *Reader) decisions(ctx context.Context, partition int, js []Judgement, batch []reader.Event) ([]events.FraudAlert, []events.FraudVerdictLabel, error) {
	var alerts []events.FraudAlert
	var labels []events.FraudVerdictLabel
	first := batch[0].Seq
	gone := 0
	for _, j := range js {
		alerts = append(alerts, j.Alerts...)
		for _, l := range j.Labels {
			ev, err := r.find(ctx, l.Seq, first, batch)
			if errors.Is(err, ErrNotInLog) {
				gone++
				continue
			}
			if err != nil {
				return nil, nil, fmt.Errorf("label click %d: %w", l.Seq, err)
			}
			c := &ev.Click
			labels = append(labels, events.FraudVerdictLabel{
				ClickID: c.ID, ClickSeq: l.Seq, Code: c.Code, Owner: c.Owner,
				Rule: l.Rule, AlertID: l.AlertID, Bot: true, SourceBot: c.Bot,
				ClickTime: c.Time, Country: c.Country, Referrer: c.Referrer, Time: j.At.UTC(),
			})
		}
	}
	if gone > 0 {
		r.metrics.notInLog.Add(float64(gone))
		r.log.Warn("labelled clicks no longer in CLICKS; no verdict published for them",
			"partition", partition, "labels", gone, "first_seq", first)
	}
	return alerts, labels, nil
}

// find returns the event at seq from the batch (sorted by sequence) or the log.
func (r *Reader) find(ctx context.Context, seq, first uint64, batch []reader.Event) (reader.Event, error) {
	if seq >= first {
		lo, hi := 0, len(batch)
		for lo < hi {
			m := (lo + hi) / 2
			if batch[m].Seq < seq {
				lo = m + 1
			} else {
				hi = m
			}
		}
		if lo < len(batch) && batch[lo].Seq == seq {
			return batch[lo], nil
		}
	}
	r.metrics.lookups.Inc()
	return r.clicks.Click(ctx, seq)
}
