package scenario

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/topology"
)

var kitchen = Scenario{
	Name:   "kitchen",
	Claim:  "a queue shares work out (two cooks, ~half each); a log gives every reader every event, in order",
	Needs:  "nats",
	Lesson: 3 * time.Second,
	run:    runKitchen,
}

const kitchenOrders = 100

func runKitchen(ctx context.Context, e *Env) error {
	js, err := e.NATS(ctx, 4)
	if err != nil {
		return err
	}

	// The queue: 100 jobs on PREVIEW_JOBS, two workers on the one durable
	// consumer every preview worker shares (topology.PreviewConsumerConfig).
	e.say("queue: 100 orders on %s, two workers on consumer %s", events.PreviewJobsStream, topology.PreviewConsumer)
	for i := range kitchenOrders {
		j := events.PreviewJob{V: events.PreviewJobVersion, ID: events.NewID(), Time: time.Now().UTC(),
			Code: fmt.Sprintf("order%d", i), Owner: owner, Target: "https://example.com/"}
		b, _ := json.Marshal(j)
		if _, err := js.PublishAsync(events.PreviewJobSubject, b, jetstream.WithMsgID(j.ID)); err != nil {
			return fmt.Errorf("publish job: %w", err)
		}
	}
	if err := waitPublished(ctx, js); err != nil {
		return err
	}
	var mu sync.Mutex
	perWorker := map[string]int{}
	seen := map[string]int{}
	makings := map[string][]making{}
	cook := e.Real(20 * time.Millisecond) // each order takes 20 ms of lesson time
	// Both cooks connect first and start together: a cook that began while
	// the other was still connecting (a slow moment on a loaded machine)
	// would have the queue to itself and take more than its turn.
	cooks := map[string]jetstream.Consumer{}
	var deadline func(delivered uint64) time.Duration
	for _, w := range []string{"cook-1", "cook-2"} {
		wjs, err := e.Connect(w)
		if err != nil {
			return err
		}
		cons, err := wjs.Consumer(ctx, events.PreviewJobsStream, topology.PreviewConsumer)
		if err != nil {
			return fmt.Errorf("preview consumer: %w", err)
		}
		cooks[w] = cons
		deadline = ackDeadline(cons.CachedInfo().Config)
	}
	qctx, stopQueue := context.WithCancel(ctx)
	var wg sync.WaitGroup
	queueStart := time.Now() // the makings' times are from here
	for w, cons := range cooks {
		wg.Go(func() {
			for qctx.Err() == nil {
				// Before the pull is sent: the server cannot have handed
				// the cook an order before this.
				asked := time.Now()
				b, err := cons.Fetch(1, jetstream.FetchMaxWait(200*time.Millisecond))
				if err != nil {
					continue
				}
				for m := range b.Messages() {
					var j events.PreviewJob
					_ = json.Unmarshal(m.Data(), &j)
					received := time.Now()
					var delivered, seq, cseq uint64
					if md, err := m.Metadata(); err == nil {
						delivered, seq, cseq = md.NumDelivered, md.Sequence.Stream, md.Sequence.Consumer
					}
					time.Sleep(cook) // the work itself
					// Counted as made whether or not the ack gets through: an
					// order whose ack is lost comes back and is made again,
					// and that is what "made twice" must see.
					aerr := m.DoubleAck(qctx)
					acked := time.Now()
					mk := making{cook: w, subject: m.Subject(), delivered: delivered, seq: seq, cseq: cseq,
						pulled: asked.Sub(queueStart), received: received.Sub(queueStart), acked: acked.Sub(queueStart),
						held: acked.Sub(asked), heldWall: acked.Round(0).Sub(asked.Round(0)),
						deadline: deadline(delivered), confirmed: aerr == nil, ackErr: aerr}
					mu.Lock()
					perWorker[w]++
					seen[j.ID]++
					makings[j.ID] = append(makings[j.ID], mk)
					mu.Unlock()
				}
			}
		})
	}
	err = waitFor(ctx, 60*time.Second, "the queue to empty", func() (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == kitchenOrders, nil
	})
	stopQueue()
	wg.Wait()
	if err != nil {
		return err
	}
	left, err := js.Stream(ctx, events.PreviewJobsStream)
	if err != nil {
		return fmt.Errorf("preview stream: %w", err)
	}
	info, err := left.Info(ctx)
	if err != nil {
		return fmt.Errorf("preview stream info: %w", err)
	}
	q := kitchenSeen{cook1: perWorker["cook-1"], cook2: perWorker["cook-2"], left: int(info.State.Msgs)}
	var all []making
	for _, ms := range makings {
		q.add(ms)
		all = append(all, ms...)
	}
	q.unseen = unseenDeliveries(all)
	kitchenQueueChecks(e, q)

	// The log: 100 clicks on CLICKS, two consumer groups, one member each.
	e.say("log: 100 clicks on %s, groups waiters and accounts", events.ClicksStream)
	links := codes(5)
	for i := range kitchenOrders {
		if _, err := publishClick(js, newClick(links[i%len(links)], i/len(links))); err != nil {
			return err
		}
	}
	if err := waitPublished(ctx, js); err != nil {
		return err
	}
	groups := map[string]*tally{"waiters": newTally(), "accounts": newTally()}
	var members []*member
	for g, t := range groups {
		m, err := e.startMember(ctx, groupConfig(g, g+"-1"), func(_ context.Context, _ int, batch []reader.Event) error {
			for _, ev := range batch {
				t.add(g, ev.Click)
			}
			return nil
		})
		if err != nil {
			return err
		}
		members = append(members, m)
	}
	err = waitFor(ctx, 60*time.Second, "both groups to read every click", func() (bool, error) {
		for _, t := range groups {
			if h, _, _ := t.counts(); h < kitchenOrders {
				return false, nil
			}
		}
		return true, nil
	})
	var errs []error
	for _, m := range members {
		errs = append(errs, m.stop())
	}
	if err := errors.Join(append(errs, err)...); err != nil {
		return err
	}
	for _, g := range sortedKeys(groups) {
		h, _, disorder := groups[g].counts()
		e.exact("log: clicks group "+g+" read", "clicks", kitchenOrders, float64(h), "every group reads the whole log")
		e.exact("log: out-of-order clicks in "+g, "clicks", 0, float64(disorder), "a link's clicks stay in one partition, read by one member in order")
	}
	return nil
}

