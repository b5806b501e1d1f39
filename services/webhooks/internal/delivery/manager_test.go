package delivery

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/netguard"
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
	// m1 holds every other lease already (a sender of it that stopped),
	// about to expire; another instance holds the last one.
	var mine []string
	for i := 0; i < n-1; i += 2 {
		mine = append(mine, ids[i])
	}
	if held, err := store.Leases(ctx, mine, nil, "m1", time.Minute); err != nil || len(held) != len(mine) {
		t.Fatalf("leases for m1: %d of %d, %v", len(held), len(mine), err)
	}
	theirs, err := store.Leases(ctx, ids[n-1:], nil, "m2", time.Minute)
	if err != nil || theirs[ids[n-1]] == "" {
		t.Fatalf("lease %s for m2: %v, %v", ids[n-1], theirs, err)
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
		// m1's leases hold the tokens of the senders the scan started.
		wantHolder, renewed := "", left > time.Minute
		mgr.mu.Lock()
		if r := mgr.running[id]; r != nil {
			wantHolder = r.token
		}
		mgr.mu.Unlock()
		if i == n-1 {
			wantHolder, renewed = theirs[id], left <= time.Minute
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
	if err != nil || holder != r.token {
		t.Errorf("the lease after the blip: held by %q (%v), want a's sender's token %q", holder, err, r.token)
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

// leaseOutage is a go-redis hook for an instance's Redis client: once
// armed, from the next pipeline carrying endpoint lease commands that
// succeeds, it fails every command for length, and the lease pipelines
// (the scan's and the renewals') for leaseLag longer: Redis out of the
// instance's reach for longer than the lease, serving its reads again a
// little before its lease scripts. It notes when the last lease pipeline
// that succeeded before the outage was sent.
type leaseOutage struct {
	armed             atomic.Bool
	length, leaseLag  time.Duration
	mu                sync.Mutex
	from, to, leaseTo time.Time // the outage, once armed and set
	renewedAt         time.Time // the last lease pipeline that succeeded before from was sent
	answered          time.Time // the last lease pipeline sent from leaseTo on was answered
}

func (h *leaseOutage) down(now time.Time, lease bool) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	to := h.to
	if lease {
		to = h.leaseTo
	}
	return !h.from.IsZero() && !now.Before(h.from) && now.Before(to)
}

func (h *leaseOutage) get() (renewedAt, from, to, leaseTo, answered time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.renewedAt, h.from, h.to, h.leaseTo, h.answered
}

func (h *leaseOutage) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *leaseOutage) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, c redis.Cmder) error {
		if h.down(time.Now(), isLeaseCmd(c)) {
			c.SetErr(errLeaseBlip)
			return errLeaseBlip
		}
		return next(ctx, c)
	}
}

func (h *leaseOutage) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		sent, lease := time.Now(), slices.ContainsFunc(cmds, isLeaseCmd)
		if h.down(sent, lease) {
			for _, c := range cmds {
				c.SetErr(errLeaseBlip)
			}
			return errLeaseBlip
		}
		err := next(ctx, cmds)
		if err != nil || !lease {
			return err
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		switch {
		case h.from.IsZero():
			h.renewedAt = sent
			if h.armed.Load() {
				h.from = time.Now()
				h.to = h.from.Add(h.length)
				h.leaseTo = h.to.Add(h.leaseLag)
			}
		case sent.Before(h.from) && sent.After(h.renewedAt):
			h.renewedAt = sent
		case !sent.Before(h.leaseTo):
			h.answered = time.Now()
		}
		return nil
	}
}

// post is one POST a receiver got: when, from which instance (its client's
// User-Agent), and, for one the receiver held, when the sender gave it up.
type post struct {
	at, ended time.Time
	from      string
}

// lapseRig is an endpoint (its receiver answers 503 at once, so its one
// event is tried again every 20 ms) and what runs instances sending for it:
// instance a's Redis client goes through outage.
type lapseRig struct {
	t      *testing.T
	ctx    context.Context
	store  *redisstore.Store // instance b's and the test's
	astore *redisstore.Store // instance a's, through outage
	outage *leaseOutage
	e      endpoint.Endpoint
	dialer *netguard.Dialer
	log    *slog.Logger
	hold   atomic.Bool // the receiver holds a's next POST until a gives it up
	mu     sync.Mutex
	posts  []post
}

const lapseTTL = time.Second

