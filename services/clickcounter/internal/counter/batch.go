package counter

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
// retrying while the store asks for a recheck, and counts those the store
// had lost (countMissed). A conflict reloads the state and returns
// errConflict.
func (c *Counter) write(ctx context.Context, p int, evs []reader.Event) error {
	if c.hasUnanswered(p) {
		// Its last write's answer was lost: the state is read again first,
		// which tells whether that write landed (settle).
		return c.readAgain(ctx, p)
	}
	st, err := c.cached(ctx, p)
	if err != nil {
		return err
	}
	last := &evs[len(evs)-1]
	labels := map[string]Label{}
	dups := map[string]bool{}
	start := time.Now()
	var sc *batchScratch
	select {
	case sc = <-c.batches:
	default:
		sc = &batchScratch{}
	}
	// Nothing of the scratch outlives this call: Apply is done with the
	// write when it returns. Emptied, it keeps none of the batch's clicks
	// (nor the messages their strings share) alive in c.batches.
	defer func() {
		sc.empty()
		select {
		case c.batches <- sc:
		default: // as many as partitions kept already
		}
	}()
	for attempt := 0; attempt < maxWriteAttempts; attempt++ {
		if last.Seq <= st.WM {
			// Everything was applied before: a redelivery or a replay overlap.
			c.m.duplicates.WithLabelValues("watermark").Add(float64(len(evs)))
			return nil
		}
		b := c.build(p, *st, evs, labels, dups, sc)
		b.w.Token = newToken()
		res, err := c.store.Apply(ctx, b.w)
		if err != nil {
			c.lostAnswer(p, unanswered{token: b.w.Token, expect: *st, human: b.human, bot: b.bot,
				dupWM: b.dupWM, dupID: b.dupID, missed: c.missedIn(p, evs, st.WM)})
			return fmt.Errorf("write partition %d batch: %w", p, err)
		}
		switch res.Status {
		case Conflict:
			return c.conflict(ctx, p)
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
		c.countMissed(p, evs, st.WM)
		return c.written(ctx, p, st, last.Seq, res.Switched)
	}
	return fmt.Errorf("write partition %d batch: %w", p, ErrContention)
}

// conflict handles a write the store refused because the partition's state
// changed under it: it reads the state again and returns errConflict, so
// the caller starts over from it.
//
// The state read may show a recount switched that the counter saw running:
// by a write of this member whose answer was lost (a timeout: settle finds
// its token and counts the switch), or by another member that held the
// partition meanwhile. Either way the generation read before is unused
// now, and the janitor is asked to drop it, as after a switch the counter
// made (written): nothing else asks until the partition is next assigned.
//
// It may also show an older write generation than the one cached: the
// store lost a recount's start, which recountLost starts again. Or a newer
// one: another member started a recount while this one held a batch (a
// hand-over), and what the new generation has not counted before the
// batch is the recount's to count, not lost (catchUp).
func (c *Counter) conflict(ctx context.Context, p int) error {
	c.m.retries.WithLabelValues("conflict").Inc()
	return c.readAgain(ctx, p)
}

// readAgain reads the partition's state again, handles it as conflict
// says, and returns errConflict. write and pass call it instead of
// writing after a write of the partition whose answer was lost: that write
// may have landed or not, and the state read settles it (settle).
func (c *Counter) readAgain(ctx context.Context, p int) error {
	c.mu.Lock()
	var was State
	s := c.parts[p]
	if s != nil {
		was = *s
	}
	c.mu.Unlock()
	st, ours, err := c.load(ctx, p)
	if err != nil {
		return err
	}
	if was.Replay != "" && st.Write < was.Write {
		return c.recountLost(ctx, p, was, *st)
	}
	if s != nil && st.Write > was.Write {
		c.markRecounted(p)
	}
	if was.Recounting() && st.Read != was.Read && !ours {
		c.log.Info("recount found switched when the partition's state was read again; the previous generation is to be dropped",
			"partition", p, "generation", st.Read, "previous", was.Read)
		c.requestCleanup(p)
	}
	return errConflict
}

// written records in the cached state that the write generation's
// watermark moved to seq, and the switch if the write made it.
func (c *Counter) written(ctx context.Context, p int, st *State, seq uint64, switched bool) error {
	st.WM = seq
	if switched {
		c.log.Info("recount caught up; the new generation now serves reads",
			"partition", p, "generation", st.Write, "previous", st.Read, "seq", seq)
		st.Read, st.Until = st.Write, 0
		c.m.recounts.WithLabelValues("finished").Inc()
		c.m.observeState(p, *st)
		c.requestCleanup(p)
	}
	if c.hooks.AfterWrite != nil {
		return c.hooks.AfterWrite(ctx, p, seq)
	}
	return nil
}

// OnPassed is the reader's OnPassed hook: the runtime parked the
// partition's events from info.First to info.Last, the end of a batch,
// without handing them to HandleBatch. The counter moves the write
// generation's watermark past them at once, as a batch that counted nothing
// (the batch script, with its compare-and-set, and no counts): so a recount
// whose Until is among them switches now, in the same atomic step as any
// switch, instead of waiting for the partition's next valid click, which a
// quiet partition may never get. Called again for the same positions (the
// batch handed again after a crash), it finds the watermark there and
// writes nothing. See docs/decisions/0021-click-counter-recount.md.
func (c *Counter) OnPassed(ctx context.Context, partition int, info reader.PassedInfo) error {
	for range maxWriteAttempts {
		// The events before First must be counted before the watermark
		// moves past them (a store that lost writes: see catchUp).
		err := c.catchUp(ctx, partition, info.First)
		if err == nil {
			err = c.pass(ctx, partition, info)
		}
		if !errors.Is(err, errConflict) {
			return err
		}
	}
	return fmt.Errorf("pass partition %d's parked events to %d: %w", partition, info.Last, ErrContention)
}

// pass moves the write generation's watermark to info.Last, counting
// nothing. A conflict reloads the state and returns errConflict.
func (c *Counter) pass(ctx context.Context, p int, info reader.PassedInfo) error {
	if c.hasUnanswered(p) {
		return c.readAgain(ctx, p) // as in write
	}
	st, err := c.cached(ctx, p)
	if err != nil {
		return err
	}
	if info.Last <= st.WM {
		return nil // passed before: the same positions again, or a replay overlap
	}
	token := newToken()
	res, err := c.store.Apply(ctx, &Write{
		Partition: p, Expect: *st, FirstSeq: info.First, LastSeq: info.Last, LastStored: info.Stored,
		Delta: NewDelta(), DedupTTL: c.window, Token: token,
	})
	if err != nil {
		c.lostAnswer(p, unanswered{token: token, expect: *st})
		return fmt.Errorf("pass partition %d's parked events to %d: %w", p, info.Last, err)
	}
	switch res.Status {
	case Conflict:
		return c.conflict(ctx, p)
	case Recheck: // a write without events has nothing to recheck
		return fmt.Errorf("pass partition %d's parked events to %d: the store asked to recheck a write without events", p, info.Last)
	}
	if until := c.replayOf(p).until; until != 0 && info.Last+1 >= until {
		c.replayDone(p) // the replay the counter asked for has come
	}
	return c.written(ctx, p, st, info.Last, res.Switched)
}

// built is one attempt at a batch's write.
type built struct {
	w            *Write
	dupWM, dupID int
	human, bot   int
}

// batchScratch is what building a batch's write allocates: its delta, its
// marks and the IDs it has seen, emptied and reused batch after batch.
type batchScratch struct {
	w     Write
	delta Delta
	seen  map[string]struct{}
}

// empty drops what sc holds of a batch, keeping its room.
func (sc *batchScratch) empty() {
	sc.delta.Reset()
	clear(sc.w.Marks)
	sc.w = Write{Marks: sc.w.Marks[:0]}
	clear(sc.seen)
}

// build filters evs against the state and aggregates what is left, in sc
// (emptied first). dups are event IDs the store found already counted;
// labels are verdict labels it reported (0: none).
func (c *Counter) build(p int, st State, evs []reader.Event, labels map[string]Label, dups map[string]bool, sc *batchScratch) built {
	last := &evs[len(evs)-1]
	sc.empty()
	if sc.seen == nil {
		sc.seen = make(map[string]struct{}, len(evs))
	}
	sc.w = Write{
		Partition:  p,
		Expect:     st,
		FirstSeq:   evs[0].Seq,
		LastSeq:    last.Seq,
		LastStored: last.Stored,
		Delta:      &sc.delta,
		DedupTTL:   c.window,
		Marks:      slices.Grow(sc.w.Marks[:0], len(evs)),
	}
	b := built{w: &sc.w}
	seen := sc.seen
	for i := range evs {
		e := &evs[i]
		if e.Seq <= st.WM {
			b.dupWM++
			continue
		}
		id := e.Click.ID
		// One hash of the ID, not a lookup and then an insert: a batch's
		// IDs are almost all new.
		before := len(seen)
		seen[id] = struct{}{}
		if len(seen) == before || dups[id] {
			b.dupID++
			continue
		}
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
