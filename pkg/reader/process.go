// Processing: decode a batch, park what fails the rule of validity, hand
// the rest to the handler, turn its answer into ack, retry or park (the
// failure contract of package failure), tell OnPassed of a parked end of
// the batch, and ack.

package reader

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/failure"
	"github.com/snipdev/snip/pkg/inprogress"
)

// process decodes a batch, parks what cannot be decoded, hands the rest to
// the handler (retrying transient failures, parking poison), and acks the
// batch by acking its last message.
func (w *worker) process(msgs []jetstream.Msg) error {
	m := w.m
	if w.lapsed() {
		// Another member may hold the partition now (this one was frozen,
		// or cut off from NATS, for a lease TTL): leave the batch to it.
		return errLeaseLapsed
	}
	start := time.Now()
	// Until the ack, the pin stays this owner's, however long the handler
	// takes (keepPin): the partition's next owner waits for it to go.
	defer w.keepPin()()
	// Every delivery takes the next consumer sequence. A gap means the
	// server delivered something this worker never received (a fetch that
	// gave up while messages were on their way, a slow-consumer drop).
	// Acking past it would ack the missing events unseen (AckAll), so handle
	// the contiguous part, then make the caller move the consumer back to
	// the event after the last one handled (afterGap).
	gap := false
	// The batch's metadata in one slice, read in place (readMetadata).
	mds := make([]jetstream.MsgMetadata, len(msgs))
	for i, msg := range msgs {
		md := &mds[i]
		if err := readMetadata(msg, md); err != nil {
			return fmt.Errorf("read message metadata: %w", err)
		}
		if w.cseqKnown && md.Sequence.Consumer != w.lastCseq+1 {
			w.log.Warn("gap in deliveries: handling up to it, then going on after the last event handled",
				"expected_consumer_seq", w.lastCseq+1, "got", md.Sequence.Consumer, "stream_seq", md.Sequence.Stream)
			m.met.gaps.WithLabelValues(m.cfg.Group).Inc()
			msgs, gap = msgs[:i], true
			break
		}
		w.lastCseq, w.cseqKnown = md.Sequence.Consumer, true
	}
	mds = mds[:len(msgs)]
	if len(msgs) == 0 {
		return errGap
	}
	// From here until the ack, the batch is marked in progress every
	// AckWait/3: the handler may take longer than AckWait (the warehouse
	// loader's waits behind other partitions' inserts), and so may parking
	// while DEAD_LETTER is away; its events must not be redelivered
	// meanwhile. AckWait bounds only how long a process that died or froze
	// holds events.
	defer inprogress.Keep(w.m.cfg.AckWait/3, msgs...)()
	evs := make([]Event, 0, len(msgs))
	for i, msg := range msgs {
		md := &mds[i]
		if md.NumDelivered > 1 {
			m.met.redelivered.WithLabelValues(m.cfg.Group).Inc()
		}
		// The one rule of validity, the same in every reader and at the
		// relay: an invalid event is parked here, so no handler counts,
		// loads or judges it. Decoded in place, its strings sharing the
		// message's payload (which nothing changes): no copy of the click,
		// no allocation per string.
		evs = append(evs, Event{Partition: w.p, Seq: md.Sequence.Stream, Stored: md.Timestamp, Deliveries: md.NumDelivered})
		if err := events.ReadClickShared(&evs[len(evs)-1].Click, msg.Data(), msg.Subject(), m.partitions, md.Timestamp); err != nil {
			evs = evs[:len(evs)-1]
			if err := w.park(msg, md, events.Reason(err), err); err != nil {
				return err
			}
			continue
		}
	}
	m.met.batchSize.WithLabelValues(m.cfg.Group).Observe(float64(len(evs)))
	done, poisoned, err := w.handle(evs, msgs)
	if err != nil {
		return err
	}
	// The batch ends in events the handler never completed (parked above,
	// or as poison on its answer): tell the reader, if it asks, that their
	// positions are passed, before the ack covers them.
	if last := mds[len(mds)-1]; m.cfg.OnPassed != nil && last.Sequence.Stream > done {
		first := last.Sequence.Stream
		for _, md := range mds {
			if md.Sequence.Stream > done {
				first = md.Sequence.Stream
				break
			}
		}
		if err := w.passed(PassedInfo{First: first, Last: last.Sequence.Stream, Stored: last.Timestamp}); err != nil {
			return err
		}
	}
	if w.lapsed() {
		// The same, found while the handler ran: the member that may hold
		// the partition now reads it from the ack floor, and an ack of
		// this member's deliveries, which the server takes whoever holds
		// the partition, would only move the floor under it.
		return errLeaseLapsed
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(w.ctx), m.cfg.AckTimeout)
	defer cancel()
	if err := msgs[len(msgs)-1].DoubleAck(ctx); err != nil {
		// A lost ack is healed by the next batch's (AckAll), or the batch
		// comes again: the handler is idempotent.
		w.log.Warn("ack batch", "err", err)
	}
	// Handled, whether or not the ack reached the server: what a rewind
	// goes by (planRewind), as the reader's state does; its message is kept
	// to be acked again where the ack was lost and the consumer goes back
	// to its floor (ackHandled).
	if last := mds[len(mds)-1].Sequence.Stream; last >= w.handled {
		// Of the consumer last positioned (handledOf): these deliveries
		// continue its sequence, without a gap.
		w.handled, w.handledMsg = last, msgs[len(msgs)-1]
	}
	m.met.batchSecs.WithLabelValues(m.cfg.Group).Observe(time.Since(start).Seconds())
	m.met.events.WithLabelValues(m.cfg.Group, w.ps).Add(float64(len(evs) - poisoned))
	if gap {
		return errGap
	}
	return nil
}

