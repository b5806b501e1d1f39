package reader_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
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
)

// The owner of a partition records that it carried a rewind out: WaitRewind
// and LatestRewind read that record, and the partition's next owner skips a
// rewind recorded done. A record NATS refused is written again until it is
// in, before the partition goes on. Left unwritten, WaitRewind waited for
// ever for a rewind carried out long ago, and whoever took the partition
// next replayed it a second time (the fraud detector publishing its alerts
// again, past FRAUD's duplicate window).
//
// The member's NATS user may not write the record at first (its publish is
// refused, as one lost in a NATS hiccup would be); once the server has
// refused it, the permission is given back.
func TestARewindRecordRefusedOnceIsWrittenAgain(t *testing.T) {
	t.Parallel()
	const group = "g"
	record := "$KV." + topology.MembersBucket + "." + group + ".rewound.0"
	opts := testenv.NATSOptions(server.RANDOM_PORT, filepath.Join(t.TempDir(), "jetstream"))
	users := func(deny ...string) []*server.User {
		return []*server.User{
			{Username: "admin", Password: "admin"},
			{Username: "member", Password: "member", Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: deny},
			}},
		}
	}
	opts.Users = users(record)
	srv, err := testenv.RunNATSServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	refusals := &violations{}
	srv.SetLoggerV2(refusals, false, false, false)
	url := "nats://" + srv.Addr().String()
	connect := func(user string) jetstream.JetStream { return connectAs(t, url, user, nats.MaxReconnects(-1)) }
	admin := connect("admin")
	o := topology.Defaults()
	o.Partitions = 1
	if err := topology.Apply(t.Context(), admin, o); err != nil {
		t.Fatal(err)
	}
	ids := publish(t, admin, 3, 4, 0)

	var handled atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- reader.Run(ctx, connect("member"), reader.Config{Group: group, Member: "m", LeaseTTL: time.Second},
			func(_ context.Context, _ int, b []reader.Event) error { handled.Add(int64(len(b))); return nil })
	}()
	t.Cleanup(func() { cancel(); <-done })
	testenv.WaitFor(t, 30*time.Second, "the first pass", func() bool { return handled.Load() == int64(len(ids)) })

	rctx, rcancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer rcancel()
	id, err := reader.Rewind(rctx, admin, group, reader.FromSeq(1))
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the server to refuse the member's record of the rewind", func() bool {
		return refusals.of(record) > 0
	})
	opts.Users = users()
	if err := srv.ReloadOptions(&opts); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer wcancel()
	if err := reader.WaitRewind(wctx, admin, group, id); err != nil {
		t.Fatalf("the rewind's record, refused once: %v", err)
	}
	testenv.WaitFor(t, 30*time.Second, "the replay", func() bool { return handled.Load() == int64(2*len(ids)) })
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

// WaitRewind's timeout says how far the rewind got by the last status it
// read. The read under way when the deadline passes is cut off by it; that
// one must not be what the error reports ("0 of 0 partitions done", which
// reads as a group with no partitions). Here nobody carries the rewind out:
// the test records partition 0 done itself and leaves partition 1 undone.
// The waiter's NATS user may be refused partition 1's record (its reads all
// fail, as in a NATS outage), and then the error says the status was never
// read.
func TestWaitRewindTimesOutWithTheLastStatusRead(t *testing.T) {
	t.Parallel()
	const group, id = "g", "rewind-1"
	tests := []struct {
		name string
		// deny is what the waiter may not publish (ask for).
		deny []string
		want string
	}{
		{
			name: "reads_succeed_reports_the_partitions_done",
			want: "wait for rewind rewind-1: 1 of 2 partitions done: context deadline exceeded",
		},
		{
			name: "every_read_fails_says_the_status_was_never_read",
			deny: []string{
				"$JS.API.DIRECT.GET.KV_" + topology.MembersBucket + ".$KV." + topology.MembersBucket + "." + group + ".rewound.1",
				"$JS.API.STREAM.MSG.GET.KV_" + topology.MembersBucket,
			},
			want: "wait for rewind rewind-1: status never read (",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			opts := testenv.NATSOptions(server.RANDOM_PORT, filepath.Join(t.TempDir(), "jetstream"))
			opts.Users = []*server.User{
				{Username: "admin", Password: "admin"},
				{Username: "waiter", Password: "waiter", Permissions: &server.Permissions{
					Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: tc.deny},
				}},
			}
			srv, err := testenv.RunNATSServer(opts)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
			// The refusals are expected: no need to log them.
			quiet := nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})
			connect := func(user string) jetstream.JetStream {
				return connectAs(t, "nats://"+srv.Addr().String(), user, quiet)
			}
			admin := connect("admin")
			o := topology.Defaults()
			o.Partitions = 2
			if err := topology.Apply(t.Context(), admin, o); err != nil {
				t.Fatal(err)
			}
			kv, err := admin.KeyValue(t.Context(), topology.MembersBucket)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := kv.Put(t.Context(), group+".rewound.0", []byte(id)); err != nil {
				t.Fatal(err)
			}

			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
			defer cancel()
			err = reader.WaitRewind(ctx, connect("waiter"), group, id)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("WaitRewind = %v, want the deadline exceeded", err)
			}
			if !strings.HasPrefix(err.Error(), tc.want) {
				t.Errorf("WaitRewind = %q, want it to begin %q", err, tc.want)
			}
		})
	}
}

