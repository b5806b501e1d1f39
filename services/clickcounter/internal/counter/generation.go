package counter

import (
	"context"
	"fmt"

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
func (c *Counter) OnRewind(ctx context.Context, partition int, r reader.RewindInfo) error {
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
	}
	// The new generation counts from the oldest event retained: a click
	// before it (aged out) is in none of its counts, whatever its
	// watermark says once past it (a verdict about such a click moves
	// nothing there).
	st, started, err := c.store.StartGeneration(ctx, partition, r.ID, max(r.From, first), r.Until)
	if err != nil {
		return fmt.Errorf("rewind partition %d: %w", partition, err)
	}
	c.mu.Lock()
	c.parts[partition] = &st
	c.mu.Unlock()
	c.m.observeState(partition, st)
	if started {
		c.m.recounts.WithLabelValues("started").Inc()
		c.log.Info("recount started", "partition", partition, "replay", r.ID,
			"generation", st.Write, "serving", st.Read, "until", r.Until)
		c.requestCleanup(partition)
	}
	return nil
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
// switched, and on partition assignment) until ctx ends.
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
