package reader_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/failure"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// Six partitions, ten members: exactly six work; every event is handled
// once; order per link holds. Then an active member leaves gracefully and
// another crashes: their partitions move, nothing is lost, and order holds.
func TestGroupSixPartitionsTenMembers(t *testing.T) {
	t.Parallel()
	n, js := setup(t, 6)
	rec := newRecorder()
	ms := map[string]*member{}
	var all10 []string
	for i := range 10 {
		id := fmt.Sprintf("m%d", i)
		all10 = append(all10, id)
		// A 3s lease (the default) rather than the tests' 1s: a heartbeat
		// delayed by a loaded CI machine must not make a member drop out and
		// blur the "exactly six" count.
		cfg := reader.Config{Group: "g", Member: id, BatchSize: 50, LeaseTTL: 3 * time.Second}
		ms[id] = startMember(t, n, rec.track(cfg), rec.handler(id))
	}
	// Which members hold the partitions depends on the order they joined
	// in (a member keeps what it holds, AssignSticky); the bound does not:
	// six members, one partition each.
	//
	// Settled means all ten joined and their leases agree with it too: a
	// member computes its share from the others' leases, whose claims
	// follow an assignment by a heartbeat, so a member joining (or a lease
	// not yet showing a partition just taken) could still move one
	// partition, once, after the handlers alone looked settled (CI saw a
	// seventh member handle events so). So the layout must also hold,
	// unchanged, for three heartbeats (LeaseTTL/3 each), by which time
	// every member has read every lease.
	var rest reader.RestWatch
	testenv.WaitFor(t, 30*time.Second, "the group to settle: ten members, six owners, one partition each, for three heartbeats", func() bool {
		leases, err := reader.Members(t.Context(), js, "g")
		if err != nil || len(leases) != 10 || !rec.settled(6, 1) {
			leases = nil // not at rest: the watch starts over
		}
		return rest.Observe("g", 6, leases, time.Now()) >= 3*time.Second
	})
	const links, perLink = 60, 50
	ids := publish(t, js, links, perLink, 0)
	testenv.WaitFor(t, 60*time.Second, "all events handled", func() bool { return rec.distinct() == len(ids) })

	rec.mu.Lock()
	active := []string{}
	for id, c := range rec.byMember {
		if c > 0 {
			active = append(active, id)
		}
	}
	rec.mu.Unlock()
	slices.Sort(active)
	if len(active) != 6 {
		t.Fatalf("%d members handled events (%v), want exactly 6", len(active), active)
	}
	if dups := rec.check(t, ids, perLink); dups != 0 {
		t.Fatalf("%d duplicate handlings with a stable group, want 0", dups)
	}

	// A graceful leave: its partitions move with nothing handled twice.
	ms[active[0]].stop(t)
	ids2 := publish(t, js, links, perLink, perLink)
	all := slices.Concat(ids, ids2)
	testenv.WaitFor(t, 60*time.Second, "events after a graceful leave handled", func() bool { return rec.distinct() == len(all) })
	if dups := rec.check(t, all, 2*perLink); dups != 0 {
		t.Fatalf("%d duplicate handlings after a graceful leave, want 0", dups)
	}

	// A crash mid-stream: at-least-once, so in-flight events may come again,
	// but none is lost and first-seen order per link holds.
	rec.mu.Lock()
	before := map[string]int{}
	for id, c := range rec.byMember {
		before[id] = c
	}
	rec.mu.Unlock()
	ids3 := publish(t, js, links, perLink, 2*perLink)
	var victim string
	testenv.WaitFor(t, 30*time.Second, "a member busy with the new events", func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		for id, c := range rec.byMember {
			if c > before[id] && id != active[0] {
				victim = id
				return true
			}
		}
		return false
	})
	ms[victim].crash()
	all = append(all, ids3...)
	testenv.WaitFor(t, 60*time.Second, "events after a crash handled", func() bool { return rec.distinct() == len(all) })
	dups := rec.check(t, all, 3*perLink)
	t.Logf("crash of %s: %d events handled again (at-least-once)", victim, dups)
}

// Two groups on one stream each see every event: the kitchen and the
// dashboard each get every order.
func TestTwoGroupsEachSeeEveryEvent(t *testing.T) {
	t.Parallel()
	n, js := setup(t, 4)
	kitchen, dashboard := newRecorder(), newRecorder()
	startMember(t, n, reader.Config{Group: "kitchen", Member: "k1"}, kitchen.handler("k1"))
	startMember(t, n, reader.Config{Group: "kitchen", Member: "k2"}, kitchen.handler("k2"))
	startMember(t, n, reader.Config{Group: "dashboard", Member: "d1"}, dashboard.handler("d1"))
	ids := publish(t, js, 20, 30, 0)
	testenv.WaitFor(t, 60*time.Second, "both groups handled every event", func() bool {
		return kitchen.distinct() == len(ids) && dashboard.distinct() == len(ids)
	})
	if d := kitchen.check(t, ids, 30) + dashboard.check(t, ids, 30); d != 0 {
		t.Fatalf("%d duplicates, want 0", d)
	}
}

