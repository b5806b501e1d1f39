package fraud_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/fraud/internal/fraud"
	"github.com/snipdev/snip/services/fraud/internal/redisstore"
	"github.com/snipdev/snip/services/fraud/internal/traffic"
)

// runMember runs rd as a member of fraud detection's group on its own
// connection, with h as the handler, until the test ends or crash is called.
// opts change the member's configuration.
func (w *world) runMember(t *testing.T, name string, rd *fraud.Reader, h reader.Handler, onRewind func(context.Context, int, reader.RewindInfo) error, opts ...func(*reader.Config)) (crash func()) {
	t.Helper()
	nc, err := nats.Connect(w.url, append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond)}, w.memberOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	cfg := reader.Config{
		Group: topology.GroupFraudDetection, Member: name, BatchSize: 5, LeaseTTL: time.Second, DrainTimeout: time.Second,
		OnAssign: rd.OnAssign, OnRevoke: rd.OnRevoke, OnRewind: onRewind,
	}
	for _, o := range opts {
		o(&cfg)
	}
	go func() { done <- reader.Run(ctx, js, cfg, h) }()
	var once sync.Once
	crash = func() {
		once.Do(func() {
			nc.Close() // no ack, no unpin, no goodbye: a process that died
			cancel()
			<-done
		})
	}
	t.Cleanup(crash)
	return crash
}

