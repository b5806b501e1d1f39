package jsfeed_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/failure"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/clickcounter/internal/counter"
	"github.com/snipdev/snip/services/clickcounter/internal/jsfeed"
)

func setup(tb testing.TB) jetstream.JetStream {
	tb.Helper()
	js := testenv.StartNATS(tb).JetStream(tb)
	o := topology.Defaults()
	o.Storage = jetstream.MemoryStorage
	o.Partitions = 4
	if err := topology.Apply(tb.Context(), js, o); err != nil {
		tb.Fatal(err)
	}
	if err := topology.ApplyClickCounter(tb.Context(), js); err != nil {
		tb.Fatal(err)
	}
	return js
}

// run runs a LINKS feed with h until the test ends; stop ends it earlier
// and waits for Run to return.
func run(tb testing.TB, js jetstream.JetStream, h jsfeed.HandleFunc, opts ...func(*jsfeed.Feed)) (stop func()) {
	tb.Helper()
	stop, _ = runMetered(tb, js, h, opts...)
	return stop
}

// runMetered is run, and returns the registry of the feed's metrics.
func runMetered(tb testing.TB, js jetstream.JetStream, h jsfeed.HandleFunc, opts ...func(*jsfeed.Feed)) (stop func(), reg *prometheus.Registry) {
	tb.Helper()
	reg = prometheus.NewRegistry()
	m, err := jsfeed.NewMetrics(reg)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := jsfeed.Feed{Name: "links", Stream: events.LinksStream, Consumer: topology.ClickCounterLinksConsumer,
		Source: "click-counter", Handle: h, MaxRetryDelay: 100 * time.Millisecond, DrainTimeout: 20 * time.Second}
	for _, o := range opts {
		o(&f)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := f.Run(ctx, js, m); err != nil {
			tb.Errorf("feed: %v", err)
		}
	})
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	tb.Cleanup(stop)
	return stop, reg
}

// feedMetric returns the value of the feed metric name for the LINKS feed
// (-1 when it has no such series).
func feedMetric(tb testing.TB, reg *prometheus.Registry, name string) float64 {
	tb.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "feed" && l.GetValue() == "links" {
					if m.GetGauge() != nil {
						return m.GetGauge().GetValue()
					}
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return -1
}

// logLines is a slog destination a test reads back.
type logLines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// count returns how many lines were logged at level with message msg.
func (l *logLines) count(tb testing.TB, level slog.Level, msg string) int {
	tb.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for line := range strings.Lines(l.buf.String()) {
		var rec struct{ Level, Msg string }
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			tb.Fatalf("log line %q: %v", line, err)
		}
		if rec.Level == level.String() && rec.Msg == msg {
			n++
		}
	}
	return n
}

// consumerState returns the LINKS consumer's delivered-but-unacked count
// and ack floor.
func consumerState(tb testing.TB, js jetstream.JetStream) (pending int, floor uint64) {
	tb.Helper()
	c, err := js.Consumer(tb.Context(), events.LinksStream, topology.ClickCounterLinksConsumer)
	if err != nil {
		tb.Fatal(err)
	}
	info, err := c.Info(tb.Context())
	if err != nil {
		tb.Fatal(err)
	}
	return info.NumAckPending, info.AckFloor.Stream
}

// gate holds every handler call until it is opened, and records the
// batches it sees.
type gate struct {
	open chan struct{}
	once sync.Once

	mu      sync.Mutex
	held    []int // sizes of the batches waiting at the gate, or let through
	batches []int // sizes of the batches handled
	seqs    map[uint64]int
}

func newGate() *gate { return &gate{open: make(chan struct{}), seqs: map[uint64]int{}} }

// release opens the gate (again: a no-op).
func (g *gate) release() { g.once.Do(func() { close(g.open) }) }

func (g *gate) handle(_ context.Context, msgs []jsfeed.Msg) []error {
	g.mu.Lock()
	g.held = append(g.held, len(msgs))
	g.mu.Unlock()
	<-g.open
	g.mu.Lock()
	defer g.mu.Unlock()
	g.batches = append(g.batches, len(msgs))
	for _, m := range msgs {
		g.seqs[m.Seq]++
	}
	return make([]error, len(msgs))
}