// Malformed events, unknown versions and handler-declared poison are parked
// on DEAD_LETTER with their reason, counted, and the partition goes on.
func TestPoisonIsParkedAndThePartitionGoesOn(t *testing.T) {
	t.Parallel()
	n, js := setup(t, 1)
	ctx := t.Context()
	pub := func(data string) {
		if _, err := js.Publish(ctx, events.ClickSubject("acme", "x"), []byte(data)); err != nil {
			t.Fatal(err)
		}
	}
	pub(`{not json`)
	pub(`{"v":99,"id":"x"}`)
	ids := publish(t, js, 1, 10, 0) // link0, RequestID 0..9
	pub(`{"v":1}`)                  // valid JSON, invalid click
	ids = append(ids, publish(t, js, 1, 5, 10)...)

	rec := newRecorder()
	rec.fail = func(_ string, batch []reader.Event) error {
		for i, e := range batch {
			if e.Click.RequestID == "3" {
				return reader.Poison(i, "bad target", errors.New("target rejected"))
			}
		}
		return nil
	}
	reg := prometheus.NewRegistry()
	m := startMember(t, n, reader.Config{Group: "g", Member: "m", Metrics: reg, BatchSize: 4}, rec.handler("m"))
	// Every valid event but the poisoned one is handled.
	testenv.WaitFor(t, 30*time.Second, "valid events handled", func() bool { return rec.distinct() == len(ids)-1 })

	dlq, err := js.Stream(ctx, events.DeadLetterStream)
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "4 dead letters", func() bool {
		info, err := dlq.Info(ctx)
		return err == nil && info.State.Msgs == 4
	})
	got := map[string]int{}
	for seq := uint64(1); seq <= 4; seq++ {
		m, err := dlq.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		got[m.Subject]++
		for _, h := range []string{events.HeaderDeadReason, events.HeaderDeadError, events.HeaderDeadSeq, events.HeaderDeadSubject, events.HeaderDeadGroup} {
			if m.Header.Get(h) == "" {
				t.Errorf("dead letter %s lacks header %s", m.Subject, h)
			}
		}
	}
	want := map[string]int{"dead.g.malformed": 2, "dead.g.unknown_version": 1, "dead.g.bad_target": 1}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("dead letters by subject = %v, want %v", got, want)
	}
	if v := testutil.ToFloat64(counterVec(t, reg, "snip_reader_parked_total", "malformed")); v != 2 {
		t.Fatalf("parked_total{reason=malformed} = %v, want 2", v)
	}
	// Events handled successfully: not the one the handler declared poison
	// (parked_total counts it). Read once the member stopped, every
	// batch's count added.
	m.stop(t)
	if v := gathered(t, reg, "snip_reader_events_total"); v != float64(len(ids)-1) {
		t.Errorf("events_total = %v, want %d (the valid events but the one parked as poison)", v, len(ids)-1)
	}
}

func counterVec(t *testing.T, reg *prometheus.Registry, name, reason string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "x", Help: "x"}, func() float64 { return m.GetCounter().GetValue() })
				}
			}
		}
	}
	t.Fatalf("no %s{reason=%q}", name, reason)
	return nil
}

// A transient error makes the partition wait and retry the same batch:
// nothing is skipped and order holds.
func TestTransientErrorsRetryTheBatch(t *testing.T) {
	t.Parallel()
	n, js := setup(t, 2)
	rec := newRecorder()
	var failures atomic.Int32
	rec.fail = func(_ string, batch []reader.Event) error {
		if failures.Add(1) <= 5 {
			return errors.New("sink unavailable")
		}
		return nil
	}
	ids := publish(t, js, 10, 20, 0)
	startMember(t, n, reader.Config{Group: "g", Member: "m", BatchSize: 25}, rec.handler("m"))
	testenv.WaitFor(t, 60*time.Second, "every event handled", func() bool { return rec.distinct() == len(ids) })
	if d := rec.check(t, ids, 20); d != 0 {
		t.Fatalf("%d duplicates, want 0", d)
	}
}