func newLapseRig(t *testing.T, outage *leaseOutage) *lapseRig {
	srv := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	ardb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = ardb.Close() })
	ardb.AddHook(outage)
	rig := &lapseRig{t: t, ctx: t.Context(), store: redisstore.New(rdb, 1000), astore: redisstore.New(ardb, 1000), outage: outage,
		dialer: netguard.NewDialer(netguard.NewPolicy([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}), nil, time.Second),
		log:    slog.New(slog.DiscardHandler)}
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := post{at: time.Now(), from: r.UserAgent()}
		// Read to its end: only then does the server see the client
		// close the connection (r.Context ends).
		_, _ = io.Copy(io.Discard, r.Body)
		if p.from == "a" && rig.hold.CompareAndSwap(true, false) {
			rig.add(p)
			select {
			case <-r.Context().Done():
			case <-time.After(10 * time.Second):
			}
			rig.mu.Lock()
			rig.posts[slices.IndexFunc(rig.posts, func(q post) bool { return q.at.Equal(p.at) && q.from == p.from })].ended = time.Now()
			rig.mu.Unlock()
		} else {
			rig.add(p)
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(recv.Close)
	rig.e = endpoint.Endpoint{ID: "ep_lapse", Owner: "acme", URL: recv.URL + "/hook", Types: []string{endpoint.TypeClick}, Secret: endpoint.NewSecret(), BatchMax: 1}
	if err := rig.store.Put(rig.ctx, rig.e); err != nil {
		t.Fatal(err)
	}
	ev := redisstore.Event{ID: "evt_1", Type: "click", Time: time.Now().UTC(), Data: []byte(`{"id":"evt_1"}`)}
	if _, _, err := rig.store.Enqueue(rig.ctx, redisstore.DedupNone, 0, map[string][]redisstore.Event{rig.e.ID: {ev}}); err != nil {
		t.Fatal(err)
	}
	return rig
}

func (rig *lapseRig) add(p post) {
	rig.mu.Lock()
	rig.posts = append(rig.posts, p)
	rig.mu.Unlock()
}

// postsOf returns the POSTs from instance from that came after after.
func (rig *lapseRig) postsOf(from string, after time.Time) []post {
	rig.mu.Lock()
	defer rig.mu.Unlock()
	var out []post
	for _, p := range rig.posts {
		if p.from == from && p.at.After(after) {
			out = append(out, p)
		}
	}
	return out
}

// start runs a manager for instance (a: through the outage) until the
// returned stop is called or the test ends.
func (rig *lapseRig) start(instance string) (stop func()) {
	st := rig.store
	if instance == "a" {
		st = rig.astore
	}
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		rig.t.Fatal(err)
	}
	client := NewClient(ClientConfig{Timeout: 5 * time.Second, ConnectTimeout: time.Second, MaxResponseBytes: 1 << 10, UserAgent: instance, Dialer: rig.dialer})
	cfg := SenderConfig{Schedule: []time.Duration{20 * time.Millisecond}, DisableAfter: time.Hour, MaxBatchBytes: 1 << 20, Poll: 10 * time.Millisecond}
	mgr := NewManager(st, NewSender(st, client, cfg, m, rig.log), instance, lapseTTL, rig.log)
	mctx, cancel := context.WithCancel(rig.ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Run(mctx) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	rig.t.Cleanup(stop)
	return stop
}