func publishLink(tb testing.TB, js jetstream.JetStream, code string, payload []byte) {
	tb.Helper()
	if payload == nil {
		e := events.LinkEvent{V: events.LinkVersion, ID: events.NewID(), Kind: events.LinkCreated, Time: time.Now(), Code: code, Owner: "acme"}
		payload, _ = json.Marshal(e)
	}
	if _, err := js.Publish(tb.Context(), events.LinkSubject(events.LinkCreated, code), payload); err != nil {
		tb.Fatal(err)
	}
}

func TestFeedRetriesTransientErrorsAndParksPoison(t *testing.T) {
	t.Parallel()
	js := setup(t)
	var mu sync.Mutex
	got := map[string]int{}
	var fails atomic.Int32
	fails.Store(2)
	run(t, js, jsfeed.Links(func(_ context.Context, es []counter.LinkEvent) error {
		for _, e := range es {
			if e.E.Code == "flaky" && fails.Add(-1) >= 0 {
				return errors.New("redis: connection refused")
			}
		}
		mu.Lock()
		for _, e := range es {
			got[e.E.Code]++
		}
		mu.Unlock()
		return nil
	}))
	publishLink(t, js, "ok", nil)
	publishLink(t, js, "flaky", nil)
	publishLink(t, js, "bad", []byte(`{"v":1,"id":"nope"}`))
	publishLink(t, js, "future", []byte(`{"v":9}`))
	testenv.WaitFor(t, 20*time.Second, "both good events handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return got["ok"] == 1 && got["flaky"] == 1
	})
	dl, err := js.Stream(t.Context(), events.DeadLetterStream)
	if err != nil {
		t.Fatal(err)
	}
	for reason, want := range map[string]string{reader.ReasonMalformed: "3", reader.ReasonUnknownVersion: "4"} {
		var msg *jetstream.RawStreamMsg
		testenv.WaitFor(t, 20*time.Second, "a parked "+reason+" event", func() bool {
			msg, err = dl.GetLastMsgForSubject(t.Context(), events.DeadLetterSubject("click-counter", reason))
			return err == nil
		})
		if msg.Header.Get(events.HeaderDeadSeq) != want || msg.Header.Get(events.HeaderDeadSource) != events.LinksStream ||
			msg.Header.Get(events.HeaderDeadReason) != reason {
			t.Errorf("parked %s: headers %v, want seq %s from LINKS", reason, msg.Header, want)
		}
	}
	c, err := js.Consumer(t.Context(), events.LinksStream, topology.ClickCounterLinksConsumer)
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 20*time.Second, "every LINKS event acked", func() bool {
		info, err := c.Info(t.Context())
		return err == nil && info.AckFloor.Stream == 4 && info.NumAckPending == 0
	})
}