// Parking retries while DEAD_LETTER is away (here: deleted, then made again
// by the topology) for longer than AckWait; the batch it belongs to stays
// marked in progress meanwhile, so nothing of it is redelivered, and the
// partition goes on once the event is parked.
func TestParkingLongerThanTheAckWaitGetsNoRedelivery(t *testing.T) {
	t.Parallel()
	n, js := setup(t, 1)
	ctx := t.Context()
	if err := js.DeleteStream(ctx, events.DeadLetterStream); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, events.ClickSubject("acme", "x"), []byte(`{not json`)); err != nil {
		t.Fatal(err)
	}
	ids := publish(t, js, 1, 5, 0)
	// The member's in-progress marks, seen on the acks' subjects: while
	// DEAD_LETTER is away, the batch must be marked every AckWait/3.
	nc, err := nats.Connect(n.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	var mu sync.Mutex
	marks := map[string]int{} // per delivery (reply subject)
	if _, err := nc.Subscribe("$JS.ACK.>", func(m *nats.Msg) {
		if string(m.Data) == "+WPI" {
			mu.Lock()
			marks[m.Subject]++
			mu.Unlock()
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	const ackWait = 2 * time.Second
	rec := newRecorder()
	reg := prometheus.NewRegistry()
	startMember(t, n, reader.Config{Group: "g", Member: "m", Metrics: reg, BatchSize: 100, AckWait: ackWait}, rec.handler("m"))
	// DEAD_LETTER stays away until the batch has been marked in progress
	// seven times, more than two AckWaits of parking.
	testenv.WaitFor(t, 30*time.Second, "the batch marked in progress seven times while parking waits", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, k := range marks {
			if k >= 7 {
				return true
			}
		}
		return false
	})
	c, err := js.Consumer(ctx, events.ClicksStream, topology.GroupConsumerName("g", 0))
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.NumRedelivered != 0 || rec.distinct() != 0 {
		t.Errorf("while parking waited: %d redelivered, %d handled; want 0 and 0 (the batch waits for its first event's parking)", info.NumRedelivered, rec.distinct())
	}
	o := topology.Defaults()
	o.Partitions = 1
	if err := topology.Apply(ctx, js, o); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the rest handled once the event is parked", func() bool { return rec.distinct() == len(ids) })
	if v := gathered(t, reg, "snip_reader_redeliveries_total"); v != 0 {
		t.Errorf("redeliveries_total = %v, want 0", v)
	}
	if v := gathered(t, reg, "snip_reader_parked_total"); v != 1 {
		t.Errorf("parked_total = %v, want 1", v)
	}
}

// A handler may take longer than the AckWait (the warehouse loader waits
// its turn behind other partitions' inserts): the runtime marks the batch in
// progress while the handler runs, so JetStream redelivers nothing meanwhile
// and every event is delivered once.
func TestAHandlerSlowerThanTheAckWaitGetsNoRedelivery(t *testing.T) {
	t.Parallel()
	n, js := setup(t, 1)
	// Published before the member starts, so they make one batch and the
	// fetcher keeps pulling while the handler waits: a redelivery would
	// reach it at once.
	ids := publish(t, js, 1, 10, 0)
	const ackWait = 2 * time.Second
	var (
		mu          sync.Mutex
		deliveries  = map[string]uint64{} // the most deliveries seen per event
		redelivered = -1                  // the consumer's redelivered messages as the slow call ends
		slow        atomic.Bool
	)
	h := func(ctx context.Context, p int, batch []reader.Event) error {
		if slow.CompareAndSwap(false, true) {
			select {
			case <-time.After(3 * ackWait):
			case <-ctx.Done():
				return ctx.Err()
			}
			c, err := js.Consumer(ctx, events.ClicksStream, topology.GroupConsumerName("g", p))
			if err != nil {
				return err
			}
			info, err := c.Info(ctx)
			if err != nil {
				return err
			}
			mu.Lock()
			redelivered = info.NumRedelivered
			mu.Unlock()
		}
		mu.Lock()
		defer mu.Unlock()
		for _, e := range batch {
			deliveries[e.Click.ID] = max(deliveries[e.Click.ID], e.Deliveries)
		}
		return nil
	}
	startMember(t, n, reader.Config{Group: "g", Member: "m", BatchSize: 100, AckWait: ackWait}, h)
	testenv.WaitFor(t, 60*time.Second, "every event handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(deliveries) == len(ids)
	})
	mu.Lock()
	defer mu.Unlock()
	if redelivered != 0 {
		t.Errorf("after a handler call of %s (AckWait %s) the consumer had redelivered %d messages, want 0", 3*ackWait, ackWait, redelivered)
	}
	for _, id := range ids {
		if d := deliveries[id]; d != 1 {
			t.Errorf("event %s delivered %d times, want once", id, d)
		}
	}
}

// A handler that needs its partition's events again from an earlier
// sequence answers Replay: the batch is not acked, the consumer moves back
// and everything from there is handed again, in order, acked events
// included. A Replay that would move forward is a mistake, retried as a
// transient failure.
func TestReplayHandsTheEventsAgainFromASequence(t *testing.T) {
	t.Parallel()
	n, js := setup(t, 1)
	ids := publish(t, js, 1, 30, 0) // sequences 1..30, in one partition
	var mu sync.Mutex
	var handled []uint64 // stream sequences of the events handled, in order
	refused, forward := uint64(0), false
	h := func(_ context.Context, _ int, batch []reader.Event) error {
		mu.Lock()
		defer mu.Unlock()
		if !forward {
			forward = true
			return reader.Replay(batch[0].Seq+1, errors.New("a mistaken replay: forward"))
		}
		if refused == 0 && batch[len(batch)-1].Seq >= 21 {
			refused = batch[0].Seq
			return reader.Replay(5, errors.New("the store lost what it had acked"))
		}
		for _, e := range batch {
			handled = append(handled, e.Seq)
		}
		return nil
	}
	reg := prometheus.NewRegistry()
	startMember(t, n, reader.Config{Group: "g", Member: "m", BatchSize: 10, MaxRetryDelay: 50 * time.Millisecond, Metrics: reg}, h)
	testenv.WaitFor(t, 30*time.Second, "the last event handled after the replay", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return refused != 0 && len(handled) > 0 && handled[len(handled)-1] == uint64(len(ids))
	})
	mu.Lock()
	var want []uint64
	for s := uint64(1); s < refused; s++ {
		want = append(want, s)
	}
	for s := uint64(5); s <= uint64(len(ids)); s++ {
		want = append(want, s)
	}
	if fmt.Sprint(handled) != fmt.Sprint(want) {
		t.Errorf("handled %v\nwant %v (up to the refused batch at %d, then again from 5)", handled, want, refused)
	}
	mu.Unlock()
	if v := gathered(t, reg, "snip_reader_handler_replays_total"); v != 1 {
		t.Errorf("handler_replays_total = %v, want 1", v)
	}
	if v := gathered(t, reg, "snip_reader_handler_errors_total"); v != 1 {
		t.Errorf("handler_errors_total = %v, want 1 (the forward replay, retried)", v)
	}
	testenv.WaitFor(t, 10*time.Second, "the partition acked to its last event", func() bool {
		c, err := js.Consumer(t.Context(), events.ClicksStream, topology.GroupConsumerName("g", 0))
		if err != nil {
			return false
		}
		info, err := c.Info(t.Context())
		return err == nil && info.AckFloor.Stream == uint64(len(ids)) && info.NumAckPending == 0
	})
}

