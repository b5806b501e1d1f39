package reader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/deadletter"
	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/failure"
	"github.com/snipdev/snip/pkg/topology"
)

// errReleased ends a worker's loop when its partition is taken away.
var errReleased = errors.New("partition released")

// worker owns one partition for a member: it takes the partition over,
// fetches batches in order, hands them to the handler, acks them, and gives
// the partition back when asked.
type worker struct {
	m    *member
	p    int
	name string
	log  *slog.Logger
	ps   string // partition as a label

	// ctx is cancelled only when the handler must stop at once.
	ctx    context.Context
	cancel context.CancelFunc
	// stop is closed to ask for a graceful release; releasing mirrors it for
	// the control loop, which alone touches it.
	stop      chan struct{}
	releasing bool

	cons      jetstream.Consumer
	rewoundID string
	// lastCseq is the consumer sequence of the last delivery received (0
	// before the first: a reset starts the count again), to spot deliveries
	// that never arrived; cseqKnown is false when there is no baseline.
	lastCseq    uint64
	cseqKnown   bool
	idle        bool
	lastLagRead time.Time
}

func newWorker(m *member, p int) *worker {
	ctx, cancel := context.WithCancel(m.hard)
	return &worker{
		m: m, p: p,
		name:   topology.GroupConsumerName(m.cfg.Group, p),
		log:    m.log.With("partition", p),
		ps:     strconv.Itoa(p),
		ctx:    ctx,
		cancel: cancel,
		stop:   make(chan struct{}),
		idle:   true,
	}
}

// release asks the worker to finish its batch and give the partition back.
func (w *worker) release() {
	w.releasing = true
	close(w.stop)
}

func (w *worker) stopping() bool {
	select {
	case <-w.stop:
		return true
	default:
		return false
	}
}

// sleep waits d, or until the worker is asked to stop; it reports whether
// the full wait happened.
func (w *worker) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-w.stop:
		return false
	case <-w.ctx.Done():
		return false
	}
}

func (w *worker) run() {
	defer w.cancel()
	m := w.m
	if err := w.acquire(); err != nil {
		if !errors.Is(err, errReleased) {
			w.log.Warn("take over partition", "err", err)
		}
		return
	}
	w.log.Info("partition acquired")
	defer w.giveBack()

	if err := w.assigned(); err != nil {
		return
	}
	// A fetcher goroutine reads the next batch while this one is handled,
	// so the round trip to the server overlaps the handler's work. Order is
	// unchanged: batches are handled one after the other, as fetched.
	f := w.startFetcher()
	// The tick wakes an idle worker to notice rewind requests and refresh
	// its lag gauges.
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		if req := m.rewind.Load(); req != nil && req.ID != w.rewoundID {
			// Moving the consumer back makes anything already fetched stale:
			// drop it unacked; the reset forgets it was delivered.
			f.stop()
			if err := w.maybeRewind(); err != nil {
				return
			}
			f = w.startFetcher()
		}
		w.updateLag()
		var b fetched
		select {
		case <-tick.C:
			continue
		case b = <-f.out:
		case <-w.stop:
			// The batch the fetcher is holding or still receiving was
			// delivered to us, pinned: handle it before giving the partition
			// back, so the next owner starts exactly after it.
			if b, ok := f.stop(); ok && len(b.msgs) > 0 {
				_ = w.process(b.msgs)
			}
			return
		case <-w.ctx.Done():
			f.stop()
			return
		}
		if b.err != nil {
			if errors.Is(b.err, jetstream.ErrConsumerNotFound) || errors.Is(b.err, jetstream.ErrConsumerDeleted) {
				w.log.Warn("partition consumer is gone; recreating it", "err", b.err)
				f.stop()
				if err := w.recreate(); err != nil {
					w.log.Warn("recreate partition consumer", "err", err)
				}
				f = w.startFetcher()
			}
			continue
		}
		if err := w.process(b.msgs); errors.Is(err, errGap) {
			f.stop() // what it holds is past the gap too: drop it unacked
			for {
				err := w.resetToAckFloor()
				if err == nil {
					break
				}
				w.log.Warn("recover from a delivery gap", "err", err)
				if !w.sleep(m.cfg.newBackoff().NextBackOff()) {
					return
				}
			}
			f = w.startFetcher()
			continue
		} else if err != nil {
			f.stop()
			if !errors.Is(err, errReleased) && !errors.Is(err, context.Canceled) {
				w.log.Warn("abandoning batch; the next owner gets it again", "err", err)
			}
			return
		}
	}
}