// connectAs connects to url as user (whose password is its name, as the
// tests' server configurations have it), closing at the test's end.
func connectAs(t *testing.T, url, user string, opts ...nats.Option) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url, append([]nats.Option{nats.UserInfo(user, user)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// An owner asked to let its partition go while its OnRewind runs (a
// rebuild that takes seconds: fraud detection reads ten minutes of the
// log) leaves the rewind to the next owner. The next owner takes the
// partition once the old one's pin lapses, carries the rewind out itself
// (nothing recorded it done) and replays 1..10. The old owner's OnRewind
// then returns: moving the consumer back now would do it under the new
// owner, which would be handed 1..10 a third time, and the old owner would
// record the rewind done in its place.
func TestAnOwnerReleasedDuringOnRewindLeavesTheRewindToTheNextOwner(t *testing.T) {
	t.Parallel()
	n, js := setup(t, 1)
	publish(t, js, 1, 10, 0) // sequences 1..10, in one partition
	var mu sync.Mutex
	handled := map[string][]uint64{} // member: sequences handled, in order
	handler := func(member string) reader.Handler {
		return func(_ context.Context, _ int, b []reader.Event) error {
			mu.Lock()
			defer mu.Unlock()
			for _, e := range b {
				handled[member] = append(handled[member], e.Seq)
			}
			return nil
		}
	}
	count := func(member string) int {
		mu.Lock()
		defer mu.Unlock()
		return len(handled[member])
	}
	inRewind, release := make(chan struct{}), make(chan struct{})
	old := startMember(t, n, reader.Config{Group: "g", Member: "old", BatchSize: 100, DrainTimeout: time.Minute,
		OnRewind: func(context.Context, int, reader.RewindInfo) error {
			close(inRewind)
			<-release // a rebuild that does not look at its context
			return nil
		}}, handler("old"))
	testenv.WaitFor(t, 30*time.Second, "the first pass", func() bool { return count("old") == 10 })

	id, err := reader.Rewind(t.Context(), js, "g", reader.FromSeq(1))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-inRewind:
	case <-time.After(30 * time.Second):
		t.Fatal("the owner never called OnRewind")
	}
	old.cancel() // asked to stop: it leaves the group and drains
	startMember(t, n, reader.Config{Group: "g", Member: "next", BatchSize: 100}, handler("next"))
	testenv.WaitFor(t, 30*time.Second, "the next owner to replay 1..10", func() bool { return count("next") == 10 })
	wctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := reader.WaitRewind(wctx, js, "g", id); err != nil {
		t.Fatal(err)
	}

	close(release)
	select {
	case <-old.done:
		old.done <- nil // for the cleanup
	case <-time.After(60 * time.Second):
		t.Fatal("the old owner did not stop")
	}
	publish(t, js, 1, 1, 10) // sequence 11: once the next owner has it, it has everything before it
	testenv.WaitFor(t, 30*time.Second, "the next owner to handle 11", func() bool {
		mu.Lock()
		defer mu.Unlock()
		s := handled["next"]
		return len(s) > 0 && s[len(s)-1] == 11
	})
	mu.Lock()
	defer mu.Unlock()
	if want := "[1 2 3 4 5 6 7 8 9 10 11]"; fmt.Sprint(handled["next"]) != want {
		t.Errorf("the next owner handled %v, want %s: the replay once, then 11", handled["next"], want)
	}
	if want := "[1 2 3 4 5 6 7 8 9 10]"; fmt.Sprint(handled["old"]) != want {
		t.Errorf("the old owner handled %v, want %s: the first pass only", handled["old"], want)
	}
}

// A rewind with nothing to replay in a partition (its start is past what
// the partition holds) still stops the fetcher, which drops the batch it
// had fetched ahead, unacked. Without moving the consumer the server counts
// that batch delivered: it came again only after the AckWait (a minute), or
// sooner as a "gap in deliveries" once later events were fetched. The
// owner here is handling 1..5 with 6..10 fetched ahead when the rewind
// comes; 6..10 must follow at once.
func TestARewindWithNothingToReplayLosesNoTimeOverTheBatchFetchedAhead(t *testing.T) {
	t.Parallel()
	n, js := setup(t, 1)
	publish(t, js, 1, 10, 0) // sequences 1..10, in one partition
	var mu sync.Mutex
	var handled []uint64
	holding, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	heard := make(chan struct{})
	var heardOnce sync.Once
	log := slog.New(&onMessage{msg: "rewind requested", fn: func() { heardOnce.Do(func() { close(heard) }) }})
	reg := prometheus.NewRegistry()
	startMember(t, n, reader.Config{Group: "g", Member: "m", BatchSize: 5, Linger: 50 * time.Millisecond, Logger: log, Metrics: reg},
		func(_ context.Context, _ int, b []reader.Event) error {
			once.Do(func() {
				close(holding)
				<-release
			})
			mu.Lock()
			defer mu.Unlock()
			for _, e := range b {
				handled = append(handled, e.Seq)
			}
			return nil
		})
	select {
	case <-holding:
	case <-time.After(30 * time.Second):
		t.Fatal("the first batch never came")
	}
	cons, err := js.Consumer(t.Context(), events.ClicksStream, topology.GroupConsumerName("g", 0))
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "6..10 fetched ahead", func() bool {
		info, err := cons.Info(t.Context())
		return err == nil && info.NumAckPending == 10
	})
	if _, err := reader.Rewind(t.Context(), js, "g", reader.FromSeq(11)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-heard:
	case <-time.After(30 * time.Second):
		t.Fatal("the member never heard of the rewind")
	}
	close(release)
	testenv.WaitFor(t, 15*time.Second, "6..10 handled (a minute is the AckWait)", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(handled) == 10
	})
	mu.Lock()
	defer mu.Unlock()
	if want := "[1 2 3 4 5 6 7 8 9 10]"; fmt.Sprint(handled) != want {
		t.Errorf("handled %v, want %s", handled, want)
	}
	if v := gathered(t, reg, "snip_reader_delivery_gaps_total"); v > 0 {
		t.Errorf("delivery_gaps_total = %v, want 0: the member dropped the batch itself", v)
	}
}

// onMessage is a log handler that calls fn for each record with message msg.
type onMessage struct {
	msg string
	fn  func()
}

func (h *onMessage) Enabled(context.Context, slog.Level) bool { return true }
func (h *onMessage) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.fn()
	}
	return nil
}
func (h *onMessage) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *onMessage) WithGroup(string) slog.Handler      { return h }

