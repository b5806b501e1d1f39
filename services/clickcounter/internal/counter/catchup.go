package counter

import (
	"context"
	"errors"
	"fmt"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
)

// The store can lose writes the counter has acked. Redis replicates
// asynchronously: a batch written on a master and acked to JetStream is gone
// if the master dies before its replica has it, and the promoted replica's
// watermark is older than the batches the counter has been handed since.
// Counting the next batch from that watermark would skip the lost events
// for ever (JetStream will not deliver acked events again), so whenever the
// counter takes a partition's state from the store (on assignment, on a
// cache miss, after a conflict) it first asks CLICKS for the partition's
// events between the store's watermark and the batch, and counts them. The
// watermark and the recent-ID record the store kept are the state as of
// the lost write, so each of those events is counted exactly once. In the
// steady state this costs one stream lookup per reload, which finds
// nothing.

const (
	// gapChunk is how many missed events are read and written at a time.
	gapChunk = 500
	// maxGapPerCall bounds the missed events one handler call reads, so
	// the call ends well within the ack wait of the batch it holds; the
	// runtime calls again (with backoff) and the catch-up goes on from the
	// watermark it reached.
	maxGapPerCall = 20 * gapChunk
)

// ErrCatchingUp means the handler stopped part-way through counting events
// the store had lost and the batch must be handed again; it is transient.
var ErrCatchingUp = errors.New("counting events the store lost")

// catchUp counts the partition's events stored before seq before that the
// store has not counted, if its state came from the store since the last
// check.
func (c *Counter) catchUp(ctx context.Context, p int, before uint64) (err error) {
	st, err := c.cached(ctx, p)
	if err != nil {
		return err
	}
	if !c.takeUnchecked(p) || before <= st.WM+1 {
		return nil
	}
	defer func() {
		if err != nil {
			c.markUnchecked(p) // check again next time
		}
	}()
	from, read := st.WM+1, 0
	for from < before {
		if read >= maxGapPerCall {
			return fmt.Errorf("partition %d: %d events up to sequence %d read again, more before %d: %w",
				p, read, from-1, before, ErrCatchingUp)
		}
		msgs, err := c.clicks.Stored(ctx, p, from, before, gapChunk)
		if err != nil {
			return fmt.Errorf("read partition %d's events from %d to %d again: %w", p, from, before-1, err)
		}
		if len(msgs) == 0 {
			break
		}
		if read == 0 {
			c.log.Warn("the store's watermark is behind the batch: counting the events between from CLICKS (a Redis failover lost acked writes?)",
				"partition", p, "watermark", st.WM, "batch_first", before, "first_missed", msgs[0].Seq)
		}
		read += len(msgs)
		if evs := c.readMissed(p, msgs); len(evs) > 0 {
			if err := c.write(ctx, p, evs); err != nil {
				return err
			}
		}
		if len(msgs) < gapChunk {
			break
		}
		from = msgs[len(msgs)-1].Seq + 1
	}
	return nil
}

// readMissed reads stored clicks as the reader runtime and the handler's
// screen do, and drops what they would have parked (so never counted).
func (c *Counter) readMissed(p int, msgs []StoredClick) []reader.Event {
	evs := make([]reader.Event, 0, len(msgs))
	for _, m := range msgs {
		cl, err := events.ReadClick(m.Data, m.Subject, c.n, m.Stored)
		if err == nil && events.Partition(cl.Code, c.n) != p {
			err = ErrWrongPartition
		}
		if err == nil {
			_, err = ParseID(cl.ID)
		}
		if err != nil {
			c.m.missed.WithLabelValues("invalid").Inc()
			c.log.Debug("missed event is invalid; skipped as when it was parked", "partition", p, "seq", m.Seq, "err", err)
			continue
		}
		evs = append(evs, reader.Event{Click: cl, Partition: p, Seq: m.Seq, Stored: m.Stored, Deliveries: 1})
	}
	c.m.missed.WithLabelValues("read").Add(float64(len(evs)))
	return evs
}