// A handler's Replay whose move back keeps failing (here CLICKS is deleted
// under it, so reading the partition's consumer fails at once each try) is
// tried again with a wait that grows, as a failing batch is, and logged
// now and then. Before, each try made a new backoff and waited its first
// step (about 100 ms), with a warning a try, for as long as it failed.
// The test counts the tries (the member's requests for the consumer's
// info) and the warnings over 3 s of failure: the growing wait (100 ms,
// 200 ms, 400 ms, ... with jitter) tries about 5 times.
func TestAReplayThatKeepsFailingWaitsLongerEachTry(t *testing.T) {
	t.Parallel()
	n, js := setup(t, 1)
	publish(t, js, 1, 10, 0)
	name := topology.GroupConsumerName("g", 0)
	nc := n.Connect(t)
	var tries atomic.Int64
	sub, err := nc.Subscribe("$JS.API.CONSUMER.INFO."+events.ClicksStream+"."+name, func(*nats.Msg) { tries.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	replayed := make(chan struct{})
	var once sync.Once
	h := func(ctx context.Context, _ int, batch []reader.Event) error {
		var err error
		once.Do(func() {
			err = js.DeleteStream(ctx, events.ClicksStream)
			if err == nil {
				err = reader.Replay(1, errors.New("the store lost what it had acked"))
				close(replayed)
			}
		})
		return err
	}
	logged := &onMessage{msg: "replay for the handler"}
	var warned atomic.Int64
	logged.fn = func() { warned.Add(1) }
	startMember(t, n, reader.Config{Group: "g", Member: "m", Logger: slog.New(logged)}, h)
	select {
	case <-replayed:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler was not called")
	}
	before := tries.Load()
	time.Sleep(3 * time.Second) // the period of failure measured
	switch n := tries.Load() - before; {
	case n < 2:
		t.Errorf("the consumer was read %d times in 3 s of failing replays, want it tried again", n)
	case n > 10:
		t.Errorf("the consumer was read %d times in 3 s of failing replays, want at most 10 (a wait that grows)", n)
	}
	if n := warned.Load(); n > 2 {
		t.Errorf("%d warnings of the failing replay in 3 s, want at most 2", n)
	}
}

// A handler's Replay whose partition's consumer was deleted before the
// move back (here by the handler, as it answers Replay) has the consumer
// created again, as a fetch that finds it gone does, and the partition goes
// on. The new consumer has positions of its own: the move back goes by its
// ack floor, so it hands everything from the partition's start, not from
// the Replay's sequence, which is a position of the one deleted. Before,
// each try of the move back failed "consumer not found", nothing created
// the consumer again, and the partition handled nothing more until it was
// taken away from the member.
func TestAReplayWhoseConsumerWasDeletedGoesOnWithANewOne(t *testing.T) {
	t.Parallel()
	n, js := setup(t, 1)
	ids := publish(t, js, 1, 30, 0) // sequences 1..30, in one partition
	name := topology.GroupConsumerName("g", 0)
	var mu sync.Mutex
	var handled []uint64 // stream sequences of the events handled, in order
	deleted := false
	h := func(ctx context.Context, _ int, batch []reader.Event) error {
		mu.Lock()
		defer mu.Unlock()
		if !deleted && batch[len(batch)-1].Seq >= 21 {
			deleted = true
			if err := js.DeleteConsumer(ctx, events.ClicksStream, name); err != nil {
				return err
			}
			return reader.Replay(15, errors.New("the store lost what it had acked"))
		}
		for _, e := range batch {
			handled = append(handled, e.Seq)
		}
		return nil
	}
	startMember(t, n, reader.Config{Group: "g", Member: "m", BatchSize: 10, MaxRetryDelay: 200 * time.Millisecond}, h)
	last := uint64(len(ids))
	if !testenv.Poll(30*time.Second, func() bool {
		c, err := js.Consumer(t.Context(), events.ClicksStream, name)
		if err != nil {
			return false
		}
		info, err := c.Info(t.Context())
		return err == nil && info.AckFloor.Stream == last && info.NumAckPending == 0
	}) {
		mu.Lock()
		t.Fatalf("the partition's consumer, deleted before the replay, was not acked to the last event %d in 30 s (handled %v)", last, handled)
	}
	mu.Lock()
	defer mu.Unlock()
	var want []uint64
	for s := uint64(1); s <= 20; s++ {
		want = append(want, s)
	}
	for s := uint64(1); s <= last; s++ {
		want = append(want, s)
	}
	if fmt.Sprint(handled) != fmt.Sprint(want) {
		t.Errorf("handled %v\nwant %v (up to the replay at 21, then everything again from the new consumer's start)", handled, want)
	}
}

// gathered sums every series of a counter in reg (0 if it has none).
func gathered(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var v float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				v += m.GetCounter().GetValue()
			}
		}
	}
	return v
}

