package delivery

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/webhooks/internal/endpoint"
	"github.com/snipdev/snip/services/webhooks/internal/redisstore"
)

// leaseTrips counts, through a go-redis hook, the round trips that carry
// endpoint lease commands and the lease commands they carry.
type leaseTrips struct {
	mu          sync.Mutex
	trips, cmds int
}

func isLeaseCmd(c redis.Cmder) bool {
	for _, a := range c.Args() {
		if s, ok := a.(string); ok && strings.HasPrefix(s, "snip:wh:{ep_") && strings.HasSuffix(s, "}:lease") {
			return true
		}
	}
	return false
}

func (h *leaseTrips) count(cmds []redis.Cmder) {
	n := 0
	for _, c := range cmds {
		if isLeaseCmd(c) {
			n++
		}
	}
	if n > 0 {
		h.mu.Lock()
		h.trips, h.cmds = h.trips+1, h.cmds+n
		h.mu.Unlock()
	}
}

func (h *leaseTrips) get() (trips, cmds int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.trips, h.cmds
}

func (h *leaseTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *leaseTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, c redis.Cmder) error {
		h.count([]redis.Cmder{c})
		return next(ctx, c)
	}
}

func (h *leaseTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.count(cmds)
		return next(ctx, cmds)
	}
}

// TestOneScanRenewsEveryLeaseInOneRoundTrip: an instance holding many
// endpoints took or renewed their leases one Redis round trip each, so the
// last was renewed hundreds of round trips after the first (late, under
// load, for a lease of LeaseTTL renewed every LeaseTTL/3). One scan now
// takes and renews them all in one round trip, with the lease's rules as
// they were: the leases it held are extended, the free ones taken, and
// one another instance holds stays that instance's.
func TestOneScanRenewsEveryLeaseInOneRoundTrip(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := t.Context()
	store := redisstore.New(rdb, 1000)
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	const ttl = time.Hour
	// Paused, with an hour's poll: the senders the scan starts stay idle.
	mgr := NewManager(store, NewSender(store, NewClient(ClientConfig{}), SenderConfig{Poll: time.Hour}, m, log), "m1", ttl, log)
	t.Cleanup(mgr.stopAll)

	const n = 300
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("ep_%03d", i)
		e := endpoint.Endpoint{ID: ids[i], Owner: "acme", URL: "https://example.com/hook", Types: []string{endpoint.TypeClick}, Paused: true}
		if err := store.Put(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	// m1 holds every other lease already, about to expire; another
	// instance holds the last one.
	for i := 0; i < n-1; i += 2 {
		if ok, err := store.Lease(ctx, ids[i], "m1", time.Minute); err != nil || !ok {
			t.Fatalf("lease %s for m1: %v, %v", ids[i], ok, err)
		}
	}
	if ok, err := store.Lease(ctx, ids[n-1], "m2", time.Minute); err != nil || !ok {
		t.Fatalf("lease %s for m2: %v, %v", ids[n-1], ok, err)
	}

	trips := &leaseTrips{}
	rdb.AddHook(trips)
	mgr.scan(ctx)
	if gotTrips, gotCmds := trips.get(); gotTrips != 1 || gotCmds != n {
		t.Errorf("one scan of %d endpoints: %d lease commands in %d round trips; want %d in 1", n, gotCmds, gotTrips, n)
	}

	for i, id := range ids {
		holder, err := rdb.Get(ctx, "snip:wh:{"+id+"}:lease").Result()
		if err != nil {
			t.Fatalf("lease of %s: %v", id, err)
		}
		left, err := rdb.PTTL(ctx, "snip:wh:{"+id+"}:lease").Result()
		if err != nil {
			t.Fatal(err)
		}
		wantHolder, renewed := "m1", left > time.Minute
		if i == n-1 {
			wantHolder, renewed = "m2", left <= time.Minute
		}
		if holder != wantHolder || !renewed {
			t.Errorf("lease of %s after the scan: held by %s for %s more; want %s's, and extended to %s only if m1's", id, holder, left, wantHolder, ttl)
		}
	}
	mgr.mu.Lock()
	running := len(mgr.running)
	mgr.mu.Unlock()
	if running != n-1 {
		t.Errorf("senders running after the scan: %d, want %d (all but the endpoint m2 holds)", running, n-1)
	}
}
