package main

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/redirect/internal/outbox"
)

// TestShutdownWaitsForItsOwnClicksOnly: shutdown waits until every click
// this instance committed is relayed, and no longer: an entry another
// instance wrote into a shard whose relay is stuck (its lease held by a
// hung instance) does not hold it up, and stays in the outbox for that
// shard's next relay. Every click answered 302 is in CLICKS the moment
// Stop returns.
func TestShutdownWaitsForItsOwnClicksOnly(t *testing.T) {
	t.Parallel()
	rdb, db := servers.Redis.NewDB(t)
	n := testenv.StartNATS(t)
	js := n.JetStream(t)
	cfg := testConfig(servers.Redis.URL(db), n.URL)
	layout := outbox.NewLayout(cfg.OutboxShards)

	// Shard 0 is held by a hung instance, and holds a click another
	// instance wrote: no relay publishes it while the test runs.
	const stuck = 0
	ctx := t.Context()
	if err := rdb.Set(ctx, layout.LeaseKey(stuck), "hung/0", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if err := outbox.Add(ctx, rdb, layout.OutboxKey(stuck, outbox.LaneClicks), events.NewID(), "clicks.acme.other", []byte(`{}`)).Err(); err != nil {
		t.Fatal(err)
	}

	in := startInstance(t, cfg)
	var codes []string
	for i := 0; len(codes) < 3; i++ {
		if code := fmt.Sprintf("drain-%d", i); layout.Shard(code) != stuck {
			codes = append(codes, createLink(t, in.URL, "https://example.com/", code))
		}
	}
	const clicks = 60
	for i := range clicks {
		if r := do(t, "GET", in.URL+"/"+codes[i%len(codes)], ""); r.Status != http.StatusFound {
			t.Fatalf("click %d: %d %s", i, r.Status, r.Body)
		}
	}

	start := time.Now()
	if err := in.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	took := time.Since(start)
	// The drain's bound is 5 s; waiting on the stuck shard takes all of it.
	if took > 3*time.Second {
		t.Errorf("shutdown took %s: it waited for entries that are not this instance's", took)
	}
	if got := streamCount(js, events.ClicksStream); got != clicks {
		t.Errorf("CLICKS holds %d clicks when shutdown ended, want all %d answered 302", got, clicks)
	}
	if got := rdb.XLen(ctx, layout.OutboxKey(stuck, outbox.LaneClicks)).Val(); got != 1 {
		t.Errorf("the stuck shard's outbox holds %d entries after shutdown, want its 1 left for its next relay", got)
	}
}