// A new group can start at a time: the events before it are not handed out.
func TestStartAtTimeAndNew(t *testing.T) {
	t.Parallel()
	n, js := setup(t, 2)
	old := publish(t, js, 3, 5, 0)
	cut := time.Now()
	testenv.WaitFor(t, 5*time.Second, "the clock to pass the cut", func() bool { return time.Since(cut) > 20*time.Millisecond })
	recent := publish(t, js, 3, 5, 5)

	fromTime, fromNew := newRecorder(), newRecorder()
	startMember(t, n, reader.Config{Group: "since", Member: "m", Start: reader.StartAtTime(cut)}, fromTime.handler("m"))
	startMember(t, n, reader.Config{Group: "new", Member: "m", Start: reader.StartAtNew()}, fromNew.handler("m"))
	testenv.WaitFor(t, 30*time.Second, "events since the cut handled", func() bool { return fromTime.handledAll(recent) })
	if got := fromTime.handledAny(old); got != 0 {
		t.Errorf("group started at a time handled %d events older than the cut, want 0", got)
	}
	// Wait until the new group's consumers exist before publishing.
	testenv.WaitFor(t, 30*time.Second, "group new joined", func() bool {
		_, err := reader.Lag(t.Context(), js, "new")
		return err == nil
	})
	later := publish(t, js, 3, 2, 10)
	testenv.WaitFor(t, 30*time.Second, "events after joining handled", func() bool { return fromNew.handledAll(later) })
	// Each partition hands out in stream order, so an event from before the
	// join would have come ahead of the later ones on its link.
	if got := fromNew.handledAny(slices.Concat(old, recent)); got != 0 {
		t.Errorf("StartAtNew group handled %d events published before it joined, want 0", got)
	}
}

// Rewind replays a group: OnRewind is called for every partition, and the
// events are handed out again.
func TestRewindReplaysTheGroup(t *testing.T) {
	t.Parallel()
	n, js := setup(t, 3)
	ids := publish(t, js, 9, 10, 0)
	var handled atomic.Int64
	var rewinds atomic.Int32
	h := func(_ context.Context, _ int, b []reader.Event) error { handled.Add(int64(len(b))); return nil }
	cfg := reader.Config{Group: "g", Member: "m", OnRewind: func(_ context.Context, p int, r reader.RewindInfo) error {
		if r.From == 0 || r.Until < r.From {
			return fmt.Errorf("partition %d: rewind info %+v has nothing to replay", p, r)
		}
		rewinds.Add(1)
		return nil
	}}
	startMember(t, n, cfg, h)
	testenv.WaitFor(t, 30*time.Second, "first pass", func() bool { return handled.Load() == int64(len(ids)) })

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	id, err := reader.Rewind(ctx, js, "g", reader.FromSeq(1))
	if err != nil {
		t.Fatal(err)
	}
	if err := reader.WaitRewind(ctx, js, "g", id); err != nil {
		t.Fatal(err)
	}
	st, err := reader.LatestRewind(ctx, js, "g")
	if err != nil {
		t.Fatal(err)
	}
	if st.ID != id || !st.Done() || len(st.Partitions) != 3 || st.Partitions[0].From == 0 {
		t.Fatalf("LatestRewind = %+v, want request %s carried out by all 3 partitions", st, id)
	}
	if groups, err := reader.Groups(ctx, js); err != nil || !slices.Equal(groups, []string{"g"}) {
		t.Fatalf("Groups = %v, %v; want [g]", groups, err)
	}
	if st, err := reader.LatestRewind(ctx, js, "never-replayed"); err != nil || st.ID != "" || st.Done() {
		t.Fatalf("LatestRewind of a group never replayed = %+v, %v; want the zero status", st, err)
	}
	testenv.WaitFor(t, 30*time.Second, "second pass", func() bool { return handled.Load() == int64(2*len(ids)) })
	if got := rewinds.Load(); got != 3 {
		t.Fatalf("OnRewind called %d times, want once per partition (3)", got)
	}
	if _, err := reader.Rewind(ctx, js, "nope", reader.FromSeq(1)); !errors.Is(err, reader.ErrNoGroup) {
		t.Fatalf("rewind of a missing group: err = %v, want ErrNoGroup", err)
	}
}