// TestASenderStopsWhenItsLeaseLapses: a sender went on while its instance
// could not reach Redis for longer than the endpoint's lease: its renewals
// failed, and a failed renewal stops nothing, so once Redis answered it
// again it sent the batch it held alongside the instance that had taken
// the lease meanwhile, until a renewal found the lease gone. A sender now
// starts no POST once its lease's deadline passed unrenewed (the time the
// last renewal that succeeded was sent, plus the TTL), and only a scan that
// takes the lease again starts one.
//
// Instance a sends for an endpoint whose receiver answers every POST 503
// (so the batch is tried every 20 ms); a's Redis client fails every command
// for 1.5 leases from just after a renewal of the lease, and its lease
// commands half a lease longer, while instance b asks for the lease every
// third of it. b takes it and sends; a sends nothing from its lease's
// deadline on, until b stops and gives the lease back, and then sends
// again.
func TestASenderStopsWhenItsLeaseLapses(t *testing.T) {
	t.Parallel()
	const ttl = lapseTTL
	rig := newLapseRig(t, &leaseOutage{length: ttl * 3 / 2, leaseLag: ttl / 2})
	rig.start("a")
	testenv.WaitFor(t, 10*time.Second, "a's first POST", func() bool { return len(rig.postsOf("a", time.Time{})) > 0 })
	stopB := rig.start("b")
	rig.outage.armed.Store(true)
	// Until a's lease commands are answered again after the outage (then
	// a renewal would stop a sender that still ran) and b has sent.
	testenv.WaitFor(t, 10*ttl, "the outage, a's lease commands answered after it and b's POSTs", func() bool {
		_, _, _, _, answered := rig.outage.get()
		return !answered.IsZero() && len(rig.postsOf("b", time.Time{})) > 0
	})
	renewedAt, from, to, leaseTo, _ := rig.outage.get()
	deadline := renewedAt.Add(ttl)
	if late := rig.postsOf("a", deadline); len(late) > 0 {
		t.Errorf("a sent %d POSTs after its lease's deadline (renewed %s before its Redis failed every command for %s and its lease commands for %s; the lease: %s), the first %s and the last %s after the deadline",
			len(late), from.Sub(renewedAt), to.Sub(from), leaseTo.Sub(from), ttl,
			late[0].at.Sub(deadline).Round(time.Millisecond), late[len(late)-1].at.Sub(deadline).Round(time.Millisecond))
	}
	if len(rig.postsOf("b", deadline)) == 0 {
		t.Error("b sent nothing after a's lease's deadline")
	}
	// b stops and gives the lease back: a takes it again and sends.
	stopB()
	stopped := time.Now()
	testenv.WaitFor(t, 10*time.Second, "a's POST once b gave the lease back", func() bool { return len(rig.postsOf("a", stopped)) > 0 })
}

// TestASenderGivesUpItsPOSTInFlightWhenItsLeaseLapses: a POST in flight
// when the sender's lease lapses unrenewed is cancelled then (not let
// finish: the receiver would have it from this instance while the lease's
// next holder sends the same batch). Instance a's POST is held by the
// receiver while a's Redis client fails every command for two leases from
// just after a renewal, and instance b asks for the lease every third of
// it: a gives the POST up by a quarter of a lease after its deadline (its
// client's timeout is 5 s), and b sends the batch.
func TestASenderGivesUpItsPOSTInFlightWhenItsLeaseLapses(t *testing.T) {
	t.Parallel()
	const ttl = lapseTTL
	rig := newLapseRig(t, &leaseOutage{length: 2 * ttl})
	rig.hold.Store(true)
	rig.start("a")
	testenv.WaitFor(t, 10*time.Second, "a's first POST", func() bool { return len(rig.postsOf("a", time.Time{})) > 0 })
	rig.outage.armed.Store(true)
	rig.start("b")
	testenv.WaitFor(t, 10*time.Second, "the outage", func() bool { _, from, _, _, _ := rig.outage.get(); return !from.IsZero() })
	renewedAt, _, _, _, _ := rig.outage.get()
	deadline := renewedAt.Add(ttl)
	testenv.WaitFor(t, 10*time.Second, "b's POST", func() bool { return len(rig.postsOf("b", time.Time{})) > 0 })
	var held post
	testenv.WaitFor(t, 10*time.Second, "a to give up its POST", func() bool { held = rig.postsOf("a", time.Time{})[0]; return !held.ended.IsZero() })
	late := held.ended.Sub(deadline)
	t.Logf("a gave its POST in flight up %s after its lease's deadline", late.Round(time.Millisecond))
	if late > ttl/4 {
		t.Errorf("a's POST in flight ended %s after a's lease's deadline (its Redis failing every command from just after the renewal; the lease: %s), want at most %s", late.Round(time.Millisecond), ttl, ttl/4)
	}
}

