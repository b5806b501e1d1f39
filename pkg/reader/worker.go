package reader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/topology"
)

// errReleased ends a worker's loop when its partition is taken away.
var errReleased = errors.New("partition released")

// worker owns one partition for a member: it takes the partition over,
// fetches batches in order, hands them to the handler, acks them, and gives
// the partition back when asked. This file has its loop (run); the rest is
// a file per concern: ownership.go (take over, give back), fetch.go,
// process.go (handler, ack, retry), park.go, rewind.go (maybeRewind) and
// lag.go (reportLag).
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
	// lapses is the member's count of possible lease lapses when the
	// worker started: one since, and the partition may have had another
	// owner meanwhile (lapsed).
	lapses uint64

	cons      jetstream.Consumer
	rewoundID string
	// staleRewindID is a rewind request this partition ignores: made for
	// the consumer the partition had before it was created again.
	staleRewindID string
	// lastCseq is the consumer sequence of the last delivery received (0
	// before the first: a reset starts the count again), to spot deliveries
	// that never arrived; cseqKnown is false when there is no baseline.
	lastCseq  uint64
	cseqKnown bool
	idle      bool
	// resume is the sequence OnAssign was last told to resume at.
	resume uint64
	// handled is the last stream sequence of the partition this owner
	// handled: the ack floor its consumer was last positioned at (taken
	// over, reset, recreated), then the last event of each batch it
	// processed and acked. An ack that never reached the server (it is
	// healed by the next batch's) leaves the consumer's ack floor behind
	// it; a rewind goes by the later of the two (rewind.go, planRewind).
	handled uint64
	// handledOf is when the consumer handled is a position of was created:
	// the one the server answered with where the consumer was last
	// positioned (positioned), which the batches processed since were
	// delivered by, their consumer sequences following on without a gap.
	// Only where the server's consumer is that one (the same Created) does
	// handled say anything of it: one deleted and created again has
	// positions of its own (afterGap, planRewind, ackHandled). Never
	// w.cons's cached info, which every Info call overwrites with the
	// server's consumer of the moment.
	handledOf time.Time
	// handledMsg is the message of the event handled, the last one of the
	// batch that set it; nil where handled was set otherwise (taken over,
	// reset, recreated). A consumer the server moves back only to its ack
	// floor is acked by it again (ackHandled) before it goes back there, so
	// that the floor an ack lost on its way left behind catches up with
	// handled.
	handledMsg jetstream.Msg
}

// positioned records where the partition's consumer, as the server
// described it (info), was just positioned (taken over, recreated, reset):
// the last event handled is its ack floor, of that consumer.
func (w *worker) positioned(info *jetstream.ConsumerInfo) {
	w.handled, w.handledMsg, w.handledOf = info.AckFloor.Stream, nil, info.Created
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
		lapses: m.lapses.Load(),
	}
}

// lapsed reports whether the member's lease may have lapsed since the
// worker started (member.stored), or may be lapsing now (leaseHeld):
// another member may hold the partition.
func (w *worker) lapsed() bool {
	return !w.m.leaseHeld() || w.m.lapses.Load() != w.lapses
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
	acquiring := m.met.acquiring.WithLabelValues(m.cfg.Group)
	acquiring.Inc()
	err := w.acquire()
	acquiring.Dec()
	if err != nil {
		if !errors.Is(err, errReleased) {
			w.log.Warn("take over partition", "err", err)
		}
		return
	}
	w.log.Info("partition acquired")
	// Held from here until given back (defers run last first).
	owned := m.met.owned.WithLabelValues(m.cfg.Group)
	owned.Inc()
	defer owned.Dec()
	defer w.giveBack()
	// Stopped before giveBack forgets the gauges (defers run last first).
	defer w.reportLag()()

	if err := w.assigned(w.cons.CachedInfo().AckFloor.Stream + 1); err != nil {
		return
	}
	if w.stopping() {
		// The partition moved while OnAssign ran: fetching now would take
		// (and ack) a batch from under its next owner.
		return
	}
	confirmed := false
	// A fetcher goroutine reads the next batch while this one is handled,
	// so the round trip to the server overlaps the handler's work. Order is
	// unchanged: batches are handled one after the other, as fetched.
	f := w.startFetcher()
	// The tick wakes an idle worker to notice rewind requests.
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		if w.pendingRewind() != nil {
			// Moving the consumer back makes anything already fetched stale:
			// drop it unacked; the reset forgets it was delivered.
			f.stop()
			if err := w.maybeRewind(); err != nil {
				return
			}
			f = w.startFetcher()
		}
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
				// Until it is created again: the pulls of the one deleted
				// say it is gone only once, and nothing else creates it.
				bo := m.cfg.newBackoff()
				for {
					err := w.recreate()
					if err == nil {
						break
					}
					w.log.Warn("recreate partition consumer", "err", err)
					if !w.sleep(bo.NextBackOff()) {
						return
					}
				}
				f = w.startFetcher()
			}
			continue
		}
		if !confirmed {
			md, err := b.msgs[0].Metadata()
			if err != nil {
				f.stop()
				w.log.Warn("read the first message's metadata", "err", err)
				return
			}
			if err := w.confirmResume(md.Sequence.Stream); err != nil {
				f.stop()
				return
			}
			confirmed = true
		}
		err := w.process(b.msgs)
		var re *ReplayError
		if errors.Is(err, errGap) || errors.As(err, &re) {
			// What the fetcher holds is past the gap, or past where the
			// handler wants to go on from: drop it unacked, move back.
			f.stop()
			from, what := uint64(0), "recover from a delivery gap" // from: afterGap
			if re != nil {
				w.log.Warn("the handler asked for the partition's events again", "from", re.From, "err", re.Err)
				from, what = re.From, "replay for the handler"
			}
			r := w.newRetrier()
			for {
				var err error
				if re == nil {
					from, err = w.afterGap()
				} else {
					from, err = w.replayFrom(re.From)
				}
				if err == nil {
					err = w.resetTo(from)
				}
				if err == nil {
					break
				}
				if errors.Is(err, jetstream.ErrConsumerNotFound) {
					// Deleted meanwhile: no try finds it, and nothing else
					// creates it while the fetcher is stopped. Created again
					// (as the fetch path does), it is moved by the next try,
					// which goes by the new consumer's own ack floor: the
					// positions kept are of the one deleted (createAgain).
					if cerr := w.createAgain(); cerr != nil {
						err = fmt.Errorf("%w; creating it again: %w", err, cerr)
					}
				}
				if r.again(err, 0, what) != nil {
					return
				}
			}
			if re != nil {
				m.met.replays.WithLabelValues(m.cfg.Group).Inc()
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