// Lag reads the group's position from the server, members or not.
func TestLagFromTheServer(t *testing.T) {
	t.Parallel()
	n, js := setup(t, 2)
	ctx := t.Context()
	rec := newRecorder()
	m := startMember(t, n, reader.Config{Group: "g", Member: "m"}, rec.handler("m"))
	// Lag lists the partitions whose consumer exists; the member creates
	// them as it takes the partitions, so wait for both.
	testenv.WaitFor(t, 30*time.Second, "both partition consumers", func() bool {
		lag, err := reader.Lag(ctx, js, "g")
		return err == nil && len(lag) == 2
	})
	m.stop(t)
	ids := publish(t, js, 4, 5, 0)
	// The server counts a consumer's pending events asynchronously: it acks
	// a publish, then a stream goroutine signals the consumers
	// (signalConsumersLoop), so a Lag read right after the acks may not
	// count the last events yet. It converges; poll for it.
	var lag []reader.PartitionLag
	testenv.WaitFor(t, 10*time.Second, fmt.Sprintf("lag pending = %d", len(ids)), func() bool {
		var err error
		if lag, err = reader.Lag(ctx, js, "g"); err != nil {
			t.Fatal(err)
		}
		var pending uint64
		for _, pl := range lag {
			pending += pl.Pending
		}
		return pending == uint64(len(ids))
	})
	for _, pl := range lag {
		if pl.Pending > 0 && pl.OldestUnprocessed.IsZero() {
			t.Errorf("partition %d: %d pending but no oldest time", pl.Partition, pl.Pending)
		}
		if !strings.HasPrefix(pl.Consumer, "g-p") {
			t.Errorf("consumer name %q", pl.Consumer)
		}
	}
	startMember(t, n, reader.Config{Group: "g", Member: "m2"}, rec.handler("m2"))
	testenv.WaitFor(t, 30*time.Second, "caught up", func() bool {
		lag, err := reader.Lag(ctx, js, "g")
		if err != nil {
			return false
		}
		for _, pl := range lag {
			if pl.Pending+uint64(pl.AckPending) > 0 || !pl.OldestUnprocessed.IsZero() {
				return false
			}
		}
		return true
	})
	if _, err := reader.Lag(ctx, js, "missing"); !errors.Is(err, reader.ErrNoGroup) {
		t.Fatalf("lag of a missing group: err = %v, want ErrNoGroup", err)
	}
}

func TestBadConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  reader.Config
	}{
		{"group_with_dot", reader.Config{Group: "a.b"}},
		{"lease_below_a_second", reader.Config{Group: "g", LeaseTTL: 500 * time.Millisecond}},
		{"ack_wait_below_two_leases", reader.Config{Group: "g", LeaseTTL: 5 * time.Second, AckWait: 6 * time.Second}},
		{"huge_batch", reader.Config{Group: "g", BatchSize: 1_000_000}},
		{"negative_ack_timeout", reader.Config{Group: "g", AckTimeout: -time.Second}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := reader.Run(t.Context(), nil, tc.cfg, nil)
			if !errors.Is(err, reader.ErrBadConfig) {
				t.Fatalf("Run = %v, want ErrBadConfig", err)
			}
		})
	}
}

var _ = jetstream.ErrConsumerNotFound
var _ = topology.PriorityGroup