// TestASenderStoppedAtItsDeadlineIsReplacedThoughItsLeaseWasRenewed: a
// sender stops on its own once it finds its lease's deadline passed, just
// before a POST (Sender.Run's held). The lease's timer (Manager.lapse) is
// what took its run out of the manager; when a renewal that succeeded came
// in after the deadline but before the timer's callback ran, the renewal
// moved the deadline and the callback found it ahead and did nothing. The
// run stayed registered with no sender behind it: every scan and renewal
// went on renewing its lease under its token, so no instance (this one
// included) started a sender for the endpoint, and its queue waited until
// the instance restarted. A sender's run now leaves the manager as its
// sender returns.
//
// The timer's callback losing that race is played by stopping the timer;
// the renewal that succeeded late, by renewing the lease in Redis under the
// sender's token and then letting the manager scan.
func TestASenderStoppedAtItsDeadlineIsReplacedThoughItsLeaseWasRenewed(t *testing.T) {
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
	var got atomic.Int64
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		got.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(recv.Close)
	dialer := netguard.NewDialer(netguard.NewPolicy([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}), nil, time.Second)
	client := NewClient(ClientConfig{Timeout: 5 * time.Second, ConnectTimeout: time.Second, MaxResponseBytes: 1 << 10, Dialer: dialer})
	cfg := SenderConfig{Schedule: []time.Duration{20 * time.Millisecond}, DisableAfter: time.Hour, MaxBatchBytes: 1 << 20, Poll: 10 * time.Millisecond}
	const ttl = 300 * time.Millisecond
	mgr := NewManager(store, NewSender(store, client, cfg, m, log), "a", ttl, log)
	t.Cleanup(mgr.stopAll)
	e := endpoint.Endpoint{ID: "ep_orphan", Owner: "acme", URL: recv.URL + "/hook", Types: []string{endpoint.TypeClick}, Secret: endpoint.NewSecret(), BatchMax: 1}
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
	r.lease.mu.Lock()
	r.lease.timer.Stop() // its callback comes after the late renewal
	r.lease.mu.Unlock()
	// A renewal under the sender's token reached Redis; the manager hears
	// of it only after the deadline.
	if held, err := store.Leases(ctx, []string{e.ID}, map[string]string{e.ID: r.token}, "a", time.Hour); err != nil || held[e.ID] != r.token {
		t.Fatalf("renew the lease under the sender's token: held %v, %v", held, err)
	}
	testenv.WaitFor(t, 10*time.Second, "the lease's deadline", func() bool { return !r.lease.held() })
	ev := redisstore.Event{ID: "evt_1", Type: endpoint.TypeClick, Time: time.Now().UTC(), Data: []byte(`{"id":"evt_1"}`)}
	if _, _, err := store.Enqueue(ctx, redisstore.DedupNone, 0, map[string][]redisstore.Event{e.ID: {ev}}); err != nil {
		t.Fatal(err)
	}
	mgr.Wake(e.ID)
	select {
	case <-r.done: // it found the deadline passed before its POST
	case <-time.After(10 * time.Second):
		t.Fatal("the sender did not stop at its lease's deadline")
	}
	if n := got.Load(); n != 0 {
		t.Fatalf("the receiver got %d POSTs from a sender past its lease's deadline", n)
	}
	// The late renewal's answer, then the scans that follow.
	if !testenv.Poll(5*time.Second, func() bool { mgr.scan(ctx); return got.Load() > 0 }) {
		t.Fatalf("the event was not delivered in 5 s of scans: the stopped sender's run is still registered (%v), its lease renewed, and no sender runs for the endpoint", sending() == r)
	}
}

// scriptKeys returns the keys of a script command (EVALSHA, EVAL), nil
// for any other command.
func scriptKeys(c redis.Cmder) []string {
	args := c.Args()
	if n := strings.ToLower(c.Name()); (n != "evalsha" && n != "eval") || len(args) < 3 {
		return nil
	}
	var nkeys int
	switch v := args[2].(type) {
	case int:
		nkeys = v
	case int64:
		nkeys = int(v)
	default:
		return nil
	}
	keys := make([]string, 0, nkeys)
	for _, a := range args[3:min(3+nkeys, len(args))] {
		s, _ := a.(string)
		keys = append(keys, s)
	}
	return keys
}

// keyParts returns the parts after the hash tag of an endpoint's keys
// ("snip:wh:{ep_x}:inflight": "inflight").
func keyParts(keys []string) map[string]bool {
	out := map[string]bool{}
	for _, key := range keys {
		if i := strings.LastIndex(key, "}:"); i >= 0 {
			out[key[i+2:]] = true
		}
	}
	return out
}

// onlyParts reports whether parts has want and nothing but want and allow.
func onlyParts(parts map[string]bool, want string, allow ...string) bool {
	for p := range parts {
		if p != want && !slices.Contains(allow, p) {
			return false
		}
	}
	return parts[want]
}

// lateWrite is a go-redis hook for instance a's Redis client: once armed,
// it holds the first script command that match picks by its keys' parts
// (one of the sender's writes) until released, then lets it reach Redis
// whether or not its context ended meanwhile: a write sent before the
// sender's lease lapsed that arrives after another instance took the
// lease (a GC pause, a slow network). From the hold on, a's lease scripts
// (its scans and renewals, isLeaseScript) fail, so a's lease lapses and
// stays lapsed, and a's other commands too reach Redis whatever their
// context.
type lateWrite struct {
	match         func(parts map[string]bool) bool
	armed, late   atomic.Bool
	held, release chan struct{}
}

