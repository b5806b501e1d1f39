package reader_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// A member that has not yet heard its partition moved can still pull it:
// the new owner's acquire waited for a pin and a waiting pull, and a member
// inside its OnAssign has neither. If it then handles and acks a batch while
// the new owner is in its own OnAssign (told to resume at the old ack
// floor), the new owner's state would miss that batch. Here the stale member
// is played by a client of the test: while the owner's OnAssign is held, it
// pulls the partition with the group's priority group (so it is pinned
// first), acks sequences 1..5 and unpins. The owner's first batch must then
// find the floor moved and rebuild: OnRevoke, then OnAssign at the first
// event it is handed (6), never handling 1..5.
func TestOwnerRebuildsWhenAnotherMemberAckedDuringItsOnAssign(t *testing.T) {
	t.Parallel()
	n, js := setup(t, 1)
	ids := publish(t, js, 1, 10, 0) // sequences 1..10, in one partition
	var mu sync.Mutex
	var calls []string   // "assign <resume>" and "revoke", in order
	var handled []uint64 // stream sequences handled, in order
	hold := make(chan struct{})
	var once sync.Once
	cfg := reader.Config{Group: "g", Member: "owner", BatchSize: 100, Metrics: prometheus.NewRegistry()}
	reg := cfg.Metrics.(*prometheus.Registry)
	cfg.OnAssign = func(ctx context.Context, p int, resume uint64) error {
		mu.Lock()
		calls = append(calls, fmt.Sprintf("assign %d", resume))
		mu.Unlock()
		once.Do(func() {
			select {
			case <-hold:
			case <-ctx.Done():
			}
		})
		return nil
	}
	cfg.OnRevoke = func(int) {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, "revoke")
	}
	startMember(t, n, cfg, func(_ context.Context, _ int, batch []reader.Event) error {
		mu.Lock()
		defer mu.Unlock()
		for _, e := range batch {
			handled = append(handled, e.Seq)
		}
		return nil
	})
	testenv.WaitFor(t, 30*time.Second, "the owner in its first OnAssign", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(calls) == 1
	})

	// The stale member: pinned by its pull, it acks 1..5 and lets go.
	name := topology.GroupConsumerName("g", 0)
	cons, err := js.Consumer(t.Context(), events.ClicksStream, name)
	if err != nil {
		t.Fatal(err)
	}
	mb, err := cons.Fetch(5, jetstream.FetchMaxWait(5*time.Second), jetstream.FetchPriorityGroup(topology.PriorityGroup))
	if err != nil {
		t.Fatal(err)
	}
	var last jetstream.Msg
	got := 0
	for m := range mb.Messages() {
		last = m
		got++
	}
	if got != 5 || mb.Error() != nil {
		t.Fatalf("the stale member's pull got %d messages (err %v), want 5", got, mb.Error())
	}
	if err := last.DoubleAck(t.Context()); err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(t.Context(), events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.UnpinConsumer(t.Context(), name, topology.PriorityGroup); err != nil {
		t.Fatal(err)
	}
	close(hold)

	testenv.WaitFor(t, 30*time.Second, "the owner to handle the last event", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(handled) > 0 && handled[len(handled)-1] == uint64(len(ids))
	})
	mu.Lock()
	defer mu.Unlock()
	if want := "[6 7 8 9 10]"; fmt.Sprint(handled) != want {
		t.Errorf("the owner handled %v, want %s (1..5 were the stale member's)", handled, want)
	}
	if want := "[assign 1 revoke assign 6]"; fmt.Sprint(calls) != want {
		t.Errorf("OnAssign/OnRevoke calls %v, want %s: state resumed at 1 would miss the stale member's 1..5", calls, want)
	}
	if v := gathered(t, reg, "snip_reader_takeover_reassigns_total"); v != 1 {
		t.Errorf("takeover_reassigns_total = %v, want 1", v)
	}
}

