// The worker's ownership of its partition: taking it over (waiting for the
// previous owner's pin to go, resetting to the ack floor after a crash),
// telling the reader (OnAssign), and giving it back (unpin, OnRevoke).

package reader

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/topology"
)

// acquire waits until no other client is pinned to the partition (its
// previous owner unpinned it, or went silent for PinnedTTL), forcing an
// unpin if the previous owner holds on too long. Then, if events were left
// in flight, it resets the consumer to its ack floor so they come again
// first: order per link survives the move.
func (w *worker) acquire() error {
	m := w.m
	deadline := time.Now().Add(2*m.cfg.LeaseTTL + m.cfg.DrainTimeout)
	bo := m.cfg.newBackoff()
	for {
		if w.stopping() {
			return errReleased
		}
		ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
		c, err := m.stream.Consumer(ctx, w.name)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			err = m.ensureConsumer(ctx, m.stream, w.p)
			cancel()
			if err == nil {
				continue
			}
		} else {
			cancel()
		}
		if err != nil {
			if !w.sleep(bo.NextBackOff()) {
				return errReleased
			}
			continue
		}
		info := c.CachedInfo()
		pinned := pinnedClient(info)
		// The server pins a client when it first delivers to it, so an idle
		// previous owner is not pinned yet may still have a pull waiting.
		// Wait for both to go, so it does not take one more batch after we
		// start (pinning would keep order either way; this keeps the handover
		// clean).
		if (pinned != "" || info.NumWaiting > 0) && time.Now().Before(deadline) {
			if !w.sleep(100 * time.Millisecond) {
				return errReleased
			}
			continue
		}
		if pinned != "" {
			w.log.Warn("previous owner did not let go; unpinning it", "pinned", pinned)
			if err := w.unpin(); err != nil {
				w.log.Warn("force unpin", "err", err)
			}
		}
		var reset *jetstream.ConsumerResetResponse
		if info.NumAckPending > 0 {
			ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
			var err error
			reset, err = m.js.ResetConsumer(ctx, events.ClicksStream, w.name)
			if err == nil {
				c, err = m.stream.Consumer(ctx, w.name)
			}
			cancel()
			if err != nil {
				w.log.Warn("reset partition to its ack floor", "err", err)
				if !w.sleep(bo.NextBackOff()) {
					return errReleased
				}
				continue
			}
			w.log.Info("events were left in flight; partition reset to its ack floor",
				"ack_floor", info.AckFloor.Stream, "in_flight", info.NumAckPending)
		}
		if err := w.loadRewound(); err != nil {
			w.log.Warn("read rewind state", "err", err)
			if !w.sleep(bo.NextBackOff()) {
				return errReleased
			}
			continue
		}
		w.cons = c
		w.positioned(c.CachedInfo())
		if reset != nil {
			w.baselineAfterReset(reset)
		} else {
			w.lastCseq, w.cseqKnown = c.CachedInfo().Delivered.Consumer, true
		}
		return nil
	}
}

func pinnedClient(info *jetstream.ConsumerInfo) string {
	for _, g := range info.PriorityGroups {
		if g.Group == topology.PriorityGroup {
			return g.PinnedClientID
		}
	}
	return ""
}

func (w *worker) unpin() error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(w.ctx), 5*time.Second)
	defer cancel()
	return w.m.stream.UnpinConsumer(ctx, w.name, topology.PriorityGroup)
}

// recreate creates the partition's consumer again where it was deleted,
// and positions the worker at it: what is fetched next is the new
// consumer's, from its start.
func (w *worker) recreate() error {
	if err := w.createAgain(); err != nil {
		return err
	}
	c := w.cons
	w.positioned(c.CachedInfo())
	// The new consumer counts its deliveries from its own start: its
	// first is not a gap after the old one's last.
	w.lastCseq, w.cseqKnown = c.CachedInfo().Delivered.Consumer, true
	return nil
}

// createAgain creates the partition's consumer again where it was deleted
// (as the group's config says, at its start), and takes it as w.cons. It
// leaves the worker's positions alone: they stay of the consumer deleted
// (w.handledOf), so a move back decided next (afterGap, replayFrom) sees a
// consumer created again and goes by its own ack floor, from where it
// hands the events it never handed, rather than to a position of the one
// deleted (the event after the last one handled, a Replay's from), which
// would skip them.
func (w *worker) createAgain() error {
	ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
	defer cancel()
	if err := w.m.ensureConsumer(ctx, w.m.stream, w.p); err != nil {
		return err
	}
	c, err := w.m.stream.Consumer(ctx, w.name)
	if err != nil {
		return err
	}
	w.cons = c
	return nil
}

