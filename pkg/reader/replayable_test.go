package reader_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// waitConsumers waits until the group has its consumer in every partition.
func waitConsumers(t *testing.T, js jetstream.JetStream, group string, partitions int) {
	t.Helper()
	testenv.WaitFor(t, 30*time.Second, "the group's consumers", func() bool {
		for p := range partitions {
			if _, err := js.Consumer(t.Context(), events.ClicksStream, topology.GroupConsumerName(group, p)); err != nil {
				return false
			}
		}
		return true
	})
}

// A group whose consumers were created at new events (the webhooks group,
// any reader started with StartAtNew) cannot be replayed: the server moves
// such a consumer back only to its ack floor. Rewind says so and stores
// nothing, and the group goes on. Before, the request was stored and each
// partition's owner retried a move the server refused for ever: the group
// handled nothing more.
func TestARewindOfAGroupStartedAtNewIsRefusedAndLeavesItReading(t *testing.T) {
	t.Parallel()
	const partitions = 2
	n, js := setup(t, partitions)
	group := topology.GroupWebhooks
	var handled atomic.Int64
	startMember(t, n, reader.Config{Group: group, Member: "m", Start: reader.StartAtNew()},
		func(_ context.Context, _ int, b []reader.Event) error { handled.Add(int64(len(b))); return nil })
	waitConsumers(t, js, group, partitions)
	ids := publish(t, js, 4, 2, 0)
	testenv.WaitFor(t, 30*time.Second, "the first pass", func() bool { return handled.Load() == int64(len(ids)) })

	_, err := reader.Rewind(t.Context(), js, group, reader.FromTime(time.Now().Add(-time.Hour)))
	if !errors.Is(err, reader.ErrNotReplayable) {
		t.Errorf("Rewind of a group started at new events: %v, want ErrNotReplayable", err)
	} else if !strings.Contains(err.Error(), "/api/webhooks/endpoints/<id>/replay") {
		t.Errorf("Rewind of the webhooks group: %v, want the endpoint replay named", err)
	}
	if st, err := reader.LatestRewind(t.Context(), js, group); err != nil || st.ID != "" {
		t.Errorf("latest rewind %q (%v), want none stored", st.ID, err)
	}
	// Twice: the first clicks may be fetched before the owners look for
	// a replay to carry out (every 250 ms).
	want := int64(len(ids))
	for i := range 2 {
		want += int64(len(publish(t, js, 4, 2, 2+2*i)))
		testenv.WaitFor(t, 30*time.Second, "the group to handle what was published after the replay was asked", func() bool {
			return handled.Load() == want
		})
	}
}

// A group started at a time, replayed from before it: the server moves its
// consumers back no further than their start (it refuses a reset "below
// start time"), so each partition's replay starts at its first event at or
// after that time, and the status says so. Before, the request kept the
// sequence asked for and each owner retried the refused move for ever.
func TestARewindOfAGroupStartedAtATimeFromBeforeItStartsAtItsStart(t *testing.T) {
	t.Parallel()
	const partitions = 2
	n, js := setup(t, partitions)
	early := publish(t, js, 4, 2, 0)
	s, err := js.Stream(t.Context(), events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	start := info.State.LastTime.Add(time.Nanosecond) // after every early click
	late := publish(t, js, 4, 2, 2)

	var mu sync.Mutex
	handed := map[string]int{}
	var rewinds []reader.RewindInfo
	startMember(t, n, reader.Config{Group: "g", Member: "m", Start: reader.StartAtTime(start),
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
				handed[e.Click.ID]++
			}
			return nil
		})
	count := func(ids []string) (n int) {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range ids {
			n += handed[id]
		}
		return n
	}
	testenv.WaitFor(t, 30*time.Second, "the first pass", func() bool { return count(late) == len(late) })

	id, err := reader.Rewind(t.Context(), js, "g", reader.FromSeq(1))
	if err != nil {
		t.Fatal(err)
	}
	st, err := reader.LatestRewind(t.Context(), js, "g")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range st.Partitions {
		if !p.AtGroupStart || p.From <= 1 {
			t.Errorf("partition %d replays from %d (at the group's start: %t), want its first event after the start", p.Partition, p.From, p.AtGroupStart)
		}
	}
	wctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := reader.WaitRewind(wctx, js, "g", id); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the replay", func() bool { return count(late) == 2*len(late) })
	mu.Lock()
	defer mu.Unlock()
	if n := 0; true {
		for _, id := range early {
			n += handed[id]
		}
		if n > 0 {
			t.Errorf("%d clicks from before the group's start handed", n)
		}
	}
	if len(rewinds) != partitions {
		t.Fatalf("OnRewind called %d times, want once per partition: %+v", len(rewinds), rewinds)
	}
	for _, ri := range rewinds {
		if !ri.MovesBack {
			t.Errorf("OnRewind told %+v, want MovesBack", ri)
		}
	}
}

