package counter

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/snipdev/snip/pkg/events"
)

// Expired is a verdict's status when it is about a click older than CLICKS
// retention: it is acknowledged and changes nothing (see labelHorizon).
const Expired CorrectionStatus = -1

// NotCounted is a verdict's status when it names a click stored in a
// partition its link code does not hash to: the counter never counts such a
// click, so the verdict is acknowledged and changes nothing.
const NotCounted CorrectionStatus = -2

// labelHorizon is how long after the end of a click's label day a verdict
// about it is still applied: CLICKS retention plus a day. Labels are kept a
// day longer still (labelKeep), so a verdict redelivered or replayed before
// the horizon always finds its label and is not applied twice, and one
// arriving after it is refused rather than applied without that check.
func (c *Counter) labelHorizon(d Day) time.Time { return d.End().Add(c.maxAge + 24*time.Hour) }

func (c *Counter) labelKeep(d Day) time.Time { return d.End().Add(c.maxAge + 48*time.Hour) }

// Verdict is a fraud verdict and its FRAUD stream sequence, which orders the
// verdicts about one click: the one with the higher sequence wins.
type Verdict struct {
	V   *events.FraudVerdict
	Seq uint64
}

// VerdictResult is what applying one verdict did.
type VerdictResult struct {
	Status CorrectionStatus
	// Err is set when the verdict was not applied: wrapping
	// events.ErrMalformed it never can be; otherwise it may be retried
	// (applying a verdict again changes nothing).
	Err error
}

// ApplyVerdict applies one fraud verdict; see ApplyVerdicts.
func (c *Counter) ApplyVerdict(ctx context.Context, v *events.FraudVerdict, fraudSeq uint64) (CorrectionStatus, error) {
	r := c.ApplyVerdicts(ctx, []Verdict{{V: v, Seq: fraudSeq}})[0]
	return r.Status, r.Err
}

// ApplyVerdicts applies a batch of fraud verdicts as corrections, and
// returns one result per verdict.
//
// A verdict moves only what the counter counted: whether a generation
// counted the click is looked up by event ID in its recent-ID record (the
// same record, written in the same script as the counts, that deduplicates
// clicks), and only once that record is gone is it inferred from the
// watermark of the click's own partition. A verdict naming a click stored
// in another partition than its code hashes to is NotCounted.
//
// Each verdict's label is recorded by click ID, and wherever the click was
// already counted it moves between the human and bot counts (total, day,
// hour, country, referrer) once; a verdict that repeats the current label
// changes nothing, and one at or below a FRAUD sequence already applied to
// the click is stale. A verdict that comes before its click is counted needs
// no waiting: the click is counted with the recorded label when it comes.
//
// The verdicts are grouped by partition, and each partition's group is
// applied in one atomic store call, in FRAUD order, guarded by the
// partition's generations; the groups of all partitions go in one round
// trip. A group whose generations changed meanwhile (a recount started or
// switched) is retried on the new ones.
func (c *Counter) ApplyVerdicts(ctx context.Context, vs []Verdict) []VerdictResult {
	out := make([]VerdictResult, len(vs))
	groups := map[int]*Corrections{}
	at := map[int][]int{} // partition -> indexes into vs, in the group's order
	for i, v := range vs {
		p, corr, status, err := c.correction(v)
		if err != nil || status == Expired || status == NotCounted {
			out[i] = VerdictResult{Status: status, Err: err}
			continue
		}
		g := groups[p]
		if g == nil {
			g = &Corrections{Partition: p}
			groups[p] = g
		}
		g.Items = append(g.Items, corr)
		at[p] = append(at[p], i)
	}
	// FRAUD order within a partition, so two verdicts of one click in one
	// batch end with the later one's label, as if handled one by one.
	for p, g := range groups {
		idx := at[p]
		order := make([]int, len(idx))
		for k := range order {
			order[k] = k
		}
		slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(g.Items[a].FraudSeq, g.Items[b].FraudSeq) })
		items, sorted := make([]Correction, len(order)), make([]int, len(order))
		for k, o := range order {
			items[k], sorted[k] = g.Items[o], idx[o]
		}
		g.Items, at[p] = items, sorted
	}
	fail := func(p int, err error) {
		for _, i := range at[p] {
			out[i].Err = fmt.Errorf("apply verdict %s: %w", vs[i].V.ID, err)
		}
	}
	pending := slices.Sorted(maps.Keys(groups))
	var written []int
	for attempt := 0; attempt < maxWriteAttempts && len(pending) > 0; attempt++ {
		batch := make([]*Corrections, 0, len(pending))
		for _, p := range pending {
			st, err := c.verdictState(ctx, p, attempt > 0)
			if err != nil {
				fail(p, err)
				continue
			}
			groups[p].Expect = st
			batch = append(batch, groups[p])
		}
		pending = pending[:0]
		for k, res := range c.store.Correct(ctx, batch) {
			p := batch[k].Partition
			switch {
			case res.Err != nil:
				fail(p, res.Err)
			case res.Conflict:
				c.m.retries.WithLabelValues("verdict_conflict").Inc()
				pending = append(pending, p)
			default:
				written = append(written, p)
				for j, r := range res.Items {
					out[at[p][j]].Status = r.Status
					c.m.corrections.WithLabelValues(r.Status.String()).Inc()
				}
			}
		}
	}
	for _, p := range pending {
		fail(p, ErrContention)
	}
	c.replicated(ctx, "verdicts", written, nil)
	return out
}