// errLeaseLapsed: no heartbeat of this member was stored for a lease TTL
// (leaseHeld), or one was only after that (a lapse the worker started
// before), so its lease may have lapsed and another member taken the
// partition: the batch is left unacked, and the worker gives the
// partition up.
var errLeaseLapsed = errors.New("no heartbeat stored for a lease TTL: the lease may have lapsed")

// errGap asks the worker loop to move the partition back to the event after
// the last one handled (afterGap).
var errGap = errors.New("gap in deliveries")

// afterGap returns where the partition goes on after a delivery gap: 0 (its
// ack floor) or, where this owner handled events past the floor (the ack of
// the last batch it handled was lost on its way; the next batch's would have
// healed it), the event after the last one handled (w.handled). Everything
// up to w.handled was handled: first deliveries come in stream order from
// where the consumer was last positioned (taken over, reset, recreated,
// w.handled then), process checked that none of them was missed, and
// handled each batch up to the gap; redeliveries are of events delivered
// before, and w.handled never moves back but by a reset. Back at the floor,
// the events up to w.handled came again as first deliveries (a reset
// forgets deliveries), behind what the reader had handled. The reset acks
// them, as the lost ack would have.
//
// w.handled is of the consumer created at w.handledOf, the one last
// positioned: one deleted and created again under this owner (its consumer
// sequences start again, which process takes for a gap) has its own floor,
// and goes by it, on every try (a reset that failed is retried with
// afterGap again, after this one's Info refreshed w.cons's cached info to
// the new consumer's: that cache says nothing of w.handled). A
// consumer the server moves only back to its ack floor (resetsToSeq) goes
// there, rather than the partition retrying a move the server refuses; the
// owner first acks again the last event it handled (ackHandled), which
// moves the floor up to it, so there too the partition goes on right
// after it. Where that ack fails, the events up to w.handled come again
// from the floor, as at-least-once delivery allows.
func (w *worker) afterGap() (uint64, error) {
	ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
	defer cancel()
	info, err := w.cons.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("read the ack floor after a delivery gap: %w", err)
	}
	if !w.handledOf.Equal(info.Created) || w.handled <= info.AckFloor.Stream {
		return 0, nil
	}
	if !resetsToSeq(info.Config.DeliverPolicy) {
		if err := w.ackHandled(); err != nil {
			w.log.Warn("the ack of the last batch handled before the gap was lost, acking it again failed, and the server moves this consumer back only to its ack floor: events handled past it come again",
				"err", err, "ack_floor", info.AckFloor.Stream, "handled", w.handled, "deliver_policy", info.Config.DeliverPolicy.String())
			return 0, nil
		}
		w.log.Info("the ack of the last batch handled before the gap was lost: acked it again, going on after it from the ack floor",
			"ack_floor", info.AckFloor.Stream, "handled", w.handled, "deliver_policy", info.Config.DeliverPolicy.String())
		return 0, nil
	}
	w.log.Info("the ack of the last batch handled before the gap was lost: going on after it, not at the ack floor",
		"ack_floor", info.AckFloor.Stream, "handled", w.handled)
	return w.handled + 1, nil
}