// fetched is one fetch's outcome.
type fetched struct {
	msgs []jetstream.Msg
	err  error
}

// fetcher reads batches ahead of the handler, one at a time.
type fetcher struct {
	out  chan fetched
	quit chan struct{}
	done chan struct{}
	// held is a batch fetched but not yet handed over when quit came; it is
	// written before done is closed and read after.
	held []jetstream.Msg
}

// startFetcher starts reading batches; errors back off inside it and are
// passed on for the caller to see.
func (w *worker) startFetcher() *fetcher {
	f := &fetcher{out: make(chan fetched), quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(f.done)
		bo := w.m.cfg.newBackoff()
		for {
			select {
			case <-f.quit:
				return
			default:
			}
			msgs, err := w.fetch()
			if err != nil {
				if !errors.Is(err, jetstream.ErrPinIDMismatch) {
					w.log.Debug("fetch", "err", err)
				}
				select {
				case f.out <- fetched{err: err}:
				case <-f.quit:
					return
				}
				select {
				case <-time.After(bo.NextBackOff()):
				case <-f.quit:
					return
				}
				continue
			}
			bo.Reset()
			if len(msgs) == 0 {
				continue
			}
			if !f.handOver(w, msgs) {
				return
			}
		}
	}()
	return f
}

// handOver waits for the worker to take msgs. While it waits (the handler
// may be retrying the batch before them for a long time) it tells JetStream
// these are in progress, or they would be redelivered behind later ones.
func (f *fetcher) handOver(w *worker, msgs []jetstream.Msg) bool {
	t := time.NewTicker(w.m.cfg.AckWait / 3)
	defer t.Stop()
	for {
		select {
		case f.out <- fetched{msgs: msgs}:
			return true
		case <-f.quit:
			f.held = msgs // for stop to hand over
			return false
		case <-t.C:
			for _, msg := range msgs {
				_ = msg.InProgress()
			}
		}
	}
}

// stop ends the fetcher, waiting for a fetch in progress, and returns the
// batch it was holding, if any.
func (f *fetcher) stop() (fetched, bool) {
	select {
	case <-f.quit:
	default:
		close(f.quit)
	}
	<-f.done
	if len(f.held) == 0 {
		return fetched{}, false
	}
	return fetched{msgs: f.held}, true
}

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
		if reset != nil {
			w.baselineAfterReset(reset)
		} else {
			w.lastCseq, w.cseqKnown = c.CachedInfo().Delivered.Consumer, true
		}
		return nil
	}
}

// loadRewound reads which rewind this partition last carried out, so a new
// owner neither repeats an old rewind nor misses a pending one.
func (w *worker) loadRewound() error {
	if w.m.rewind.Load() == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
	defer cancel()
	e, err := w.m.kv.Get(ctx, rewoundKey(w.m.cfg.Group, w.p))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		w.rewoundID = ""
	case err != nil:
		return err
	default:
		w.rewoundID = string(e.Value())
	}
	return nil
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