func (h *lateWrite) DialHook(next redis.DialHook) redis.DialHook { return next }

// isLeaseScript reports whether a script's keys are a lease script's
// (Leases, Release): the lease comes first; the sender's writes carry it
// after the keys they write.
func isLeaseScript(keys []string) bool {
	return len(keys) > 0 && strings.HasSuffix(keys[0], "}:lease")
}

func (h *lateWrite) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, c redis.Cmder) error {
		keys := scriptKeys(c)
		if h.late.Load() && isLeaseScript(keys) {
			c.SetErr(errLeaseBlip)
			return errLeaseBlip
		}
		if keys != nil && h.match(keyParts(keys)) && h.armed.CompareAndSwap(true, false) {
			h.late.Store(true)
			close(h.held)
			<-h.release
			return next(context.WithoutCancel(ctx), c)
		}
		if h.late.Load() {
			ctx = context.WithoutCancel(ctx)
		}
		return next(ctx, c)
	}
}

func (h *lateWrite) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.late.Load() && slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return isLeaseScript(scriptKeys(c)) }) {
			for _, c := range cmds {
				c.SetErr(errLeaseBlip)
			}
			return errLeaseBlip
		}
		return next(ctx, cmds)
	}
}

// TestALateWriteOfASenderWhoseLeasePassedChangesNothing: a sender's writes
// of its endpoint's state (its batch in flight, a delivery, a failure, a
// disable) were not bound to its lease: one sent before the lease lapsed
// that reached Redis after another instance had taken the lease and sent
// wrote over that instance's state. Its batch in flight replaced the new
// holder's mark (after a crash the batch was sent cut differently, under
// another webhook-id); its delivery deleted the new holder's mark and
// ended the failing run the new holder had begun since, so that the
// endpoint's retries and its disable counted from later; its failure
// counted again in the new holder's run; its disable, decided on the run
// the new holder's delivery had since ended, disabled an endpoint that
// takes batches again. Each is now refused unless the endpoint's lease
// still holds the sender's token, and the sender stops.
//
// Instance a's Redis client holds a's write until instance b has taken
// the lease (a's lease scripts failing from then on) and sent; then lets
// it through. The state b left (the mark, the queue, the failing run, the
// endpoint's revision and whether it is disabled) is unchanged after it.
func TestALateWriteOfASenderWhoseLeasePassedChangesNothing(t *testing.T) {
	t.Parallel()
	type answers struct{ a, b int }
	tests := []struct {
		name  string
		match func(parts map[string]bool) bool
		codes answers
		// failing is the endpoint's failing run before a starts (0: none).
		failing time.Duration
		// settled reports whether b left the state it leaves.
		settled func(st redisstore.State, mark string, queued int) bool
	}{
		{"in_flight", func(p map[string]bool) bool { return onlyParts(p, "inflight", "ep", "lease") },
			answers{503, 503}, 0,
			func(st redisstore.State, mark string, _ int) bool { return st.Attempts == 1 && mark != "" }},
		{"delivered", func(p map[string]bool) bool { return p["q"] && p["inflight"] },
			answers{204, 503}, 0,
			func(st redisstore.State, mark string, _ int) bool { return st.Attempts == 1 && mark != "" }},
		{"failure", func(p map[string]bool) bool { return onlyParts(p, "ep", "lease") },
			answers{503, 503}, 0,
			func(st redisstore.State, mark string, _ int) bool { return st.Attempts == 1 && mark != "" }},
		{"disable", func(p map[string]bool) bool { return onlyParts(p, "replay_lease", "ep", "lease") },
			answers{503, 204}, 2 * time.Hour,
			func(st redisstore.State, mark string, queued int) bool {
				return st.Attempts == 0 && st.FailingSince.IsZero() && mark == "" && queued == 0
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := testenv.StartRedis(t)
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
			t.Cleanup(func() { _ = rdb.Close() })
			ardb := redis.NewClient(&redis.Options{Addr: srv.Addr})
			t.Cleanup(func() { _ = ardb.Close() })
			hook := &lateWrite{match: tc.match, held: make(chan struct{}), release: make(chan struct{})}
			hook.armed.Store(true)
			ardb.AddHook(hook)
			var released sync.Once
			release := func() { released.Do(func() { close(hook.release) }) }
			t.Cleanup(release)
			ctx := t.Context()
			store, astore := redisstore.New(rdb, 1000), redisstore.New(ardb, 1000)
			log := slog.New(slog.DiscardHandler)
			dialer := netguard.NewDialer(netguard.NewPolicy([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}), nil, time.Second)

			recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				if r.UserAgent() == "a" {
					w.WriteHeader(tc.codes.a)
				} else {
					w.WriteHeader(tc.codes.b)
				}
			}))
			t.Cleanup(recv.Close)
			e := endpoint.Endpoint{ID: "ep_late", Owner: "acme", URL: recv.URL + "/hook", Types: []string{endpoint.TypeClick}, Secret: endpoint.NewSecret(), BatchMax: 10}
			if err := store.Put(ctx, e); err != nil {
				t.Fatal(err)
			}
			if tc.failing > 0 {
				if err := rdb.HSet(ctx, "snip:wh:{"+e.ID+"}:ep", "failing_since", time.Now().Add(-tc.failing).UnixMilli(), "last_error", "HTTP 503", "attempts", 5).Err(); err != nil {
					t.Fatal(err)
				}
			}
			enqueue := func(id string) {
				t.Helper()
				ev := redisstore.Event{ID: id, Type: "click", Time: time.Now().UTC(), Data: []byte(`{"id":"` + id + `"}`)}
				if _, _, err := store.Enqueue(ctx, redisstore.DedupNone, 0, map[string][]redisstore.Event{e.ID: {ev}}); err != nil {
					t.Fatal(err)
				}
			}
			enqueue("evt_1")

			start := func(instance string, st *redisstore.Store) *Manager {
				m, err := NewMetrics(prometheus.NewRegistry())
				if err != nil {
					t.Fatal(err)
				}
				client := NewClient(ClientConfig{Timeout: 5 * time.Second, ConnectTimeout: time.Second, MaxResponseBytes: 1 << 10, UserAgent: instance, Dialer: dialer})
				// The same for both: a failing batch waits an hour, so b's
				// state stays as b left it.
				cfg := SenderConfig{Schedule: []time.Duration{time.Hour}, DisableAfter: time.Hour, MaxBatchBytes: 1 << 20, Poll: 10 * time.Millisecond}
				mgr := NewManager(st, NewSender(st, client, cfg, m, log), instance, lapseTTL, log)
				mctx, cancel := context.WithCancel(ctx)
				done := make(chan error, 1)
				go func() { done <- mgr.Run(mctx) }()
				t.Cleanup(func() { release(); cancel(); <-done })
				return mgr
			}
			amgr := start("a", astore)
			select {
			case <-hook.held:
			case <-time.After(10 * time.Second):
				t.Fatal("a made no write the test holds")
			}
			amgr.mu.Lock()
			arun := amgr.running[e.ID]
			amgr.mu.Unlock()
			if arun == nil {
				t.Fatal("a's sender is not running with its write held")
			}
			enqueue("evt_2") // b's batch is cut otherwise than a's
			start("b", store)

			type state struct {
				Mark         string
				Queue        []string
				FailingSince time.Time
				LastError    string
				Attempts     int
				Disabled     bool
				Rev          string
			}
			read := func() (state, redisstore.State) {
				t.Helper()
				got, st, err := store.Get(ctx, e.ID)
				if err != nil {
					t.Fatal(err)
				}
				q, err := store.Read(ctx, e.ID, "0", 100, 1<<20, 0)
				if err != nil {
					t.Fatal(err)
				}
				var ids []string
				for _, ev := range q {
					ids = append(ids, ev.ID)
				}
				mark, err := rdb.Get(ctx, "snip:wh:{"+e.ID+"}:inflight").Result()
				if err != nil && !errors.Is(err, redis.Nil) {
					t.Fatal(err)
				}
				return state{Mark: mark, Queue: ids, FailingSince: st.FailingSince, LastError: st.LastError, Attempts: st.Attempts,
					Disabled: !got.DisabledAt.IsZero(), Rev: rdb.HGet(ctx, "snip:wh:{"+e.ID+"}:ep", "rev").Val()}, st
			}
			testenv.WaitFor(t, 10*time.Second, "b to take the lease and send", func() bool {
				v := rdb.Get(ctx, "snip:wh:{"+e.ID+"}:lease").Val()
				s, st := read()
				return strings.HasPrefix(v, "b") && tc.settled(st, s.Mark, len(s.Queue))
			})
			want, _ := read()

			release()
			select {
			case <-arun.done:
			case <-time.After(10 * time.Second):
				t.Fatal("a's sender did not stop once its write was let through")
			}
			got, _ := read()
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("state after a's late %s write (-as b left it +got):\n%s", tc.name, diff)
			}
		})
	}
}