// gathered returns a counter's value summed over its series (0: none yet).
func gathered(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// TestATakeoverDuringAReplayJudgesTheRestOfIt: the group judged a burst
// (30 clicks of one visitor, 1..30 in one partition: visitor_burst alerts at
// the 21st and labels every click), then is replayed from the start. The
// owner judges the replay's first batch (1..5) again and dies holding the
// second. Redis's mark is 30, the first pass's, ahead of the new owner's
// resume point (6): not a batch the dead owner stored and did not ack, but
// the replay's first pass. The new owner goes on with the replay: it judges
// 6..30 again and raises the burst's alert and labels again (FRAUD drops
// them as duplicates). Taken for a stored but unacked batch, 6..30 were fed
// without a decision and the rest of the replay judged nothing.
func TestATakeoverDuringAReplayJudgesTheRestOfIt(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := t.Context()
	p, evs := w.hotBurst(t)
	last := evs[len(evs)-1].Seq
	if len(evs) != 30 || last != 30 {
		t.Fatalf("the burst is %d events up to %d, want 30 up to 30", len(evs), last)
	}

	first := w.reader(t, fraud.Defaults(), nil)
	var rewound atomic.Bool
	var replayBatches atomic.Int32
	holding := make(chan struct{})
	var hold sync.Once
	crash := w.runMember(t, "first", first, func(ctx context.Context, part int, batch []reader.Event) error {
		if part == p && rewound.Load() && replayBatches.Add(1) > 1 {
			// The replay's second batch: the member dies holding it.
			hold.Do(func() { close(holding) })
			<-ctx.Done()
			return ctx.Err()
		}
		return first.Handle(ctx, part, batch)
	}, func(ctx context.Context, part int, ri reader.RewindInfo) error {
		err := first.OnRewind(ctx, part, ri)
		if err == nil && part == p {
			rewound.Store(true)
		}
		return err
	})
	testenv.WaitFor(t, 30*time.Second, "the first pass to be stored", func() bool {
		mark, err := w.store.HighWater(ctx, p)
		return err == nil && mark == last
	})
	alerts := w.fraudMsgs(t, "fraud.alerts.>")
	if len(alerts) != 1 {
		t.Fatalf("the first pass raised %v, want one alert", alerts)
	}

	if _, err := reader.Rewind(ctx, w.js, topology.GroupFraudDetection, reader.FromSeq(1)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-holding:
	case <-time.After(30 * time.Second):
		t.Fatal("the owner never took the replay's second batch")
	}
	crash()

	reg := prometheus.NewRegistry()
	next := w.reader(t, fraud.Defaults(), fraud.NewMetrics(reg))
	w.runMember(t, "next", next, next.Handle, next.OnRewind)
	name := topology.GroupConsumerName(topology.GroupFraudDetection, p)
	testenv.WaitFor(t, 60*time.Second, "the new owner to reach the end of the replay", func() bool {
		c, err := w.js.Consumer(ctx, events.ClicksStream, name)
		return err == nil && c.CachedInfo().AckFloor.Stream == last
	})

	if got := gathered(t, reg, "snip_fraud_events_judged_total"); got != 25 {
		t.Errorf("the new owner judged %v events, want 25 (the replay's 6..30)", got)
	}
	if got := gathered(t, reg, "snip_fraud_alerts_total"); got != 1 {
		t.Errorf("the new owner raised %v alerts, want the burst's one again", got)
	}
	if got := gathered(t, reg, "snip_fraud_verdicts_total"); got != 30 {
		t.Errorf("the new owner published %v labels, want the burst's 30 again", got)
	}
	if got := gathered(t, reg, "snip_fraud_events_behind_total"); got != 0 {
		t.Errorf("snip_fraud_events_behind_total = %v, want 0", got)
	}
	if got := w.fraudMsgs(t, "fraud.alerts.>"); len(got) != 1 || got[firstKey(alerts)] != 1 {
		t.Errorf("alerts on FRAUD after the replay = %v, want %v", got, alerts)
	}
	st, err := w.store.LinkStats(ctx, "hot")
	if err != nil || st.Total != 30 || st.Flagged != 30 {
		t.Errorf("stats = %+v, %v; want 30 of 30 flagged, as before the replay", st, err)
	}
}

func firstKey(m map[string]int) string {
	for k := range m {
		return k
	}
	return ""
}

// lostAck is a member that judged a burst (1..30 in one partition, in
// batches of 5) and whose ack of its last batch never reached the server
// (its NATS user may not ack then, as an ack lost in a NATS hiccup would
// be): the consumer's ack floor is the batch before it, the state's last
// judged event 30.
type lostAck struct {
	js   jetstream.JetStream
	p    int
	reg  *prometheus.Registry
	cons jetstream.Consumer

	mu      sync.Mutex
	rewound bool     // OnRewind was called for p
	again   []uint64 // what p was handed after OnRewind
	told    reader.RewindInfo
}

func newLostAck(t *testing.T) *lostAck {
	t.Helper()
	la := &lostAck{p: events.Partition("hot", parts), reg: prometheus.NewRegistry()}
	acks := "$JS.ACK." + events.ClicksStream + "." + topology.GroupConsumerName(topology.GroupFraudDetection, la.p) + "."
	opts := testenv.NATSOptions(server.RANDOM_PORT, filepath.Join(t.TempDir(), "jetstream"))
	users := func(deny ...string) []*server.User {
		return []*server.User{
			{Username: "admin", Password: "admin"},
			{Username: "member", Password: "member", Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: deny},
			}},
		}
	}
	opts.Users = users()
	srv, err := testenv.RunNATSServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	refusals := &violations{}
	srv.SetLoggerV2(refusals, false, false, false)
	url := "nats://" + srv.Addr().String()
	nc, err := nats.Connect(url, nats.UserInfo("admin", "admin"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	la.js, _ = jetstream.New(nc)
	o := topology.Defaults()
	o.Partitions = parts
	if err := topology.Apply(t.Context(), la.js, o); err != nil {
		t.Fatal(err)
	}
	rdb, _ := servers.Redis.NewDB(t)
	w := &world{url: url, memberOpts: []nats.Option{nats.UserInfo("member", "member")}, nc: nc, js: la.js, rdb: rdb, store: redisstore.New(rdb, parts, 100)}
	if hot, evs := w.hotBurst(t); hot != la.p || len(evs) != 30 || evs[29].Seq != 30 {
		t.Fatalf("the burst is %d events of partition %d, want 1..30 of %d", len(evs), hot, la.p)
	}

	rd := w.reader(t, fraud.Defaults(), fraud.NewMetrics(la.reg))
	var lostFirst uint64 // the first event of the batch whose ack is lost
	w.runMember(t, "m", rd, func(ctx context.Context, part int, b []reader.Event) error {
		la.mu.Lock()
		if part == la.p && la.rewound {
			for _, ev := range b {
				la.again = append(la.again, ev.Seq)
			}
		}
		if part == la.p && b[len(b)-1].Seq == 30 && lostFirst == 0 {
			// The batch's ack is refused from now on.
			lostFirst = b[0].Seq
			o := opts
			o.Users = users(acks + ">")
			if err := srv.ReloadOptions(&o); err != nil {
				t.Error(err)
			}
		}
		la.mu.Unlock()
		return rd.Handle(ctx, part, b)
	}, func(ctx context.Context, part int, ri reader.RewindInfo) error {
		if part == la.p {
			la.mu.Lock()
			la.rewound, la.told = true, ri
			la.mu.Unlock()
		}
		return rd.OnRewind(ctx, part, ri)
	})
	testenv.WaitFor(t, 30*time.Second, "the server to refuse the last batch's ack", func() bool { return refusals.of(acks) > 0 })
	la.mu.Lock()
	first := lostFirst
	la.mu.Unlock()
	if first >= 30 {
		t.Fatalf("the last batch is %d..30, want two events or more", first)
	}
	o2 := opts
	o2.Users = users()
	if err := srv.ReloadOptions(&o2); err != nil {
		t.Fatal(err)
	}
	la.cons, err = la.js.Consumer(t.Context(), events.ClicksStream, topology.GroupConsumerName(topology.GroupFraudDetection, la.p))
	if err != nil {
		t.Fatal(err)
	}
	if info, err := la.cons.Info(t.Context()); err != nil || info.AckFloor.Stream != first-1 {
		t.Fatalf("ack floor %v (%v), want %d: the last batch's ack lost", info.AckFloor.Stream, err, first-1)
	}
	if got := gathered(t, la.reg, "snip_fraud_events_judged_total"); got != 30 {
		t.Fatalf("the first pass judged %v events, want 30", got)
	}
	return la
}

// rewind replays the group from seq, waits until the partition carried it
// out, then publishes one more click of the burst (31) and waits until the
// member has handled it: what it was handed after the rewind is all there.
func (la *lostAck) rewind(t *testing.T, seq uint64) {
	t.Helper()
	ctx := t.Context()
	id, err := reader.Rewind(ctx, la.js, topology.GroupFraudDetection, reader.FromSeq(seq))
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := reader.WaitRewind(wctx, la.js, topology.GroupFraudDetection, id); err != nil {
		t.Fatal(err)
	}
	if err := traffic.Publish(ctx, la.js, traffic.Burst(time.Now(), 1, 0, "hot", "acme", "bot"), 1); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the partition to handle 31", func() bool {
		info, err := la.cons.Info(ctx)
		return err == nil && info.AckFloor.Stream == 31
	})
}