// replicated waits, if the store is configured to, until its replicas have
// what a feed just wrote, before the feed acks it: then a Redis master that
// dies right after the ack does not take the feed's writes with it (the
// click counts have their own cover, catchUp). When the replicas do not
// confirm in time the feed goes on, as without the wait: the writes are on
// the master, and the shortfall is counted and logged.
func (c *Counter) replicated(ctx context.Context, feed string, partitions []int, codes []string) {
	if len(partitions)+len(codes) == 0 {
		return
	}
	if err := c.store.Replicated(ctx, partitions, codes); err != nil {
		c.m.replicaShort.WithLabelValues(feed).Inc()
		c.log.Warn("the Redis replicas did not confirm a feed's writes in time; they are on the master only", "feed", feed, "err", err)
	}
}

// correction resolves a verdict into its partition and the counts it would
// move. It returns
// Expired for a verdict past the label horizon, and an error wrapping
// events.ErrMalformed for one that can never be applied.
func (c *Counter) correction(v Verdict) (int, Correction, CorrectionStatus, error) {
	p := events.Partition(v.V.Code, c.n)
	if v.V.Partition != p {
		// The click was stored where its code does not hash to: every
		// reader parks such a click, and the counter counts a click only in
		// its code's partition, so it never counted this one. Another
		// partition's watermark says nothing about it.
		c.log.Warn("verdict about a click stored in another partition than its link code hashes to; ignored",
			"verdict", v.V.ID, "click", v.V.ClickID, "code", v.V.Code, "partition", v.V.Partition, "computed", p)
		c.m.corrections.WithLabelValues(NotCounted.String()).Inc()
		return p, Correction{}, NotCounted, nil
	}
	mark, err := ParseID(v.V.ClickID)
	if err != nil {
		return p, Correction{}, 0, fmt.Errorf("apply verdict %s: %w: %w", v.V.ID, err, events.ErrMalformed)
	}
	day := mark.LabelDay()
	if c.now().After(c.labelHorizon(day)) {
		c.m.corrections.WithLabelValues("expired").Inc()
		return p, Correction{}, Expired, nil
	}
	t := v.V.ClickTime.UTC()
	return p, Correction{
		ClickID:     v.V.ClickID,
		Mark:        mark,
		LabelDay:    day,
		FraudSeq:    v.Seq,
		To:          LabelOf(v.V.Bot),
		Source:      LabelOf(v.V.SourceBot),
		ClickSeq:    v.V.ClickSeq,
		Link:        LinkRef{Owner: v.V.Owner, Code: v.V.Code},
		Day:         DayOf(t),
		Hour:        t.Hour(),
		Country:     CountryOf(v.V.Country),
		Referrer:    ReferrerHost(v.V.Referrer),
		LabelExpiry: c.labelKeep(day),
	}, 0, nil
}