// A rewind by a time finds where each partition starts with a consumer of
// its own on CLICKS, which it deletes when done: after 5 rewinds the
// stream has as many consumers as before. Before, each such consumer
// stayed until the server dropped it as inactive (nats.go's default for an
// ordered consumer, 5 minutes), so repeated rewinds, rewind plans and
// handler replays piled them up on CLICKS.
func TestARewindByTimeLeavesNoConsumerBehind(t *testing.T) {
	t.Parallel()
	n, js := setup(t, 1)
	publish(t, js, 2, 2, 0)
	startMember(t, n, reader.Config{Group: "g", Member: "m"}, func(context.Context, int, []reader.Event) error { return nil })
	testenv.WaitFor(t, 30*time.Second, "the group's consumer", func() bool {
		_, err := js.Consumer(t.Context(), events.ClicksStream, topology.GroupConsumerName("g", 0))
		return err == nil
	})
	s, err := js.Stream(t.Context(), events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	consumers := func() int {
		info, err := s.Info(t.Context())
		if err != nil {
			return -1
		}
		return info.State.Consumers
	}
	before := consumers()
	at := time.Now().Add(-time.Hour) // before every event: each rewind fetches one
	for range 5 {
		if _, err := reader.Rewind(t.Context(), js, "g", reader.FromTime(at)); err != nil {
			t.Fatal(err)
		}
	}
	now := before
	if !testenv.Poll(20*time.Second, func() bool { now = consumers(); return now == before }) {
		t.Errorf("CLICKS has %d consumers 20 s after 5 rewinds by time, want %d as before them", now, before)
	}
}

// A rewind by a time answers a partition with nothing stored at or after
// the time at once: its last event is before it. Before, each such
// partition waited for a fetch from the time to give up (2 s), so a rewind
// of 8 quiet partitions took 16 s or more (the console's replay button
// waiting all that time). Here 7 of 8 partitions are quiet after the time
// and one has an event after it, which is where its replay starts; the
// call must return within 8 s, half the old wait for 8 partitions and
// margin enough for a loaded machine.
func TestARewindByTimeAnswersQuietPartitionsAtOnce(t *testing.T) {
	t.Parallel()
	const partitions = 8
	n, js := setup(t, partitions)
	publish(t, js, 16, 2, 0) // events in most partitions, before the time
	startMember(t, n, reader.Config{Group: "g", Member: "m"}, func(context.Context, int, []reader.Event) error { return nil })
	testenv.WaitFor(t, 30*time.Second, "the group's consumers", func() bool {
		_, err := js.Consumer(t.Context(), events.ClicksStream, topology.GroupConsumerName("g", partitions-1))
		return err == nil
	})
	at := time.Now()        // after every event so far was stored
	publish(t, js, 1, 1, 2) // link0's third click, after the time
	s, err := js.Stream(t.Context(), events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	after, err := s.GetLastMsgForSubject(t.Context(), events.PartitionFilter(events.Partition("link0", partitions)))
	if err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	if _, err := reader.Rewind(t.Context(), js, "g", reader.FromTime(at)); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	t.Logf("Rewind took %v", took)
	if took > 8*time.Second {
		t.Errorf("Rewind took %v, want under 8s for %d partitions, %d of them quiet after the time", took, partitions, partitions-1)
	}
	st, err := reader.LatestRewind(t.Context(), js, "g")
	if err != nil {
		t.Fatal(err)
	}
	for _, pr := range st.Partitions {
		if pr.Partition == events.Partition("link0", partitions) {
			if pr.From != after.Sequence || pr.Until != after.Sequence {
				t.Errorf("partition %d replays %d..%d, want %d..%d: link0's click after the time", pr.Partition, pr.From, pr.Until, after.Sequence, after.Sequence)
			}
		} else if pr.From != pr.Until+1 {
			t.Errorf("partition %d replays %d..%d, want nothing (from %d)", pr.Partition, pr.From, pr.Until, pr.Until+1)
		}
	}
}

// A rewind is for the group's consumers of when it was asked. Here it is
// asked while the group has no member (nobody carries it out), then an
// operator deletes the group's consumers (nats consumer rm) and a later
// deploy creates the group again, starting at new events. The new group
// is not the one the rewind was asked of: it must not move back (before,
// its members found the request and carried it out, calling OnRewind and
// moving the new consumers back to the old start, which the server refuses
// for a consumer created at `new`: the partition retried the move and
// handled nothing), and it records nothing of it.
func TestARewindPendingWhenTheGroupWasDeletedIsNotTheRecreatedGroups(t *testing.T) {
	t.Parallel()
	const partitions = 2
	n, js := setup(t, partitions)
	ids := publish(t, js, 4, 3, 0)
	var handled atomic.Int64
	first := startMember(t, n, reader.Config{Group: "g", Member: "first"},
		func(_ context.Context, _ int, b []reader.Event) error { handled.Add(int64(len(b))); return nil })
	testenv.WaitFor(t, 30*time.Second, "the first pass", func() bool { return handled.Load() == int64(len(ids)) })
	first.stop(t)

	id, err := reader.Rewind(t.Context(), js, "g", reader.FromSeq(1))
	if err != nil {
		t.Fatal(err)
	}
	for p := range partitions {
		if err := js.DeleteConsumer(t.Context(), events.ClicksStream, topology.GroupConsumerName("g", p)); err != nil {
			t.Fatal(err)
		}
	}

	var mu sync.Mutex
	var rewinds []reader.RewindInfo
	var again []string // click IDs the new group handled
	startMember(t, n, reader.Config{Group: "g", Member: "next", Start: reader.StartAtNew(),
		OnRewind: func(_ context.Context, _ int, ri reader.RewindInfo) error {
			mu.Lock()
			defer mu.Unlock()
			rewinds = append(rewinds, ri)
			return nil
		}},
		func(_ context.Context, _ int, b []reader.Event) error {
			mu.Lock()
			defer mu.Unlock()
			for _, e := range b {
				again = append(again, e.Click.ID)
			}
			return nil
		})
	testenv.WaitFor(t, 30*time.Second, "the new group's consumers", func() bool {
		for p := range partitions {
			if _, err := js.Consumer(t.Context(), events.ClicksStream, topology.GroupConsumerName("g", p)); err != nil {
				return false
			}
		}
		return true
	})
	later := publish(t, js, 4, 1, 3) // a click of each link: in both partitions
	testenv.WaitFor(t, 30*time.Second, "the new group to handle the new clicks (or to rewind)", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(again) >= len(later) || len(rewinds) > 0
	})
	mu.Lock()
	defer mu.Unlock()
	if len(rewinds) > 0 {
		t.Errorf("the new group carried out the old group's rewind: OnRewind(%+v)", rewinds)
	}
	slices.Sort(again)
	slices.Sort(later)
	if !slices.Equal(again, later) {
		t.Errorf("the new group handled %d clicks, want the %d published after it started, once each", len(again), len(later))
	}
	st, err := reader.LatestRewind(t.Context(), js, "g")
	if err != nil {
		t.Fatal(err)
	}
	if st.ID != id {
		t.Fatalf("latest rewind %s, want %s", st.ID, id)
	}
	for _, p := range st.Partitions {
		if p.Done {
			t.Errorf("partition %d recorded the old group's rewind done", p.Partition)
		}
	}
}

// A rewind the group's consumers were deleted under before they carried it
// out never will be: the status says so (Void) and WaitRewind ends at once
// with ErrRewindVoid, whether the consumers are gone or created again.
// Before, the partitions stayed pending for ever: WaitRewind (snipctl replay
// --wait) waited until its context ended, and LatestRewind showed a replay
// running. A rewind carried out before the consumers were deleted stays
// done, its partitions Void: the consumers there now did not move back.
func TestARewindLeftPendingByADeletedGroupIsVoid(t *testing.T) {
	t.Parallel()
	const partitions = 2
	n, js := setup(t, partitions)
	publish(t, js, 4, 2, 0)
	ctx := t.Context()
	create := func() {
		t.Helper()
		for p := range partitions {
			cfg := topology.GroupConsumerConfig("g", p, topology.GroupConsumer{
				AckWait: time.Minute, PinnedTTL: 5 * time.Second, MaxAckPending: 100, DeliverPolicy: jetstream.DeliverAllPolicy,
			})
			if _, err := js.CreateOrUpdateConsumer(ctx, events.ClicksStream, cfg); err != nil {
				t.Fatal(err)
			}
		}
	}
	remove := func() {
		t.Helper()
		for p := range partitions {
			if err := js.DeleteConsumer(ctx, events.ClicksStream, topology.GroupConsumerName("g", p)); err != nil {
				t.Fatal(err)
			}
		}
	}
	status := func(id string) reader.RewindStatus {
		t.Helper()
		st, err := reader.LatestRewind(ctx, js, "g")
		if err != nil {
			t.Fatal(err)
		}
		if st.ID != id {
			t.Fatalf("latest rewind %s, want %s", st.ID, id)
		}
		return st
	}
	wait := func(id string, d time.Duration) (time.Duration, error) {
		wctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		start := time.Now()
		err := reader.WaitRewind(wctx, js, "g", id)
		return time.Since(start), err
	}

	create() // the group, no member: nobody carries the rewind out
	id, err := reader.Rewind(ctx, js, "g", reader.FromSeq(1))
	if err != nil {
		t.Fatal(err)
	}
	if st := status(id); st.Void() || st.Done() {
		t.Fatalf("status with the group's own consumers = %+v, want pending", st)
	}
	if _, err := wait(id, time.Second); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitRewind with the group's own consumers = %v, want it to wait", err)
	}

	remove()
	for _, step := range []string{"deleted", "created_again"} {
		if step == "created_again" {
			create()
		}
		st := status(id)
		for _, p := range st.Partitions {
			if p.Done || !p.Void {
				t.Errorf("%s: partition %+v, want void and not done", step, p)
			}
		}
		if !st.Void() || st.Done() {
			t.Errorf("%s: Void() = %v, Done() = %v; want void, not done", step, st.Void(), st.Done())
		}
		took, err := wait(id, 20*time.Second)
		if !errors.Is(err, reader.ErrRewindVoid) || took > 10*time.Second {
			t.Errorf("%s: WaitRewind = %v after %v, want ErrRewindVoid at once", step, err, took.Round(time.Millisecond))
		}
	}

	// A rewind carried out, then the consumers deleted and created again.
	m := startMember(t, n, reader.Config{Group: "g", Member: "m"},
		func(context.Context, int, []reader.Event) error { return nil })
	done, err := reader.Rewind(ctx, js, "g", reader.FromSeq(1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wait(done, 30*time.Second); err != nil {
		t.Fatalf("WaitRewind with a member = %v", err)
	}
	m.stop(t)
	remove()
	create()
	st := status(done)
	for _, p := range st.Partitions {
		if !p.Done || !p.Void {
			t.Errorf("carried out before the group was created again: partition %+v, want done and void", p)
		}
	}
	if st.Void() || !st.Done() {
		t.Errorf("carried out before the group was created again: Void() = %v, Done() = %v; want done", st.Void(), st.Done())
	}
	if _, err := wait(done, 20*time.Second); err != nil {
		t.Errorf("WaitRewind of a rewind carried out before the group was created again = %v, want nil", err)
	}
}

// A rewind another request of the group replaced (a second operator's
// replay, a console click) never will be carried out: the partitions carry
// out the group's latest request only. WaitRewind ends with
// ErrRewindSuperseded as soon as it reads the newer request, naming it.
// Before, it waited until its context ended (snipctl replay --wait until
// SNIPCTL_TIMEOUT). A partition's record of an ID that is neither the one
// waited for nor the latest request (left by some older rewind) says
// nothing: the wait goes on.
func TestWaitRewindOfARewindRequestedAgainEndsSuperseded(t *testing.T) {
	t.Parallel()
	n, js := setup(t, 2)
	publish(t, js, 4, 2, 0)
	ctx := t.Context()
	createGroup(t, js, "g", 2) // no member: nobody carries a rewind out
	kv, err := js.KeyValue(ctx, topology.MembersBucket)
	if err != nil {
		t.Fatal(err)
	}
	// The waiter's reads of the request, seen on the server.
	var reads atomic.Int64
	sub, err := n.Connect(t).Subscribe("$JS.API.DIRECT.GET.KV_"+topology.MembersBucket+".$KV."+topology.MembersBucket+".g.rewind",
		func(*nats.Msg) { reads.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()

	id, err := reader.Rewind(ctx, js, "g", reader.FromSeq(1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "g.rewound.0", []byte(events.NewID())); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	res := make(chan error, 1)
	go func() { res <- reader.WaitRewind(wctx, n.JetStream(t), "g", id) }()
	// The waiter has read the request (ours) more than once: it has seen
	// the stray record too, and waits on.
	testenv.WaitFor(t, 10*time.Second, "the waiter's reads", func() bool { return reads.Load() >= 3 })
	select {
	case err := <-res:
		t.Fatalf("WaitRewind with a partition recording another rewind = %v, want it to wait", err)
	default:
	}

	newer, err := reader.Rewind(ctx, js, "g", reader.FromSeq(2))
	if err != nil {
		t.Fatal(err)
	}
	requested := time.Now()
	select {
	case err := <-res:
		took := time.Since(requested)
		if !errors.Is(err, reader.ErrRewindSuperseded) || !strings.Contains(err.Error(), newer) || took > 5*time.Second {
			t.Errorf("WaitRewind = %v after %v, want ErrRewindSuperseded naming %s, at once", err, took.Round(time.Millisecond), newer)
		}
	case <-wctx.Done():
		t.Fatalf("WaitRewind still waiting for a rewind replaced by %s", newer)
	}
}

// A wait for an ID the group's request never is (a wrong ID, or one
// replaced before the wait first read it) reads the latest request as a
// server that lags would, so it does not end at once; it ends once that
// cannot be lag: with ErrRewindUnknown, or ErrRewindSuperseded where the
// latest request was made after the ID. Before, it waited until its
// context ended.
func TestWaitRewindOfAnIDNeverStoredEnds(t *testing.T) {
	t.Parallel()
	_, js := setup(t, 2)
	publish(t, js, 4, 2, 0)
	ctx := t.Context()
	createGroup(t, js, "g", 2)
	before := events.NewID() // made, never stored: replaced at once
	latest, err := reader.Rewind(ctx, js, "g", reader.FromSeq(1))
	if err != nil {
		t.Fatal(err)
	}
	after := events.NewID() // as one requested after the latest, not yet read

	wait := func(id string, d time.Duration) (time.Duration, error) {
		wctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		start := time.Now()
		err := reader.WaitRewind(wctx, js, "g", id)
		return time.Since(start), err
	}
	if _, err := wait(after, 2*time.Second); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitRewind of a rewind not read stored yet = %v, want it to wait", err)
	}
	var wg sync.WaitGroup
	for _, tc := range []struct {
		name, id string
		want     error
		names    string
	}{
		{"requested_after_the_latest", after, reader.ErrRewindUnknown, ""},
		{"made_before_the_latest", before, reader.ErrRewindSuperseded, latest},
		{"not_an_id", "nope", reader.ErrRewindUnknown, ""},
	} {
		wg.Go(func() {
			took, err := wait(tc.id, 60*time.Second)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.names) || took > 30*time.Second {
				t.Errorf("%s: WaitRewind = %v after %v, want %v naming %q", tc.name, err, took.Round(time.Millisecond), tc.want, tc.names)
			}
		})
	}
	wg.Wait()
}

// createGroup creates the group's consumers on CLICKS, one per partition.
func createGroup(t *testing.T, js jetstream.JetStream, group string, partitions int) {
	t.Helper()
	for p := range partitions {
		cfg := topology.GroupConsumerConfig(group, p, topology.GroupConsumer{
			AckWait: time.Minute, PinnedTTL: 5 * time.Second, MaxAckPending: 100, DeliverPolicy: jetstream.DeliverAllPolicy,
		})
		if _, err := js.CreateOrUpdateConsumer(t.Context(), events.ClicksStream, cfg); err != nil {
			t.Fatal(err)
		}
	}
}

// rewindAfterALostAck runs a member of a group started at new events on
// one partition: it handles 1..10 in batches of 5, the server refuses the
// ack of the batch ending at 10 (the ack floor stays behind it), then the
// partition carries out a rewind with nothing to replay (a request an older
// version stored: Rewind refuses the group). With refuseAgain, the server
// goes on refusing the member's acks until it has refused one more (the
// owner's ack again of the last event it handled, ackHandled). It returns
// once 11..15, published after the rewind, are handled and acked: the first
// event of the batch whose ack was lost, the last event, and how many times
// each event was handed.
func rewindAfterALostAck(t *testing.T, group string, refuseAgain bool) (first, last uint64, handed map[uint64]int) {
	t.Helper()
	s := newAckRefusingServer(t, 1)
	consumer := topology.GroupConsumerName(group, 0)
	refused := "$JS.ACK." + events.ClicksStream + "." + consumer + "."
	var mu sync.Mutex
	seen := map[uint64]int{}
	var lostFirst uint64 // the first event of the batch whose ack is refused
	// AckWait long enough that no event is marked in progress (an ack
	// refused too) while acks are refused: each refusal is an ack.
	s.member(t, reader.Config{Group: group, Member: "m", BatchSize: 5, Start: reader.StartAtNew(), AckWait: 3 * time.Minute}, func(_ context.Context, _ int, b []reader.Event) error {
		mu.Lock()
		defer mu.Unlock()
		for _, ev := range b {
			seen[ev.Seq]++
		}
		if lostFirst == 0 && b[len(b)-1].Seq == firstPass {
			lostFirst = b[0].Seq
			s.refuseAcks(t, consumer) // before the runtime acks the batch
		}
		return nil
	})
	testenv.WaitFor(t, 30*time.Second, "the group's consumer", func() bool {
		_, err := s.js.Consumer(t.Context(), events.ClicksStream, consumer)
		return err == nil
	})
	cons, err := s.js.Consumer(t.Context(), events.ClicksStream, consumer)
	if err != nil {
		t.Fatal(err)
	}
	publish(t, s.js, 1, firstPass, 0)
	testenv.WaitFor(t, 30*time.Second, "the server to refuse the first pass's last ack", func() bool { return s.log.of(refused) > 0 })
	refusals := s.log.of(refused)
	if !refuseAgain {
		s.refuseAcks(t, "")
	}
	mu.Lock()
	first = lostFirst
	mu.Unlock()
	if info, err := cons.Info(t.Context()); err != nil || info.AckFloor.Stream != first-1 {
		t.Fatalf("ack floor %v (%v), want %d: the last batch's ack lost", info.AckFloor.Stream, err, first-1)
	}

	// Rewind refuses a group started at new events (ErrNotReplayable); a
	// request an older version stored is carried out as nothing to replay.
	id := storeOldRewind(t, s.js, group, firstPass+1, firstPass)
	if refuseAgain {
		testenv.WaitFor(t, 60*time.Second, "the server to refuse an ack for the rewind", func() bool { return s.log.of(refused) > refusals })
		s.refuseAcks(t, "")
	}
	wctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := reader.WaitRewind(wctx, s.js, group, id); err != nil {
		t.Fatal(err)
	}
	more := publish(t, s.js, 1, 5, firstPass)
	last = uint64(firstPass + len(more))
	testenv.WaitFor(t, 30*time.Second, "the partition to handle and ack what was published after the rewind", func() bool {
		info, err := cons.Info(t.Context())
		return err == nil && info.AckFloor.Stream == last
	})
	mu.Lock()
	defer mu.Unlock()
	return first, last, maps.Clone(seen)
}

// A rewind with nothing to replay after a lost ack, in a group started at
// new events: the server moves its consumer only back to its ack floor (a
// reset to a sequence is refused), so the owner acks 10, the last event it
// handled, again, which moves the floor up to it, and goes on from the
// floor, after 10: every event is handed once. Before, the partition went
// on from the floor behind the lost ack, 6..10 handed again as first
// deliveries (webhooks sent again); before that, the owner asked for the
// event after the last one it handled, which the server refused, and
// retried it for ever: the rewind was never carried out and the partition
// handled nothing more.
func TestARewindAfterALostAckOfAGroupStartedAtNewGoesOnAfterWhatWasHandled(t *testing.T) {
	t.Parallel()
	_, last, handed := rewindAfterALostAck(t, "rewindnew", false)
	for seq := uint64(1); seq <= last; seq++ {
		if handed[seq] != 1 {
			t.Errorf("event %d handed %d times, want once", seq, handed[seq])
		}
	}
}

// The same where the owner cannot ack the last event it handled again
// either (acks still refused): the partition goes on from its ack floor,
// the events handled past it handed again (at least once), rather than
// waiting for an ack that does not come and handling nothing more.
func TestARewindAfterALostAckOfAGroupStartedAtNewThatCannotAckAgainGoesOnFromTheFloor(t *testing.T) {
	t.Parallel()
	lf, last, handed := rewindAfterALostAck(t, "rewindnewrefused", true)
	for seq := uint64(1); seq <= last; seq++ {
		if want := 1 + btoi(seq >= lf && seq <= firstPass); handed[seq] != want {
			t.Errorf("event %d handed %d times, want %d (the events past the ack floor again)", seq, handed[seq], want)
		}
	}
}

// A rewind with nothing to replay after a lost ack, in a group started at
// new events, whose consumer is deleted and created again (at the oldest
// event, by a later deploy) while the owner's OnRewind runs, and which the
// partition's next reader pulls 1..10 from before that OnRewind returns.
// The owner decided, before OnRewind, to ack 10 again (ackHandled): that
// ack is of the consumer before, and the one created again must not take
// it. Before, the owner acked first and only then read which consumer it
// had acked on: the ack moved the new consumer's floor to 10 over events
// its reader held unacked, the owner's reset then went on from there, and
// the group created again never handed 1..10.
func TestARewindWhoseConsumerIsCreatedAgainDuringOnRewindAcksNothingOfTheNewOne(t *testing.T) {
	t.Parallel()
	const group = "rewindnewagain"
	h := heldRewindAfterALostAck(t, group, reader.StartAtNew())
	s, consumer, old := h.s, h.consumer, h.old

	// Nothing to replay (a request an older version stored): the owner
	// decides to ack 10 again, then calls OnRewind, which waits.
	id := storeOldRewind(t, s.js, group, firstPass+1, firstPass)
	h.waitOnRewind(t)
	if err := s.js.DeleteConsumer(t.Context(), events.ClicksStream, consumer); err != nil {
		t.Fatal(err)
	}
	again := old.Config
	again.DeliverPolicy = jetstream.DeliverAllPolicy
	c2 := createAgain(t, s.js, again)
	// The partition's next reader pulls 1..10 from the consumer created
	// again, and has not acked them when the owner's OnRewind returns.
	b, err := c2.Fetch(firstPass, jetstream.FetchPriorityGroup(topology.PriorityGroup), jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	pulled := 0
	for range b.Messages() {
		pulled++
	}
	if pulled != firstPass {
		t.Fatalf("pulled %d events from the consumer created again (%v), want %d", pulled, b.Error(), firstPass)
	}
	h.release()
	wctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := reader.WaitRewind(wctx, s.js, group, id); err != nil {
		t.Fatal(err)
	}
	more := publish(t, s.js, 1, 5, firstPass)
	last := uint64(firstPass + len(more))
	testenv.WaitFor(t, 60*time.Second, "the consumer created again acked to the last event", func() bool {
		info, err := c2.Info(t.Context())
		return err == nil && info.AckFloor.Stream == last
	})
	h.checkHandedFromItsStart(t, last)
}

// A rewind whose partition's consumer is deleted and created again (by a
// later deploy, at the oldest event) while the owner's OnRewind runs: the
// owner decided on the consumer before (the ack of 6..10 lost, its floor
// at 5, the last event handled 10), and that decision is not the new
// consumer's. The request was made for the consumer before, so it is void
// for the new one (ErrRewindVoid), which hands every event from its
// start. Before, the owner moved the consumer created again as it had
// decided for the one before: to 3 for a replay from 3, to 11, after the
// last event it handled, for one with nothing to replay; either way the
// group created again never handed the events before, and the rewind was
// recorded done.
func TestARewindWhoseConsumerIsCreatedAgainDuringOnRewindGoesByTheNewConsumer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		from uint64
	}{
		{"from 3", 3},
		{"nothing to replay", firstPass + 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const group = "rewindagain"
			h := heldRewindAfterALostAck(t, group, reader.Start{})
			s, consumer, old := h.s, h.consumer, h.old

			id, err := reader.Rewind(t.Context(), s.js, group, reader.FromSeq(tc.from))
			if err != nil {
				t.Fatal(err)
			}
			h.waitOnRewind(t)
			if err := s.js.DeleteConsumer(t.Context(), events.ClicksStream, consumer); err != nil {
				t.Fatal(err)
			}
			c2 := createAgain(t, s.js, old.Config)
			h.release()
			wctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			if err := reader.WaitRewind(wctx, s.js, group, id); !errors.Is(err, reader.ErrRewindVoid) {
				t.Errorf("WaitRewind of a rewind requested for the consumer before = %v, want ErrRewindVoid", err)
			}
			more := publish(t, s.js, 1, 5, firstPass)
			last := uint64(firstPass + len(more))
			testenv.WaitFor(t, 60*time.Second, "the consumer created again acked to the last event", func() bool {
				info, err := c2.Info(t.Context())
				return err == nil && info.AckFloor.Stream == last
			})
			h.checkHandedFromItsStart(t, last)
		})
	}
}

// heldRewind is a member of group (one partition) whose first pass's last
// ack (its last batch, up to firstPass) the server lost, and whose
// OnRewind, once called, waits for release: a rewind under way while a test
// changes the partition's consumer.
type heldRewind struct {
	s        *ackRefusingServer
	consumer string
	old      *jetstream.ConsumerInfo // the consumer once the ack was lost
	entered  chan struct{}
	released chan struct{}
	mu       sync.Mutex
	handed   map[uint64]int
}

func heldRewindAfterALostAck(t *testing.T, group string, start reader.Start) *heldRewind {
	t.Helper()
	s := newAckRefusingServer(t, 1)
	h := &heldRewind{s: s, consumer: topology.GroupConsumerName(group, 0), entered: make(chan struct{}), released: make(chan struct{}),
		handed: map[uint64]int{}}
	refused := "$JS.ACK." + events.ClicksStream + "." + h.consumer + "."
	var lostFirst uint64
	var enteredOnce sync.Once
	cfg := reader.Config{Group: group, Member: "m", BatchSize: 5, Start: start, AckWait: 3 * time.Minute}
	cfg.OnRewind = func(ctx context.Context, _ int, _ reader.RewindInfo) error {
		enteredOnce.Do(func() { close(h.entered) })
		select {
		case <-h.released:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.member(t, cfg, func(_ context.Context, _ int, b []reader.Event) error {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, ev := range b {
			h.handed[ev.Seq]++
		}
		if lostFirst == 0 && b[len(b)-1].Seq == firstPass {
			lostFirst = b[0].Seq
			s.refuseAcks(t, h.consumer) // before the runtime acks the batch
		}
		return nil
	})
	testenv.WaitFor(t, 30*time.Second, "the group's consumer", func() bool {
		_, err := s.js.Consumer(t.Context(), events.ClicksStream, h.consumer)
		return err == nil
	})
	publish(t, s.js, 1, firstPass, 0)
	testenv.WaitFor(t, 30*time.Second, "the server to refuse the first pass's last ack", func() bool { return s.log.of(refused) > 0 })
	s.refuseAcks(t, "")
	cons, err := s.js.Consumer(t.Context(), events.ClicksStream, h.consumer)
	if err != nil {
		t.Fatal(err)
	}
	h.old = cons.CachedInfo()
	h.mu.Lock()
	first := lostFirst
	h.mu.Unlock()
	if h.old.AckFloor.Stream != first-1 {
		t.Fatalf("ack floor %d, want %d: the last batch's ack lost", h.old.AckFloor.Stream, first-1)
	}
	return h
}

// waitOnRewind waits until the member's OnRewind is called.
func (h *heldRewind) waitOnRewind(t *testing.T) {
	t.Helper()
	select {
	case <-h.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("OnRewind was never called")
	}
}

// release lets OnRewind return.
func (h *heldRewind) release() { close(h.released) }

// checkHandedFromItsStart fails the test unless every event up to last was
// handed by the consumer created again from its start: 1..firstPass a
// second time, the rest once.
func (h *heldRewind) checkHandedFromItsStart(t *testing.T, last uint64) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	var missed []uint64
	for seq := uint64(1); seq <= last; seq++ {
		if want := 1 + btoi(seq <= firstPass); h.handed[seq] < want {
			missed = append(missed, seq)
		}
	}
	if len(missed) > 0 {
		t.Errorf("the consumer created again never handed %v, want every event from its start", missed)
	}
}

// A handler's Replay(from) asked of a batch whose consumer was deleted and
// created again (at the oldest event, by a later deploy) while the handler
// held it: 1..5 handled and acked, the handler holding 6..10 asks for them
// again, and the consumer there now never handed anything. It goes on from
// its own ack floor, handing every event from its start (6.. among them,
// as asked). Before, the owner moved the consumer created again to 6, as
// if it were the one before: the group created again never handed 1..5.
func TestAHandlersReplayOfAConsumerCreatedAgainGoesOnFromItsAckFloor(t *testing.T) {
	t.Parallel()
	n, js := setup(t, 1)
	consumer := topology.GroupConsumerName("g", 0)
	var mu sync.Mutex
	handed := map[uint64]int{}
	held, release := make(chan struct{}), make(chan struct{})
	var replayed atomic.Bool
	startMember(t, n, reader.Config{Group: "g", Member: "m", BatchSize: 5}, func(ctx context.Context, _ int, b []reader.Event) error {
		mu.Lock()
		for _, ev := range b {
			handed[ev.Seq]++
		}
		mu.Unlock()
		if b[0].Seq != 6 || !replayed.CompareAndSwap(false, true) {
			return nil
		}
		close(held)
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		return reader.Replay(6, errors.New("the handler wants 6.. again"))
	})
	publish(t, js, 1, 5, 0)
	var old *jetstream.ConsumerInfo
	testenv.WaitFor(t, 30*time.Second, "1..5 handled and acked", func() bool {
		c, err := js.Consumer(t.Context(), events.ClicksStream, consumer)
		if err == nil {
			old = c.CachedInfo()
		}
		return err == nil && old.AckFloor.Stream == 5
	})
	publish(t, js, 1, 5, 5)
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("6..10 were never handed")
	}
	if err := js.DeleteConsumer(t.Context(), events.ClicksStream, consumer); err != nil {
		t.Fatal(err)
	}
	createAgain(t, js, old.Config)
	close(release)
	publish(t, js, 1, 5, 10)
	const last = 15
	testenv.WaitFor(t, 60*time.Second, "the new consumer acked to the last event", func() bool {
		c, err := js.Consumer(t.Context(), events.ClicksStream, consumer)
		return err == nil && c.CachedInfo().AckFloor.Stream == last
	})
	mu.Lock()
	defer mu.Unlock()
	var missed []uint64 // events the consumer created again never handed
	for seq := uint64(1); seq <= last; seq++ {
		want := 1
		if seq <= 10 {
			want = 2 // handed by the consumer before too
		}
		if handed[seq] < want {
			missed = append(missed, seq)
		}
	}
	if len(missed) > 0 {
		t.Errorf("the consumer created again never handed %v, want every event from its start", missed)
	}
}

// warnings is a log handler that keeps the messages of the warnings and
// errors logged.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (h *warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h *warnings) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.msgs = append(h.msgs, r.Message)
	return nil
}
func (h *warnings) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *warnings) WithGroup(string) slog.Handler      { return h }