// TestARewindPastALostAckJudgesWhatTheRuntimeHandsAgain: after the lost ack
// (lostAck), a replay from 30 reaches the partition. The runtime and the
// reader decide once, by the same position, that the partition moves back
// to 30: the state starts again at 30 and the runtime hands 30 again, which
// is judged again. Before, fraud went by the last event it judged (30:
// rebuild at 30) and the runtime by the ack floor (30 is past it: nothing to
// replay, back to the floor): the last batch was handed again from its
// first event, which the rebuilt state took for first deliveries behind its
// position, never to be judged (snip_fraud_events_behind_total).
func TestARewindPastALostAckJudgesWhatTheRuntimeHandsAgain(t *testing.T) {
	t.Parallel()
	la := newLostAck(t)
	la.rewind(t, 30)
	la.mu.Lock()
	defer la.mu.Unlock()
	if !la.told.MovesBack || la.told.From != 30 {
		t.Errorf("OnRewind was told %+v, want the partition moved back to 30", la.told)
	}
	if fmt.Sprint(la.again) != "[30 31]" {
		t.Errorf("after the rewind the member was handed %v, want [30 31]: the replay from 30, then 31", la.again)
	}
	if got := gathered(t, la.reg, "snip_fraud_events_judged_total"); got != 32 {
		t.Errorf("judged %v events, want 32: the first pass, 30 again and 31", got)
	}
	if got := gathered(t, la.reg, "snip_fraud_events_behind_total"); got != 0 {
		t.Errorf("snip_fraud_events_behind_total = %v, want 0", got)
	}
}

