package counter

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
)

// maxWriteAttempts bounds how often one call retries a batch whose write
// met a conflict or a recheck. Each retry is caused by another writer or by
// a duplicate found; more than a handful in a row means something is wrong,
// and the runtime's backoff takes over.
const maxWriteAttempts = 8

// ReasonWrongPartition is the dead-letter reason of a click stored in a
// partition its link code does not hash to. The reader runtime parks such a
// click before the counter sees it (events.ReadClick, the rule every reader
// applies); the counter checks again because counting it would be wrong.
const ReasonWrongPartition = events.ReasonWrongPartition

// HandleBatch is the reader.Handler of the click counter: it counts one
// partition's batch exactly once, in one atomic write.
func (c *Counter) HandleBatch(ctx context.Context, partition int, batch []reader.Event) error {
	good, poison := c.screen(partition, batch)
	if good > 0 {
		if err := c.count(ctx, partition, batch[:good]); err != nil {
			return err
		}
	}
	return poison
}

// screen finds the first event that can never be counted. It returns how
// many events precede it and the reader.Poison error for it (nil if none).
func (c *Counter) screen(p int, batch []reader.Event) (int, error) {
	for i := range batch {
		cl := &batch[i].Click
		if got := events.Partition(cl.Code, c.n); got != p {
			return i, reader.Poison(i, ReasonWrongPartition,
				fmt.Errorf("click %s of link %q belongs in partition %d, read from %d: %w", cl.ID, cl.Code, got, p, ErrWrongPartition))
		}
		if _, err := ParseID(cl.ID); err != nil {
			return i, reader.Poison(i, reader.ReasonMalformed, fmt.Errorf("%w: %w", err, events.ErrMalformed))
		}
	}
	return len(batch), nil
}

// count applies events (all countable) to the partition's write
// generation, after any events before them that the store lost (catchUp).
func (c *Counter) count(ctx context.Context, p int, evs []reader.Event) error {
	for range maxWriteAttempts {
		err := c.catchUp(ctx, p, evs[0].Seq)
		if err == nil {
			err = c.write(ctx, p, evs)
		}
		if err == nil {
			c.countMissed(p, evs)
		}
		if !errors.Is(err, errConflict) {
			return err
		}
	}
	return fmt.Errorf("write partition %d batch: %w", p, ErrContention)
}

// errConflict: the partition's state changed under a write and was read
// again; count starts over from it.
var errConflict = errors.New("partition state changed")

// write applies consecutive events of the partition in one atomic write,
// retrying while the store asks for a recheck. A conflict reloads the
// state and returns errConflict.
func (c *Counter) write(ctx context.Context, p int, evs []reader.Event) error {
	st, err := c.cached(ctx, p)
	if err != nil {
		return err
	}
	last := &evs[len(evs)-1]
	labels := map[string]Label{}
	dups := map[string]bool{}
	start := time.Now()
	for attempt := 0; attempt < maxWriteAttempts; attempt++ {
		if last.Seq <= st.WM {
			// Everything was applied before: a redelivery or a replay overlap.
			c.m.duplicates.WithLabelValues("watermark").Add(float64(len(evs)))
			return nil
		}
		b := c.build(p, *st, evs, labels, dups)
		res, err := c.store.Apply(ctx, b.w)
		if err != nil {
			return fmt.Errorf("write partition %d batch: %w", p, err)
		}
		switch res.Status {
		case Conflict:
			c.m.retries.WithLabelValues("conflict").Inc()
			if _, err := c.reload(ctx, p); err != nil {
				return err
			}
			return errConflict
		case Recheck:
			c.m.retries.WithLabelValues("recheck").Inc()
			for _, i := range res.Duplicates {
				dups[b.w.Marks[i].ID] = true
			}
			for i, l := range res.Labels {
				labels[b.w.Marks[i].ID] = l
			}
			continue
		}
		c.m.writeTime.Observe(time.Since(start).Seconds())
		c.m.duplicates.WithLabelValues("watermark").Add(float64(b.dupWM))
		c.m.duplicates.WithLabelValues("event_id").Add(float64(b.dupID))
		c.m.counted.WithLabelValues(Human.String()).Add(float64(b.human))
		c.m.counted.WithLabelValues(Bot.String()).Add(float64(b.bot))
		st.WM = last.Seq
		if res.Switched {
			c.log.Info("recount caught up; the new generation now serves reads",
				"partition", p, "generation", st.Write, "previous", st.Read, "seq", last.Seq)
			st.Read, st.Until = st.Write, 0
			c.m.recounts.WithLabelValues("finished").Inc()
			c.m.observeState(p, *st)
			c.requestCleanup(p)
		}
		if c.hooks.AfterWrite != nil {
			return c.hooks.AfterWrite(ctx, p, last.Seq)
		}
		return nil
	}
	return fmt.Errorf("write partition %d batch: %w", p, ErrContention)
}

// built is one attempt at a batch's write.
type built struct {
	w            *Write
	dupWM, dupID int
	human, bot   int
}

// build filters evs against the state and aggregates what is left. dups
// are event IDs the store found already counted; labels are verdict labels
// it reported (0: none).
func (c *Counter) build(p int, st State, evs []reader.Event, labels map[string]Label, dups map[string]bool) built {
	last := &evs[len(evs)-1]
	b := built{w: &Write{
		Partition:  p,
		Expect:     st,
		LastSeq:    last.Seq,
		LastStored: last.Stored,
		Delta:      NewDelta(),
		DedupTTL:   c.window,
		Marks:      make([]Mark, 0, len(evs)),
	}}
	seen := make(map[string]struct{}, len(evs))
	for i := range evs {
		e := &evs[i]
		if e.Seq <= st.WM {
			b.dupWM++
			continue
		}
		id := e.Click.ID
		if _, ok := seen[id]; ok || dups[id] {
			b.dupID++
			continue
		}
		seen[id] = struct{}{}
		mark, _ := ParseID(id) // screened
		l, assumed := LabelOf(e.Click.Bot), Label(0)
		if v := labels[id]; v != 0 {
			l, assumed = v, v
		}
		n := int64(1)
		if c.hooks.Weight != nil {
			n = c.hooks.Weight(&e.Click)
		}
		b.w.Delta.Add(&e.Click, l, n)
		b.w.Marks = append(b.w.Marks, Mark{ID: id, IDMark: mark, Assumed: assumed})
		b.w.Counted++
		if l == Bot {
			b.bot++
		} else {
			b.human++
		}
	}
	return b
}
