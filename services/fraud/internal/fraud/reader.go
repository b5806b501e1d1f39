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
	// Next returns the sequence of partition's first event at or after
	// from, or 0 when the log holds none.
	Next(ctx context.Context, partition int, from uint64) (uint64, error)
}

// Origins records, outside the store, where each partition's statistics
// begin: the first sequence whose judgement was applied to the store. A
// store that loses everything of a partition (a Redis failover to an empty
// replica, a FLUSHALL, a restore from an empty or old snapshot) holds no
// mark, as one that never had the partition does (a group started at
// `new`); the record, kept in NATS, tells them apart. It is written when a
// batch is applied to a store holding nothing of the partition (about once
// in the partition's life), never per click. It also tells a takeover
// whether the partition is in the middle of a replay, from the group's
// replay records beside it: the store's mark is then the replay's first
// pass, not a batch stored and not acked. And it tells which consumer the
// group has for the partition, so events a consumer created again hands
// again are told from events behind the state's position.
type Origins interface {
	// Origin returns the partition's recorded origin (0: none).
	Origin(ctx context.Context, partition int) (uint64, error)
	// Lower records seq as the partition's origin unless one at or before
	// it is recorded.
	Lower(ctx context.Context, partition int, seq uint64) error
	// Raise records seq as the partition's origin where from is still the
	// one recorded: the statistics of the events from from up to seq were
	// lost for good (retention took them before the store lost them), and
	// a later loss must not report them again.
	Raise(ctx context.Context, partition int, from, seq uint64) error
	// Replaying reports whether the partition carried out the group's
	// latest replay (reader.Rewind), with the consumer it has now (not the
	// one of a group deleted and created again since), and next is within
	// it: at or after its first event of the partition and at or before the
	// last it hands again. The group's replay records are kept in NATS too.
	Replaying(ctx context.Context, partition int, next uint64) (bool, error)
	// Consumer returns when the group's consumer of the partition was
	// created (zero: there is none). One deleted and created again (by an
	// operator, a topology reset) hands the partition's events again from
	// its own start, as first deliveries, under the same owner.
	Consumer(ctx context.Context, partition int) (time.Time, error)
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
// each owner's recent alerts, and what a rebuilt state needs beyond the log:
// the label counters of the alert period. Apply must be idempotent: applying
// judgements of events it has applied before changes nothing.
type Store interface {
	// Apply writes a batch of one partition and moves the partition's
	// high-water mark to its last judgement, all at once; of a batch whose
	// events are all at or before the mark it writes nothing.
	Apply(ctx context.Context, partition int, b Batch) error
	// HighWater returns the partition's high-water mark: the last sequence
	// applied (0: none).
	HighWater(ctx context.Context, partition int) (uint64, error)
	// LabelCounts returns the partition's label counters stored for the
	// alert periods of length period starting at starts, and the high-water
	// mark they are as of, read together.
	LabelCounts(ctx context.Context, partition int, period time.Duration, starts []time.Time) (mark uint64, counts []Count, err error)
}

// Batch is what one Apply writes.
type Batch struct {
	// Judgements are in sequence order.
	Judgements []Judgement
	// Counts are the label counters the judgements changed, as of the last
	// of them (Partition.Counts).
	Counts []Count
	// Period is the alert period, which keys the counters.
	Period time.Duration
	// After is the partition's mark as far as the caller knows (0: not
	// known): what it applied or read before. A store whose mark is behind
	// it lost writes; Apply then writes nothing and returns a
	// *StoreBehindError.
	After uint64
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
	origins Origins
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

	// mark is the partition's high-water mark in the store as far as this
	// state knows: what the rebuild read, then the last batch applied.
	mark uint64
	// origin is the partition's recorded origin (Origins) as far as this
	// state knows: what the rebuild read, or what it recorded since.
	origin uint64
	// restore: the label counters are to be set from the store's before
	// the first event after mark is judged (the stored ones are as of mark).
	restore bool
	// done is the store's mark when it was ahead of the runtime's resume
	// point at the takeover (the previous owner stored a batch and stopped
	// before acking it): the state was fed up to it, and those events,
	// handed again, are skipped without a word.
	done uint64
	// consumer is when the partition's consumer was created, as read when
	// the state was rebuilt (zero: none then) or when it was last found
	// created again; rehanded is the state's last event when it was found
	// created again. A consumer created again hands the partition's events
	// again from its own start, as first deliveries: those up to rehanded
	// were judged, by this member or before it, and are skipped without a
	// word, not counted behind the state's position.
	consumer time.Time
	rehanded uint64

	// published is the last sequence whose decisions are on FRAUD: this
	// member's last batch published, or the event before the rebuild's
	// resume point (whoever handled the events before it published their
	// decisions before acking them).
	published uint64
	// quiet: the decisions of events up to it are not published again. Set
	// when the store lost writes and the partition's events are handed
	// again from the first it lacks: they are judged again for the store,
	// but their decisions are on FRAUD already.
	quiet uint64
	// replayFrom, when not 0, is where the next Handle asks the runtime to
	// hand the partition's events again from (the rebuild found the store
	// behind events the log holds and that were acked, so applied).
	replayFrom uint64
	// asked, when not 0, is where this state asked the runtime to hand the
	// partition's events again from (reader.Replay), until the next batch
	// says where the runtime went: later, where the server does not move
	// the consumer back that far (replayedLater).
	asked uint64
	// lostFrom and lostTo, when lostTo is not 0: the statistics of the
	// events from lostFrom up to lostTo were lost and will not be counted
	// again (a replay went on from lostTo, later than asked). A rule that
	// labels one of them still publishes its label, but the store counts
	// no flag of a click whose total it does not count.
	lostFrom, lostTo uint64
}

// counted returns js with the labels of clicks whose statistics were lost
// for good left out (lostFrom, lostTo): the store counts a label as a flag
// of the judged click's link, and a flag without its click's total shows
// more flagged than total. js itself where none is.
func (ps *partState) counted(js []Judgement) []Judgement {
	lost := func(l Label) bool { return l.Seq >= ps.lostFrom && l.Seq < ps.lostTo }
	if ps.lostTo == 0 || !slices.ContainsFunc(js, func(j Judgement) bool { return slices.ContainsFunc(j.Labels, lost) }) {
		return js
	}
	out := slices.Clone(js)
	for i := range out {
		out[i].Labels = slices.DeleteFunc(slices.Clone(out[i].Labels), lost)
	}
	return out
}

// isPending reports whether the event at seq was judged and its decisions
// are not yet published and stored (pending is in sequence order).
func (ps *partState) isPending(seq uint64) bool {
	_, ok := slices.BinarySearchFunc(ps.pending, seq, func(j Judgement, s uint64) int { return cmp.Compare(j.Seq, s) })
	return ok
}

// NewReader wires a detector to its log, publisher, store and the record of
// where the store's statistics begin.
func NewReader(d *Detector, clicks ClickLog, pub Publisher, store Store, origins Origins, log *slog.Logger, m *Metrics) *Reader {
	if m == nil {
		m = NewMetrics(nil)
	}
	return &Reader{d: d, clicks: clicks, pub: pub, store: store, origins: origins, log: log, metrics: m, parts: map[int]*partState{}}
}

// OnAssign rebuilds the partition's state from the log before it judges
// anything: the events stored in the Memory before resumeSeq are fed
// without decisions (their owner published those), so the windows are
// what an uninterrupted member would have at resumeSeq. If the store has
// applied events from resumeSeq on (the previous owner stopped between
// storing a batch and acking it), the state is fed up to the store's mark
// instead: those events were published and stored, and are skipped when
// they are handed again. The label counters of the alert period come from
// the store before the first event is judged. If the store holds nothing of
// a partition whose statistics began before resumeSeq (Origins), it lost
// them all: the state starts where they began, as far as the log still
// holds them, and the events are handed again from there (see wiped).
func (r *Reader) OnAssign(ctx context.Context, partition int, resumeSeq uint64) error {
	consumer, err := r.origins.Consumer(ctx, partition)
	if err != nil {
		return fmt.Errorf("assign partition %d: %w", partition, err)
	}
	ps, err := r.rebuild(ctx, partition, resumeSeq, true, true)
	if err != nil {
		return fmt.Errorf("assign partition %d: %w", partition, err)
	}
	ps.consumer = consumer
	r.mu.Lock()
	r.parts[partition] = ps
	r.mu.Unlock()
	r.metrics.observe(partition, ps.p.Stats())
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
// rebuilt from the log before it, so the replay judges every event as the
// first pass did and raises the same alert IDs (which FRAUD then drops as
// duplicates). The label counters count from the Memory before the replay's
// start until the replay passes the store's mark, where they are set from
// the store's: from there on they are exact. A rewind the runtime does not
// move the partition back for (info.MovesBack false: From is past what the
// partition handled) keeps the state: the decision is the runtime's, made
// once, so the state and the consumer never go by different positions.
func (r *Reader) OnRewind(ctx context.Context, partition int, info reader.RewindInfo) error {
	if !info.MovesBack {
		// The runtime goes on where the partition was: so does the state,
		// or the events between what was judged and From would be skipped.
		return nil
	}
	consumer, err := r.origins.Consumer(ctx, partition)
	if err != nil {
		return fmt.Errorf("rewind partition %d to %d: %w", partition, info.From, err)
	}
	ps, err := r.rebuild(ctx, partition, info.From, false, true)
	if err != nil {
		return fmt.Errorf("rewind partition %d to %d: %w", partition, info.From, err)
	}
	ps.consumer = consumer
	r.mu.Lock()
	r.parts[partition] = ps
	r.mu.Unlock()
	r.log.Info("partition rewound", "partition", partition, "from", info.From, "replay", info.ID)
	return nil
}

// rebuild returns state for a partition whose next event is resume. On a
// takeover (not a rewind) it goes up to the store's mark where that is
// ahead of resume. With checkLost, a store that lost statistics is found:
// one behind events the log holds before resume, and one that holds
// nothing of a partition whose statistics began before resume (wiped).
func (r *Reader) rebuild(ctx context.Context, partition int, resume uint64, takeover, checkLost bool) (*partState, error) {
	started := time.Now()
	mark, err := r.store.HighWater(ctx, partition)
	if err != nil {
		return nil, fmt.Errorf("rebuild: %w", err)
	}
	origin, err := r.origins.Origin(ctx, partition)
	if err != nil {
		return nil, fmt.Errorf("rebuild: %w", err)
	}
	if origin == 0 && mark > 0 {
		// Statistics written before origins were recorded (an upgrade):
		// the mark is the earliest event known to be applied.
		if err := r.origins.Lower(ctx, partition, mark); err != nil {
			return nil, fmt.Errorf("rebuild: %w", err)
		}
		origin = mark
	}
	if checkLost && mark == 0 && origin > 0 && origin < resume {
		return r.wiped(ctx, partition, origin, resume)
	}
	until := resume
	foreign := false // the mark is not an event of the partition: said once rebuilt
	if takeover && mark >= resume {
		// A partition taken over in the middle of a replay has the mark of
		// the replay's first pass ahead of resume: the events up to it are
		// the replay's to judge again, as OnRewind started it, not a batch
		// the previous owner stored and did not ack. (A batch stored and
		// not acked within a replay is judged again too: its decisions are
		// published again, which their IDs make harmless, as the replay's.)
		replaying, err := r.origins.Replaying(ctx, partition, resume)
		if err != nil {
			return nil, fmt.Errorf("rebuild: %w", err)
		}
		if replaying {
			r.log.Info("partition taken over during a replay: judging the rest of it", "partition", partition, "resume_seq", resume, "mark", mark)
			takeover = false
		}
	}
	if takeover && mark >= resume {
		// The previous owner published and stored the events up to the mark
		// and stopped before acking them: the runtime hands them again. Feed
		// them, as the events before resume: judging them again would
		// publish their decisions again (under other verdict IDs where the
		// batch is cut differently), taken with label counters short of the
		// store's, which are as of the mark.
		ev, err := r.clicks.Click(ctx, mark)
		switch {
		case err == nil && ev.Partition == partition:
			until = mark + 1
		case err == nil || errors.Is(err, ErrNotInLog):
			// Not a batch the previous owner stored: a Redis kept from
			// another CLICKS stream (deleted and created again, its
			// sequences started over). The store answers every batch at or
			// below its mark as applied before, so nothing of the partition
			// is stored until its sequences pass the mark. Nothing here can
			// tell whose statistics those are; an operator can.
			foreign = true
		default:
			return nil, fmt.Errorf("rebuild: the event at the store's mark: %w", err)
		}
	}
	// rebuilt says what the rebuild found, once it succeeded: one that
	// fails (the log or the store unreachable) is tried again, by the
	// runtime (OnAssign) or with the batch (Handle), and finds it again.
	rebuilt := func(ps *partState) (*partState, error) {
		if foreign {
			r.metrics.foreign.Inc()
			r.log.Error("the store's mark is ahead of the resume point and is not an event of the partition in CLICKS (a Redis kept from another CLICKS stream?): the partition's statistics and alerts are not stored until its events pass the mark; delete the partition's keys in Redis (fraud:{p<N>}:*) and restart this member to store them again",
				"partition", partition, "resume_seq", resume, "mark", mark, "keys", fmt.Sprintf("fraud:{p%d}:*", partition))
		}
		return ps, nil
	}
	ps := &partState{p: r.d.NewPartition(), mark: mark, origin: origin, restore: mark > 0, published: until - 1}
	if until > resume {
		ps.done = until - 1
	}
	if until <= 1 {
		return rebuilt(ps)
	}
	p := ps.p
	anchor, err := r.clicks.StoredAt(ctx, until-1)
	if errors.Is(err, ErrNotInLog) {
		// The event before until is gone (retention): so is everything a
		// window could need. Start empty.
		r.log.Warn("nothing to rebuild from", "partition", partition, "resume_seq", resume)
		return rebuilt(ps)
	}
	if err != nil {
		return nil, fmt.Errorf("rebuild: %w", err)
	}
	// Read from a bucket boundary: the rebuilt state watches whole buckets.
	from := anchor.Add(-r.d.Memory()).Truncate(r.d.rules.FloodWindow)
	n, err := r.clicks.Scan(ctx, partition, from, until, func(ev reader.Event) { p.Feed(ev) })
	if err != nil {
		return nil, fmt.Errorf("rebuild: %w", err)
	}
	if checkLost && mark > 0 && mark < p.Last() {
		// The log holds events of the partition after the store's mark and
		// before the resume point, which were acked, so applied: the store
		// lost them (a Redis failover, a crash, while the partition changed
		// hands). Start the state at the first it lacks, and have the
		// runtime hand the events again from there; their decisions are on
		// FRAUD already. A mark of 0 is a store that never had the
		// partition, as far as can be told: not a loss.
		r.log.Warn("the store's mark is behind events the log holds before the resume point: the store lost applied writes",
			"partition", partition, "mark", mark, "last_in_log", p.Last(), "resume_seq", resume)
		lost, err := r.rebuild(ctx, partition, mark+1, true, false)
		if err != nil {
			return nil, err
		}
		lost.quiet = max(lost.quiet, until-1)
		lost.published = max(lost.published, lost.quiet)
		if lost.replayFrom == 0 {
			lost.replayFrom = mark + 1
		}
		return lost, nil
	}
	took := time.Since(started)
	r.metrics.rebuilds.Observe(took.Seconds())
	r.metrics.rebuildRead.Observe(float64(n))
	r.metrics.observe(partition, p.Stats())
	r.log.Info("partition rebuilt from the log", "partition", partition, "resume_seq", resume,
		"from", from, "until", until, "events", n, "mark", mark, "took", took.Round(time.Millisecond))
	return rebuilt(ps)
}

// wiped returns state for a partition whose store holds nothing (no mark)
// although its statistics began at origin, before resume: Redis lost them
// all, and with them the alert list and the label counters of the alert
// period, which the Memory before resume cannot rebuild. The events from
// origin to resume were acked, so JetStream will not hand them again unless
// asked: the state starts at the first of them the log still holds, and the
// next Handle asks the runtime to hand the partition's events again from
// there (reader.Replay). They are judged again and applied, so the
// statistics, the alert list and the counters are what they were; their
// decisions, published before, are not published again. What retention
// took before the loss is lost for good: said, counted, and the state
// starts at resume as on any takeover. The partition's origin then moves
// up to the first event whose statistics are counted again (Origins.Raise):
// the statistics begin there now, and a later loss, or a takeover before
// the events are handed again, does not report the same events lost again.
//
// The loss is counted and said once the state is rebuilt and the origin
// moved: a rebuild that fails (the log, the store or the record
// unreachable) is tried again, by the runtime (OnAssign) or with the batch
// (Handle), and finds the same loss again.
func (r *Reader) wiped(ctx context.Context, partition int, origin, resume uint64) (*partState, error) {
	from, err := r.clicks.Next(ctx, partition, origin)
	if err != nil {
		return nil, fmt.Errorf("rebuild: the partition's first event from %d: %w", origin, err)
	}
	if from >= resume {
		from = 0 // nothing of it left in the log
	}
	ps, err := r.rebuild(ctx, partition, cmp.Or(from, resume), true, false)
	if err != nil {
		return nil, err
	}
	if from != origin {
		lostBefore := cmp.Or(from, resume)
		if err := r.origins.Raise(ctx, partition, origin, lostBefore); err != nil {
			return nil, fmt.Errorf("rebuild: move the partition's origin past the statistics lost for good: %w", err)
		}
		ps.origin = lostBefore
		r.metrics.unrecoverable.Inc()
		r.log.Error("the store lost statistics of events CLICKS no longer holds (retention): their counts, their alerts in the alert list and their label counters are lost for good",
			"partition", partition, "lost_from", origin, "lost_before", lostBefore, "resume_seq", resume)
	}
	r.metrics.wiped.Inc()
	if from == 0 {
		return ps, nil
	}
	r.log.Warn("the store holds nothing of the partition, whose statistics began before the resume point: Redis lost them all (a failover to an empty replica, a FLUSHALL, a restore from an empty or old snapshot); asking for the partition's events again from the first the log holds",
		"partition", partition, "origin", origin, "resume_seq", resume, "replay_from", from)
	ps.quiet = max(ps.quiet, resume-1)
	ps.published = max(ps.published, ps.quiet)
	if ps.replayFrom == 0 {
		ps.replayFrom = from
	}
	return ps, nil
}

// restoreCounts sets the state's label counters from the store's before
// next is judged. They are as of the store's mark, which must still be the
// one the rebuild read.
func (r *Reader) restoreCounts(ctx context.Context, partition int, ps *partState, next reader.Event, first uint64) error {
	mark, cs, err := r.store.LabelCounts(ctx, partition, r.d.rules.AlertPeriod, ps.p.CountPeriods(next))
	if err != nil {
		return fmt.Errorf("restore label counters: %w", err)
	}
	if mark < ps.mark {
		return r.storeLost(ctx, partition, ps, mark, first)
	}
	if mark != ps.mark {
		// Someone applied a batch of the partition since the rebuild (a
		// member that had not yet heard it moved): the state is not as of
		// the store's counters. Rebuild it on the next call.
		r.mu.Lock()
		if r.parts[partition] == ps {
			delete(r.parts, partition)
		}
		r.mu.Unlock()
		return fmt.Errorf("restore label counters: the partition's mark moved from %d to %d since the rebuild; rebuilding", ps.mark, mark)
	}
	ps.p.RestoreCounts(cs)
	ps.restore = false
	r.log.Info("label counters restored from the store", "partition", partition, "mark", mark, "counters", len(cs))
	return nil
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
	if from := ps.replayFrom; from > 0 {
		ps.replayFrom = 0
		if from < batch[0].Seq {
			return r.replay(ps, partition, from, fmt.Errorf("partition %d: the store's mark is %d, behind events acked before %d: %w", partition, from-1, batch[0].Seq, ErrStoreBehind))
		}
	}
	if ps.asked > 0 {
		next, err := r.replayedLater(ctx, partition, ps, batch[0].Seq)
		if err != nil {
			return fmt.Errorf("handle partition %d: %w", partition, err)
		}
		ps = next
	}
	var behind, firstBehind uint64 // first deliveries behind the position (logged once)
	lastBefore := ps.p.Last()
	for _, ev := range batch {
		if ps.restore && ev.Seq > ps.mark && ev.Seq > ps.p.Last() {
			if err := r.restoreCounts(ctx, partition, ps, ev, batch[0].Seq); err != nil {
				return fmt.Errorf("handle partition %d: %w", partition, err)
			}
		}
		j, ok := ps.p.Judge(ev)
		if !ok {
			// The runtime retries a batch that failed after it was judged
			// with the same events, still first deliveries: those are
			// pending here, judged and waiting to be published and stored.
			// Those up to done were stored by the previous owner, those up
			// to rehanded handed again by a consumer created again.
			if ev.Deliveries <= 1 && ev.Seq > max(ps.done, ps.rehanded) && !ps.isPending(ev.Seq) {
				// A first delivery behind the state's position was never
				// judged and now never will be: say so loudly, once a batch,
				// unless the consumer was created again (below).
				if behind == 0 {
					firstBehind = ev.Seq
				}
				behind++
			}
			continue
		}
		ps.pending = append(ps.pending, j)
		ps.resolved, ps.sent = false, false
		if j.Copy {
			r.metrics.copies.Inc()
			continue
		}
		r.metrics.judged.Inc()
	}
	if behind > 0 {
		r.behind(ctx, partition, ps, behind, firstBehind, lastBefore)
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

// behind deals with first deliveries behind the state's position (n, the
// first at first; last is the state's last event before the batch). The
// partition's consumer created again since the state was rebuilt (deleted by
// an operator or a topology reset, created again by the runtime) hands the
// partition's events again from its own start, first deliveries of events
// judged before: not behind, and skipped up to last without asking again.
// Otherwise they are events never judged that never will be, counted and
// said loudly. One read of the consumer, only in a batch with such events.
func (r *Reader) behind(ctx context.Context, partition int, ps *partState, n, first, last uint64) {
	created, err := r.origins.Consumer(ctx, partition)
	if err == nil && !created.Equal(ps.consumer) {
		r.log.Info("the partition's consumer was created again: it hands the events judged before again, skipped",
			"partition", partition, "events", n, "first_seq", first, "last_judged", last, "consumer_created", created)
		ps.consumer, ps.rehanded = created, max(ps.rehanded, last)
		return
	}
	r.metrics.behind.Add(float64(n))
	r.log.Warn("events delivered behind the partition's position; not judged",
		"partition", partition, "events", n, "first_seq", first, "last_judged", last, "consumer_err", err)
}

// flush publishes and stores what is pending, in that order: the API's
// statistics never show an alert that FRAUD does not have.
func (r *Reader) flush(ctx context.Context, partition int, ps *partState, batch []reader.Event) error {
	if !ps.resolved {
		// Decisions about events up to quiet were published before the
		// store lost them: they are judged again for the store only.
		live := ps.pending
		if ps.quiet > 0 {
			i, _ := slices.BinarySearchFunc(live, ps.quiet+1, func(j Judgement, s uint64) int { return cmp.Compare(j.Seq, s) })
			live = live[i:]
		}
		ps.alerts, ps.labels, ps.verdicts = nil, 0, nil
		if len(live) > 0 {
			alerts, labels, err := r.decisions(ctx, partition, live, batch)
			if err != nil {
				return err
			}
			// The messages' IDs come from the sequences judged: a retry of
			// this flush re-sends these very messages, from memory.
			first, last := live[0].Seq, live[len(live)-1].Seq
			ps.alerts, ps.labels = alerts, len(labels)
			ps.verdicts = events.SplitVerdicts(partition, first, last, labels)
		}
		ps.resolved = true
	}
	if !ps.sent {
		dups := 0
		if len(ps.alerts)+len(ps.verdicts) > 0 {
			var err error
			dups, err = r.pub.Publish(ctx, ps.alerts, ps.verdicts)
			if err != nil {
				return fmt.Errorf("publish %d alerts and %d verdict messages (%d labels): %w", len(ps.alerts), len(ps.verdicts), ps.labels, err)
			}
		}
		ps.sent = true
		ps.published = max(ps.published, ps.pending[len(ps.pending)-1].Seq)
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
	if first := ps.pending[0].Seq; ps.mark == 0 && (ps.origin == 0 || first < ps.origin) {
		// The store holds nothing of the partition: its statistics begin
		// with this batch. Recorded before they are written, so a store
		// that loses them is found (wiped).
		if err := r.origins.Lower(ctx, partition, first); err != nil {
			return fmt.Errorf("record where the partition's statistics begin: %w", err)
		}
		ps.origin = first
	}
	b := Batch{Judgements: ps.counted(ps.pending), Counts: ps.p.Counts(nil), Period: r.d.rules.AlertPeriod, After: ps.mark}
	if err := r.store.Apply(ctx, partition, b); err != nil {
		var behind *StoreBehindError
		if errors.As(err, &behind) {
			return r.storeLost(ctx, partition, ps, behind.Mark, batch[0].Seq)
		}
		return fmt.Errorf("store statistics: %w", err)
	}
	ps.p.CountsStored()
	ps.mark = max(ps.mark, ps.pending[len(ps.pending)-1].Seq)
	ps.pending, ps.alerts, ps.verdicts = ps.pending[:0], nil, nil
	return nil
}

// storeLost handles a store whose mark of the partition went back to stored,
// behind what this state applied (Redis lost acknowledged writes): the
// events after it were acked, so JetStream will not hand them again unless
// asked. The state is rebuilt at the first event the store lacks and the
// runtime asked to hand the partition's events again from there
// (reader.Replay); they are judged again and applied, and the decisions
// this member or an earlier owner published (up to ps.published) are not
// published again. first is the batch's first sequence.
//
// A store that lost everything of the partition (stored is 0) lost the
// events from where its statistics began (Origins): the rebuild at the
// batch finds them (wiped), and where the log still holds them from.
func (r *Reader) storeLost(ctx context.Context, partition int, ps *partState, stored, first uint64) error {
	from := min(stored+1, first)
	if stored == 0 && ps.origin > 0 {
		from = first
	}
	next, err := r.rebuild(ctx, partition, from, true, true)
	if err != nil {
		return fmt.Errorf("the store's mark went back from %d to %d; rebuild at %d: %w", ps.mark, stored, from, err)
	}
	next.quiet = max(next.quiet, ps.quiet, ps.published)
	next.published = max(next.published, next.quiet)
	next.consumer = ps.consumer
	if from >= ps.lostTo {
		next.lostFrom, next.lostTo = ps.lostFrom, ps.lostTo
	}
	if next.replayFrom > 0 {
		// The store lost more meanwhile.
		from, next.replayFrom = min(from, next.replayFrom), 0
	}
	r.mu.Lock()
	r.parts[partition] = next
	r.mu.Unlock()
	return r.replay(next, partition, from, fmt.Errorf("partition %d: the store's mark is %d, this member applied up to %d: %w", partition, stored, ps.mark, ErrStoreBehind))
}

// replay asks the runtime to hand the partition's events again from from,
// for a store that lost applied writes; ps, rebuilt at from, is the state
// that judges them.
func (r *Reader) replay(ps *partState, partition int, from uint64, why error) error {
	ps.asked = from
	r.metrics.storeReplays.Inc()
	r.log.Warn("the store lost applied writes (a Redis failover to a replica without them, or a crash that lost its last second): asking for the partition's events again from the first it lacks",
		"partition", partition, "from", from, "err", why)
	return reader.Replay(from, why)
}

// replayedLater returns the state that judges the first batch after a
// replay ps asked for (ps.asked), first its first sequence. The runtime
// hands the events again from where the server moves the partition's
// consumer back, which is not always where it was asked: no further back
// than where the consumer started (a group started at a sequence or a
// time, created again since), and for a group started at new events
// (FRAUD_START=new) only to its ack floor. The events of the partition from
// ps.asked up to first are then not handed again, and ps, rebuilt at
// ps.asked, has not seen them: its windows have a hole, and it judged the
// clicks after it on part of their window (a burst or a flood across it
// went uncaught, a link's baseline too low). They are in the log (the
// group's start is not the log's), so the state is rebuilt from the log up
// to first, as on a takeover there, its decisions and label counters
// going on from the store's mark. Their statistics, which the store lost,
// stay lost (the runtime said so when it moved), and so does a flag of
// them that a later click's burst or flood labels (counted). A replay that
// went where it was asked, or past nothing of the partition, keeps ps.
func (r *Reader) replayedLater(ctx context.Context, partition int, ps *partState, first uint64) (*partState, error) {
	asked := ps.asked
	if first <= asked {
		ps.asked = 0
		return ps, nil
	}
	next, err := r.clicks.Next(ctx, partition, asked)
	if err != nil {
		return nil, fmt.Errorf("the partition's first event from %d, where its replay was asked from: %w", asked, err)
	}
	if next == 0 || next >= first {
		ps.asked = 0
		return ps, nil
	}
	r.log.Warn("the replay went on from later than asked (the server moves the partition's consumer back no further): rebuilding the state from the log up to where it goes on, so its windows have no hole",
		"partition", partition, "asked", asked, "first_seq", first)
	again, err := r.rebuild(ctx, partition, first, false, false)
	if err != nil {
		return nil, fmt.Errorf("rebuild where the replay went on from: %w", err)
	}
	again.quiet = max(again.quiet, ps.quiet)
	again.published = max(again.published, ps.published, again.quiet)
	again.consumer, again.rehanded = ps.consumer, ps.rehanded
	again.lostFrom, again.lostTo = again.mark+1, first
	r.mu.Lock()
	if r.parts[partition] == ps {
		r.parts[partition] = again
	}
	r.mu.Unlock()
	return again, nil
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
	var labelled map[string]struct{} // click IDs labelled, made at the first label
	first := batch[0].Seq
	gone, twice := 0, 0
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
			// Two sequences can hold one click: a copy more than Memory
			// behind the partition's clock is judged as a click (copies.go).
			// A verdict message that labels a click twice is malformed to
			// the click counter, which would park it with every other label
			// in it; the counter keys labels by click ID, so one is enough.
			if labelled == nil {
				labelled = make(map[string]struct{}, len(js))
			}
			if _, dup := labelled[c.ID]; dup {
				twice++
				continue
			}
			labelled[c.ID] = struct{}{}
			labels = append(labels, events.FraudVerdictLabel{
				ClickID: c.ID, ClickSeq: l.Seq, Code: c.Code, Owner: c.Owner,
				Rule: l.Rule, AlertID: l.AlertID, Bot: true, SourceBot: c.Bot,
				ClickTime: c.Time, Country: c.Country, Referrer: c.Referrer, Time: j.At.UTC(),
			})
		}
	}
	if twice > 0 {
		r.log.Info("clicks stored twice and judged as two (copies beyond the state's memory) labelled once in the batch's verdicts",
			"partition", partition, "labels_left_out", twice, "first_seq", first)
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