// TestARewindWithNothingToReplayAfterALostAckGoesOnAfterWhatWasHandled:
// after the lost ack (lostAck), a replay from 31, past everything stored,
// reaches the partition: nothing to replay, the state is kept, and the
// partition goes on after 30, the last event handled, as the state does.
// Before, the runtime went back to the ack floor: the last batch came again
// as first deliveries (a reset forgets deliveries), behind the kept state's
// position, never to be judged (snip_fraud_events_behind_total).
func TestARewindWithNothingToReplayAfterALostAckGoesOnAfterWhatWasHandled(t *testing.T) {
	t.Parallel()
	la := newLostAck(t)
	la.rewind(t, 31)
	la.mu.Lock()
	defer la.mu.Unlock()
	if la.told.MovesBack {
		t.Errorf("OnRewind was told %+v, want the partition left where it was", la.told)
	}
	if fmt.Sprint(la.again) != "[31]" {
		t.Errorf("after the rewind the member was handed %v, want [31]: nothing again", la.again)
	}
	if got := gathered(t, la.reg, "snip_fraud_events_judged_total"); got != 31 {
		t.Errorf("judged %v events, want 31: the first pass and 31", got)
	}
	if got := gathered(t, la.reg, "snip_fraud_events_behind_total"); got != 0 {
		t.Errorf("snip_fraud_events_behind_total = %v, want 0", got)
	}
}

// violations counts the publish violations a server logs, by subject.
type violations struct {
	mu   sync.Mutex
	logs []string
}

func (v *violations) of(subject string) int {
	v.mu.Lock()
	defer v.mu.Unlock()
	n := 0
	for _, l := range v.logs {
		if strings.Contains(l, "Publish Violation") && strings.Contains(l, subject) {
			n++
		}
	}
	return n
}

func (v *violations) Errorf(format string, a ...any) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.logs = append(v.logs, fmt.Sprintf(format, a...))
}

func (v *violations) Noticef(string, ...any) {}
func (v *violations) Warnf(string, ...any)   {}
func (v *violations) Fatalf(string, ...any)  {}
func (v *violations) Debugf(string, ...any)  {}
func (v *violations) Tracef(string, ...any)  {}

// TestAGroupCreatedAgainIsNotInTheMiddleOfTheOldGroupsReplay: the group
// judged a burst (1..30 in one partition, Redis's mark 30) and carried out
// a replay from the start; then its consumers are deleted and a member
// creates the group again, from the oldest event (FRAUD_START). Its
// takeover finds the mark (30) ahead of its resume point (1): the events up
// to it were judged, published and stored, so they are fed, not judged
// again. The old group's replay, which the partition's consumer before
// carried out and whose range holds the resume point, is not the new
// group's: before, it was taken for a replay in progress and the new group
// judged 1..30 again, publishing their labels again.
func TestAGroupCreatedAgainIsNotInTheMiddleOfTheOldGroupsReplay(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := t.Context()
	p, evs := w.hotBurst(t)
	last := evs[len(evs)-1].Seq
	if len(evs) != 30 || last != 30 {
		t.Fatalf("the burst is %d events up to %d, want 30 up to 30", len(evs), last)
	}
	name := topology.GroupConsumerName(topology.GroupFraudDetection, p)
	ackFloor := func() uint64 {
		c, err := w.js.Consumer(ctx, events.ClicksStream, name)
		if err != nil {
			return 0
		}
		return c.CachedInfo().AckFloor.Stream
	}

	first := w.reader(t, fraud.Defaults(), nil)
	crash := w.runMember(t, "first", first, first.Handle, first.OnRewind)
	testenv.WaitFor(t, 30*time.Second, "the first pass to be stored and acked", func() bool {
		mark, err := w.store.HighWater(ctx, p)
		return err == nil && mark == last && ackFloor() == last
	})
	id, err := reader.Rewind(ctx, w.js, topology.GroupFraudDetection, reader.FromSeq(1))
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := reader.WaitRewind(wctx, w.js, topology.GroupFraudDetection, id); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the replay to be handled", func() bool { return ackFloor() == last })
	crash()
	for part := range parts {
		if err := w.js.DeleteConsumer(ctx, events.ClicksStream, topology.GroupConsumerName(topology.GroupFraudDetection, part)); err != nil {
			t.Fatal(err)
		}
	}
	_, verdictsBefore := w.verdictLabels(t)

	reg := prometheus.NewRegistry()
	next := w.reader(t, fraud.Defaults(), fraud.NewMetrics(reg))
	w.runMember(t, "next", next, next.Handle, next.OnRewind)
	testenv.WaitFor(t, 60*time.Second, "the new group to reach the burst's end", func() bool { return ackFloor() == last })

	if got := gathered(t, reg, "snip_fraud_events_judged_total"); got != 0 {
		t.Errorf("the new group judged %v events, want 0 (1..30 judged and stored before, fed)", got)
	}
	if got := gathered(t, reg, "snip_fraud_verdicts_total"); got != 0 {
		t.Errorf("the new group published %v labels, want 0", got)
	}
	if _, verdicts := w.verdictLabels(t); verdicts != verdictsBefore {
		t.Errorf("verdict messages on FRAUD_VERDICTS: %d, want the %d before the group was created again", verdicts, verdictsBefore)
	}
	st, err := w.store.LinkStats(ctx, "hot")
	if err != nil || st.Total != 30 || st.Flagged != 30 {
		t.Errorf("stats = %+v, %v; want 30 of 30 flagged, as before", st, err)
	}
}

