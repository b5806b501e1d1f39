package outbox

import (
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
)

// TestRelayDoesNotPublishABatchAgainAfterARedisOutageLongerThanTheDuplicateWindow:
// JetStream acknowledges a batch, and Redis stops answering before the
// relay's trim; it answers again only once the stream's duplicate window has
// passed since the acks (here the window is made short; in production it is
// 2 minutes, and Redis restarts or fails over slower than that). The relay
// retries the trim of the batch it knows was acknowledged instead of reading
// the lane again and publishing the batch anew, which the stream would
// store twice: every click is in CLICKS once, in order, and counted once.
// The window (1 s) is longer than the relay's lease lives (540 ms), so the
// lease has lapsed in Redis by the time it answers again: the relay loses
// the shard and takes it again, and trims the batch then.
func TestRelayDoesNotPublishABatchAgainAfterARedisOutageLongerThanTheDuplicateWindow(t *testing.T) {
	testenv.Parallel(t)
	e := newEnv(t, 1)
	s, err := e.js.Stream(t.Context(), events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.Duplicates = time.Second
	if _, err := e.js.UpdateStream(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	ids := e.addClicks(t, "abc", 40)

	// Redis as the relay sees it: every command fails once down.
	down := &killed{}
	e.rdb.AddHook(down)
	r := e.relay("r")
	var once sync.Once
	acked := make(chan struct{})
	r.afterAcks = func(int, Lane, []string) error {
		once.Do(func() { down.kill(); close(acked) })
		return nil
	}
	rr := start(r)
	defer rr.stop()
	<-acked

	// A probe published after the batch's acks: once the stream stores it
	// again, the window has passed for the batch too.
	const probe = "probe-duplicate-window"
	pub := func() *jetstream.PubAck {
		msg := &nats.Msg{Subject: events.ClickSubject("acme", "probe"), Data: []byte("{}"), Header: nats.Header{events.HeaderMsgID: []string{probe}}}
		ack, err := e.js.PublishMsg(t.Context(), msg)
		if err != nil {
			t.Fatal(err)
		}
		return ack
	}
	pub()
	testenv.WaitFor(t, 10*time.Second, "the duplicate window to pass", func() bool { return !pub().Duplicate })
	down.dead.Store(false) // Redis answers again

	testenv.WaitFor(t, 10*time.Second, "the outbox to empty", func() bool { return e.outboxLen(t) == 0 })
	var got []string
	for _, id := range storedIDs(t, e.js, events.ClicksStream) {
		if id != probe {
			got = append(got, id)
		}
	}
	sameSequence(t, "CLICKS", ids, got)
	if n := counterValue(r.m.Published.WithLabelValues(LaneClicks.Name)); n != 40 {
		t.Fatalf("relay_published_total = %v, want 40", n)
	}
	if n := testutilLeasesLost(r); n < 1 {
		t.Fatalf("relay_leases_lost_total = %v: the outage did not let the lease lapse", n)
	}
}