// The same with a rewind pending that has nothing to replay in the
// partition: carrying it out before the first batch moves the consumer to
// its ack floor (what the fetcher had fetched comes again at once), which
// is the stale member's floor by then. The owner's state was built for 1,
// so its first batch must still find the floor moved and rebuild at 6.
func TestOwnerRebuildsWhenAnotherMemberAckedDuringItsOnAssignWithARewindPending(t *testing.T) {
	t.Parallel()
	n, js := setup(t, 1)
	publish(t, js, 1, 10, 0) // sequences 1..10, in one partition
	var mu sync.Mutex
	var calls []string
	var handled []uint64
	hold := make(chan struct{})
	var once sync.Once
	heard := make(chan struct{})
	var heardOnce sync.Once
	cfg := reader.Config{Group: "g", Member: "owner", BatchSize: 100,
		Logger: slog.New(&onMessage{msg: "rewind requested", fn: func() { heardOnce.Do(func() { close(heard) }) }})}
	cfg.OnAssign = func(ctx context.Context, p int, resume uint64) error {
		mu.Lock()
		calls = append(calls, fmt.Sprintf("assign %d", resume))
		mu.Unlock()
		once.Do(func() {
			select {
			case <-hold:
			case <-ctx.Done():
			}
		})
		return nil
	}
	cfg.OnRevoke = func(int) {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, "revoke")
	}
	startMember(t, n, cfg, func(_ context.Context, _ int, batch []reader.Event) error {
		mu.Lock()
		defer mu.Unlock()
		for _, e := range batch {
			handled = append(handled, e.Seq)
		}
		return nil
	})
	testenv.WaitFor(t, 30*time.Second, "the owner in its first OnAssign", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(calls) == 1
	})
	if _, err := reader.Rewind(t.Context(), js, "g", reader.FromSeq(100)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-heard:
	case <-time.After(30 * time.Second):
		t.Fatal("the owner never heard of the rewind")
	}

	// The stale member: pinned by its pull, it acks 1..5 and lets go.
	name := topology.GroupConsumerName("g", 0)
	cons, err := js.Consumer(t.Context(), events.ClicksStream, name)
	if err != nil {
		t.Fatal(err)
	}
	mb, err := cons.Fetch(5, jetstream.FetchMaxWait(5*time.Second), jetstream.FetchPriorityGroup(topology.PriorityGroup))
	if err != nil {
		t.Fatal(err)
	}
	var last jetstream.Msg
	for m := range mb.Messages() {
		last = m
	}
	if last == nil || mb.Error() != nil {
		t.Fatalf("the stale member's pull got nothing (err %v)", mb.Error())
	}
	if err := last.DoubleAck(t.Context()); err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(t.Context(), events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.UnpinConsumer(t.Context(), name, topology.PriorityGroup); err != nil {
		t.Fatal(err)
	}
	close(hold)

	testenv.WaitFor(t, 30*time.Second, "the owner to handle the last event", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(handled) > 0 && handled[len(handled)-1] == 10
	})
	mu.Lock()
	defer mu.Unlock()
	if want := "[6 7 8 9 10]"; fmt.Sprint(handled) != want {
		t.Errorf("the owner handled %v, want %s (1..5 were the stale member's)", handled, want)
	}
	if want := "[assign 1 revoke assign 6]"; fmt.Sprint(calls) != want {
		t.Errorf("OnAssign/OnRevoke calls %v, want %s: state resumed at 1 would miss the stale member's 1..5", calls, want)
	}
}

// OnAssign failing is retried, with the same resume sequence, while the
// partition stays this member's: it is not given up (no OnRevoke), and
// the partition's events are handed out once OnAssign succeeds.
func TestAFailingOnAssignIsRetriedAndThePartitionKept(t *testing.T) {
	t.Parallel()
	n, js := setup(t, 1)
	ids := publish(t, js, 1, 10, 0)
	var mu sync.Mutex
	var calls []string // "assign <resume>" and "revoke", in order
	cfg := reader.Config{Group: "g", Member: "m", BatchSize: 100}
	cfg.OnAssign = func(_ context.Context, _ int, resume uint64) error {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, fmt.Sprintf("assign %d", resume))
		if len(calls) < 3 {
			return errors.New("state store not reachable yet")
		}
		return nil
	}
	cfg.OnRevoke = func(int) {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, "revoke")
	}
	rec := newRecorder()
	m := startMember(t, n, cfg, rec.handler("m"))
	testenv.WaitFor(t, 30*time.Second, "every event handled", func() bool { return rec.handledAll(ids) })
	m.stop(t)
	mu.Lock()
	defer mu.Unlock()
	if want := "[assign 1 assign 1 assign 1 revoke]"; fmt.Sprint(calls) != want {
		t.Errorf("OnAssign/OnRevoke calls %v, want %s (retried, the partition kept until the member left)", calls, want)
	}
}
