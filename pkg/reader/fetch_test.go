package reader_test

import (
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// A partition that falls idle after a burst of full batches pulls once per
// idle wait (LeaseTTL/2, capped), not once per Linger: a fetch that comes
// back empty sets it idle, so an idle group costs the server a pull every
// idle wait per partition, however busy it was before.
func TestAPartitionIdleAfterFullBatchesPullsOncePerIdleWait(t *testing.T) {
	t.Parallel()
	n, js := setup(t, 1)
	const ttl = 2 * time.Second
	idleWait := ttl / 2 // Config.idleWait
	// Full batches first (10 a batch, at least half of which makes the
	// partition busy).
	publish(t, js, 1, 30, 0)

	var mu sync.Mutex
	var pulls []time.Time
	sub, err := js.Conn().Subscribe("$JS.API.CONSUMER.MSG.NEXT."+events.ClicksStream+"."+topology.GroupConsumerName("g", 0), func(*nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		pulls = append(pulls, time.Now())
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := js.Conn().Flush(); err != nil {
		t.Fatal(err)
	}

	o := newOwnership()
	cfg := o.config("a")
	cfg.LeaseTTL = ttl
	startMember(t, n, cfg, o.handler("a"))
	testenv.WaitFor(t, 30*time.Second, "the member handling the 30 events", func() bool {
		return o.handledUpTo(30)
	})
	mu.Lock()
	from := len(pulls)
	mu.Unlock()
	// The pulls after the burst: the one that found nothing, then the
	// idle ones.
	const idle = 6
	testenv.WaitFor(t, 60*time.Second, "pulls of the partition idle", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(pulls) >= from+1+idle
	})
	mu.Lock()
	defer mu.Unlock()
	first, last := pulls[from+1], pulls[from+idle]
	mean := last.Sub(first) / (idle - 1)
	t.Logf("an idle partition pulled every %s on average (idle wait %s)", mean.Round(time.Millisecond), idleWait)
	if mean < idleWait/2 {
		t.Errorf("an idle partition pulled every %s on average (%d pulls in %s), want about the idle wait %s (Linger is %s)",
			mean.Round(time.Millisecond), idle, last.Sub(first).Round(time.Millisecond), idleWait, 100*time.Millisecond)
	}
}