func TestClicksFirstSeq(t *testing.T) {
	t.Parallel()
	js := setup(t)
	clicks := jsfeed.Clicks{JS: js}
	first, err := clicks.FirstSeq(t.Context(), 0)
	if err != nil || first != 0 {
		t.Fatalf("empty partition: FirstSeq = %d, %v; want 0", first, err)
	}
	want := map[int]uint64{}
	for i := range 20 {
		code := "c" + string(rune('a'+i))
		ack, err := js.Publish(t.Context(), events.ClickSubject("acme", code), []byte(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		if p := events.Partition(code, 4); want[p] == 0 {
			want[p] = ack.Sequence
		}
	}
	for p, seq := range want {
		got, err := clicks.FirstSeq(t.Context(), p)
		if err != nil || got != seq {
			t.Errorf("partition %d: FirstSeq = %d, %v; want %d", p, got, err, seq)
		}
	}
}

// NextSeq finds a partition's first event at or after a sequence, past the
// other partitions' events in between.
func TestClicksNextSeq(t *testing.T) {
	t.Parallel()
	js := setup(t)
	clicks := jsfeed.Clicks{JS: js}
	if got, err := clicks.NextSeq(t.Context(), 0, 1); err != nil || got != 0 {
		t.Fatalf("empty stream: NextSeq = %d, %v; want 0", got, err)
	}
	const p = 2
	var inP []uint64 // sequences of partition p's events
	for i := range 40 {
		code := "s" + strconv.Itoa(i)
		ack, err := js.Publish(t.Context(), events.ClickSubject("acme", code), []byte(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		if events.Partition(code, 4) == p {
			inP = append(inP, ack.Sequence)
		}
	}
	if len(inP) < 3 || inP[1] == inP[0]+1 {
		t.Fatalf("partition %d's sequences %v: want three or more, the first two apart", p, inP)
	}
	for _, tc := range []struct {
		from, want uint64
	}{
		{1, inP[0]},
		{inP[0], inP[0]},
		{inP[0] + 1, inP[1]},
		{inP[len(inP)-1], inP[len(inP)-1]},
		{inP[len(inP)-1] + 1, 0},
	} {
		if got, err := clicks.NextSeq(t.Context(), p, tc.from); err != nil || got != tc.want {
			t.Errorf("NextSeq(%d, %d) = %d, %v; want %d", p, tc.from, got, err, tc.want)
		}
	}
}

// Messages come in batches, and a message is acked only after its batch
// was handled: while the handler works, everything delivered stays pending.
func TestFeedAcksABatchOnlyAfterItIsHandled(t *testing.T) {
	t.Parallel()
	js := setup(t)
	const n = 40
	for i := range n {
		publishLink(t, js, "c"+strconv.Itoa(i), nil)
	}
	g := newGate()
	run(t, js, g.handle)
	t.Cleanup(g.release)
	testenv.WaitFor(t, 20*time.Second, "every message delivered", func() bool {
		pending, _ := consumerState(t, js)
		return pending == n
	})
	if _, floor := consumerState(t, js); floor != 0 {
		t.Fatalf("ack floor %d while the handler holds the batch, want 0", floor)
	}
	g.release()
	testenv.WaitFor(t, 20*time.Second, "every message acked", func() bool {
		pending, floor := consumerState(t, js)
		return pending == 0 && floor == n
	})
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.seqs) != n || slices.Max(g.batches) < 2 || slices.Max(g.batches) > jsfeed.DefaultBatchSize {
		t.Errorf("handled %d distinct messages in batches %v; want %d in batches of 2..%d", len(g.seqs), g.batches, n, jsfeed.DefaultBatchSize)
	}
	for seq, k := range g.seqs {
		if k != 1 {
			t.Errorf("message %d handled %d times", seq, k)
		}
	}
}

// Each message of a batch is settled by its own result: acked, parked, or
// redelivered later (and then handled).
func TestFeedSettlesEachMessageOfABatch(t *testing.T) {
	t.Parallel()
	js := setup(t)
	for _, code := range []string{"ok1", "poison", "flaky", "ok2"} {
		publishLink(t, js, code, []byte(code))
	}
	var mu sync.Mutex
	handled := map[string]int{}
	var flakyFailed atomic.Bool
	run(t, js, func(_ context.Context, msgs []jsfeed.Msg) []error {
		mu.Lock()
		defer mu.Unlock()
		errs := make([]error, len(msgs))
		for i, m := range msgs {
			switch string(m.Data) {
			case "poison":
				errs[i] = fmt.Errorf("decode: %w", events.ErrMalformed)
				continue
			case "flaky":
				if flakyFailed.CompareAndSwap(false, true) {
					errs[i] = errors.New("redis: i/o timeout")
					continue
				}
			}
			handled[string(m.Data)]++
		}
		return errs
	})
	testenv.WaitFor(t, 20*time.Second, "every message settled", func() bool {
		pending, floor := consumerState(t, js)
		return pending == 0 && floor == 4
	})
	mu.Lock()
	if d := cmp.Diff(map[string]int{"ok1": 1, "flaky": 1, "ok2": 1}, handled); d != "" {
		t.Errorf("handled (-want +got):\n%s", d)
	}
	mu.Unlock()
	dl, err := js.Stream(t.Context(), events.DeadLetterStream)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := dl.GetLastMsgForSubject(t.Context(), events.DeadLetterSubject("click-counter", reader.ReasonMalformed))
	if err != nil || msg.Header.Get(events.HeaderDeadSeq) != "2" || string(msg.Data) != "poison" {
		t.Fatalf("parked message: %v, %v; want LINKS seq 2", msg, err)
	}
}

// A graceful stop handles and acks what the feed holds: the batches in
// hand and those already received but not yet handed out.
func TestFeedStopHandlesWhatItReceived(t *testing.T) {
	t.Parallel()
	js := setup(t)
	const n, batch = 40, 5
	for i := range n {
		publishLink(t, js, "c"+strconv.Itoa(i), nil)
	}
	g := newGate()
	stop := run(t, js, g.handle, func(f *jsfeed.Feed) { f.BatchSize = batch })
	t.Cleanup(g.release) // before stop: a failed test must not leave the handler blocked
	// Both workers hold a batch, and more was delivered: it waits in the
	// feed (a batch being collected, or the prefetch buffer).
	testenv.WaitFor(t, 20*time.Second, "more messages delivered than the workers hold", func() bool {
		g.mu.Lock()
		held := slices.Clone(g.held)
		g.mu.Unlock()
		pending, _ := consumerState(t, js)
		return len(held) == jsfeed.DefaultWorkers && pending > held[0]+held[1]
	})
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	g.release()
	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		t.Fatal("the feed did not stop")
	}
	// Acks are sent without waiting for the server; give them time to land.
	var floor uint64
	testenv.WaitFor(t, 20*time.Second, "every received message acked", func() bool {
		var pending int
		pending, floor = consumerState(t, js)
		return pending == 0
	})
	g.mu.Lock()
	defer g.mu.Unlock()
	if held := g.held[0] + g.held[1]; floor <= uint64(held) || uint64(len(g.seqs)) != floor {
		t.Errorf("acked up to %d, handled %d messages; want the same, above the %d the workers held", floor, len(g.seqs), held)
	}
}

// An instance killed while it holds a batch (kill -9: no ack, no nak)
// leaves the messages to the others within the consumer's short AckWait,
// not after the 30 s it used to be.
func TestMessagesHeldByAKilledInstanceComeBackWithinTheAckWait(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t)
	js := n.JetStream(t)
	o := topology.Defaults()
	o.Storage, o.Partitions = jetstream.MemoryStorage, 4
	if err := topology.Apply(t.Context(), js, o); err != nil {
		t.Fatal(err)
	}
	if err := topology.ApplyClickCounter(t.Context(), js); err != nil {
		t.Fatal(err)
	}
	for i := range 30 {
		publishLink(t, js, fmt.Sprintf("k%d", i), nil)
	}
	doomedNC := n.Connect(t)
	doomedJS, err := jetstream.New(doomedNC)
	if err != nil {
		t.Fatal(err)
	}
	held := newGate()
	defer held.release() // after the test: lets the doomed handler return
	run(t, doomedJS, held.handle)
	testenv.WaitFor(t, 10*time.Second, "the doomed instance to hold a batch", func() bool {
		held.mu.Lock()
		defer held.mu.Unlock()
		return len(held.held) > 0
	})
	doomedNC.Close() // kill -9: the connection goes, nothing is acked or naked
	killed := time.Now()

	survivor := newGate()
	survivor.release()
	run(t, js, survivor.handle)
	testenv.WaitFor(t, 3*topology.FeedAckWait+5*time.Second, "the survivor to handle all 30", func() bool {
		survivor.mu.Lock()
		defer survivor.mu.Unlock()
		return len(survivor.seqs) == 30
	})
	took := time.Since(killed)
	t.Logf("the killed instance's messages handled %s after the kill (AckWait %s)", took.Round(10*time.Millisecond), topology.FeedAckWait)
	if bound := topology.FeedAckWait + 2*time.Second; took > bound {
		t.Errorf("took %s, want within the AckWait plus a fetch (%s)", took, bound)
	}
}

// A batch held longer than the AckWait by a live instance (a slow Redis) is
// marked in progress, so it is not redelivered meanwhile: each message is
// handled once.
func TestASlowBatchIsKeptInProgressNotRedelivered(t *testing.T) {
	t.Parallel()
	js := setup(t)
	for i := range 10 {
		publishLink(t, js, fmt.Sprintf("s%d", i), nil)
	}
	g := newGate()
	stop := run(t, js, g.handle)
	run(t, js, g.handle) // another instance, free to take a redelivery
	testenv.WaitFor(t, 10*time.Second, "a batch held", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(g.held) > 0
	})
	// The fault: Redis answers this batch after twice the AckWait. The
	// fixed hold is the fault's definition, not a wait for a condition:
	// what is checked is that nothing is redelivered while the batch is
	// held past the AckWait, and only the time passing can show that
	// absence (a redelivery meanwhile would reach one of the two
	// instances and be handled twice after the release).
	<-time.After(2*topology.FeedAckWait + time.Second)
	g.mu.Lock()
	holders := len(g.held)
	g.mu.Unlock()
	g.release()
	testenv.WaitFor(t, 10*time.Second, "all 10 handled", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(g.seqs) == 10
	})
	stop()
	g.mu.Lock()
	defer g.mu.Unlock()
	for seq, n := range g.seqs {
		if n != 1 {
			t.Errorf("link event %d handled %d times, want once (held batches: %d)", seq, n, holders)
		}
	}
}