// ackHandled acks again the last event this owner handled (w.handledMsg,
// w.handled), which the caller found past the consumer's ack floor (an ack
// lost on its way) in the Info it read of the consumer w.handled is of
// (w.handledOf), where the floor is behind it still, and reports why not
// (an error) unless the floor is at or past it now. For a consumer the
// server moves back only to its ack floor (resetsToSeq), whose reset to the
// floor would otherwise hand the events up to w.handled again as first
// deliveries: with the floor caught up, the reset goes on right after what
// was handled, as it would have had the ack arrived.
//
// The ack (AckAll) acks every event up to the one acked, and all of them
// were handled: first deliveries came in stream order and contiguous from
// where the consumer was last positioned (taken over, reset, recreated,
// which clears w.handledMsg), each batch handled (or its events parked) up
// to its end before w.handled moved to that end, and redeliveries are of
// events delivered before (afterGap says so at length). The delivery lost
// in a gap and what was fetched after it are past w.handled, so they stay
// unacked. The message must be of the consumer on the server now (created
// when the one that delivered it was): one deleted and created again has
// its own floor, which this ack has no business with: which consumer is
// there is read just before the ack (the server would hand the ack to one
// created again), and again after it.
func (w *worker) ackHandled() error {
	msg, handled, of := w.handledMsg, w.handled, w.handledOf
	if msg == nil {
		return errors.New("the message of the last event handled is not kept (the consumer was positioned since)")
	}
	ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
	defer cancel()
	// The server hands an ack to whichever consumer has the name: one
	// created again would take this one over events its reader has not
	// handled. The caller's Info does not say which consumer is there now
	// (a rewind's was read before OnRewind ran, which can take long), so
	// ask just before the ack. Where the floor is there already (a retry
	// after this ack arrived and the reset after it failed), nothing is
	// acked: the client refuses a message acked already.
	if info, err := w.consumerOf(ctx, of); err != nil || info.AckFloor.Stream >= handled {
		return err
	}
	actx, acancel := context.WithTimeout(ctx, w.m.cfg.AckTimeout)
	err := msg.DoubleAck(actx)
	acancel()
	if err != nil {
		return fmt.Errorf("ack event %d again: %w", handled, err)
	}
	// Confirmed: the floor is there now, unless the consumer changed under
	// the ack. The server does not count the ack as a delivery, so the
	// consumer sequences are as they were; the reset that follows starts
	// them again anyway (baselineAfterReset).
	info, err := w.consumerOf(ctx, of)
	switch {
	case err != nil:
		return err
	case info.AckFloor.Stream < handled:
		return fmt.Errorf("the ack floor is %d after acking event %d again", info.AckFloor.Stream, handled)
	}
	return nil
}

// consumerOf reads the partition's consumer, and fails unless it is the
// one created at of (errConsumerChanged).
func (w *worker) consumerOf(ctx context.Context, of time.Time) (*jetstream.ConsumerInfo, error) {
	info, err := w.cons.Info(ctx)
	switch {
	case err != nil:
		return nil, fmt.Errorf("read the partition's consumer: %w", err)
	case !info.Created.Equal(of):
		return nil, fmt.Errorf("%w (%s, not the one created %s)",
			errConsumerChanged, info.Created.Format(time.RFC3339Nano), of.Format(time.RFC3339Nano))
	}
	return info, nil
}

// errConsumerChanged: the partition's consumer is not the one a position
// (or a decision) is of; it was deleted and created again since.
var errConsumerChanged = errors.New("the partition's consumer was created again")

