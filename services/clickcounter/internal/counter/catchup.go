package counter

import (
	"context"
	"errors"
	"fmt"

	"github.com/snipdev/snip/pkg/reader"
)

// The store can lose writes the counter has acked. Redis replicates
// asynchronously: a batch written on a master and acked to JetStream is gone
// if the master dies before its replica has it, and the promoted replica's
// watermark is older than the batches the counter has been handed since.
// Counting the next batch from that watermark would skip the lost events
// for ever (JetStream will not deliver acked events again, unless asked),
// so whenever the counter takes a partition's state from the store (on
// assignment, on a cache miss, after a conflict) it first asks CLICKS
// whether the partition holds events between the store's watermark and the
// batch. If it does, the handler answers reader.Replay from the first of
// them: the runtime moves the partition's consumer back there and hands
// everything from there again, and the counter counts it as any batch,
// from the watermark the store kept. The watermark and the recent-ID record
// the store kept are the state as of the lost write, so each of those
// events is counted exactly once; they come at the speed of any catch-up,
// however many there are (a Redis that lost everything included). In the
// steady state this costs one stream lookup per reload, which finds
// nothing.

// ErrStoreBehind is the reason of the counter's replay: the store's
// watermark is behind events CLICKS holds before the batch.
var ErrStoreBehind = errors.New("the store has not counted events before the batch")

// catchUp checks, if the partition's state came from the store since the
// last check, whether CLICKS holds partition events the store has not
// counted before seq before; if so it returns a reader.Replay from the
// first of them.
func (c *Counter) catchUp(ctx context.Context, p int, before uint64) error {
	st, err := c.cached(ctx, p)
	if err != nil {
		return err
	}
	unchecked, recounted := c.takeUnchecked(p)
	if !unchecked || before <= st.WM+1 {
		return nil
	}
	from, err := c.clicks.NextSeq(ctx, p, st.WM+1)
	if err != nil {
		c.markUnchecked(p) // check again next time
		if recounted {
			c.markRecounted(p)
		}
		return fmt.Errorf("look for partition %d's events from %d to %d: %w", p, st.WM+1, before-1, err)
	}
	if from == 0 || from >= before {
		return nil
	}
	if recounted {
		// A recount another member started while this one held the batch:
		// the new generation has not counted the events before it yet, and
		// the store lost none of them. They are asked for so that the
		// recount misses none, and neither the metric nor the store's
		// record of a lost stretch takes them for lost.
		c.log.Info("a recount started while this member held the batch: asking for the partition's events again from the first the new generation has not counted",
			"partition", p, "generation", st.Write, "watermark", st.WM, "batch_first", before, "replay_from", from)
		return reader.Replay(from, fmt.Errorf("partition %d: generation %d at %d, batch from %d, CLICKS holds the partition's sequence %d: %w", p, st.Write, st.WM, before, from, ErrStoreBehind))
	}
	c.log.Warn("the store's watermark is behind the batch: asking for the partition's events again from the first it has not counted (a Redis failover lost acked writes? or the last events before this load were parked)",
		"partition", p, "watermark", st.WM, "batch_first", before, "replay_from", from)
	r := c.setReplay(p, from, before)
	// Kept in the store too: a member that takes the partition over
	// during the catch-up counts the rest of it as missed.
	if err := c.store.MarkLost(ctx, p, st.Write, r.from, r.until); err != nil {
		c.markUnchecked(p) // check again next time
		return err
	}
	return reader.Replay(from, fmt.Errorf("partition %d: watermark %d, batch from %d, CLICKS holds the partition's sequence %d: %w", p, st.WM, before, from, ErrStoreBehind))
}

// countMissed counts, in the metric, the events of a batch just written
// from watermark wm that the store had lost: those after wm from the first
// the counter asked for again to where the batch that asked began. Those
// at or below wm were written before, and counted in the metric then: a
// batch handed again after a hand-over (written, not acked) counts nothing
// twice. Those before the first are not among them, though a recount
// started meanwhile counts them again too.
func (c *Counter) countMissed(p int, evs []reader.Event, wm uint64) {
	c.m.missed.WithLabelValues("read").Add(float64(c.missedIn(p, evs, wm)))
	if r := c.replayOf(p); r.until != 0 && evs[len(evs)-1].Seq+1 >= r.until {
		c.replayDone(p)
	}
}

// missedIn is how many of a batch's events, written from watermark wm,
// the store had lost (see countMissed).
func (c *Counter) missedIn(p int, evs []reader.Event, wm uint64) int {
	r := c.replayOf(p)
	if r.until == 0 {
		return 0
	}
	n := 0
	for _, e := range evs {
		if e.Seq > wm && r.has(e.Seq) {
			n++
		}
	}
	return n
}