// assigned calls OnAssign with resume, retrying with backoff while the
// partition is ours.
func (w *worker) assigned(resume uint64) error {
	if w.m.cfg.OnAssign == nil {
		return nil
	}
	w.resume = resume
	bo := w.m.cfg.newBackoff()
	for {
		err := w.m.cfg.OnAssign(w.ctx, w.p, resume)
		if err == nil {
			return nil
		}
		w.log.Warn("on assign", "err", err)
		if !w.sleep(bo.NextBackOff()) {
			return errReleased
		}
	}
}

// confirmResume checks, at the first batch this owner receives, that no one
// acked the partition since OnAssign was told where to resume; if someone
// did, the reader's state is rebuilt (OnRevoke, then OnAssign) to resume at
// first, the sequence of the batch's first event. (After a reset of our own
// before the first batch, a rewind, the floor it left is the one to match.)
//
// acquire waits for the previous owner's pin and pulls to go, but a member
// still inside its own OnAssign has neither. If it has not yet heard that
// the partition moved, it pulls once its OnAssign returns, is pinned before
// us (we were in OnAssign too), handles and acks a batch, and only then lets
// go. Our OnAssign was told to resume after the ack floor of our acquire: a
// reader that rebuilds state from the log up to there (fraud detection's
// windows) would never see that batch. The first batch is the point to
// check: we are pinned from then on, so no other member acks after it.
func (w *worker) confirmResume(first uint64) error {
	if w.m.cfg.OnAssign == nil || w.resume == 0 {
		return nil
	}
	bo := w.m.cfg.newBackoff()
	for {
		ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
		c, err := w.m.stream.Consumer(ctx, w.name)
		cancel()
		if err == nil {
			floor := c.CachedInfo().AckFloor.Stream
			if floor+1 == w.resume {
				return nil
			}
			w.log.Warn("the partition was acked by another member after this one took it over; rebuilding the reader's state from its first event",
				"told_resume", w.resume, "ack_floor", floor, "first_seq", first)
			w.m.met.resumeMoved.WithLabelValues(w.m.cfg.Group).Inc()
			if w.m.cfg.OnRevoke != nil {
				w.m.cfg.OnRevoke(w.p)
			}
			return w.assigned(first)
		}
		w.log.Warn("read the ack floor at the first batch", "err", err)
		if !w.sleep(bo.NextBackOff()) {
			return errReleased
		}
	}
}

// giveBack unpins the partition so its next owner starts at once, and tells
// the reader. A member whose lease may have lapsed (lapsed) leaves the pin
// alone: the partition's next owner may hold it already (the server
// unpins a client that stopped pulling after PinnedTTL anyway), and one
// cut off from NATS would wait for the unpin's answer in vain.
func (w *worker) giveBack() {
	if w.lapsed() {
		w.log.Warn("the lease may have lapsed: giving the partition up without unpinning it")
	} else if err := w.unpin(); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		w.log.Debug("unpin on release", "err", err)
	}
	w.m.met.forgetPartition(w.m.cfg.Group, w.p)
	if w.m.cfg.OnRevoke != nil {
		w.m.cfg.OnRevoke(w.p)
	}
	w.log.Info("partition released")
}

// keepPin keeps the partition pinned to this owner while it holds a batch,
// until the returned stop is called (and returns once the keeper ended).
// The server unpins a client that sent no pull for PinnedTTL (LeaseTTL),
// and while a batch is handled (and the next one, fetched ahead, waits)
// nothing is pulled: a handler slower than that would lose the pin, and a
// partition given up meanwhile (a leave, a rebalance) would be taken by
// its next owner, whose acquire waits only for the pin to go, while this
// one still handles and acks it. So every LeaseTTL/3 the keeper sends a
// pull that can deliver nothing (at most 1 byte: the server answers it at
// once when an event is waiting, 409, or after a short wait, and delivers
// no event), which restarts the pin's timer. A member whose lease may have
// lapsed keeps nothing: the next owner may be waiting for the pin.
func (w *worker) keepPin() (stop func()) {
	c, every := w.cons, w.m.cfg.LeaseTTL/3
	group := jetstream.FetchPriorityGroup(topology.PriorityGroup)
	return repeat(every, false, func() bool {
		if w.lapsed() {
			return false
		}
		if b, err := c.FetchBytes(1, jetstream.FetchMaxWait(min(every, 100*time.Millisecond)), group); err == nil {
			for msg := range b.Messages() {
				// Never expected (1 byte holds no event): left unacked,
				// it is a delivery gap process catches.
				w.log.Warn("the pin keeper's pull delivered an event", "subject", msg.Subject())
			}
		}
		return true
	})
}