// A request stored by an older version, which refused nothing, for a
// group started at new events: its owner decides the partition does not
// move back (the server would refuse it), tells OnRewind so, records the
// rewind and goes on. Before, it retried the refused move for ever.
func TestAnOldRewindRequestOfAGroupStartedAtNewDoesNotWedgeIt(t *testing.T) {
	t.Parallel()
	n, js := setup(t, 1)
	var mu sync.Mutex
	var rewinds []reader.RewindInfo
	var handled atomic.Int64
	startMember(t, n, reader.Config{Group: "g", Member: "m", Start: reader.StartAtNew(),
		OnRewind: func(_ context.Context, _ int, ri reader.RewindInfo) error {
			mu.Lock()
			defer mu.Unlock()
			rewinds = append(rewinds, ri)
			return nil
		}},
		func(_ context.Context, _ int, b []reader.Event) error { handled.Add(int64(len(b))); return nil })
	waitConsumers(t, js, "g", 1)
	ids := publish(t, js, 2, 3, 0)
	testenv.WaitFor(t, 30*time.Second, "the first pass", func() bool { return handled.Load() == int64(len(ids)) })

	id := storeOldRewind(t, js, "g", 1, uint64(len(ids)))
	wctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := reader.WaitRewind(wctx, js, "g", id); err != nil {
		t.Fatal(err)
	}
	more := publish(t, js, 2, 2, 3)
	testenv.WaitFor(t, 30*time.Second, "the partition to handle what was published after the rewind", func() bool {
		return handled.Load() == int64(len(ids)+len(more))
	})
	mu.Lock()
	defer mu.Unlock()
	if len(rewinds) != 1 || rewinds[0].MovesBack {
		t.Errorf("OnRewind told %+v, want once, MovesBack false", rewinds)
	}
}

// A handler's Replay(from) in a group started at new events: the server
// moves the consumer back only to its ack floor, so the partition goes on
// from there (an error logged) rather than retrying the move for ever.
func TestAHandlersReplayInAGroupStartedAtNewGoesOnFromTheFloor(t *testing.T) {
	t.Parallel()
	n, js := setup(t, 1)
	var mu sync.Mutex
	handed := map[string]int{}
	asked := false
	startMember(t, n, reader.Config{Group: "g", Member: "m", Start: reader.StartAtNew()},
		func(_ context.Context, _ int, b []reader.Event) error {
			mu.Lock()
			defer mu.Unlock()
			if b[0].Click.RequestID == "3" && !asked {
				asked = true
				return reader.Replay(1, errors.New("the store lost applied writes"))
			}
			for _, e := range b {
				handed[e.Click.ID]++
			}
			return nil
		})
	waitConsumers(t, js, "g", 1)
	first := publish(t, js, 1, 3, 0)
	testenv.WaitFor(t, 30*time.Second, "the first pass", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(handed) == len(first)
	})
	more := publish(t, js, 1, 3, 3) // the first batch of these asks for a replay
	testenv.WaitFor(t, 30*time.Second, "the partition to go on after the replay asked for", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range more {
			if handed[id] == 0 {
				return false
			}
		}
		return true
	})
}

// storeOldRewind stores a rewind request of partition 0 of the group from
// from until until as a version that refused nothing stored it (no
// consumers recorded, nothing moved up to the group's start), and returns
// its ID.
func storeOldRewind(t *testing.T, js jetstream.JetStream, group string, from, until uint64) string {
	t.Helper()
	kv, err := js.KeyValue(t.Context(), topology.MembersBucket)
	if err != nil {
		t.Fatal(err)
	}
	id := events.NewID()
	b, _ := json.Marshal(map[string]any{
		"id": id, "requested": time.Now().UTC(),
		"from": map[string]uint64{"0": from}, "until": map[string]uint64{"0": until},
	})
	if _, err := kv.Put(t.Context(), group+".rewind", b); err != nil {
		t.Fatal(err)
	}
	return id
}