// making is one cook's making of one order. held runs from before the
// cook asked for the order to the confirmation of its ack: longer than the
// server saw the order in that cook's hands, so an order held for less
// than its ack deadline, with its ack confirmed, was acknowledged in time.
//
// The server times a delivery by the wall clock (nats-server's
// trackPending and checkPending read time.Now().UnixNano(), which drops
// the monotonic reading), so held is timed on both clocks: the
// monotonic one (held) is how long the cook really had it, the wall one
// (heldWall) what the server's clock said. They differ only when the
// wall clock was stepped while the cook had the order (a time sync on the
// machine): stepped forward past the deadline, the server hands on an
// order whose ack came in real time, and both cooks make it. That is the
// queue's at-least-once delivery too, and counted so.
type making struct {
	cook      string
	subject   string        // the order's subject
	delivered uint64        // the delivery's number (1 the first time)
	seq       uint64        // the order's stream sequence
	cseq      uint64        // the delivery's consumer sequence (every delivery of the consumer counts)
	held      time.Duration // from the cook's pull to its ack's confirmation
	heldWall  time.Duration // the same by the wall clock, the server's
	deadline  time.Duration // the ack deadline of this delivery
	confirmed bool          // the ack's confirmation came
	ackErr    error         // why not, if it did not
	// When, from the queue's start, the cook asked for the order, had it,
	// and had its ack answered (or failed).
	pulled, received, acked time.Duration
}

// late reports whether the server may have handed the order on while this
// cook had it: its ack missed the deadline by either clock, or was never
// confirmed.
func (m making) late() bool {
	return !m.confirmed || m.held >= m.deadline || m.heldWall >= m.deadline
}

func (m making) String() string {
	ack := "confirmed"
	if !m.confirmed {
		ack = fmt.Sprintf("not confirmed (%v)", m.ackErr)
	}
	ms := func(d time.Duration) string { return d.Round(time.Millisecond).String() }
	held := ms(m.held)
	if d := m.heldWall - m.held; d > 10*time.Millisecond || d < -10*time.Millisecond {
		held += " (" + ms(m.heldWall) + " by the wall clock, the server's)"
	}
	return fmt.Sprintf("%s: delivery %d (consumer sequence %d) of sequence %d on %s, pulled at %s, received at %s, ack %s at %s: held %s of its %s",
		m.cook, m.delivered, m.cseq, m.seq, m.subject, ms(m.pulled), ms(m.received), ack, ms(m.acked), held, m.deadline)
}

