package reader_test

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// An owner whose fetches failed for a while (here: refused, its priority
// group gone from the consumer's config, as a NATS leader election would
// refuse them) goes on within a second or two of the failures ending: its
// backoff stays under the pin's TTL. Backing off up to MaxRetryDelay (10s)
// it lost its pin meanwhile, and its first pull after was refused for the
// old pin ID and backed off again: the partition stood still for 10-20s
// with nothing wrong any more.
func TestAnOwnerWhoseFetchesFailedGoesOnSoonAfterTheyStop(t *testing.T) {
	t.Parallel()
	n, js := setup(t, 1)
	ctx := t.Context()
	var fetchErrors atomic.Int64
	var handled atomic.Int64
	startMember(t, n, reader.Config{Group: "backoff", Member: "m1", MaxRetryDelay: 10 * time.Second,
		Logger: slog.New(&onMessage{msg: "fetch", fn: func() { fetchErrors.Add(1) }})},
		func(_ context.Context, _ int, b []reader.Event) error {
			handled.Add(int64(len(b)))
			return nil
		})
	publish(t, js, 1, 1, 0)
	testenv.WaitFor(t, 30*time.Second, "the first event handled", func() bool { return handled.Load() == 1 })

	name := topology.GroupConsumerName("backoff", 0)
	setGroups := func(groups ...string) {
		t.Helper()
		c, err := js.Consumer(ctx, events.ClicksStream, name)
		if err != nil {
			t.Fatal(err)
		}
		cfg := c.CachedInfo().Config
		cfg.PriorityGroups = groups
		if _, err := js.UpdateConsumer(ctx, events.ClicksStream, cfg); err != nil {
			t.Fatal(err)
		}
	}
	setGroups("elsewhere")
	// Nine failures in a row: backing off up to MaxRetryDelay, the next
	// wait is at the cap; under the pin's TTL, it is half a lease.
	testenv.WaitFor(t, 60*time.Second, "nine fetches refused", func() bool { return fetchErrors.Load() >= 9 })
	setGroups(topology.PriorityGroup)
	publish(t, js, 1, 1, 1)
	ended := time.Now()
	if !testenv.Poll(5*time.Second, func() bool { return handled.Load() == 2 }) {
		testenv.WaitFor(t, 60*time.Second, "the event handled at all", func() bool { return handled.Load() == 2 })
		t.Fatalf("the event published after the fetches stopped failing handled %s after, want within 5s (lease 1s)",
			time.Since(ended).Round(time.Millisecond))
	}
	t.Logf("handled %s after the fetches stopped failing", time.Since(ended).Round(time.Millisecond))
}