// replayFrom returns where the partition goes on for a handler's
// Replay(from), as the server allows the move (lowestRewind): from; where
// the partition's consumer started, if from is before it (the group never
// read the events before, so everything it handled is handed again, which
// is what the handler asked for); or 0, its ack floor, for a consumer
// created at new events, which the server moves back nowhere else. That
// last hands again only the events past the floor, not the ones from
// from: the handler's state misses them, which is logged as an error,
// rather than the partition retrying a move the server refuses for ever
// and handling nothing more. A consumer deleted and created again since
// the batch the handler asked of (not the one w.handledOf says its
// positions are of) goes no further than its own ack floor: from there it
// hands the events it never handed, from among them.
func (w *worker) replayFrom(from uint64) (uint64, error) {
	ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
	defer cancel()
	info, err := w.cons.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("read the partition's consumer for a replay: %w", err)
	}
	if !w.handledOf.Equal(info.Created) && from > info.AckFloor.Stream+1 {
		// The batch the handler asked of was delivered by a consumer
		// deleted since: the one created again has its own positions, and
		// moving it to from would skip the events before, which it never
		// handed. From its ack floor it hands them, from among them.
		w.log.Warn("the handler asked for events again of a partition whose consumer was created again since: going on from the new one's ack floor",
			"from", from, "ack_floor", info.AckFloor.Stream)
		return 0, nil
	}
	lowest, seqs, err := lowestRewind(ctx, w.m.js, w.p, info.Config)
	switch {
	case err != nil:
		return 0, fmt.Errorf("where the partition's consumer started: %w", err)
	case !seqs:
		w.log.Error("the handler asked for events the server cannot hand again: it moves this consumer (created at new events) back only to its ack floor; going on from there, the events before it missed",
			"from", from, "ack_floor", info.AckFloor.Stream, "deliver_policy", info.Config.DeliverPolicy.String())
		return 0, nil
	case from < lowest:
		w.log.Warn("the handler asked for events from before the partition's consumer started: replaying from its start",
			"from", from, "start", lowest, "deliver_policy", info.Config.DeliverPolicy.String())
		return lowest, nil
	}
	return from, nil
}

// resetsToSeq reports whether the server moves a consumer of the deliver
// policy p to a sequence of our choosing (a reset to a non-zero sequence);
// one created at new events (StartAtNew) it moves only back to its ack floor.
func resetsToSeq(p jetstream.DeliverPolicy) bool {
	switch p {
	case jetstream.DeliverAllPolicy, jetstream.DeliverByStartSequencePolicy, jetstream.DeliverByStartTimePolicy:
		return true
	}
	return false
}

// resetTo makes the server deliver again everything from stream sequence
// seq (0: everything after the ack floor), in order, forgetting what it had
// delivered (and, from seq, acked).
func (w *worker) resetTo(seq uint64) error {
	ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
	defer cancel()
	resp, err := w.m.js.ResetConsumerToSequence(ctx, events.ClicksStream, w.name, seq)
	if err != nil {
		return fmt.Errorf("reset %s to %d (0: its ack floor): %w", w.name, seq, err)
	}
	w.baselineAfterReset(resp)
	// The ack floor moved by our own hand (a rewind, a replay): OnRewind or
	// the handler's Replay prepared the reader for it, so that is where it
	// resumes now (0: unknown, confirmResume then checks nothing).
	w.resume, w.handled, w.handledMsg, w.handledOf = 0, 0, nil, time.Time{}
	if resp != nil && resp.ConsumerInfo != nil {
		w.resume = resp.ConsumerInfo.AckFloor.Stream + 1
		w.positioned(resp.ConsumerInfo)
	}
	w.idle = true
	return nil
}

// baselineAfterReset takes the consumer sequence a reset left (the server
// counts deliveries again from there).
func (w *worker) baselineAfterReset(resp *jetstream.ConsumerResetResponse) {
	if resp == nil || resp.ConsumerInfo == nil {
		w.cseqKnown = false
		return
	}
	w.lastCseq, w.cseqKnown = resp.ConsumerInfo.Delivered.Consumer, true
}

// handle calls the handler until the batch is done, parking poison events
// and backing off on transient errors (process keeps the batch marked in
// progress meanwhile). It returns the stream sequence of the last event the
// handler completed (0 if none) and how many of the batch's events it
// parked as poison (not handled: snip_reader_parked_total counts them),
// and gives up (returning errReleased) if the partition is taken away.
func (w *worker) handle(batch []Event, msgs []jetstream.Msg) (done uint64, poisoned int, err error) {
	m := w.m
	r := w.newRetrier()
	for len(batch) > 0 {
		err := w.call(batch)
		if err == nil {
			return batch[len(batch)-1].Seq, poisoned, nil
		}
		var pe *PoisonError
		if errors.As(err, &pe) && pe.Index >= 0 && pe.Index < len(batch) {
			m.met.errors.WithLabelValues(m.cfg.Group, "poison").Inc()
			ev := batch[pe.Index]
			msg := msgBySeq(msgs, ev.Seq)
			md, _ := msg.Metadata()
			if err := w.park(msg, md, pe.Reason, pe.Err); err != nil {
				return done, poisoned, err
			}
			poisoned++
			if pe.Index > 0 {
				done = batch[pe.Index-1].Seq
			}
			batch = batch[pe.Index+1:]
			continue
		}
		var re *ReplayError
		if errors.As(err, &re) {
			if re.From >= 1 && re.From <= batch[0].Seq {
				return done, poisoned, err // process leaves the batch unacked; run moves the consumer back
			}
			w.log.Error("handler asked for a replay from a sequence not at or before its batch; retrying the batch", "err", err, "from", re.From, "first_seq", batch[0].Seq)
		}
		verdict := failure.Classify(err)
		if verdict.Kind == failure.Park && len(batch) == 1 {
			m.met.errors.WithLabelValues(m.cfg.Group, "poison").Inc()
			msg := msgBySeq(msgs, batch[0].Seq)
			md, _ := msg.Metadata()
			if err := w.park(msg, md, verdict.Reason, err); err != nil {
				return done, poisoned, err
			}
			return done, poisoned + 1, nil
		}
		if verdict.Kind == failure.Park {
			w.log.Error("handler returned a permanent error without the event's index (reader.Poison); retrying the batch", "err", err, "first_seq", batch[0].Seq)
		}
		m.met.errors.WithLabelValues(m.cfg.Group, "transient").Inc()
		if err := r.again(err, verdict.RetryAfter, "handler failed; retrying the batch", "first_seq", batch[0].Seq); err != nil {
			return done, poisoned, err
		}
	}
	return done, poisoned, nil
}