// A rewind with nothing to replay after a lost ack, in a group started at
// new events (rewindAfterALostAck's case), whose reset to the floor after
// the owner acked 10 again is refused once (as one that times out): the
// retry finds the floor at 10 already, does not ack again, and goes on
// after 10, every event handed once, with no warning that the ack again
// failed. Before, the retry acked the same message again, which the client
// refused as acked already, and the owner warned that the events handled
// past the floor come again, which they did not.
func TestARewindAfterALostAckWhoseResetFailedOnceDoesNotAckAgain(t *testing.T) {
	t.Parallel()
	const group = "rewindnewreset"
	s := newAckRefusingServer(t, 1)
	consumer := topology.GroupConsumerName(group, 0)
	refused := "$JS.ACK." + events.ClicksStream + "." + consumer + "."
	reset := "$JS.API.CONSUMER.RESET." + events.ClicksStream + "." + consumer
	var mu sync.Mutex
	handed := map[uint64]int{}
	var lostFirst uint64
	logged := &warnings{}
	cfg := reader.Config{Group: group, Member: "m", BatchSize: 5, Start: reader.StartAtNew(), AckWait: 3 * time.Minute, Logger: slog.New(logged)}
	s.member(t, cfg, func(_ context.Context, _ int, b []reader.Event) error {
		mu.Lock()
		defer mu.Unlock()
		for _, ev := range b {
			handed[ev.Seq]++
		}
		if lostFirst == 0 && b[len(b)-1].Seq == firstPass {
			lostFirst = b[0].Seq
			s.refuseAcks(t, consumer) // before the runtime acks the batch
		}
		return nil
	})
	testenv.WaitFor(t, 30*time.Second, "the group's consumer", func() bool {
		_, err := s.js.Consumer(t.Context(), events.ClicksStream, consumer)
		return err == nil
	})
	cons, err := s.js.Consumer(t.Context(), events.ClicksStream, consumer)
	if err != nil {
		t.Fatal(err)
	}
	publish(t, s.js, 1, firstPass, 0)
	testenv.WaitFor(t, 30*time.Second, "the server to refuse the first pass's last ack", func() bool { return s.log.of(refused) > 0 })
	s.refuse(t, reset)
	mu.Lock()
	first := lostFirst
	mu.Unlock()
	if info, err := cons.Info(t.Context()); err != nil || info.AckFloor.Stream != first-1 {
		t.Fatalf("ack floor %v (%v), want %d: the last batch's ack lost", info.AckFloor.Stream, err, first-1)
	}
	id := storeOldRewind(t, s.js, group, firstPass+1, firstPass)
	testenv.WaitFor(t, 60*time.Second, "the server to refuse the rewind's reset", func() bool { return s.log.of(reset) > 0 })
	s.refuse(t)
	wctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := reader.WaitRewind(wctx, s.js, group, id); err != nil {
		t.Fatal(err)
	}
	more := publish(t, s.js, 1, 5, firstPass)
	last := uint64(firstPass + len(more))
	testenv.WaitFor(t, 30*time.Second, "the partition to handle and ack what was published after the rewind", func() bool {
		info, err := cons.Info(t.Context())
		return err == nil && info.AckFloor.Stream == last
	})
	mu.Lock()
	for seq := uint64(1); seq <= last; seq++ {
		if handed[seq] != 1 {
			t.Errorf("event %d handed %d times, want once", seq, handed[seq])
		}
	}
	mu.Unlock()
	logged.mu.Lock()
	defer logged.mu.Unlock()
	for _, msg := range logged.msgs {
		if strings.Contains(msg, "acking it again failed") {
			t.Errorf("the owner warned %q, want no such warning: the retry found the floor at %d already", msg, firstPass)
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// A rewind that finds the partition's consumer deleted and created again
// under its owner (heard while the owner's handler held 1..5 with 6..10
// fetched; the consumer created again before the handler returned) goes
// by the new consumer: its ack floor, the last event the owner handled (5)
// being of the consumer before, and its creation, not the one the owner
// last read. Before, the owner took that event for the new consumer's
// position: from past it (8) the partition went on after it, at 6; from
// before it (3) it moved back there. Either way the group created again
// never handled the events before, which it has from its start (6..10,
// fetched ahead, the owner dropped for the rewind: the group created again
// hands them once). A rewind requested for the consumer before is void
// for the new one (ErrRewindVoid): it was carried out, and recorded done,
// because the owner's cached info still showed the consumer it was made
// for. One requested for the consumer created again is carried out: it
// was ignored for ever, as made for another consumer than the one in the
// owner's cache.
func TestARewindOfAConsumerCreatedAgainUnderItsOwnerGoesByThatConsumer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		from  uint64
		again bool // requested for the consumer created again
	}{
		{"for the consumer before from 8", 8, false},
		{"for the consumer before from 3", 3, false},
		{"for the consumer created again", 3, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n, js := setup(t, 1)
			ids := publish(t, js, 1, firstPass, 0)
			consumer := topology.GroupConsumerName("g", 0)
			heard := make(chan struct{})
			var heardOnce sync.Once
			log := slog.New(&onMessage{msg: "rewind requested", fn: func() { heardOnce.Do(func() { close(heard) }) }})
			h := newFirstBatchHeld()
			startMember(t, n, reader.Config{Group: "g", Member: "m", BatchSize: 5, Logger: log}, h.handle)
			old := h.fetchedAhead(t, js, consumer)
			createAgain := func() {
				if err := js.DeleteConsumer(t.Context(), events.ClicksStream, consumer); err != nil {
					t.Fatal(err)
				}
				createAgain(t, js, old.Config)
			}
			if tc.again {
				createAgain()
			}
			id, err := reader.Rewind(t.Context(), js, "g", reader.FromSeq(tc.from))
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-heard:
			case <-time.After(30 * time.Second):
				t.Fatal("the member never heard of the rewind")
			}
			if !tc.again {
				createAgain()
			}
			close(h.release)
			more := publish(t, js, 1, 5, firstPass)
			last := uint64(len(ids) + len(more))
			testenv.WaitFor(t, 60*time.Second, "the new consumer acked to the last event", func() bool {
				c, err := js.Consumer(t.Context(), events.ClicksStream, consumer)
				return err == nil && c.CachedInfo().AckFloor.Stream == last
			})
			wctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			switch err := reader.WaitRewind(wctx, js, "g", id); {
			case tc.again && err != nil:
				t.Errorf("WaitRewind of a rewind requested for the consumer created again = %v, want nil", err)
			case !tc.again && !errors.Is(err, reader.ErrRewindVoid):
				t.Errorf("WaitRewind of a rewind requested for the consumer before = %v, want ErrRewindVoid", err)
			}
			h.mu.Lock()
			defer h.mu.Unlock()
			var missed []uint64 // events the new consumer never handed
			for seq := uint64(1); seq <= last; seq++ {
				want := 1 // 6..10, fetched ahead, were dropped for the rewind
				if seq <= h.blocked {
					want = 2 // handled for the consumer before too
				}
				if h.handed[seq] < want {
					missed = append(missed, seq)
				}
			}
			if len(missed) > 0 {
				t.Errorf("the consumer created again never handed %v, want every event from its start", missed)
			}
		})
	}
}