// An operator deleted the feed's consumer: the feed creates it again with
// its declared configuration, from the stream's start, and goes on: the
// event published after the deletion is handled, the one before it handed
// again (the counter finds it stale).
func TestADeletedConsumerIsCreatedAgainFromTheStart(t *testing.T) {
	t.Parallel()
	js := setup(t)
	publishLink(t, js, "before", nil)
	g := newGate()
	g.release()
	_, reg := runMetered(t, js, g.handle, func(f *jsfeed.Feed) { f.Declared = topology.ClickCounterLinksConsumerConfig() })
	testenv.WaitFor(t, 20*time.Second, "the first event handled and acked", func() bool {
		_, floor := consumerState(t, js)
		return floor == 1
	})
	if err := js.DeleteConsumer(t.Context(), events.LinksStream, topology.ClickCounterLinksConsumer); err != nil {
		t.Fatal(err)
	}
	publishLink(t, js, "after", nil)
	testenv.WaitFor(t, 20*time.Second, "the event published after the deletion handled", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.seqs[2] == 1
	})
	g.mu.Lock()
	if d := cmp.Diff(map[uint64]int{1: 2, 2: 1}, g.seqs); d != "" {
		t.Errorf("times each LINKS sequence was handled (-want +got):\n%s", d)
	}
	g.mu.Unlock()
	c, err := js.Consumer(t.Context(), events.LinksStream, topology.ClickCounterLinksConsumer)
	if err != nil {
		t.Fatal(err)
	}
	want, have := topology.ClickCounterLinksConsumerConfig(), c.CachedInfo().Config
	if have.DeliverPolicy != want.DeliverPolicy || have.FilterSubject != want.FilterSubject || have.AckPolicy != want.AckPolicy ||
		have.AckWait != want.AckWait || have.MaxDeliver != want.MaxDeliver || have.MaxAckPending != want.MaxAckPending || have.Description != want.Description {
		t.Errorf("created consumer %+v; want the declared %+v", have, want)
	}
	testenv.WaitFor(t, 10*time.Second, "the feed up again", func() bool {
		return feedMetric(t, reg, "snip_clickcounter_feed_up") == 1
	})
	if n := feedMetric(t, reg, "snip_clickcounter_feed_consumer_created_total"); n != 1 {
		t.Errorf("snip_clickcounter_feed_consumer_created_total = %v, want 1", n)
	}
}