func (w *worker) recreate() error {
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

// assigned calls OnAssign, retrying with backoff while the partition is ours.
func (w *worker) assigned() error {
	if w.m.cfg.OnAssign == nil {
		return nil
	}
	bo := w.m.cfg.newBackoff()
	for {
		resume := w.cons.CachedInfo().AckFloor.Stream + 1
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

// giveBack unpins the partition so its next owner starts at once, and tells
// the reader.
func (w *worker) giveBack() {
	if err := w.unpin(); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		w.log.Debug("unpin on release", "err", err)
	}
	w.m.met.forgetPartition(w.m.cfg.Group, w.p)
	if w.m.cfg.OnRevoke != nil {
		w.m.cfg.OnRevoke(w.p)
	}
	w.log.Info("partition released")
}

// fetch returns the next batch: when the partition was idle it first waits
// (up to idleWait) for one event, then gives the rest of the batch Linger to
// arrive; when busy it asks for a full batch at once.
func (w *worker) fetch() ([]jetstream.Msg, error) {
	cfg := w.m.cfg
	group := jetstream.FetchPriorityGroup(topology.PriorityGroup)
	var msgs []jetstream.Msg
	want, wait := cfg.BatchSize, cfg.Linger
	if w.idle {
		// Messages that arrived are kept even if the fetch then failed:
		// dropping them would leave them in flight until AckWait.
		first, err := collect(w.cons.Fetch(1, jetstream.FetchMaxWait(cfg.idleWait()), group))
		if len(first) == 0 {
			return nil, err
		}
		msgs = first
		want--
	}
	if want > 0 {
		more, err := collect(w.cons.Fetch(want, jetstream.FetchMaxWait(wait), group))
		if len(msgs)+len(more) == 0 {
			return nil, err
		}
		msgs = append(msgs, more...)
	}
	w.idle = len(msgs) < cfg.BatchSize/2
	if dropForTest != nil {
		kept := msgs[:0]
		for _, msg := range msgs {
			if md, err := msg.Metadata(); err == nil && dropForTest(cfg.Group, md.Sequence.Stream) {
				continue
			}
			kept = append(kept, msg)
		}
		msgs = kept
	}
	return msgs, nil
}

// collect drains a fetch; it returns what arrived and the fetch's error.
func collect(b jetstream.MessageBatch, err error) ([]jetstream.Msg, error) {
	if err != nil {
		return nil, err
	}
	var out []jetstream.Msg
	for m := range b.Messages() {
		out = append(out, m)
	}
	return out, b.Error()
}

// dropForTest, when set (export_test.go), makes fetch lose the deliveries it
// returns true for, as a client that gave up on a fetch too early would.
var dropForTest func(group string, streamSeq uint64) bool

// process decodes a batch, parks what cannot be decoded, hands the rest to
// the handler (retrying transient failures, parking poison), and acks the
// batch by acking its last message.
func (w *worker) process(msgs []jetstream.Msg) error {
	m := w.m
	start := time.Now()
	// Every delivery takes the next consumer sequence. A gap means the
	// server delivered something this worker never received (a fetch that
	// gave up while messages were on their way, a slow-consumer drop).
	// Acking past it would ack the missing events unseen (AckAll), so handle
	// the contiguous part, then make the caller reset to the ack floor.
	gap := false
	mds := make([]*jetstream.MsgMetadata, 0, len(msgs))
	for i, msg := range msgs {
		md, err := msg.Metadata()
		if err != nil {
			return fmt.Errorf("read message metadata: %w", err)
		}
		if w.cseqKnown && md.Sequence.Consumer != w.lastCseq+1 {
			w.log.Warn("gap in deliveries: handling up to it, then resetting to the ack floor",
				"expected_consumer_seq", w.lastCseq+1, "got", md.Sequence.Consumer, "stream_seq", md.Sequence.Stream)
			m.met.gaps.WithLabelValues(m.cfg.Group).Inc()
			msgs, gap = msgs[:i], true
			break
		}
		w.lastCseq, w.cseqKnown = md.Sequence.Consumer, true
		mds = append(mds, md)
	}
	if len(msgs) == 0 {
		return errGap
	}
	evs := make([]Event, 0, len(msgs))
	for i, msg := range msgs {
		md := mds[i]
		if md.NumDelivered > 1 {
			m.met.redelivered.WithLabelValues(m.cfg.Group).Inc()
		}
		// The one rule of validity, the same in every reader and at the
		// relay: an invalid event is parked here, so no handler counts,
		// loads or judges it.
		click, err := events.ReadClick(msg.Data(), msg.Subject(), m.partitions, md.Timestamp)
		if err != nil {
			if err := w.park(msg, md, events.Reason(err), err); err != nil {
				return err
			}
			continue
		}
		evs = append(evs, Event{Click: click, Partition: w.p, Seq: md.Sequence.Stream, Stored: md.Timestamp, Deliveries: md.NumDelivered})
	}
	m.met.batchSize.WithLabelValues(m.cfg.Group).Observe(float64(len(evs)))
	if err := w.handle(evs, msgs); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(w.ctx), 10*time.Second)
	defer cancel()
	if err := msgs[len(msgs)-1].DoubleAck(ctx); err != nil {
		// A lost ack is healed by the next batch's (AckAll), or the batch
		// comes again: the handler is idempotent.
		w.log.Warn("ack batch", "err", err)
	}
	m.met.batchSecs.WithLabelValues(m.cfg.Group).Observe(time.Since(start).Seconds())
	m.met.events.WithLabelValues(m.cfg.Group, w.ps).Add(float64(len(evs)))
	if gap {
		return errGap
	}
	return nil
}

// errGap asks the worker loop to reset the partition to its ack floor.
var errGap = errors.New("gap in deliveries")

// resetToAckFloor makes the server deliver again everything after the ack
// floor, in order, forgetting what it had delivered.
func (w *worker) resetToAckFloor() error {
	ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
	defer cancel()
	resp, err := w.m.js.ResetConsumer(ctx, events.ClicksStream, w.name)
	if err != nil {
		return fmt.Errorf("reset %s to its ack floor: %w", w.name, err)
	}
	w.baselineAfterReset(resp)
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
// and backing off on transient errors. While it waits it tells JetStream the
// batch is in progress, so the events are not redelivered meanwhile. It gives
// up (returning errReleased) if the partition is taken away.
func (w *worker) handle(batch []Event, msgs []jetstream.Msg) error {
	m := w.m
	bo := m.cfg.newBackoff()
	failures := 0
	for len(batch) > 0 {
		err := w.call(batch)
		if err == nil {
			return nil
		}
		var pe *PoisonError
		if errors.As(err, &pe) && pe.Index >= 0 && pe.Index < len(batch) {
			m.met.errors.WithLabelValues(m.cfg.Group, "poison").Inc()
			ev := batch[pe.Index]
			msg := msgBySeq(msgs, ev.Seq)
			md, _ := msg.Metadata()
			if err := w.park(msg, md, pe.Reason, pe.Err); err != nil {
				return err
			}
			batch = batch[pe.Index+1:]
			continue
		}
		verdict := failure.Classify(err)
		if verdict.Kind == failure.Park && len(batch) == 1 {
			m.met.errors.WithLabelValues(m.cfg.Group, "poison").Inc()
			msg := msgBySeq(msgs, batch[0].Seq)
			md, _ := msg.Metadata()
			if err := w.park(msg, md, verdict.Reason, err); err != nil {
				return err
			}
			return nil
		}
		if verdict.Kind == failure.Park {
			w.log.Error("handler returned a permanent error without the event's index (reader.Poison); retrying the batch", "err", err, "first_seq", batch[0].Seq)
		}
		if w.ctx.Err() != nil {
			return w.ctx.Err()
		}
		m.met.errors.WithLabelValues(m.cfg.Group, "transient").Inc()
		failures++
		d := max(bo.NextBackOff(), verdict.RetryAfter)
		if failures == 1 || failures%10 == 0 {
			w.log.Warn("handler failed; retrying the batch", "err", err, "failures", failures, "in", d, "first_seq", batch[0].Seq)
		}
		if !w.waitInProgress(d, msgs) {
			return errReleased
		}
	}
	return nil
}

// call runs the handler, turning a panic into a transient error so one bad
// batch cannot take the process down.
func (w *worker) call(batch []Event) (err error) {
	defer func() {
		if r := recover(); r != nil {
			w.m.met.errors.WithLabelValues(w.m.cfg.Group, "panic").Inc()
			w.log.Error("handler panicked", "panic", r, "stack", string(debug.Stack()))
			err = fmt.Errorf("handler panicked: %v", r)
		}
	}()
	return w.m.h(w.ctx, w.p, batch)
}

// waitInProgress sleeps d, then tells JetStream the batch is still in
// progress (resetting its events' ack timers, so they are not redelivered
// while the handler retries) and refreshes the lag gauges.
func (w *worker) waitInProgress(d time.Duration, msgs []jetstream.Msg) bool {
	if !w.sleep(d) {
		return false
	}
	for _, msg := range msgs {
		_ = msg.InProgress()
	}
	w.updateLag()
	return true
}

func msgBySeq(msgs []jetstream.Msg, seq uint64) jetstream.Msg {
	for _, msg := range msgs {
		if md, err := msg.Metadata(); err == nil && md.Sequence.Stream == seq {
			return msg
		}
	}
	return msgs[0]
}

// park copies an event to DEAD_LETTER as dead.<group>.<reason> (package
// deadletter: the original payload with Snip-Dead-* headers saying where it
// came from, why, and after how many deliveries). Parking the same event
// again after a crash is deduplicated by its Nats-Msg-Id. It retries until
// the copy is stored or the partition is taken away.
func (w *worker) park(msg jetstream.Msg, md *jetstream.MsgMetadata, reason string, cause error) error {
	m := w.m
	parcel := deadletter.Parcel{
		Source:   m.cfg.Group,
		Reason:   sanitizeToken(reason),
		Stream:   events.ClicksStream,
		Subject:  msg.Subject(),
		Seq:      md.Sequence.Stream,
		Attempts: int(md.NumDelivered),
		Error:    cause.Error(),
		Consumer: m.cfg.Group,
		Data:     msg.Data(),
	}
	bo := m.cfg.newBackoff()
	for {
		ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
		_, err := deadletter.Publish(ctx, m.js, parcel)
		cancel()
		if err == nil {
			m.met.parked.WithLabelValues(m.cfg.Group, parcel.Reason).Inc()
			w.log.Warn("event parked on DEAD_LETTER", "seq", parcel.Seq, "reason", parcel.Reason, "err", cause)
			return nil
		}
		w.log.Warn("park event: retrying", "seq", parcel.Seq, "err", err)
		if !w.sleep(bo.NextBackOff()) {
			return errReleased
		}
	}
}

// maybeRewind carries out the group's latest rewind request if this
// partition has not yet: OnRewind, then the consumer moves back.
func (w *worker) maybeRewind() error {
	m := w.m
	req := m.rewind.Load()
	if req == nil || req.ID == w.rewoundID {
		return nil
	}
	ri := req.info(w.p)
	bo := m.cfg.newBackoff()
	if m.cfg.OnRewind != nil {
		for {
			err := m.cfg.OnRewind(w.ctx, w.p, ri)
			if err == nil {
				break
			}
			w.log.Warn("on rewind", "err", err)
			if !w.sleep(bo.NextBackOff()) {
				return errReleased
			}
		}
	}
	for {
		err := w.rewindTo(ri)
		if err == nil {
			break
		}
		w.log.Warn("rewind partition", "err", err)
		if !w.sleep(bo.NextBackOff()) {
			return errReleased
		}
	}
	ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
	defer cancel()
	if _, err := m.kv.Put(ctx, rewoundKey(m.cfg.Group, w.p), []byte(req.ID)); err != nil {
		w.log.Warn("record rewind done", "err", err)
	}
	w.rewoundID = req.ID
	w.idle = true
	return nil
}

func (w *worker) rewindTo(ri RewindInfo) error {
	ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
	defer cancel()
	info, err := w.cons.Info(ctx)
	if err != nil {
		return err
	}
	if ri.From == 0 || ri.From > ri.Until || ri.From > info.AckFloor.Stream+1 {
		w.log.Info("rewind: nothing to replay in this partition", "rewind", ri.ID, "from", ri.From, "until", ri.Until, "ack_floor", info.AckFloor.Stream)
		return nil
	}
	resp, err := w.m.js.ResetConsumerToSequence(ctx, events.ClicksStream, w.name, ri.From)
	if err != nil {
		return fmt.Errorf("reset %s to %d: %w", w.name, ri.From, err)
	}
	w.baselineAfterReset(resp)
	w.log.Info("partition rewound", "rewind", ri.ID, "from", ri.From, "until", ri.Until)
	return nil
}

// updateLag refreshes the partition's lag gauges every few seconds.
func (w *worker) updateLag() {
	if time.Since(w.lastLagRead) < 5*time.Second {
		return
	}
	w.lastLagRead = time.Now()
	ctx, cancel := context.WithTimeout(w.ctx, 2*time.Second)
	defer cancel()
	pl, err := partitionLag(ctx, w.m.stream, w.m.cfg.Group, w.p)
	if err != nil {
		return
	}
	g := w.m.cfg.Group
	w.m.met.lag.WithLabelValues(g, w.ps).Set(float64(pl.Pending))
	w.m.met.ackPending.WithLabelValues(g, w.ps).Set(float64(pl.AckPending))
	age := 0.0
	if !pl.OldestUnprocessed.IsZero() {
		age = time.Since(pl.OldestUnprocessed).Seconds()
	}
	w.m.met.oldestAge.WithLabelValues(g, w.ps).Set(age)
}