// unseenDeliveries returns the consumer sequences below the highest a cook
// received that no cook did: deliveries the server made that never reached
// a cook (one to a pull the cook had given up on), each of which the
// server hands on after its deadline.
func unseenDeliveries(ms []making) []uint64 {
	seen := map[uint64]bool{}
	var top uint64
	for _, m := range ms {
		seen[m.cseq] = true
		top = max(top, m.cseq)
	}
	var unseen []uint64
	for c := uint64(1); c < top; c++ {
		if !seen[c] {
			unseen = append(unseen, c)
		}
	}
	return unseen
}

// ackDeadline returns the ack deadline of delivery n on consumer c: the
// BackOff step of that delivery (the last one repeats), else AckWait.
func ackDeadline(c jetstream.ConsumerConfig) func(n uint64) time.Duration {
	return func(n uint64) time.Duration {
		if len(c.BackOff) == 0 {
			return c.AckWait
		}
		return c.BackOff[min(max(n, 1), uint64(len(c.BackOff)))-1]
	}
}

// kitchenSeen is what the queue half of the lesson observed.
type kitchenSeen struct {
	cook1, cook2 int // orders each cook made
	twice        int // orders made more than once
	// twiceLate are the orders made more than once whose every making but
	// the last was late (its ack missed the deadline or was lost): the
	// queue was right to hand them on.
	twiceLate int
	late      int           // orders with a late making
	longest   time.Duration // the longest a cook held an order
	left      int           // messages left in the stream
	// unexplained describes the orders made twice though their earlier
	// makings were acknowledged in time: every making of each.
	unexplained []string
	// unseen are the deliveries no cook received (unseenDeliveries).
	unseen []uint64
}

// add records the makings of one order.
func (s *kitchenSeen) add(ms []making) {
	slices.SortFunc(ms, func(a, b making) int { return cmp.Compare(a.delivered, b.delivered) })
	anyLate := false
	for _, m := range ms {
		s.longest = max(s.longest, m.held)
		anyLate = anyLate || m.late()
	}
	if anyLate {
		s.late++
	}
	if len(ms) < 2 {
		return
	}
	s.twice++
	for _, m := range ms[:len(ms)-1] {
		if !m.late() {
			var b strings.Builder
			for i, m := range ms {
				if i > 0 {
					b.WriteString("; ")
				}
				fmt.Fprintf(&b, "[%d] %s", i+1, m)
			}
			s.unexplained = append(s.unexplained, b.String())
			return
		}
	}
	s.twiceLate++
}

// kitchenQueueChecks judges the queue: the cooks share the orders, each
// order is made once unless its cook missed the ack deadline, and the
// stream is empty afterwards.
func kitchenQueueChecks(e *Env, s kitchenSeen) {
	const fair = "pulls are served in turn, one order each; a worker that the scheduler favours may take a few more"
	e.within("queue: orders cook-1 made", "orders", 50, float64(s.cook1), 0.3, 0, fair)
	e.within("queue: orders cook-2 made", "orders", 50, float64(s.cook2), 0.3, 0, fair)
	e.exact("queue: orders made twice", "orders", float64(s.twiceLate), float64(s.twice),
		"a work queue hands a job to one worker at a time; it comes again only if that worker's ack missed the deadline (1 s on the first delivery) or was lost: the orders so held are predicted")
	e.exact("queue: orders left in the stream", "msgs", 0, float64(s.left), "work-queue retention deletes a job on its ack")
	if s.late > 0 {
		e.note("%d order(s) may have been held past the ack deadline or had the ack unconfirmed (timed from the cook's pull to its ack's confirmation; the longest %s: a cook starved on a busy machine); the queue hands such an order on, and %d of them were made twice: delivery is at least once, and a handler must be idempotent. A preview worker tells the server three times per deadline that a job is still in hand, so only one silent that long loses it",
			s.late, s.longest.Round(time.Millisecond), s.twiceLate)
	}
	for _, u := range s.unexplained {
		e.note("made twice though acknowledged in time, every making of it: %s", u)
	}
	if len(s.unexplained) > 0 {
		e.note("deliveries the server made that no cook received (consumer sequences): %v", s.unseen)
	}
}