// The consumer a feed creates again starts from the stream's start, not
// just past the last sequence the counter applied: the consumers are shared
// and their messages handled out of order, so a message below that one may
// still wait for its redelivery (it failed; or the instance holding it died)
// when the consumer is deleted, and the redelivery dies with the consumer.
// Here LINKS seq 2 fails and waits while seq 3 is applied; the consumer is
// deleted then, and the one created again must hand seq 2 over.
func TestAMessageAwaitingRedeliveryIsHandledByTheConsumerCreatedAgain(t *testing.T) {
	t.Parallel()
	js := setup(t)
	for _, code := range []string{"a", "flaky", "c"} {
		publishLink(t, js, code, []byte(code))
	}
	var mu sync.Mutex
	handled := map[uint64]int{}
	var deleted atomic.Bool
	run(t, js, func(_ context.Context, msgs []jsfeed.Msg) []error {
		mu.Lock()
		defer mu.Unlock()
		errs := make([]error, len(msgs))
		for i, m := range msgs {
			if string(m.Data) == "flaky" && !deleted.Load() {
				// Redelivered by the deleted consumer only long after the test.
				errs[i] = failure.RetryableAfter("redis_down", time.Hour, errors.New("redis: i/o timeout"))
				continue
			}
			handled[m.Seq]++
		}
		return errs
	}, func(f *jsfeed.Feed) { f.Declared = topology.ClickCounterLinksConsumerConfig() })
	testenv.WaitFor(t, 20*time.Second, "seq 3 applied while seq 2 waits for its redelivery", func() bool {
		mu.Lock()
		applied := handled[3] == 1
		mu.Unlock()
		pending, floor := consumerState(t, js)
		return applied && pending == 1 && floor == 1
	})
	if err := js.DeleteConsumer(t.Context(), events.LinksStream, topology.ClickCounterLinksConsumer); err != nil {
		t.Fatal(err)
	}
	deleted.Store(true)
	publishLink(t, js, "after", []byte("after"))
	testenv.WaitFor(t, 20*time.Second, "the consumer created again has settled every LINKS event", func() bool {
		c, err := js.Consumer(t.Context(), events.LinksStream, topology.ClickCounterLinksConsumer)
		if err != nil {
			return false
		}
		info, err := c.Info(t.Context())
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0 && info.AckFloor.Stream == 4
	})
	mu.Lock()
	defer mu.Unlock()
	if d := cmp.Diff(map[uint64]int{1: 2, 2: 1, 3: 2, 4: 1}, handled); d != "" {
		t.Errorf("times each LINKS sequence was handled (-want +got):\n%s", d)
	}
}