// passed calls OnPassed until it succeeds, as handle calls the handler: a
// Replay at or before p.First is returned (process leaves the batch
// unacked; run moves the consumer back), anything else is retried with
// backoff (the events are parked already: there is nothing to park).
func (w *worker) passed(p PassedInfo) error {
	m := w.m
	r := w.newRetrier()
	for {
		err := w.protect("OnPassed", func() error { return m.cfg.OnPassed(w.ctx, w.p, p) })
		if err == nil {
			return nil
		}
		var re *ReplayError
		if errors.As(err, &re) {
			if re.From >= 1 && re.From <= p.First {
				return err
			}
			w.log.Error("OnPassed asked for a replay from a sequence not at or before the positions passed; retrying it", "err", err, "from", re.From, "first_seq", p.First)
		}
		m.met.errors.WithLabelValues(m.cfg.Group, "transient").Inc()
		if err := r.again(err, failure.Classify(err).RetryAfter, "OnPassed failed; retrying it", "first_seq", p.First, "last_seq", p.Last); err != nil {
			return err
		}
	}
}

// retrier backs off between tries of one step that keeps failing (one
// batch's handler or OnPassed call, moving the consumer back for a gap or a
// replay): the wait grows to MaxRetryDelay, and the log has the first
// failure and every tenth, not one line a try.
type retrier struct {
	w        *worker
	bo       *backoff.ExponentialBackOff
	failures int
}

func (w *worker) newRetrier() *retrier { return &retrier{w: w, bo: w.m.cfg.newBackoff()} }

// again counts a failure, logs the first and every tenth, and
// waits the next backoff, at least retryAfter, before the next try. It
// returns nil to try again, or the member's context error or errReleased
// to give up.
func (r *retrier) again(err error, retryAfter time.Duration, msg string, attrs ...any) error {
	w := r.w
	if w.ctx.Err() != nil {
		return w.ctx.Err()
	}
	r.failures++
	d := max(r.bo.NextBackOff(), retryAfter)
	if r.failures == 1 || r.failures%10 == 0 {
		w.log.Warn(msg, append([]any{"err", err, "failures", r.failures, "in", d}, attrs...)...)
	}
	if !w.sleep(d) { // process keeps the batch marked in progress meanwhile
		return errReleased
	}
	return nil
}

// call runs the handler, turning a panic into a transient error so one bad
// batch cannot take the process down.
func (w *worker) call(batch []Event) error {
	return w.protect("handler", func() error { return w.m.h(w.ctx, w.p, batch) })
}

// protect runs f, turning a panic into a transient error.
func (w *worker) protect(what string, f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			w.m.met.errors.WithLabelValues(w.m.cfg.Group, "panic").Inc()
			w.log.Error(what+" panicked", "panic", r, "stack", string(debug.Stack()))
			err = fmt.Errorf("%s panicked: %v", what, r)
		}
	}()
	return f()
}

func msgBySeq(msgs []jetstream.Msg, seq uint64) jetstream.Msg {
	for _, msg := range msgs {
		if md, err := msg.Metadata(); err == nil && md.Sequence.Stream == seq {
			return msg
		}
	}
	return msgs[0]
}
