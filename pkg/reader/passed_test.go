package reader_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// OnPassed tells a reader of the positions the runtime passed without the
// handler completing them: a batch that ends in events parked before the
// handler saw them, a batch of nothing else, and a batch whose last event
// the handler answered with Poison. It is called after those events are on
// DEAD_LETTER and before the ack, retried on an error as a handler is, and
// never for a batch whose last event the handler completed (a parked event
// between valid ones is passed when the next one is handed over).
func TestOnPassedIsCalledForTheParkedEndOfABatch(t *testing.T) {
	t.Parallel()
	n, js := setup(t, 1) // one partition: its sequences are the stream's
	ctx := t.Context()
	raw := func(data string) uint64 {
		t.Helper()
		ack, err := js.Publish(ctx, events.ClickSubject("acme", "link0"), []byte(data))
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}
	valid := func(i int) uint64 {
		t.Helper()
		c := click("link0", i)
		return raw(mustJSON(t, c))
	}
	dlq, err := js.Stream(ctx, events.DeadLetterStream)
	if err != nil {
		t.Fatal(err)
	}
	// The partition's consumer, made by the member when it starts.
	ackFloor := func(ctx context.Context) (uint64, error) {
		c, err := js.Consumer(ctx, events.ClicksStream, topology.GroupConsumerName("g", 0))
		if err != nil {
			return 0, err
		}
		ci, err := c.Info(ctx)
		if err != nil {
			return 0, err
		}
		return ci.AckFloor.Stream, nil
	}

	var mu sync.Mutex
	var handled []uint64          // sequences the handler completed
	var calls []reader.PassedInfo // every OnPassed call, failed ones included
	var problems []string         // what a call found out of order
	failNext := false             // the next call fails (once)
	h := func(_ context.Context, _ int, batch []reader.Event) error {
		mu.Lock()
		defer mu.Unlock()
		for i, e := range batch {
			if e.Click.RequestID == "poison" {
				return reader.Poison(i, "bad_target", errors.New("target rejected"))
			}
			handled = append(handled, e.Seq)
		}
		return nil
	}
	onPassed := func(ctx context.Context, p int, info reader.PassedInfo) error {
		// Before the ack, after the parking: the partition is acked below
		// info.Last, and the event at info.Last is on DEAD_LETTER.
		floor, err := ackFloor(ctx)
		if err != nil {
			return err
		}
		parked, err := deadLetterSeqs(ctx, dlq)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, info)
		if p != 0 || info.First > info.Last || info.Stored.IsZero() {
			problems = append(problems, fmt.Sprintf("call %+v on partition %d", info, p))
		}
		if floor >= info.Last {
			problems = append(problems, fmt.Sprintf("call %+v after the ack (ack floor %d)", info, floor))
		}
		if !parked[info.Last] {
			problems = append(problems, fmt.Sprintf("call %+v before the event at %d was parked (dead letters of %v)", info, info.Last, parked))
		}
		if failNext {
			failNext = false
			return errors.New("the reader's store is away")
		}
		return nil
	}
	snapshot := func() ([]uint64, []reader.PassedInfo) {
		mu.Lock()
		defer mu.Unlock()
		return append([]uint64(nil), handled...), append([]reader.PassedInfo(nil), calls...)
	}
	lastCall := func(last uint64) func() bool {
		return func() bool {
			_, cs := snapshot()
			return len(cs) > 0 && cs[len(cs)-1].Last == last
		}
	}

	// 1. Stored before the member starts, so they make one batch: a parked
	// event between two valid ones, then two parked events that end it.
	valid(0)
	raw(`{not json`)
	valid(1)
	raw(`{"v":99,"id":"x"}`)
	endOfFirst := raw(`{"v":1}`)
	startMember(t, n, reader.Config{Group: "g", Member: "m", BatchSize: 100, MaxRetryDelay: 50 * time.Millisecond, OnPassed: onPassed}, h)
	testenv.WaitFor(t, 30*time.Second, "OnPassed for the parked end of the first batch", lastCall(endOfFirst))

	// 2. An ordinary batch: valid events only.
	var ordinary []uint64
	for i := 2; i < 5; i++ {
		ordinary = append(ordinary, valid(i))
	}
	testenv.WaitFor(t, 30*time.Second, "the ordinary batch handled", func() bool {
		hs, _ := snapshot()
		return len(hs) > 0 && hs[len(hs)-1] == ordinary[len(ordinary)-1]
	})

	// 3. Parked events alone; the first OnPassed call fails and is retried.
	mu.Lock()
	failNext = true
	mu.Unlock()
	firstParked := raw(`{not json`)
	lastParked := raw(`{not json either`)
	testenv.WaitFor(t, 30*time.Second, "OnPassed for the batch of parked events", lastCall(lastParked))

	// 4. The handler answers Poison for the batch's last event.
	poison := click("link0", 0)
	poison.RequestID = "poison"
	poisoned := raw(mustJSON(t, poison))
	testenv.WaitFor(t, 30*time.Second, "OnPassed for the poisoned last event", lastCall(poisoned))
	testenv.WaitFor(t, 10*time.Second, "the partition acked to its last event", func() bool {
		floor, err := ackFloor(ctx)
		return err == nil && floor == poisoned
	})

	hs, cs := snapshot()
	if d := cmp.Diff([]uint64{1, 3, ordinary[0], ordinary[1], ordinary[2]}, hs); d != "" {
		t.Errorf("handled (-want +got):\n%s", d)
	}
	mu.Lock()
	for _, p := range problems {
		t.Error(p)
	}
	mu.Unlock()
	// The parked end of each batch once, the one of phase 3 twice (its
	// first call failed); no call for the ordinary batch or for the parked
	// event the handler passed when it was handed the next one. (Phase 3's
	// two events are published one after the other while the partition is
	// idle: they may come in one batch or two.)
	want := []reader.PassedInfo{{First: 4, Last: endOfFirst}, {First: firstParked, Last: lastParked}, {First: firstParked, Last: lastParked}, {First: poisoned, Last: poisoned}}
	if len(cs) == 5 {
		want = []reader.PassedInfo{want[0], {First: firstParked, Last: firstParked}, {First: firstParked, Last: firstParked}, {First: lastParked, Last: lastParked}, want[3]}
	}
	if d := cmp.Diff(want, cs, cmp.Comparer(func(a, b reader.PassedInfo) bool { return a.First == b.First && a.Last == b.Last })); d != "" {
		t.Errorf("OnPassed calls (-want +got):\n%s", d)
	}
}

