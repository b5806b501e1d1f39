package delivery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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

// leaseBlip is a go-redis hook for an instance's Redis client: once armed,
// it fails every command for length, from after past the next renewal of
// an endpoint's lease that succeeded: a Redis that refuses the instance's
// connections for a while (a restart, a failover, a proxy), then serves it
// again.
type leaseBlip struct {
	armed         atomic.Bool
	after, length time.Duration

	mu       sync.Mutex
	from, to time.Time // the blip, once armed and set
}

var errLeaseBlip = errors.New("redis out of reach")

func (h *leaseBlip) window() (from, to time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.from, h.to
}

func (h *leaseBlip) down() bool {
	from, to := h.window()
	now := time.Now()
	return !from.IsZero() && !now.Before(from) && now.Before(to)
}

func (h *leaseBlip) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *leaseBlip) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, c redis.Cmder) error {
		if h.down() {
			c.SetErr(errLeaseBlip)
			return errLeaseBlip
		}
		return next(ctx, c)
	}
}

func (h *leaseBlip) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.down() {
			for _, c := range cmds {
				c.SetErr(errLeaseBlip)
			}
			return errLeaseBlip
		}
		err := next(ctx, cmds)
		if err == nil && slices.ContainsFunc(cmds, isLeaseCmd) && h.armed.CompareAndSwap(true, false) {
			h.mu.Lock()
			h.from = time.Now().Add(h.after)
			h.to = h.from.Add(h.length)
			h.mu.Unlock()
		}
		return err
	}
}

// TestAnEndpointLeaseOutlivesARedisBlipShorterThanIt: while an instance
// sends for an endpoint, the endpoint's lease must not lapse: another
// instance would take it and send the same queue alongside. Renewed only by
// the scan, every third of the lease, it lapsed under a blip of eight
// tenths of it (2.4 s of the default 3 s) that began a little before a
// renewal was due: that scan and the next two failed, and the lease ran out
// a third of it before the next. Here instance a's Redis client fails every
// command for 2.4 s, from 0.81 s after a renewal of its lease succeeded,
// while another instance asks for the lease every 10 ms through the blip
// and a third of the lease past it: it never gets it, and a's sender runs
// throughout, the same one.
func TestAnEndpointLeaseOutlivesARedisBlipShorterThanIt(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	const ttl = 3 * time.Second // WEBHOOKS_LEASE_TTL's default
	blip := &leaseBlip{after: ttl * 27 / 100, length: ttl * 8 / 10}
	brdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = brdb.Close() })
	brdb.AddHook(blip)
	ctx := t.Context()
	store, bstore := redisstore.New(rdb, 1000), redisstore.New(brdb, 1000)
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	// Paused, with an hour's poll: the sender stays idle, and makes no
	// Redis call of its own during the blip.
	e := endpoint.Endpoint{ID: "ep_blip", Owner: "acme", URL: "https://example.com/hook", Types: []string{endpoint.TypeClick}, Paused: true}
	if err := store.Put(ctx, e); err != nil {
		t.Fatal(err)
	}
	mgr := NewManager(bstore, NewSender(bstore, NewClient(ClientConfig{}), SenderConfig{Poll: time.Hour}, m, log), "a", ttl, log)
	mctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Run(mctx) }()
	t.Cleanup(func() { stop(); <-done })
	sending := func() *run {
		mgr.mu.Lock()
		defer mgr.mu.Unlock()
		return mgr.running[e.ID]
	}
	testenv.WaitFor(t, 10*time.Second, "a's sender", func() bool { return sending() != nil })
	r := sending()

	blip.armed.Store(true)
	testenv.WaitFor(t, 10*time.Second, "a renewal of the lease", func() bool { f, _ := blip.window(); return !f.IsZero() })
	blipFrom, blipTo := blip.window()
	renewedAt := blipFrom.Add(-blip.after)
	// Instance b asks for the lease through the blip and a third of the
	// lease past it: a lease that lapsed in it is b's by then.
	var takenAt time.Time
	if testenv.Poll(time.Until(blipTo)+ttl/3, func() bool {
		ok, err := store.Lease(ctx, e.ID, "b", ttl)
		if err != nil {
			t.Error(err)
		}
		takenAt = time.Now()
		return ok
	}) {
		t.Fatalf("a's lease, its instance out of Redis' reach for %s (%s to %s after a renewal; the lease: %s), was taken by another instance %s after the renewal",
			blip.length, blip.after, blip.after+blip.length, ttl, takenAt.Sub(renewedAt).Round(time.Millisecond))
	}
	if got := sending(); got != r {
		t.Errorf("a's sender after the blip: %p, want the one that ran before it (%p)", got, r)
	}
	holder, err := rdb.Get(ctx, "snip:wh:{"+e.ID+"}:lease").Result()
	if err != nil || holder != "a" {
		t.Errorf("the lease after the blip: held by %q (%v), want a", holder, err)
	}
}

// failLeases is a go-redis hook that fails the next pipeline carrying
// endpoint lease commands once armed.
type failLeases struct{ armed atomic.Bool }

func (h *failLeases) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *failLeases) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h *failLeases) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if slices.ContainsFunc(cmds, isLeaseCmd) && h.armed.CompareAndSwap(true, false) {
			for _, c := range cmds {
				c.SetErr(errLeaseBlip)
			}
			return errLeaseBlip
		}
		return next(ctx, cmds)
	}
}

// TestAScanWhoseLeasesFailStopsNoSender: a scan that listed the endpoints
// and then failed to take or renew their leases (Redis refusing the
// instance for a moment) counted every lease as another instance's and
// stopped every sender, mid-delivery, though no lease had lapsed. Such a
// scan now starts nothing and stops nothing; a scan that finds another
// instance holding the lease still stops its sender.
func TestAScanWhoseLeasesFailStopsNoSender(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	fail := &failLeases{}
	rdb.AddHook(fail)
	ctx := t.Context()
	store := redisstore.New(rdb, 1000)
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	mgr := NewManager(store, NewSender(store, NewClient(ClientConfig{}), SenderConfig{Poll: time.Hour}, m, log), "a", time.Hour, log)
	t.Cleanup(mgr.stopAll)
	e := endpoint.Endpoint{ID: "ep_fail", Owner: "acme", URL: "https://example.com/hook", Types: []string{endpoint.TypeClick}, Paused: true}
	if err := store.Put(ctx, e); err != nil {
		t.Fatal(err)
	}
	sending := func() *run {
		mgr.mu.Lock()
		defer mgr.mu.Unlock()
		return mgr.running[e.ID]
	}
	mgr.scan(ctx)
	r := sending()
	if r == nil {
		t.Fatal("no sender after the first scan")
	}
	fail.armed.Store(true)
	mgr.scan(ctx)
	if fail.armed.Load() {
		t.Fatal("the scan sent no lease commands")
	}
	if got := sending(); got == nil {
		t.Error("a scan whose leases failed stopped the sender, though its lease had not lapsed")
	} else if got != r {
		t.Error("a scan whose leases failed replaced the sender")
	}
	// Another instance holds the lease now: the next scan stops the sender.
	if err := rdb.Set(ctx, "snip:wh:{"+e.ID+"}:lease", "b", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	mgr.scan(ctx)
	if got := sending(); got != nil {
		t.Errorf("a sender runs for an endpoint another instance holds")
	}
}
