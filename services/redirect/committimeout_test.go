package main

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/redirect/internal/outbox"
)

// TestCommitTimeoutBoundsTheGroupCommit: against a frozen Redis, a group
// commit through the committer's client (committerRedis) fails
// SNIP_COMMIT_TIMEOUT after it was sent. Not sooner, even when REDIS_URL's
// read timeout is shorter: the click's XADD, in the frozen Redis's socket,
// could then still be stored within its validity after the failure had its
// request answered 503, and be relayed. Not much later either when the
// URL's read timeout is longer (2 s by default).
func TestCommitTimeoutBoundsTheGroupCommit(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	for _, tc := range []struct {
		query   string
		timeout time.Duration
	}{
		{query: "?read_timeout=50ms", timeout: 1200 * time.Millisecond},
		{query: "", timeout: 500 * time.Millisecond},
	} {
		cfg := testConfig(r.URL(0)+tc.query, "")
		cfg.CommitTimeout = tc.timeout
		rdb, err := committerRedis(cfg)
		if err != nil {
			t.Fatal(err)
		}
		c := outbox.NewCommitter(rdb, outbox.NewLayout(1), outbox.CommitterConfig{
			MaxBatch: 8, Workers: 1, MaxEntries: 1 << 40, Timeout: cfg.CommitTimeout, Cooldown: time.Millisecond,
		}, outbox.NewMetrics(prometheus.NewRegistry()))
		c.Start()
		appendOne := func() error {
			return c.Append(context.Background(), 0, []byte(events.NewID()), []byte("clicks.acme.abc"), []byte("{}"))
		}
		if err := appendOne(); err != nil { // the connection is open
			t.Fatal(err)
		}
		r.Pause()
		start := time.Now()
		err = appendOne()
		took := time.Since(start)
		r.Resume()
		c.Close()
		_ = rdb.Close()
		t.Logf("URL query %q, SNIP_COMMIT_TIMEOUT %s: failed after %s", tc.query, tc.timeout, took)
		if !errors.Is(err, outbox.ErrUnavailable) {
			t.Fatalf("URL query %q: append to a frozen Redis: %v, want ErrUnavailable", tc.query, err)
		}
		if took < tc.timeout || took > tc.timeout+time.Second {
			t.Fatalf("URL query %q, SNIP_COMMIT_TIMEOUT %s: the commit failed after %s", tc.query, tc.timeout, took.Round(time.Millisecond))
		}
	}
}