// A rewind whose partition's consumer is deleted (an operator, a topology
// reset) while the partition's owner carries it out: before the owner
// decides it (the request is there when the member starts, and the
// consumer goes as OnAssign runs), or while OnRewind runs. Nothing else
// creates the consumer again while the fetcher is stopped for the rewind:
// the owner creates it, as the group's config says, and goes on from its
// start. The request was made for the consumer deleted, so it is void for
// the new one (not recorded, WaitRewind says so), and the new consumer
// hands every event from its start, the rewind's From among them: moved to
// From, it would skip the events before, which it never handed. Before,
// each try of the rewind read the deleted consumer and failed "consumer
// not found": the partition handled nothing more until taken away.
func TestARewindWhoseConsumerIsDeletedWhileItIsCarriedOutGoesOnWithANewOne(t *testing.T) {
	t.Parallel()
	for _, where := range []string{"OnAssign", "OnRewind"} {
		t.Run("deleted in "+where, func(t *testing.T) {
			t.Parallel()
			n, js := setup(t, 1)
			const group, last = "g", 20
			consumer := topology.GroupConsumerName(group, 0)
			publish(t, js, 1, last, 0) // sequences 1..20, in one partition
			first := startMember(t, n, reader.Config{Group: group, Member: "first"},
				func(context.Context, int, []reader.Event) error { return nil })
			ackedToLast := func() bool {
				info, err := js.Consumer(t.Context(), events.ClicksStream, consumer)
				if err != nil {
					return false
				}
				ci, err := info.Info(t.Context())
				return err == nil && ci.AckFloor.Stream == last && ci.NumAckPending == 0
			}
			testenv.WaitFor(t, 30*time.Second, "the first pass acked", ackedToLast)
			first.stop(t)
			old, err := js.Consumer(t.Context(), events.ClicksStream, consumer)
			if err != nil {
				t.Fatal(err)
			}
			id, err := reader.Rewind(t.Context(), js, group, reader.FromSeq(5))
			if err != nil {
				t.Fatal(err)
			}

			var mu sync.Mutex
			var handled []uint64
			var once sync.Once
			del := func(ctx context.Context) (err error) {
				once.Do(func() { err = js.DeleteConsumer(ctx, events.ClicksStream, consumer) })
				return err
			}
			cfg := reader.Config{Group: group, Member: "second", MaxRetryDelay: 200 * time.Millisecond}
			if where == "OnAssign" {
				cfg.OnAssign = func(ctx context.Context, _ int, _ uint64) error { return del(ctx) }
			} else {
				cfg.OnRewind = func(ctx context.Context, _ int, _ reader.RewindInfo) error { return del(ctx) }
			}
			startMember(t, n, cfg, func(_ context.Context, _ int, b []reader.Event) error {
				mu.Lock()
				defer mu.Unlock()
				for _, e := range b {
					handled = append(handled, e.Seq)
				}
				return nil
			})
			if !testenv.Poll(30*time.Second, func() bool {
				c, err := js.Consumer(t.Context(), events.ClicksStream, consumer)
				return err == nil && !c.CachedInfo().Created.Equal(old.CachedInfo().Created) && ackedToLast()
			}) {
				mu.Lock()
				defer mu.Unlock()
				t.Fatalf("the partition's consumer, deleted in %s during a rewind, was not created again and acked to the last event %d in 30 s (handled %v)",
					where, last, handled)
			}
			mu.Lock()
			var want []uint64
			for s := uint64(1); s <= last; s++ {
				want = append(want, s)
			}
			if fmt.Sprint(handled) != fmt.Sprint(want) {
				t.Errorf("handled %v\nwant %v (everything from the new consumer's start)", handled, want)
			}
			mu.Unlock()
			wctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			if err := reader.WaitRewind(wctx, js, group, id); !errors.Is(err, reader.ErrRewindVoid) {
				t.Errorf("WaitRewind of a rewind whose consumer was deleted = %v, want ErrRewindVoid", err)
			}
		})
	}
}