// scans counts, through a go-redis hook, the manager's scans: each lists
// every endpoint (SMEMBERS snip:wh:endpoints).
type scans struct{ n atomic.Int64 }

func (h *scans) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *scans) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, c redis.Cmder) error {
		if args := c.Args(); len(args) == 2 && strings.EqualFold(c.Name(), "smembers") && args[1] == "snip:wh:endpoints" {
			h.n.Add(1)
		}
		return next(ctx, c)
	}
}

func (h *scans) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// warnings keeps the log records at Warn and above.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	w.mu.Lock()
	w.msgs = append(w.msgs, r.Message)
	w.mu.Unlock()
	return nil
}
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnings) WithGroup(string) slog.Handler      { return w }
func (w *warnings) get() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.msgs)
}

// TestADeletedEndpointsSenderStopsAndLeavesNoKey: an endpoint deleted while
// its sender holds its lease and has a POST in flight leaves no key in
// Redis. Its lease was left to expire: the manager went on renewing it
// until its next scan found the endpoint gone, and it lived a TTL after
// that. Delete now removes the lease with the endpoint; the sender's
// writes after its POST (a delivery record, delivered or a failure) write
// nothing, its renewals find no lease and stop it, no scan takes the lease
// again, and nothing is logged as a warning (the sender stops as on any
// deleted endpoint, not as one whose lease another sender took).
func TestADeletedEndpointsSenderStopsAndLeavesNoKey(t *testing.T) {
	t.Parallel()
	for _, code := range []int{http.StatusOK, http.StatusServiceUnavailable} {
		t.Run(strconv.Itoa(code), func(t *testing.T) {
			t.Parallel()
			srv := testenv.StartRedis(t)
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
			t.Cleanup(func() { _ = rdb.Close() })
			sc := &scans{}
			rdb.AddHook(sc)
			ctx := t.Context()
			store := redisstore.New(rdb, 1000)
			posted, answer := make(chan struct{}), make(chan struct{})
			var once sync.Once
			recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				once.Do(func() { close(posted); <-answer })
				w.WriteHeader(code)
			}))
			t.Cleanup(recv.Close)
			t.Cleanup(func() {
				select {
				case <-answer:
				default:
					close(answer)
				}
			})
			e := endpoint.Endpoint{ID: "ep_gone", Owner: "acme", URL: recv.URL + "/hook", Types: []string{endpoint.TypeClick}, Secret: endpoint.NewSecret(), BatchMax: 1}
			if err := store.Put(ctx, e); err != nil {
				t.Fatal(err)
			}
			ev := redisstore.Event{ID: "evt_1", Type: "click", Time: time.Now().UTC(), Data: []byte(`{"id":"evt_1"}`)}
			if _, _, err := store.Enqueue(ctx, redisstore.DedupNone, 0, map[string][]redisstore.Event{e.ID: {ev}}); err != nil {
				t.Fatal(err)
			}
			m, err := NewMetrics(prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			warned := &warnings{}
			log := slog.New(warned)
			dialer := netguard.NewDialer(netguard.NewPolicy([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}), nil, time.Second)
			client := NewClient(ClientConfig{Timeout: 10 * time.Second, ConnectTimeout: time.Second, MaxResponseBytes: 1 << 10, UserAgent: "a", Dialer: dialer})
			cfg := SenderConfig{Schedule: []time.Duration{20 * time.Millisecond}, DisableAfter: time.Hour, MaxBatchBytes: 1 << 20, Poll: 10 * time.Millisecond}
			// The lease outlives the test: left behind, it would still be
			// there at the end.
			const ttl = 6 * time.Second
			mgr := NewManager(store, NewSender(store, client, cfg, m, log), "a", ttl, log)
			mctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- mgr.Run(mctx) }()
			t.Cleanup(func() { cancel(); <-done })

			select {
			case <-posted:
			case <-time.After(10 * time.Second):
				t.Fatal("no POST")
			}
			mgr.mu.Lock()
			r := mgr.running[e.ID]
			mgr.mu.Unlock()
			if r == nil {
				t.Fatal("no sender runs for the endpoint whose POST is in flight")
			}
			if err := store.Delete(ctx, e); err != nil {
				t.Fatal(err)
			}
			close(answer)
			testenv.WaitFor(t, 10*time.Second, "the sender to stop and the manager to drop it", func() bool {
				select {
				case <-r.done:
				default:
					return false
				}
				mgr.mu.Lock()
				defer mgr.mu.Unlock()
				return len(mgr.running) == 0
			})
			if left := testenv.Keys(t, rdb, "snip:wh:{"+e.ID+"}:*"); len(left) != 0 {
				t.Errorf("keys of the deleted endpoint left once its sender stopped: %q", left)
			}
			// Two scans later (and the renewals between them), nothing has
			// taken a lease or written a key for it again.
			from := sc.n.Load()
			testenv.WaitFor(t, 3*ttl, "two more scans", func() bool { return sc.n.Load() >= from+2 })
			if left := testenv.Keys(t, rdb, "snip:wh:{"+e.ID+"}:*"); len(left) != 0 {
				t.Errorf("keys of the deleted endpoint two scans after its sender stopped: %q", left)
			}
			if w := warned.get(); len(w) != 0 {
				t.Errorf("logged %q, want nothing at warn or above", w)
			}
		})
	}
}