func mustJSON(t *testing.T, c events.Click) string {
	t.Helper()
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// deadLetterSeqs returns the CLICKS sequences DEAD_LETTER holds dead letters of.
func deadLetterSeqs(ctx context.Context, dlq jetstream.Stream) (map[uint64]bool, error) {
	info, err := dlq.Info(ctx)
	if err != nil {
		return nil, err
	}
	out := map[uint64]bool{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := dlq.GetMsg(ctx, seq)
		if err != nil {
			return nil, err
		}
		s, _ := strconv.ParseUint(m.Header.Get(events.HeaderDeadSeq), 10, 64)
		out[s] = true
	}
	return out, nil
}

// An event parked again by the same group (here its batch is replayed:
// OnPassed asks for it once) is stored once on DEAD_LETTER, its Nats-Msg-Id
// being the same, and counted once in snip_reader_parked_total.
func TestAnEventParkedAgainIsCountedOnce(t *testing.T) {
	t.Parallel()
	n, js := setup(t, 1)
	ctx := t.Context()
	ack, err := js.Publish(ctx, events.ClickSubject("acme", "link0"), []byte(`{not json`))
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		calls int
	)
	onPassed := func(_ context.Context, _ int, p reader.PassedInfo) error {
		mu.Lock()
		defer mu.Unlock()
		if calls++; calls == 1 {
			return reader.Replay(p.First, errors.New("the reader's store lost its position"))
		}
		return nil
	}
	reg := prometheus.NewRegistry()
	startMember(t, n, reader.Config{Group: "g", Member: "m", Metrics: reg, BatchSize: 100, MaxRetryDelay: 50 * time.Millisecond, OnPassed: onPassed},
		func(context.Context, int, []reader.Event) error { return nil })
	testenv.WaitFor(t, 30*time.Second, "the malformed event parked, replayed, parked again and acked", func() bool {
		mu.Lock()
		defer mu.Unlock()
		if calls < 2 {
			return false
		}
		c, err := js.Consumer(ctx, events.ClicksStream, topology.GroupConsumerName("g", 0))
		if err != nil {
			return false
		}
		ci, err := c.Info(ctx)
		return err == nil && ci.AckFloor.Stream == ack.Sequence
	})
	dlq, err := js.Stream(ctx, events.DeadLetterStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := dlq.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Errorf("DEAD_LETTER holds %d letters, want 1", info.State.Msgs)
	}
	if v := gathered(t, reg, "snip_reader_parked_total"); v != 1 {
		t.Errorf("parked_total = %v after parking one event twice, want 1", v)
	}
}
