package counter

import (
	"context"
	"fmt"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
)

// OnAssign is the reader's OnAssign hook: the member now owns the
// partition, so it loads the partition's state afresh (another member may
// have moved it on) and tidies generations left behind by a crash.
func (c *Counter) OnAssign(ctx context.Context, partition int, _ uint64) error {
	if _, err := c.reload(ctx, partition); err != nil {
		return err
	}
	c.requestCleanup(partition)
	return nil
}

// OnRevoke is the reader's OnRevoke hook: the member no longer owns the
// partition, so its cached state may go stale and is dropped.
func (c *Counter) OnRevoke(partition int) { c.forget(partition) }

// OnRewind is the reader's OnRewind hook. A replay that starts at the
// partition's oldest retained event is a recount: it starts a new, empty
// generation, which takes over the reads once it has counted up to
// r.Until. A replay that starts later cannot rebuild all-time totals (the
// events before it would be missing), so it recounts nothing: the
// watermark skips the events replayed, and the counts stay as they were.
// Nor does a replay of a partition CLICKS retains nothing of, once it has
// counted something. See docs/decisions/0021-click-counter-recount.md.
//
// Nor does a replay the runtime does not move the partition back for
// (r.MovesBack false): nothing is handed again, the partition goes on
// after the last event it handled, and a new generation would count only
// what comes after that, never the retained events handled before. That
// is the case of a partition that held nothing (Until 0), or nothing from
// the replay's position (From past Until), when the replay was asked for,
// and whose owner handled new clicks before it carried the replay out:
// went by From alone, the recount switched to a generation without them
// (at once, for Until 0), and they were lost from the counts. Where the
// runtime moves the partition back, to From at or before the oldest
// retained event, every retained event is handed to the new generation.
// A partition the runtime does not move back because it has not handled
// anything up to From yet (its consumer behind CLICKS retention) would be
// recounted whole, but nothing tells that case from the others but a
// position of the counter's own, which the runtime's decision is there to
// replace: it is not recounted either, and a replay once it has caught up
// recounts it. A partition CLICKS retains nothing of and that never
// counted anything starts its (empty) generation whatever the runtime
// decided: there is nothing to lose.
func (c *Counter) OnRewind(ctx context.Context, partition int, r reader.RewindInfo) error {
	if c.hasUnanswered(partition) {
		// Settled against the generation it was made in, before a
		// recount's start replaces the state cached.
		if _, err := c.reload(ctx, partition); err != nil {
			return fmt.Errorf("rewind partition %d: %w", partition, err)
		}
	}
	first, err := c.clicks.FirstSeq(ctx, partition)
	if err != nil {
		return fmt.Errorf("rewind partition %d: %w", partition, err)
	}
	if first != 0 && r.From > first {
		c.log.Warn("replay starts after the oldest retained event: not a recount, nothing is counted twice or rebuilt; replay from the first sequence to recount",
			"partition", partition, "replay", r.ID, "from", r.From, "oldest", first)
		c.m.recounts.WithLabelValues("partial_ignored").Inc()
		return nil
	}
	if first == 0 {
		// CLICKS retains nothing of the partition, whatever the replay
		// asked (a --since finds nothing, as does --from-seq 1): a recount
		// would replace the all-time counts with nothing. Only a partition
		// that never counted anything starts one (it switches at once).
		st, err := c.store.State(ctx, partition)
		if err != nil {
			return fmt.Errorf("rewind partition %d: %w", partition, err)
		}
		if st.WM > 0 {
			c.log.Warn("replay of a partition CLICKS retains nothing of: no recount, the counts stay as they are",
				"partition", partition, "replay", r.ID, "watermark", st.WM)
			c.m.recounts.WithLabelValues("nothing_retained").Inc()
			return nil
		}
	} else if !r.MovesBack {
		c.log.Warn("replay that hands nothing of the partition again (it held nothing from the replay's start when the replay was asked for, or has not handled up to it yet): no recount, the counts stay as they are; replay again to recount it",
			"partition", partition, "replay", r.ID, "from", r.From, "until", r.Until, "oldest", first)
		c.m.recounts.WithLabelValues("not_replayed").Inc()
		return nil
	}
	// The new generation counts from the oldest event retained: a click
	// before it (aged out) is in none of its counts, whatever its
	// watermark says once past it (a verdict about such a click moves
	// nothing there).
	if err := c.startRecount(ctx, partition, r.ID, max(r.From, first), r.Until, "started"); err != nil {
		return fmt.Errorf("rewind partition %d: %w", partition, err)
	}
	return nil
}

// pendingStart is a recount start the counter asked the store for and has
// not had answered: the replay's ID and the token its tries carry.
type pendingStart struct{ id, token string }