// queueReads counts, through a go-redis hook, the reads of an endpoint's
// queue (XRANGE of its "q" key).
type queueReads struct{ n atomic.Int64 }

func (h *queueReads) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *queueReads) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, c redis.Cmder) error {
		err := next(ctx, c)
		if args := c.Args(); c.Name() == "xrange" && len(args) > 1 {
			if key, ok := args[1].(string); ok && strings.HasSuffix(key, "}:q") {
				h.n.Add(1)
			}
		}
		return err
	}
}
func (h *queueReads) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestAStopWhileABatchFillsWarnsOfNothing: a sender waiting for its batch
// to fill (the endpoint's batch wait) when the service stops stops quietly.
// It read the queue once more with the stop's cancelled context and logged
// the "context canceled" of that read as a warning ("webhooks: read
// queue"), at every stop of a service whose endpoints were filling a batch
// (make demo's, every time). The event stays queued for the next sender.
func TestAStopWhileABatchFillsWarnsOfNothing(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	reads := &queueReads{}
	rdb.AddHook(reads)
	ctx := t.Context()
	store := redisstore.New(rdb, 1000)
	var posts atomic.Int64
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		posts.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(recv.Close)
	e := endpoint.Endpoint{ID: "ep_filling", Owner: "acme", URL: recv.URL + "/hook", Types: []string{endpoint.TypeClick}, Secret: endpoint.NewSecret(),
		BatchMax: 50, BatchWait: endpoint.MaxBatchWait}
	if err := store.Put(ctx, e); err != nil {
		t.Fatal(err)
	}
	ev := redisstore.Event{ID: "evt_1", Type: "click", Time: time.Now().UTC(), Data: []byte(`{"id":"evt_1"}`)}
	if _, _, err := store.Enqueue(ctx, redisstore.DedupNone, 0, map[string][]redisstore.Event{e.ID: {ev}}); err != nil {
		t.Fatal(err)
	}
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	warned := &warnings{}
	log := slog.New(warned)
	dialer := netguard.NewDialer(netguard.NewPolicy([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}), nil, time.Second)
	client := NewClient(ClientConfig{Timeout: 10 * time.Second, ConnectTimeout: time.Second, MaxResponseBytes: 1 << 10, UserAgent: "a", Dialer: dialer})
	cfg := SenderConfig{Schedule: []time.Duration{20 * time.Millisecond}, DisableAfter: time.Hour, MaxBatchBytes: 1 << 20, Poll: 10 * time.Millisecond}
	mgr := NewManager(store, NewSender(store, client, cfg, m, log), "a", 6*time.Second, log)
	mctx, cancel := context.WithCancel(ctx)
	var runErr error
	stopped := make(chan struct{})
	go func() { runErr = mgr.Run(mctx); close(stopped) }()
	t.Cleanup(func() { cancel(); <-stopped })

	// The sender read the queue, found the event and waits (a minute) for
	// more before it sends.
	testenv.WaitFor(t, 10*time.Second, "the sender's first read of the queue", func() bool { return reads.n.Load() > 0 })
	cancel()
	select {
	case <-stopped:
		if runErr != nil {
			t.Fatalf("stop: %v", runErr)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the manager did not stop")
	}
	if w := warned.get(); len(w) != 0 {
		t.Errorf("a stop while a batch filled logged %q, want nothing at warn or above", w)
	}
	if n := posts.Load(); n != 0 {
		t.Errorf("%d POSTs, want none (the batch was still filling)", n)
	}
	if evs, err := store.Read(ctx, e.ID, "0", 10, 1<<20, 0); err != nil || len(evs) != 1 {
		t.Errorf("queue after the stop: %d events (%v), want the one event", len(evs), err)
	}
}