// A delivery that never reaches the member (a fetch that gave up while the
// message was on its way) must not be acked past: AckAll would lose it. The
// member sees the gap in consumer sequences and resets to its ack floor.
func TestLostDeliveryIsNotAckedPast(t *testing.T) {
	t.Parallel()
	n, js := setup(t, 1)
	ids := publish(t, js, 3, 20, 0) // 60 events, one partition
	var mu sync.Mutex
	dropped := map[uint64]bool{}
	reader.SetDropForTest("lossy", func(seq uint64) bool {
		mu.Lock()
		defer mu.Unlock()
		if (seq != 7 && seq != 31) || dropped[seq] {
			return false
		}
		dropped[seq] = true // lose the first delivery of each only
		return true
	})
	t.Cleanup(func() { reader.SetDropForTest("lossy", nil) })
	rec := newRecorder()
	reg := prometheus.NewRegistry()
	startMember(t, n, reader.Config{Group: "lossy", Member: "m", BatchSize: 10, Metrics: reg}, rec.handler("m"))
	testenv.WaitFor(t, 30*time.Second, "every event handled despite two lost deliveries", func() bool { return rec.distinct() == len(ids) })
	if d := rec.check(t, ids, 20); d != 0 {
		t.Fatalf("%d duplicates, want 0", d)
	}
	mfs, _ := reg.Gather()
	gaps := 0.0
	for _, mf := range mfs {
		if mf.GetName() == "snip_reader_delivery_gaps_total" {
			gaps = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(dropped) != 2 || gaps != 2 {
		t.Fatalf("dropped %d deliveries, gaps counted %v; want 2 and 2", len(dropped), gaps)
	}
}

// When a member dies and idle members exist, only its partition moves, to
// an idle member: no healthy member gives a partition up (each would stop
// and restart a partition for nothing).
func TestFailoverMovesOnlyTheDeadMembersPartitions(t *testing.T) {
	t.Parallel()
	n, js := setup(t, 3)
	rec := newRecorder()
	revoked := map[string]int{}
	ms := map[string]*member{}
	for i := range 5 {
		id := fmt.Sprintf("m%d", i)
		cfg := rec.track(reader.Config{Group: "g", Member: id, BatchSize: 50, LeaseTTL: 2 * time.Second})
		onRevoke := cfg.OnRevoke
		cfg.OnRevoke = func(p int) {
			onRevoke(p)
			rec.mu.Lock()
			revoked[id]++
			rec.mu.Unlock()
		}
		ms[id] = startMember(t, n, cfg, rec.handler(id))
	}
	testenv.WaitFor(t, 30*time.Second, "three owners, one partition each", func() bool { return rec.settled(3, 1) })
	ids := publish(t, js, 9, 5, 0)
	testenv.WaitFor(t, 30*time.Second, "all events handled", func() bool { return rec.distinct() == len(ids) })
	// Read the owners when every partition has exactly one: a member that
	// joined late can still be taking a partition over (for a moment it has
	// none, or two), and a victim must be a real owner.
	var before []string
	testenv.WaitFor(t, 30*time.Second, "one owner per partition", func() bool {
		before = rec.ownersNow(3)
		return !slices.Contains(before, "")
	})
	rec.mu.Lock()
	revokedBefore := maps.Clone(revoked)
	rec.mu.Unlock()

	// Kill, preferably, an owner whose death would make rendezvous hashing
	// alone move a healthy member's partition too.
	dead := 0
	for p, m := range before {
		alive := slices.DeleteFunc(slices.Collect(maps.Keys(ms)), func(id string) bool { return id == m })
		stateless := reader.Assign("g", 3, alive)
		for q := range 3 {
			if q != p && stateless[q] != before[q] {
				dead = p
			}
		}
	}
	victim := before[dead]
	ms[victim].crash()
	testenv.WaitFor(t, 30*time.Second, "the dead member's partition taken over", func() bool {
		now := rec.ownersNow(3)
		return now[dead] != "" && now[dead] != victim
	})
	ids = append(ids, publish(t, js, 9, 5, 5)...)
	testenv.WaitFor(t, 30*time.Second, "events after the crash handled", func() bool { return rec.distinct() == len(ids) })
	after := rec.ownersNow(3)
	if slices.Contains(before, after[dead]) {
		t.Errorf("partition %d went to %s, which was busy (owners before %v), while idle members exist", dead, after[dead], before)
	}
	for p := range 3 {
		if p != dead && after[p] != before[p] {
			t.Errorf("healthy member %s lost partition %d to %s", before[p], p, after[p])
		}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for id, n := range revoked {
		if id != victim && n != revokedBefore[id] {
			t.Errorf("healthy member %s gave up %d partitions during the failover", id, n-revokedBefore[id])
		}
	}
}

// The failure contract without an index: a handler of one-event batches may
// answer failure.Permanent, and the event is parked like a Poison; in a
// longer batch the runtime cannot tell which event is meant, so it retries
// the batch rather than park an innocent one.
func TestPermanentErrorWithoutAnIndex(t *testing.T) {
	t.Parallel()
	n, js := setup(t, 1)
	ctx := t.Context()
	ids := publish(t, js, 1, 8, 0) // link0, RequestID 0..7

	single := newRecorder()
	single.fail = func(_ string, batch []reader.Event) error {
		if batch[0].Click.RequestID == "3" {
			return failure.Permanent("bad_target", errors.New("target rejected"))
		}
		return nil
	}
	startMember(t, n, reader.Config{Group: "single", Member: "m", BatchSize: 1}, single.handler("m"))

	var refusedOnce atomic.Bool
	batched := newRecorder()
	batched.fail = func(_ string, batch []reader.Event) error {
		for _, e := range batch {
			if e.Click.RequestID == "3" && len(batch) > 1 && refusedOnce.CompareAndSwap(false, true) {
				return failure.Permanent("bad_target", errors.New("target rejected"))
			}
		}
		return nil
	}
	startMember(t, n, reader.Config{Group: "batched", Member: "m", BatchSize: 8, MaxRetryDelay: 50 * time.Millisecond}, batched.handler("m"))

	testenv.WaitFor(t, 30*time.Second, "the one-event group to handle all but the refused event", func() bool { return single.distinct() == len(ids)-1 })
	testenv.WaitFor(t, 30*time.Second, "the batched group to handle every event", func() bool { return batched.distinct() == len(ids) })
	dlq, err := js.Stream(ctx, events.DeadLetterStream)
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "one dead letter", func() bool {
		info, err := dlq.Info(ctx)
		return err == nil && info.State.Msgs == 1
	})
	m, err := dlq.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if m.Subject != "dead.single.bad_target" {
		t.Errorf("dead letter on %s, want dead.single.bad_target", m.Subject)
	}
	if !refusedOnce.Load() {
		t.Error("the batched group never saw the event in a batch of more than one")
	}
}

// A partition consumer deleted under its owner is created again, and its
// first delivery (consumer sequence 1) is not a gap: the owner takes the
// new consumer's delivered count as its baseline, as at an acquire.
// Before, it kept the old consumer's, counted a gap
// (snip_reader_delivery_gaps_total) and reset the consumer for nothing.
func TestAConsumerCreatedAgainUnderItsOwnerIsNoGap(t *testing.T) {
	t.Parallel()
	n, js := setup(t, 1)
	first := publish(t, js, 2, 10, 0) // 20 events, one partition
	rec := newRecorder()
	reg := prometheus.NewRegistry()
	startMember(t, n, reader.Config{Group: "again", Member: "m", BatchSize: 10, Metrics: reg}, rec.handler("m"))
	testenv.WaitFor(t, 30*time.Second, "the first events handled", func() bool { return rec.distinct() == len(first) })
	name := topology.GroupConsumerName("again", 0)
	testenv.WaitFor(t, 30*time.Second, "the first events acked", func() bool {
		c, err := js.Consumer(t.Context(), events.ClicksStream, name)
		return err == nil && c.CachedInfo().AckFloor.Stream == uint64(len(first))
	})
	if err := js.DeleteConsumer(t.Context(), events.ClicksStream, name); err != nil {
		t.Fatal(err)
	}
	more := publish(t, js, 1, 5, 10)
	testenv.WaitFor(t, 30*time.Second, "the events after the delete handled", func() bool { return rec.distinct() == len(first)+len(more) })
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "snip_reader_delivery_gaps_total" {
			if v := mf.GetMetric()[0].GetCounter().GetValue(); v != 0 {
				t.Errorf("delivery gaps counted: %v, want 0 (the consumer created again delivers from its sequence 1)", v)
			}
		}
	}
}

// A partition whose consumer is deleted under its owner, and whose first
// try to create it again fails (here the server refuses the member the
// consumer create API; in the wild, a create racing the server's own
// delete was answered "consumer does not exist"), is created again by a
// later try, and the partition goes on. Before, the worker tried once,
// logged the failure and went on fetching from the consumer deleted, whose
// pulls never again said it was gone: the partition handled nothing more
// until it was taken away from the member.
func TestAConsumerThatFailsToBeCreatedAgainIsTriedAgain(t *testing.T) {
	t.Parallel()
	s := newAckRefusingServer(t, 1)
	first := publish(t, s.js, 2, 10, 0) // 20 events, one partition
	rec := newRecorder()
	s.member(t, reader.Config{Group: "again", Member: "m", BatchSize: 10, MaxRetryDelay: 200 * time.Millisecond}, rec.handler("m"))
	name := topology.GroupConsumerName("again", 0)
	testenv.WaitFor(t, 30*time.Second, "the first events handled and acked", func() bool {
		c, err := s.js.Consumer(t.Context(), events.ClicksStream, name)
		return err == nil && c.CachedInfo().AckFloor.Stream == uint64(len(first)) && rec.distinct() == len(first)
	})
	create := "$JS.API.CONSUMER.CREATE." + events.ClicksStream + ".>"
	s.refuse(t, create)
	if err := s.js.DeleteConsumer(t.Context(), events.ClicksStream, name); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the owner's try to create the consumer again refused", func() bool {
		return s.log.of("$JS.API.CONSUMER.CREATE."+events.ClicksStream) > 0
	})
	s.refuse(t)
	more := publish(t, s.js, 1, 5, 10)
	testenv.WaitFor(t, 30*time.Second, "the events after the delete handled", func() bool { return rec.distinct() == len(first)+len(more) })
}