// verdictState returns the generations verdicts for partition p are
// written against: cached, because they change only when a recount starts
// or switches, and the store's compare-and-set says when they did (then
// fresh is set, and they are read again).
func (c *Counter) verdictState(ctx context.Context, p int, fresh bool) (State, error) {
	c.mu.Lock()
	st, ok := c.vstate[p]
	c.mu.Unlock()
	if ok && !fresh {
		return st, nil
	}
	st, err := c.store.State(ctx, p)
	if err != nil {
		return State{}, fmt.Errorf("load partition %d state: %w", p, err)
	}
	c.mu.Lock()
	c.vstate[p] = st
	c.mu.Unlock()
	return st, nil
}

// DeletedLinkHorizon is how long past CLICKS retention after its deletion
// a deleted link's counts are kept: a click redirected before the deletion
// and stored late (an outbox backlog) is counted within CLICKS retention of
// being stored, and a verdict about it is applied until a day past that.
const DeletedLinkHorizon = 2 * 24 * time.Hour

// LinkEvent is a LINKS event and its stream sequence.
type LinkEvent struct {
	E   *events.LinkEvent
	Seq uint64
}

// ApplyLinkEvent records one LINKS event; see ApplyLinkEvents.
func (c *Counter) ApplyLinkEvent(ctx context.Context, e *events.LinkEvent, seq uint64) error {
	return c.ApplyLinkEvents(ctx, []LinkEvent{{E: e, Seq: seq}})
}

// ApplyLinkEvents records a batch of LINKS events, in one round trip: who
// owns each code, or that it was deleted. The stats API needs it for links
// with no clicks yet, and to refuse deleted ones. An event at or below the
// sequence already recorded for its code changes nothing, so the batch may
// be applied again after an error.
//
// A deleted link's counts are never read again (the stats API refuses it,
// and its code is never created again: the redirect keeps a tombstone), so
// they are given an expiry (ForgetLinks): DeletedLinkHorizon after the
// deletion, when no late click of the link (one redirected before it) can
// still be counted, nor a verdict move one. Every deletion of the batch,
// applied now or before (a batch retried after ForgetLinks failed), is
// forgotten; doing it twice changes nothing.
func (c *Counter) ApplyLinkEvents(ctx context.Context, es []LinkEvent) error {
	applied, err := c.store.ApplyLinkEvents(ctx, es)
	if err != nil {
		return fmt.Errorf("apply %d link events: %w", len(es), err)
	}
	codes := make([]string, len(es))
	var gone []DeletedLink
	var parts []int
	for i, e := range es {
		codes[i] = e.E.Code
		if e.E.Kind != events.LinkDeleted {
			continue
		}
		p := events.Partition(e.E.Code, c.n)
		gone = append(gone, DeletedLink{Partition: p, Ref: LinkRef{Owner: e.E.Owner, Code: e.E.Code},
			Until: e.E.Time.Add(c.maxAge + DeletedLinkHorizon)})
		if !slices.Contains(parts, p) {
			parts = append(parts, p)
		}
	}
	if len(gone) > 0 {
		if err := c.store.ForgetLinks(ctx, gone); err != nil {
			return fmt.Errorf("apply %d link events: %w", len(es), err)
		}
	}
	c.replicated(ctx, "links", parts, codes)
	for _, ok := range applied {
		if ok {
			c.m.linkEvents.WithLabelValues("applied").Inc()
		} else {
			c.m.linkEvents.WithLabelValues("stale").Inc()
		}
	}
	return nil
}