// TestAConsumerCreatedAgainIsNotCountedBehind: the group judged a burst
// (1..30 in one partition), then the partition's consumer is deleted (an
// operator's `nats consumer rm`, a topology reset) while its owner runs. The
// owner's runtime creates it again, from the oldest event (the group's
// start), and it hands 1..30 again as first deliveries. They were judged:
// the owner skips them without counting them behind its position
// (snip_fraud_events_behind_total, "should stay 0"), and judges the next
// click as usual. Before, every event the new consumer handed again was
// counted there, with a warning a batch.
func TestAConsumerCreatedAgainIsNotCountedBehind(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := t.Context()
	p, evs := w.hotBurst(t)
	if len(evs) != 30 || evs[29].Seq != 30 {
		t.Fatalf("the burst is %d events, want 1..30", len(evs))
	}
	name := topology.GroupConsumerName(topology.GroupFraudDetection, p)
	consumer := func() (jetstream.ConsumerInfo, bool) {
		c, err := w.js.Consumer(ctx, events.ClicksStream, name)
		if err != nil {
			return jetstream.ConsumerInfo{}, false
		}
		return *c.CachedInfo(), true
	}
	reg := prometheus.NewRegistry()
	rd := w.reader(t, fraud.Defaults(), fraud.NewMetrics(reg))
	var mu sync.Mutex
	deleted := false
	var again []uint64 // events of p handed after the delete, first deliveries
	w.runMember(t, "m", rd, func(ctx context.Context, part int, b []reader.Event) error {
		mu.Lock()
		if part == p && deleted {
			for _, ev := range b {
				if ev.Deliveries == 1 {
					again = append(again, ev.Seq)
				}
			}
		}
		mu.Unlock()
		return rd.Handle(ctx, part, b)
	}, rd.OnRewind)
	testenv.WaitFor(t, 30*time.Second, "the burst to be judged and acked", func() bool {
		info, ok := consumer()
		return ok && info.AckFloor.Stream == 30
	})
	before, _ := consumer()
	mu.Lock()
	deleted = true
	mu.Unlock()
	if err := w.js.DeleteConsumer(ctx, events.ClicksStream, name); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the consumer created again to hand 1..30 again", func() bool {
		info, ok := consumer()
		return ok && !info.Created.Equal(before.Created) && info.AckFloor.Stream == 30
	})
	if err := traffic.Publish(ctx, w.js, traffic.Burst(time.Now(), 1, 0, "hot", "acme", "someone"), 1); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the next click to be handled", func() bool {
		info, ok := consumer()
		return ok && info.AckFloor.Stream == 31
	})
	mu.Lock()
	handedAgain := slices.Contains(again, 1) && slices.Contains(again, 30)
	mu.Unlock()
	if !handedAgain {
		t.Fatalf("after the delete the member was handed %v as first deliveries, want 1..30 again, then 31", again)
	}
	if got := gathered(t, reg, "snip_fraud_events_behind_total"); got != 0 {
		t.Errorf("snip_fraud_events_behind_total = %v, want 0: the events handed again were judged", got)
	}
	if got := gathered(t, reg, "snip_fraud_events_judged_total"); got != 31 {
		t.Errorf("judged %v events, want 31: the burst once and the next click", got)
	}
	if st, err := w.store.LinkStats(ctx, "hot"); err != nil || st.Total != 31 {
		t.Errorf("stats = %+v, %v; want 31 clicks counted", st, err)
	}
}