// A feed that cannot fetch (its consumer gone, and no declared
// configuration to create it again with, as under a NATS user that may not)
// says so: the up gauge at 0, every failure counted, one Warn line rather
// than one per retry; and it recovers, saying so, once the consumer is back.
func TestAFeedThatCannotFetchSaysSo(t *testing.T) {
	t.Parallel()
	js := setup(t)
	logs := &logLines{}
	g := newGate()
	g.release()
	_, reg := runMetered(t, js, g.handle, func(f *jsfeed.Feed) {
		f.Log = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	testenv.WaitFor(t, 20*time.Second, "the feed up", func() bool {
		return feedMetric(t, reg, "snip_clickcounter_feed_up") == 1
	})
	if err := js.DeleteConsumer(t.Context(), events.LinksStream, topology.ClickCounterLinksConsumer); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 20*time.Second, "five failed fetches counted", func() bool {
		return feedMetric(t, reg, "snip_clickcounter_feed_fetch_errors_total") >= 5
	})
	if up := feedMetric(t, reg, "snip_clickcounter_feed_up"); up != 0 {
		t.Errorf("snip_clickcounter_feed_up = %v while the consumer is gone, want 0", up)
	}
	if n := logs.count(t, slog.LevelWarn, "feed cannot fetch; retrying"); n != 1 {
		t.Errorf("%d Warn lines for five failures within a minute, want 1", n)
	}
	if err := topology.ApplyClickCounter(t.Context(), js); err != nil {
		t.Fatal(err)
	}
	publishLink(t, js, "back", nil)
	testenv.WaitFor(t, 20*time.Second, "the event published once the consumer was back handled", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.seqs[1] == 1
	})
	testenv.WaitFor(t, 10*time.Second, "the feed up again, and saying so", func() bool {
		return feedMetric(t, reg, "snip_clickcounter_feed_up") == 1 && logs.count(t, slog.LevelInfo, "feed fetching again") == 1
	})
	if n := feedMetric(t, reg, "snip_clickcounter_feed_consumer_created_total"); n != 0 {
		t.Errorf("snip_clickcounter_feed_consumer_created_total = %v without a declared configuration, want 0", n)
	}
}