// startRecount starts replay id's recount of partition p (a new write
// generation counting from sequence from, taking over the reads at until:
// Store.StartGeneration), caches the state it leaves, and, if this call
// started it, counts it in recounts_total{result}, logs it and asks the
// janitor for the generation it abandons, if any.
//
// Every try for one replay carries the same token until one is answered,
// so a try whose answer was lost (a timeout after Redis ran the script; the
// runtime calls OnRewind again) is told by the next one that the start was
// its own: counted and cleaned up once, not taken for a start another
// member made.
//
// With the replica wait on (CLICKCOUNTER_WAIT_REPLICAS), it then waits for
// the replicas to have the start, so that a failover right after does not
// lose it once the consumer has moved back. A wait that falls short is
// counted and logged, and the recount goes on: the member that counts it
// finds a lost start on its next write (conflict) and starts it again.
func (c *Counter) startRecount(ctx context.Context, p int, id string, from, until uint64, result string) error {
	c.mu.Lock()
	ps, ok := c.starts[p]
	if !ok || ps.id != id {
		ps = pendingStart{id: id, token: events.NewID()}
		c.starts[p] = ps
	}
	c.mu.Unlock()
	st, started, err := c.store.StartGeneration(ctx, p, id, ps.token, from, until)
	if err != nil {
		return err
	}
	c.mu.Lock()
	delete(c.starts, p)
	c.parts[p] = &st
	c.mu.Unlock()
	c.m.observeState(p, st)
	if started {
		c.m.recounts.WithLabelValues(result).Inc()
		c.log.Info("recount "+result, "partition", p, "replay", id,
			"generation", st.Write, "serving", st.Read, "from", from, "until", until)
		c.requestCleanup(p)
	}
	if err := c.store.Replicated(ctx, []int{p}, nil); err != nil {
		c.m.replicaShort.WithLabelValues("recount").Inc()
		c.log.Warn("the recount's start is not confirmed by the Redis replicas: a failover now may lose it, and the member counting it would then start it again",
			"partition", p, "replay", id, "err", err)
	}
	return nil
}

// recountLost handles a partition whose state, read again after a
// conflict, has lost the recount the counter knew of (was): its write
// generation is older than the one cached, which the store only shows
// when it lost writes (a failover to a replica that had not received the
// recount's start, a Redis that lost its last second). Left so, the
// replayed events would fall below the old generation's watermark and be
// skipped: the recount asked for would not happen, and nothing would say
// so. So it starts the recount again, under the same replay ID, from the
// oldest event CLICKS retains to the same end (for a recount that had
// switched already, to where its generation had counted), and returns
// errConflict: the batch is then counted into it, after the events before
// it, which the catch-up asks for again (the state is unchecked). If the
// start fails, the state cached before is put back, so the next try finds
// the loss again. A partition CLICKS now retains nothing of cannot be
// recounted: the loss is logged and counted (recounts_total{result="lost"}).
func (c *Counter) recountLost(ctx context.Context, p int, was, st State) error {
	until := was.Until
	if !was.Recounting() {
		until = was.WM
	}
	first, err := c.clicks.FirstSeq(ctx, p)
	if err == nil && first == 0 {
		c.log.Error("the store lost a recount's start and CLICKS retains nothing of the partition to count again: the recount did not happen; the counts are the old generation's",
			"partition", p, "replay", was.Replay, "lost_generation", was.Write, "generation", st.Write)
		c.m.recounts.WithLabelValues("lost").Inc()
		return errConflict
	}
	if err == nil {
		c.log.Warn("the store lost a recount's start (a Redis failover to a replica that had not received it?): starting it again",
			"partition", p, "replay", was.Replay, "lost_generation", was.Write, "generation", st.Write, "from", first, "until", until)
		err = c.startRecount(ctx, p, was.Replay, first, until, "restarted")
	}
	if err != nil {
		c.mu.Lock()
		c.parts[p] = &was
		c.mu.Unlock()
		return fmt.Errorf("start partition %d's lost recount %s again: %w", p, was.Replay, err)
	}
	c.markUnchecked(p)
	return errConflict
}

// requestCleanup asks the janitor to drop the partition's unused
// generations. It never blocks: a full queue already holds enough work.
func (c *Counter) requestCleanup(p int) {
	select {
	case c.janitor <- p:
	default:
	}
}

// RunJanitor deletes unused generations in the background (after a recount
// switched, and on partition assignment), and gives deleted links' counts
// in the generations left their expiry, until ctx ends.
func (c *Counter) RunJanitor(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case p := <-c.janitor:
			if n, err := c.DropOldGenerations(ctx, p); err != nil {
				c.log.Warn("drop old generations", "partition", p, "err", err)
			} else if n > 0 {
				c.log.Info("dropped old generations", "partition", p, "count", n)
			}
			// A recount counts the retained clicks of links deleted
			// before it into its generation, with no expiry: they get it
			// here, after the switch (and on assignment, after a crash).
			if err := c.store.ExpireDeletedLinks(ctx, p); err != nil {
				c.log.Warn("expire deleted links' counts", "partition", p, "err", err)
			}
		}
	}
}

// DropOldGenerations deletes the partition's generations that are neither
// read nor written and older than both, and returns how many it dropped.
// It lists the generations before reading the state, so a generation
// started meanwhile (numbered above both) is never taken for an old one.
func (c *Counter) DropOldGenerations(ctx context.Context, p int) (int, error) {
	gens, err := c.store.Generations(ctx, p)
	if err != nil {
		return 0, fmt.Errorf("drop old generations: %w", err)
	}
	st, err := c.store.State(ctx, p)
	if err != nil {
		return 0, fmt.Errorf("drop old generations: %w", err)
	}
	top := max(st.Read, st.Write)
	n := 0
	for _, g := range gens {
		if g == st.Read || g == st.Write || g >= top {
			continue
		}
		if err := c.store.DropGeneration(ctx, p, g); err != nil {
			return n, fmt.Errorf("drop old generations: %w", err)
		}
		n++
	}
	return n, nil
}