// TestAReplayThatGoesOnLaterThanAskedLeavesNoHoleInTheWindows: a group
// started at new events (FRAUD_START=new) judges the first 10 clicks of a
// visitor (1..10, half a second apart), and Redis loses the second batch's
// statistics (put back to a snapshot taken after the first: mark 5). The
// next batch (11..15) finds the mark behind and asks for the partition's
// events again from 6 (reader.Replay), on a state rebuilt at 6. The server
// moves such a group's consumer back only to its ack floor: the runtime
// goes on from 11 (logging an error), and the state must not judge 11.. on
// a window without 6..10. The visitor's 25 clicks within a minute are a
// burst: visitor_burst fires at the 21st, as on an uninterrupted member.
// Before, the state judged 11..25 with 6..10 missing from the window: 20
// clicks, no burst, no alert, no label.
func TestAReplayThatGoesOnLaterThanAskedLeavesNoHoleInTheWindows(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := t.Context()
	p := events.Partition("hot", parts)
	name := topology.GroupConsumerName(topology.GroupFraudDetection, p)
	ackFloor := func() uint64 {
		c, err := w.js.Consumer(ctx, events.ClicksStream, name)
		if err != nil {
			return 0
		}
		return c.CachedInfo().AckFloor.Stream
	}
	reg := prometheus.NewRegistry()
	rd := w.reader(t, fraud.Defaults(), fraud.NewMetrics(reg))
	var replayed atomic.Int32
	w.runMember(t, "m", rd, func(ctx context.Context, part int, b []reader.Event) error {
		err := rd.Handle(ctx, part, b)
		if re := (*reader.ReplayError)(nil); errors.As(err, &re) {
			replayed.Add(1)
		}
		return err
	}, rd.OnRewind, func(c *reader.Config) { c.Start = reader.StartAtNew() })
	testenv.WaitFor(t, 30*time.Second, "the group's consumer created at new events", func() bool {
		_, err := w.js.Consumer(ctx, events.ClicksStream, name)
		return err == nil
	})

	clicks := traffic.Burst(time.Now().Add(-time.Minute), 25, 500*time.Millisecond, "hot", "acme", "bot")
	stored := func(upTo uint64) {
		testenv.WaitFor(t, 30*time.Second, fmt.Sprintf("1..%d judged, stored and acked", upTo), func() bool {
			mark, err := w.store.HighWater(ctx, p)
			return err == nil && mark == upTo && ackFloor() == upTo
		})
	}
	if err := traffic.Publish(ctx, w.js, clicks[:5], 64); err != nil {
		t.Fatal(err)
	}
	stored(5)
	snap := testenv.SnapshotRedis(t, w.rdb)
	if err := traffic.Publish(ctx, w.js, clicks[5:10], 64); err != nil {
		t.Fatal(err)
	}
	stored(10)
	snap.Restore(t, w.rdb) // 6..10 acked, and their statistics lost
	if err := traffic.Publish(ctx, w.js, clicks[10:], 64); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "11..25 handled", func() bool { return ackFloor() == 25 })

	if replayed.Load() == 0 {
		t.Fatal("the member never asked for the events again")
	}
	want := fraud.AlertID(fraud.RuleVisitorBurst, "hot", "bot", clicks[20].Time.Truncate(time.Hour))
	if got := w.fraudMsgs(t, "fraud.alerts.>"); len(got) != 1 || got[want] != 1 {
		t.Errorf("alerts on FRAUD = %v, want one %s: the visitor's 21st click within a minute", got, want)
	}
	labels, _ := w.verdictLabels(t)
	var once []int // the clicks labelled once, as the burst labels every click of its window
	for i, c := range clicks {
		if labels[c.ID] == 1 {
			once = append(once, i+1)
		}
	}
	if len(once) != len(clicks) {
		t.Errorf("clicks labelled once: %v, want 1..25", once)
	}
	// 6..10's statistics are lost: the server would not hand them again,
	// and their labels count no flag without their total.
	if st, err := w.store.LinkStats(ctx, "hot"); err != nil || st.Total != 20 || st.Flagged != 20 {
		t.Errorf("stats = %+v, %v; want 1..5 and 11..25 counted, all flagged", st, err)
	}
	if got := gathered(t, reg, "snip_fraud_events_behind_total"); got != 0 {
		t.Errorf("snip_fraud_events_behind_total = %v, want 0", got)
	}
}