// A member that leaves gracefully gives its partition up at once (its lease
// goes, the others see it go, long before its lease would have lapsed),
// and its lease leaves nothing behind in the members bucket once the
// lease's TTL has passed: every member has a name of its own (host, PID,
// random), so whatever each leave left would pile up for good, one record
// per restart, and every member's watch of the group would read them all.
func TestALeaveGivesUpThePartitionAtOnceAndLeavesNoRecord(t *testing.T) {
	t.Parallel()
	n, js := setup(t, 1)
	rec := newRecorder()
	const ttl = 5 * time.Second
	leaver := startMember(t, n, rec.track(reader.Config{Group: "g", Member: "leaver", LeaseTTL: ttl}), rec.handler("leaver"))
	testenv.WaitFor(t, 30*time.Second, "the leaver owns the partition", func() bool { return rec.ownersNow(1)[0] == "leaver" })
	startMember(t, n, rec.track(reader.Config{Group: "g", Member: "stayer", LeaseTTL: ttl}), rec.handler("stayer"))
	testenv.WaitFor(t, 30*time.Second, "the stayer has joined", func() bool {
		ls, err := reader.Members(t.Context(), js, "g")
		return err == nil && len(ls) == 2
	})

	left := time.Now()
	leaver.stop(t)
	testenv.WaitFor(t, 30*time.Second, "the stayer owns the partition", func() bool { return rec.ownersNow(1)[0] == "stayer" })
	if took := time.Since(left); took >= ttl {
		t.Errorf("the partition moved %s after the leave, not before the leaver's lease (%s) would have lapsed", took, ttl)
	}

	kvs, err := js.Stream(t.Context(), "KV_"+topology.MembersBucket)
	if err != nil {
		t.Fatal(err)
	}
	subject := "$KV." + topology.MembersBucket + ".g.members.leaver"
	testenv.WaitFor(t, ttl+10*time.Second, "nothing left of the leaver's lease in the bucket", func() bool {
		_, err := kvs.GetLastMsgForSubject(t.Context(), subject)
		return errors.Is(err, jetstream.ErrMsgNotFound)
	})
	if ls, err := reader.Members(t.Context(), js, "g"); err != nil || len(ls) != 1 || ls[0].Member != "stayer" {
		t.Fatalf("members after the leave: %v, %v; want the stayer alone", ls, err)
	}
}
