package delivery_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/webhooks/internal/delivery"
	"github.com/snipdev/snip/services/webhooks/internal/endpoint"
	"github.com/snipdev/snip/services/webhooks/internal/redisstore"
)

// TestAFailedReplayShowsAndAskingAgainRefillsTheQueue: a replay runs after
// its 202, and one that NATS failed after it had cleared the endpoint's
// queue up to its cut (here FRAUD refuses the alerts' copy: its subjects no
// longer cover them) was only logged: the queue lacked the alerts, and the
// owner, told nothing, did not know to ask again. The endpoint's status
// shows the replay failed, with the error; asked again once NATS serves
// the alerts, the replay is done and the queue holds every event up to the
// cut once (the failed replay's clicks were cleared, not kept twice).
func TestAFailedReplayShowsAndAskingAgainRefillsTheQueue(t *testing.T) {
	t.Parallel()
	js := testenv.StartNATS(t).JetStream(t)
	rdb := servers.RedisClient(t)
	ctx := t.Context()
	o := topology.Defaults()
	o.Storage = jetstream.MemoryStorage
	if err := topology.Apply(ctx, js, o); err != nil {
		t.Fatal(err)
	}
	store := redisstore.New(rdb, 100_000)
	ep := endpoint.Endpoint{ID: "ep_replay", Owner: "acme", URL: "https://example.com/hook",
		Types: []string{endpoint.TypeClick, endpoint.TypeFraudAlert}}
	if err := store.Put(ctx, ep); err != nil {
		t.Fatal(err)
	}
	m, err := delivery.NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	replayer := delivery.NewReplayer(js, store, delivery.NewIntake(store, m), slog.New(slog.DiscardHandler),
		delivery.ReplayerConfig{Pending: 4, Partitions: o.Partitions, Instance: "i1", LeaseTTL: 3 * time.Second})
	admin := &delivery.Admin{Store: store, Replayer: replayer}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- replayer.Run(rctx) }()
	t.Cleanup(func() { stop(); <-done })

	from := time.Now().UTC()
	want := map[string]int{}
	for i := range 5 {
		c := events.Click{V: events.ClickVersion, ID: events.NewID(), Time: time.Now().UTC(), Code: "a1",
			Owner: "acme", Target: "https://example.com/", Visitor: "visitor", Country: "NL"}
		a := events.FraudAlert{V: events.FraudVersion, ID: events.NewID(), Rule: "visitor_burst", Code: "a1",
			Owner: "acme", WindowStart: from, WindowEnd: from, Count: 10 + i, Threshold: 5, Time: from}
		cb, _ := json.Marshal(c)
		ab, _ := json.Marshal(a)
		if _, err := js.Publish(ctx, events.ClickSubject(c.Owner, c.Code), cb, jetstream.WithMsgID(c.ID)); err != nil {
			t.Fatal(err)
		}
		if _, err := js.Publish(ctx, events.FraudAlertSubject(a.Code), ab, jetstream.WithMsgID(a.ID)); err != nil {
			t.Fatal(err)
		}
		want[c.ID], want[a.ID] = 1, 1
	}
	// FRAUD refuses another consumer while it has as many as it may.
	fraudMaxConsumers := func(full bool) {
		t.Helper()
		s, err := js.Stream(ctx, events.FraudStream)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		cfg := info.Config
		cfg.MaxConsumers = -1
		if full {
			if info.State.Consumers == 0 {
				t.Fatal("FRAUD has no consumers: a max of 0 is no max")
			}
			cfg.MaxConsumers = info.State.Consumers
		}
		if _, err := js.UpdateStream(ctx, cfg); err != nil {
			t.Fatalf("set FRAUD's max consumers to %d: %v", cfg.MaxConsumers, err)
		}
	}
	replay := func(state string) redisstore.Replay {
		t.Helper()
		if err := admin.Replay(ctx, "acme", ep.ID, from); err != nil {
			t.Fatalf("replay: %v", err)
		}
		var got redisstore.Replay
		if !testenv.Poll(30*time.Second, func() bool {
			s, err := admin.Get(ctx, "acme", ep.ID)
			got = s.Replay
			return err == nil && (got.State == redisstore.ReplayFailed || got.State == redisstore.ReplayDone)
		}) || got.State != state {
			t.Fatalf("the endpoint's replay: %+v, want it %s", got, state)
		}
		return got
	}
	queued := func() map[string]int {
		t.Helper()
		evs, err := store.Read(ctx, ep.ID, "0", 1000, 1<<30, 0)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int{}
		for _, e := range evs {
			out[e.ID]++
		}
		return out
	}

	fraudMaxConsumers(true)
	failed := replay(redisstore.ReplayFailed)
	t.Logf("the failed replay: %+v", failed)
	if failed.Error != "reading the event streams failed; ask again" || !failed.From.Equal(from) {
		t.Errorf("failed replay %+v: want the owner's reason (no internal error) and its from (%s)", failed, from)
	}
	if len(queued()) >= len(want) {
		t.Fatalf("the replay failed with every event queued; the fault did not hit after the clear")
	}

	fraudMaxConsumers(false)
	again := replay(redisstore.ReplayDone)
	if again.Error != "" || again.Events != len(want) || again.ID == failed.ID {
		t.Errorf("replay asked again: %+v, want done, a new ID, %d events and no error", again, len(want))
	}
	if d := cmp.Diff(want, queued()); d != "" {
		t.Errorf("queue after the replay asked again, event IDs (-want +got):\n%s", d)
	}
}

// TestAStopMarksTheReplaysItHoldsFailed: a replay is not resumed by another
// instance, so one still waiting when its instance stops must not show
// "queued" for ever: it shows failed, and the owner asks again (a request
// the stopped replayer can no longer take is turned away, busy).
func TestAStopMarksTheReplaysItHoldsFailed(t *testing.T) {
	t.Parallel()
	js := testenv.StartNATS(t).JetStream(t)
	store := redisstore.New(servers.RedisClient(t), 100_000)
	ctx := t.Context()
	m, err := delivery.NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	replayer := delivery.NewReplayer(js, store, delivery.NewIntake(store, m), slog.New(slog.DiscardHandler),
		delivery.ReplayerConfig{Pending: 4, Partitions: 1, Instance: "i1", LeaseTTL: 3 * time.Second})
	admin := &delivery.Admin{Store: store, Replayer: replayer}
	ids := []string{"ep_stop1", "ep_stop2"}
	for _, id := range ids {
		if err := store.Put(ctx, endpoint.Endpoint{ID: id, Owner: "acme", URL: "https://example.com/hook", Types: []string{endpoint.TypeClick}}); err != nil {
			t.Fatal(err)
		}
		if err := admin.Replay(ctx, "acme", id, time.Now().Add(-time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	stopped, stop := context.WithCancel(ctx)
	stop()
	if err := replayer.Run(stopped); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		s, err := admin.Get(ctx, "acme", id)
		if err != nil {
			t.Fatal(err)
		}
		if s.Replay.State != redisstore.ReplayFailed || s.Replay.Error != "the instance running the replay stopped; ask again" {
			t.Errorf("%s: replay %+v after the stop, want failed with the reason", id, s.Replay)
		}
	}
	if err := admin.Replay(ctx, "acme", ids[0], time.Now().Add(-time.Hour)); !errors.Is(err, delivery.ErrBusy) {
		t.Errorf("replay asked of the stopped replayer: %v, want busy", err)
	}
}

// crashable is a go-redis hook for an instance's Redis client: it holds the
// first queue write of endpoint queue (a replay copying) until the instance
// crashes, and from then on fails every command, as the connections of a
// process killed with SIGKILL would: the instance writes nothing more.
type crashable struct {
	queue   string
	blocked chan struct{} // closed when the queue write is held
	crash   chan struct{} // closed to crash the instance
	held    atomic.Bool
}

var errCrashed = errors.New("the instance crashed")

func (h *crashable) dead() bool {
	select {
	case <-h.crash:
		return true
	default:
		return false
	}
}

func (h *crashable) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *crashable) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, c redis.Cmder) error {
		if h.dead() {
			c.SetErr(errCrashed)
			return errCrashed
		}
		return next(ctx, c)
	}
}

func (h *crashable) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		writesQueue := slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return slices.Contains(c.Args(), any(h.queue)) })
		if writesQueue && h.held.CompareAndSwap(false, true) {
			close(h.blocked)
			select {
			case <-h.crash:
			case <-ctx.Done(): // the instance stops first (the test failed)
			}
		}
		if h.dead() {
			for _, c := range cmds {
				c.SetErr(errCrashed)
			}
			return errCrashed
		}
		return next(ctx, cmds)
	}
}

// TestAReplayWhoseInstanceCrashedReadsInterruptedAndIsAskedAgain: an
// instance that crashed (SIGKILL: no stop to mark its replay failed) while
// a replay ran left the replay "running" in the endpoint's GET for ever.
// The replay's lease, renewed by its instance while it runs (so a replay
// longer than the lease stays running), lapses once the instance is gone:
// the GET shows it interrupted, with a reason for the owner, and the owner
// asks again through another instance, which replays every event once.
// The crash is the instance's Redis client failing every command from a
// moment on, while the replay is held mid-copy.
func TestAReplayWhoseInstanceCrashedReadsInterruptedAndIsAskedAgain(t *testing.T) {
	t.Parallel()
	js := testenv.StartNATS(t).JetStream(t)
	ctx := t.Context()
	o := topology.Defaults()
	o.Storage = jetstream.MemoryStorage
	if err := topology.Apply(ctx, js, o); err != nil {
		t.Fatal(err)
	}
	rdb, db := servers.Redis.NewDB(t)
	ep := endpoint.Endpoint{ID: "ep_crash", Owner: "acme", URL: "https://example.com/hook", Types: []string{endpoint.TypeClick}}
	crash := &crashable{queue: "snip:wh:{" + ep.ID + "}:q", blocked: make(chan struct{}), crash: make(chan struct{})}
	var crashOnce sync.Once
	crashNow := func() { crashOnce.Do(func() { close(crash.crash) }) }
	t.Cleanup(crashNow)
	crashingRDB := redis.NewClient(&redis.Options{Addr: servers.Redis.Addr, DB: db})
	t.Cleanup(func() { _ = crashingRDB.Close() })
	crashingRDB.AddHook(crash)

	// Two instances on one Redis: b will crash, a lives.
	const leaseTTL = 2 * time.Second
	start := func(name string, rdb redis.UniversalClient) (*delivery.Admin, *redisstore.Store) {
		store := redisstore.New(rdb, 100_000)
		m, err := delivery.NewMetrics(prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		replayer := delivery.NewReplayer(js, store, delivery.NewIntake(store, m), slog.New(slog.DiscardHandler),
			delivery.ReplayerConfig{Pending: 4, Partitions: o.Partitions, Instance: name, LeaseTTL: leaseTTL})
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- replayer.Run(rctx) }()
		t.Cleanup(func() { stop(); <-done })
		return &delivery.Admin{Store: store, Replayer: replayer}, store
	}
	a, store := start("a", rdb)
	b, _ := start("b", crashingRDB)
	if err := store.Put(ctx, ep); err != nil {
		t.Fatal(err)
	}
	from := time.Now().UTC()
	want := map[string]int{}
	for range 3 {
		c := events.Click{V: events.ClickVersion, ID: events.NewID(), Time: time.Now().UTC(), Code: "a1",
			Owner: "acme", Target: "https://example.com/", Visitor: "visitor", Country: "NL"}
		cb, _ := json.Marshal(c)
		if _, err := js.Publish(ctx, events.ClickSubject(c.Owner, c.Code), cb, jetstream.WithMsgID(c.ID)); err != nil {
			t.Fatal(err)
		}
		want[c.ID] = 1
	}
	replayState := func() redisstore.Replay {
		t.Helper()
		s, err := a.Get(ctx, "acme", ep.ID)
		if err != nil {
			t.Fatal(err)
		}
		return s.Replay
	}

	if err := b.Replay(ctx, "acme", ep.ID, from); err != nil {
		t.Fatal(err)
	}
	select {
	case <-crash.blocked:
	case <-time.After(30 * time.Second):
		t.Fatalf("b's replay never copied: %+v", replayState())
	}
	// Running longer than its lease, renewed by b.
	copying := time.Now()
	testenv.Poll(2*leaseTTL, func() bool { return time.Since(copying) > leaseTTL*3/2 })
	running := replayState()
	if running.State != redisstore.ReplayRunning {
		t.Fatalf("b's replay, copying for %s (its lease: %s): %+v; want running, its lease renewed", time.Since(copying), leaseTTL, running)
	}

	crashNow()
	var got redisstore.Replay
	if !testenv.Poll(10*leaseTTL, func() bool { got = replayState(); return got.State != redisstore.ReplayRunning }) ||
		got.State != redisstore.ReplayInterrupted || got.Error != redisstore.ReplayInterruptedReason || got.ID != running.ID {
		t.Fatalf("b's replay after b crashed: %+v; want it interrupted with the reason %q", got, redisstore.ReplayInterruptedReason)
	}

	if err := a.Replay(ctx, "acme", ep.ID, from); err != nil {
		t.Fatalf("the replay asked again after the interrupted one: %v", err)
	}
	if !testenv.Poll(30*time.Second, func() bool {
		got = replayState()
		return got.State == redisstore.ReplayDone || got.State == redisstore.ReplayFailed
	}) || got.State != redisstore.ReplayDone || got.Events != len(want) {
		t.Fatalf("the replay asked again: %+v; want done with %d events", got, len(want))
	}
	queued := queuedIDs(t, store, ep.ID)
	if d := cmp.Diff(want, queued); d != "" {
		t.Errorf("queue after the replay asked again, event IDs (-want +got):\n%s", d)
	}
}

// blipping is a go-redis hook for an instance's Redis client: it holds the
// first queue write of endpoint queue (a replay copying) until released,
// and, once armed, fails every command for length from after past the next
// renewal of a replay lease that succeeded: a Redis that refuses the
// instance's connections for a while (a restart, a failover, a proxy),
// then serves it again.
type blipping struct {
	queue         string
	blocked       chan struct{} // closed when the queue write is held
	release       chan struct{} // closed to let it go on
	held          atomic.Bool
	armed         atomic.Bool
	after, length time.Duration

	mu       sync.Mutex
	from, to time.Time // the blip, once armed and set
}

var errBlip = errors.New("redis out of reach")

func (h *blipping) window() (from, to time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.from, h.to
}

func (h *blipping) down() bool {
	from, to := h.window()
	now := time.Now()
	return !from.IsZero() && !now.Before(from) && now.Before(to)
}

// renews: cmds are a renewal of replay leases (RenewReplays' pipeline of
// scripts; an endpoint's read has the lease's key too, in a GET).
func renews(cmds []redis.Cmder) bool {
	return slices.ContainsFunc(cmds, func(c redis.Cmder) bool {
		return c.Name() == "evalsha" && slices.ContainsFunc(c.Args(), func(a any) bool {
			s, ok := a.(string)
			return ok && strings.HasSuffix(s, "}:replay_lease")
		})
	})
}

func (h *blipping) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *blipping) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, c redis.Cmder) error {
		if h.down() {
			c.SetErr(errBlip)
			return errBlip
		}
		return next(ctx, c)
	}
}

func (h *blipping) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		writesQueue := slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return slices.Contains(c.Args(), any(h.queue)) })
		if writesQueue && h.held.CompareAndSwap(false, true) {
			close(h.blocked)
			select {
			case <-h.release:
			case <-ctx.Done():
			}
		}
		if h.down() {
			for _, c := range cmds {
				c.SetErr(errBlip)
			}
			return errBlip
		}
		err := next(ctx, cmds)
		if err == nil && renews(cmds) && h.armed.CompareAndSwap(true, false) {
			h.mu.Lock()
			h.from = time.Now().Add(h.after)
			h.to = h.from.Add(h.length)
			h.mu.Unlock()
		}
		return err
	}
}

// TestARunningReplayOutlivesARedisBlipShorterThanItsLease: a replay's
// lease lapses for good (the replay reads interrupted, and its instance
// never renews it again), so a live instance must not let it lapse when
// Redis is out of its reach for less than the lease. Renewed every third
// of the lease, it lapsed under a blip of eight tenths of it (2.4 s of the
// default 3 s) that began a little before a renewal was due: that renewal
// and the next failed, and the one after came as the lease ran out. The
// instance here loses Redis (every command fails) for 2.4 s, from 0.81 s
// after a renewal succeeded, while its replay is held mid-copy; read
// through another client, the replay stays running throughout and after,
// and once let go it is done.
func TestARunningReplayOutlivesARedisBlipShorterThanItsLease(t *testing.T) {
	t.Parallel()
	js := testenv.StartNATS(t).JetStream(t)
	ctx := t.Context()
	o := topology.Defaults()
	o.Storage = jetstream.MemoryStorage
	if err := topology.Apply(ctx, js, o); err != nil {
		t.Fatal(err)
	}
	rdb, db := servers.Redis.NewDB(t)
	const leaseTTL = 3 * time.Second // WEBHOOKS_LEASE_TTL's default
	ep := endpoint.Endpoint{ID: "ep_blip", Owner: "acme", URL: "https://example.com/hook", Types: []string{endpoint.TypeClick}}
	blip := &blipping{queue: "snip:wh:{" + ep.ID + "}:q", blocked: make(chan struct{}), release: make(chan struct{}),
		after: leaseTTL * 27 / 100, length: leaseTTL * 8 / 10}
	var releaseOnce sync.Once
	releaseNow := func() { releaseOnce.Do(func() { close(blip.release) }) }
	t.Cleanup(releaseNow)
	blippingRDB := redis.NewClient(&redis.Options{Addr: servers.Redis.Addr, DB: db})
	t.Cleanup(func() { _ = blippingRDB.Close() })
	blippingRDB.AddHook(blip)

	store := redisstore.New(rdb, 100_000)
	bstore := redisstore.New(blippingRDB, 100_000)
	m, err := delivery.NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	replayer := delivery.NewReplayer(js, bstore, delivery.NewIntake(bstore, m), slog.New(slog.DiscardHandler),
		delivery.ReplayerConfig{Pending: 4, Partitions: o.Partitions, Instance: "b", LeaseTTL: leaseTTL})
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- replayer.Run(rctx) }()
	t.Cleanup(func() { stop(); <-done })
	admin := &delivery.Admin{Store: bstore, Replayer: replayer}
	if err := store.Put(ctx, ep); err != nil {
		t.Fatal(err)
	}
	from := time.Now().UTC()
	const clicks = 3
	for range clicks {
		c := events.Click{V: events.ClickVersion, ID: events.NewID(), Time: time.Now().UTC(), Code: "a1",
			Owner: "acme", Target: "https://example.com/", Visitor: "visitor", Country: "NL"}
		cb, _ := json.Marshal(c)
		if _, err := js.Publish(ctx, events.ClickSubject(c.Owner, c.Code), cb, jetstream.WithMsgID(c.ID)); err != nil {
			t.Fatal(err)
		}
	}
	replayState := func() redisstore.Replay {
		t.Helper()
		_, st, err := store.Get(ctx, ep.ID)
		if err != nil {
			t.Fatal(err)
		}
		return st.Replay
	}

	if err := admin.Replay(ctx, "acme", ep.ID, from); err != nil {
		t.Fatal(err)
	}
	select {
	case <-blip.blocked:
	case <-time.After(30 * time.Second):
		t.Fatalf("the replay never copied: %+v", replayState())
	}
	blip.armed.Store(true)
	testenv.WaitFor(t, 10*time.Second, "a renewal of the replay's lease", func() bool { f, _ := blip.window(); return !f.IsZero() })
	blipFrom, blipTo := blip.window()
	// Through the blip, and a third of the lease past it: a lease that lapsed
	// in it reads interrupted by then.
	var got redisstore.Replay
	testenv.Poll(blipTo.Sub(time.Now())+leaseTTL/3, func() bool {
		got = replayState()
		return got.State != redisstore.ReplayRunning
	})
	if got.State != redisstore.ReplayRunning {
		t.Fatalf("the replay, its instance out of Redis' reach for %s (%s to %s after a renewal; its lease: %s), read at %s after the renewal: %+v; want running",
			blip.length, blip.after, blip.after+blip.length, leaseTTL, time.Since(blipFrom.Add(-blip.after)).Round(time.Millisecond), got)
	}

	releaseNow()
	if !testenv.Poll(30*time.Second, func() bool {
		got = replayState()
		return got.State != redisstore.ReplayRunning
	}) || got.State != redisstore.ReplayDone || got.Events != clicks {
		t.Fatalf("the replay let go after the blip: %+v; want done with %d events", got, clicks)
	}
}

// holding is a go-redis hook for an instance's Redis client: it holds the
// first pipeline that match accepts until released.
type holding struct {
	match   func(ctx context.Context, cmds []redis.Cmder) bool
	blocked chan struct{} // closed when the pipeline is held
	release chan struct{} // closed to let it go on
	held    atomic.Bool
}

func (h *holding) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *holding) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h *holding) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !h.held.Load() && h.match(ctx, cmds) && h.held.CompareAndSwap(false, true) {
			close(h.blocked)
			select {
			case <-h.release:
			case <-ctx.Done():
			}
		}
		return next(ctx, cmds)
	}
}

// TestAReplayStopsOnceSupersededOrItsLeaseLapsed: a replay went on
// copying events into the endpoint's queue until it ended, after a newer
// replay of the endpoint was asked for (through another instance) or after
// its lease lapsed (it read interrupted). The newer replay cut, cleared
// the queue and copied the same events, so the old replay's batches that
// landed after the clear survived it and the receiver got those events
// twice; one whose lease lapsed wrote done over interrupted. Here instance
// b's replay is held at its first batch (every event, read before the
// newer replay cut) while instance a's replay supersedes it and runs to
// done, or while b's lease lapses; let go, b's batch is refused: each
// event is queued once (none, after the lapse: b had cleared the queue),
// and b's replay ends without writing its state. Held before its cut
// instead (after its running write), b's replay must neither cut nor
// clear once let go: its clear would delete a's copies, which b, stopped
// from copying, would not bring back.
func TestAReplayStopsOnceSupersededOrItsLeaseLapsed(t *testing.T) {
	t.Parallel()
	supersede := func(t *testing.T, a *delivery.Admin, _ *redis.Client, ep string, held redisstore.Replay) redisstore.Replay {
		if err := a.Replay(t.Context(), "acme", ep, held.From); err != nil {
			t.Fatal(err)
		}
		var got redisstore.Replay
		if !testenv.Poll(30*time.Second, func() bool {
			s, err := a.Get(t.Context(), "acme", ep)
			got = s.Replay
			return err == nil && (got.State == redisstore.ReplayDone || got.State == redisstore.ReplayFailed)
		}) || got.State != redisstore.ReplayDone || got.ID == held.ID {
			t.Fatalf("the newer replay: %+v; want done", got)
		}
		return got
	}
	lapse := func(t *testing.T, a *delivery.Admin, rdb *redis.Client, ep string, _ redisstore.Replay) redisstore.Replay {
		// As it lapses: nothing renews a lease that is gone.
		if err := rdb.Del(t.Context(), "snip:wh:{"+ep+"}:replay_lease").Err(); err != nil {
			t.Fatal(err)
		}
		s, err := a.Get(t.Context(), "acme", ep)
		if err != nil || s.Replay.State != redisstore.ReplayInterrupted {
			t.Fatalf("the replay after its lease lapsed: %+v, %v; want interrupted", s.Replay, err)
		}
		return s.Replay
	}
	tests := []struct {
		name string
		// cut: b's replay is held as it reads the endpoint for its cut;
		// else at its first batch.
		cut bool
		// meanwhile supersedes or interrupts b's held replay, and returns
		// the endpoint's replay as it should stay.
		meanwhile func(t *testing.T, a *delivery.Admin, rdb *redis.Client, ep string, held redisstore.Replay) redisstore.Replay
		// queued is whether each event is to be queued (once) or none.
		queued bool
	}{
		{name: "superseded_mid_copy_by_a_newer_replay_through_another_instance", meanwhile: supersede, queued: true},
		{name: "its_lease_lapsed_mid_copy", meanwhile: lapse, queued: false},
		{name: "superseded_before_its_cut", cut: true, meanwhile: supersede, queued: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			js := testenv.StartNATS(t).JetStream(t)
			ctx := t.Context()
			o := topology.Defaults()
			o.Storage = jetstream.MemoryStorage
			if err := topology.Apply(ctx, js, o); err != nil {
				t.Fatal(err)
			}
			rdb, db := servers.Redis.NewDB(t)
			ep := endpoint.Endpoint{ID: "ep_old", Owner: "acme", URL: "https://example.com/hook", Types: []string{endpoint.TypeClick}}
			// b's replays run one at a time: once this one's is done, b's
			// replay of ep has ended.
			next := endpoint.Endpoint{ID: "ep_next", Owner: "acme", URL: "https://example.com/next", Types: []string{endpoint.TypeClick}}
			epKey, queueKey := "snip:wh:{"+ep.ID+"}:ep", "snip:wh:{"+ep.ID+"}:q"
			hold := &holding{blocked: make(chan struct{}), release: make(chan struct{}), match: func(_ context.Context, cmds []redis.Cmder) bool {
				return slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return slices.Contains(c.Args(), any(queueKey)) })
			}}
			if tc.cut {
				// The endpoint's read (HGETALL) while b's replay reads
				// running: its cut's, not the request's.
				hold.match = func(ctx context.Context, cmds []redis.Cmder) bool {
					reads := slices.ContainsFunc(cmds, func(c redis.Cmder) bool {
						return c.Name() == "hgetall" && slices.Contains(c.Args(), any(epKey))
					})
					if !reads {
						return false
					}
					var r redisstore.Replay
					b, err := rdb.HGet(ctx, epKey, "replay").Bytes()
					return err == nil && json.Unmarshal(b, &r) == nil && r.State == redisstore.ReplayRunning
				}
			}
			var releaseOnce sync.Once
			releaseNow := func() { releaseOnce.Do(func() { close(hold.release) }) }
			t.Cleanup(releaseNow)
			holdingRDB := redis.NewClient(&redis.Options{Addr: servers.Redis.Addr, DB: db})
			t.Cleanup(func() { _ = holdingRDB.Close() })
			holdingRDB.AddHook(hold)

			start := func(name string, rdb redis.UniversalClient) (*delivery.Admin, *redisstore.Store) {
				store := redisstore.New(rdb, 100_000)
				m, err := delivery.NewMetrics(prometheus.NewRegistry())
				if err != nil {
					t.Fatal(err)
				}
				replayer := delivery.NewReplayer(js, store, delivery.NewIntake(store, m), slog.New(slog.DiscardHandler),
					delivery.ReplayerConfig{Pending: 4, Partitions: o.Partitions, Instance: name, LeaseTTL: 3 * time.Second})
				rctx, stop := context.WithCancel(ctx)
				done := make(chan error, 1)
				go func() { done <- replayer.Run(rctx) }()
				t.Cleanup(func() { stop(); <-done })
				return &delivery.Admin{Store: store, Replayer: replayer}, store
			}
			a, store := start("a", rdb)
			b, _ := start("b", holdingRDB)
			for _, e := range []endpoint.Endpoint{ep, next} {
				if err := store.Put(ctx, e); err != nil {
					t.Fatal(err)
				}
			}
			from := time.Now().UTC()
			want := map[string]int{}
			for range 3 {
				c := events.Click{V: events.ClickVersion, ID: events.NewID(), Time: time.Now().UTC(), Code: "a1",
					Owner: "acme", Target: "https://example.com/", Visitor: "visitor", Country: "NL"}
				cb, _ := json.Marshal(c)
				if _, err := js.Publish(ctx, events.ClickSubject(c.Owner, c.Code), cb, jetstream.WithMsgID(c.ID)); err != nil {
					t.Fatal(err)
				}
				if tc.queued {
					want[c.ID] = 1
				}
			}
			replayOf := func(id string) redisstore.Replay {
				t.Helper()
				s, err := a.Get(ctx, "acme", id)
				if err != nil {
					t.Fatal(err)
				}
				return s.Replay
			}

			if err := b.Replay(ctx, "acme", ep.ID, from); err != nil {
				t.Fatal(err)
			}
			select {
			case <-hold.blocked:
			case <-time.After(30 * time.Second):
				t.Fatalf("b's replay never got to the held write: %+v", replayOf(ep.ID))
			}
			held := replayOf(ep.ID)
			if held.State != redisstore.ReplayRunning {
				t.Fatalf("b's replay held: %+v; want running", held)
			}
			stays := tc.meanwhile(t, a, rdb, ep.ID, held)
			cut, _, err := store.Get(ctx, ep.ID)
			if err != nil {
				t.Fatal(err)
			}

			releaseNow()
			if err := b.Replay(ctx, "acme", next.ID, from); err != nil {
				t.Fatal(err)
			}
			var got redisstore.Replay
			if !testenv.Poll(30*time.Second, func() bool {
				got = replayOf(next.ID)
				return got.State == redisstore.ReplayDone || got.State == redisstore.ReplayFailed
			}) || got.State != redisstore.ReplayDone {
				t.Fatalf("b's next replay, after the held one: %+v; want done", got)
			}

			if d := cmp.Diff(stays, replayOf(ep.ID)); d != "" {
				t.Errorf("the endpoint's replay once b's held replay ended (-want +got):\n%s", d)
			}
			after, _, err := store.Get(ctx, ep.ID)
			if err != nil {
				t.Fatal(err)
			}
			if after.ReplayClicksUpto != cut.ReplayClicksUpto || after.Generation != cut.Generation {
				t.Errorf("the endpoint's cut once b's held replay ended: %d (generation %d), want %d (generation %d) as before it was let go",
					after.ReplayClicksUpto, after.Generation, cut.ReplayClicksUpto, cut.Generation)
			}
			queued := queuedIDs(t, store, ep.ID)
			if d := cmp.Diff(want, queued); d != "" {
				t.Errorf("the endpoint's queue, event IDs and how often each is queued (-want +got):\n%s", d)
			}
		})
	}
}

// TestClicksIntakeRoutedBeforeAReplayCutAreQueuedOnce: the intake routes a
// batch with the endpoints as it last loaded them, then queues it. A
// replay that cut and cleared the queue in between (here the intake's
// queue write is held while the replay, through another instance, cuts,
// clears, copies and is done) left the batch's clicks, all at or below
// its cut, to be queued after its clear, beside its own copies of them:
// the receiver got each click twice. Each is queued once.
func TestClicksIntakeRoutedBeforeAReplayCutAreQueuedOnce(t *testing.T) {
	t.Parallel()
	js := testenv.StartNATS(t).JetStream(t)
	ctx := t.Context()
	o := topology.Defaults()
	o.Storage = jetstream.MemoryStorage
	if err := topology.Apply(ctx, js, o); err != nil {
		t.Fatal(err)
	}
	rdb, db := servers.Redis.NewDB(t)
	ep := endpoint.Endpoint{ID: "ep_live", Owner: "acme", URL: "https://example.com/hook", Types: []string{endpoint.TypeClick}}
	queueKey := "snip:wh:{" + ep.ID + "}:q"
	hold := &holding{blocked: make(chan struct{}), release: make(chan struct{}), match: func(_ context.Context, cmds []redis.Cmder) bool {
		return slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return slices.Contains(c.Args(), any(queueKey)) })
	}}
	var releaseOnce sync.Once
	releaseNow := func() { releaseOnce.Do(func() { close(hold.release) }) }
	t.Cleanup(releaseNow)
	holdingRDB := redis.NewClient(&redis.Options{Addr: servers.Redis.Addr, DB: db})
	t.Cleanup(func() { _ = holdingRDB.Close() })
	holdingRDB.AddHook(hold)

	newIntake := func(rdb redis.UniversalClient) (*delivery.Intake, *redisstore.Store) {
		store := redisstore.New(rdb, 100_000)
		m, err := delivery.NewMetrics(prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		return delivery.NewIntake(store, m), store
	}
	intake, _ := newIntake(holdingRDB)
	replayIntake, store := newIntake(rdb)
	replayer := delivery.NewReplayer(js, store, replayIntake, slog.New(slog.DiscardHandler),
		delivery.ReplayerConfig{Pending: 4, Partitions: o.Partitions, Instance: "a", LeaseTTL: 3 * time.Second})
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- replayer.Run(rctx) }()
	t.Cleanup(func() { stop(); <-done })
	admin := &delivery.Admin{Store: store, Replayer: replayer}
	if err := store.Put(ctx, ep); err != nil {
		t.Fatal(err)
	}

	from := time.Now().UTC()
	var batch []reader.Event
	want := map[string]int{}
	for range 3 {
		c := events.Click{V: events.ClickVersion, ID: events.NewID(), Time: time.Now().UTC(), Code: "a1",
			Owner: "acme", Target: "https://example.com/", Visitor: "visitor", Country: "NL"}
		cb, _ := json.Marshal(c)
		ack, err := js.Publish(ctx, events.ClickSubject(c.Owner, c.Code), cb, jetstream.WithMsgID(c.ID))
		if err != nil {
			t.Fatal(err)
		}
		batch = append(batch, reader.Event{Click: c, Seq: ack.Sequence, Stored: c.Time, Deliveries: 1})
		want[c.ID] = 1
	}
	handled := make(chan error, 1)
	go func() { handled <- intake.HandleClicks(ctx, 0, batch) }()
	select {
	case <-hold.blocked:
	case <-time.After(30 * time.Second):
		t.Fatal("the intake never got to its queue write")
	}

	if err := admin.Replay(ctx, "acme", ep.ID, from); err != nil {
		t.Fatal(err)
	}
	var got redisstore.Replay
	if !testenv.Poll(30*time.Second, func() bool {
		s, err := admin.Get(ctx, "acme", ep.ID)
		got = s.Replay
		return err == nil && (got.State == redisstore.ReplayDone || got.State == redisstore.ReplayFailed)
	}) || got.State != redisstore.ReplayDone || got.Events != len(batch) {
		t.Fatalf("the replay: %+v; want done with %d events", got, len(batch))
	}
	releaseNow()
	select {
	case err := <-handled:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the intake's batch was never handled")
	}

	queued := queuedIDs(t, store, ep.ID)
	if d := cmp.Diff(want, queued); d != "" {
		t.Errorf("the endpoint's queue, event IDs and how often each is queued (-want +got):\n%s", d)
	}
}

// counting is a go-redis hook that counts the pipelines match accepts
// that ran (one the server answered NOSCRIPT, sent again once the script
// is loaded, counts once).
type counting struct {
	match func(cmds []redis.Cmder) bool
	n     atomic.Int64
}

func (h *counting) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *counting) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h *counting) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if h.match(cmds) && !redis.HasErrorPrefix(err, "NOSCRIPT") {
			h.n.Add(1)
		}
		return err
	}
}

// TestAReplayOfAnEndpointDeletedMidCopyStops: a replay whose endpoint was
// deleted while it copied queued nothing more (the script writes nothing
// for a deleted endpoint) but went on reading the stream to its cut and
// sending every batch to Redis, one after the other, holding up the
// instance's other replays (they run one at a time) for as long as the
// owner's history took to read. Here instance b's replay is held at its
// first batch of two while the endpoint is deleted; let go, it writes no
// other batch, and none of the endpoint's keys come back.
func TestAReplayOfAnEndpointDeletedMidCopyStops(t *testing.T) {
	t.Parallel()
	js := testenv.StartNATS(t).JetStream(t)
	ctx := t.Context()
	o := topology.Defaults()
	o.Storage = jetstream.MemoryStorage
	if err := topology.Apply(ctx, js, o); err != nil {
		t.Fatal(err)
	}
	rdb, db := servers.Redis.NewDB(t)
	ep := endpoint.Endpoint{ID: "ep_deleted", Owner: "acme", URL: "https://example.com/hook", Types: []string{endpoint.TypeClick}}
	next := endpoint.Endpoint{ID: "ep_next", Owner: "acme", URL: "https://example.com/next", Types: []string{endpoint.TypeClick}}
	queueKey := "snip:wh:{" + ep.ID + "}:q"
	writesQueue := func(cmds []redis.Cmder) bool {
		return slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return slices.Contains(c.Args(), any(queueKey)) })
	}
	hold := &holding{blocked: make(chan struct{}), release: make(chan struct{}),
		match: func(_ context.Context, cmds []redis.Cmder) bool { return writesQueue(cmds) }}
	var releaseOnce sync.Once
	releaseNow := func() { releaseOnce.Do(func() { close(hold.release) }) }
	t.Cleanup(releaseNow)
	writes := &counting{match: writesQueue}
	holdingRDB := redis.NewClient(&redis.Options{Addr: servers.Redis.Addr, DB: db})
	t.Cleanup(func() { _ = holdingRDB.Close() })
	holdingRDB.AddHook(writes)
	holdingRDB.AddHook(hold)

	store := redisstore.New(holdingRDB, 100_000)
	m, err := delivery.NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	replayer := delivery.NewReplayer(js, store, delivery.NewIntake(store, m), slog.New(slog.DiscardHandler),
		delivery.ReplayerConfig{Pending: 4, Partitions: o.Partitions, Instance: "b", LeaseTTL: 3 * time.Second})
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- replayer.Run(rctx) }()
	t.Cleanup(func() { stop(); <-done })
	b := &delivery.Admin{Store: store, Replayer: replayer}
	plain := redisstore.New(rdb, 100_000)
	for _, e := range []endpoint.Endpoint{ep, next} {
		if err := plain.Put(ctx, e); err != nil {
			t.Fatal(err)
		}
	}

	from := time.Now().UTC()
	const clicks = 750 // two batches of at most 500
	for range clicks {
		c := events.Click{V: events.ClickVersion, ID: events.NewID(), Time: time.Now().UTC(), Code: "a1",
			Owner: "acme", Target: "https://example.com/", Visitor: "visitor", Country: "NL"}
		cb, _ := json.Marshal(c)
		if _, err := js.Publish(ctx, events.ClickSubject(c.Owner, c.Code), cb, jetstream.WithMsgID(c.ID)); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Replay(ctx, "acme", ep.ID, from); err != nil {
		t.Fatal(err)
	}
	select {
	case <-hold.blocked:
	case <-time.After(30 * time.Second):
		t.Fatal("b's replay never got to its first batch")
	}
	if err := plain.Delete(ctx, ep); err != nil {
		t.Fatal(err)
	}
	releaseNow()
	if err := b.Replay(ctx, "acme", next.ID, from); err != nil {
		t.Fatal(err)
	}
	var got redisstore.Replay
	if !testenv.Poll(30*time.Second, func() bool {
		s, err := b.Get(ctx, "acme", next.ID)
		got = s.Replay
		return err == nil && (got.State == redisstore.ReplayDone || got.State == redisstore.ReplayFailed)
	}) || got.State != redisstore.ReplayDone || got.Events != clicks {
		t.Fatalf("b's next replay, after the one of the deleted endpoint: %+v; want done with %d events", got, clicks)
	}
	if n := writes.n.Load(); n != 1 {
		t.Errorf("queue writes of the deleted endpoint's replay: %d, want 1 (the held batch, refused)", n)
	}
	if left := testenv.Keys(t, rdb, "snip:wh:{"+ep.ID+"}:*"); len(left) != 0 {
		t.Errorf("keys written for the deleted endpoint: %q", left)
	}
}

// TestAReplayOfADisabledEndpointRefillsItsQueue: a disabled endpoint wants
// nothing of live intake, and the replay filtered the streams with the
// same rule (Endpoint.Wants): asked while the endpoint was disabled (the
// README's "resume, replay" done the other way round, or a disable by its
// sender while the replay ran), it cleared the queue up to its cut,
// dropping what the endpoint had queued before it was disabled, copied
// nothing, and read done. The replay filters by event type and link only:
// the queue holds every event since from once, to be sent once the owner
// resumes.
func TestAReplayOfADisabledEndpointRefillsItsQueue(t *testing.T) {
	t.Parallel()
	js := testenv.StartNATS(t).JetStream(t)
	rdb := servers.RedisClient(t)
	ctx := t.Context()
	o := topology.Defaults()
	o.Storage = jetstream.MemoryStorage
	if err := topology.Apply(ctx, js, o); err != nil {
		t.Fatal(err)
	}
	store := redisstore.New(rdb, 100_000)
	ep := endpoint.Endpoint{ID: "ep_disabled_replay", Owner: "acme", URL: "https://example.com/hook",
		Types: []string{endpoint.TypeClick, endpoint.TypeFraudAlert}, Links: []string{"a1"}}
	if err := store.Put(ctx, ep); err != nil {
		t.Fatal(err)
	}
	m, err := delivery.NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	intake := delivery.NewIntake(store, m)
	replayer := delivery.NewReplayer(js, store, intake, slog.New(slog.DiscardHandler),
		delivery.ReplayerConfig{Pending: 4, Partitions: o.Partitions, Instance: "i1", LeaseTTL: 3 * time.Second})
	admin := &delivery.Admin{Store: store, Replayer: replayer}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- replayer.Run(rctx) }()
	t.Cleanup(func() { stop(); <-done })

	from := time.Now().UTC()
	want := map[string]int{}
	for i := range 4 {
		code := "a1"
		if i == 3 {
			code = "a2" // a link the endpoint leaves out
		}
		c := events.Click{V: events.ClickVersion, ID: events.NewID(), Time: time.Now().UTC(), Code: code,
			Owner: "acme", Target: "https://example.com/", Visitor: "visitor", Country: "NL"}
		a := events.FraudAlert{V: events.FraudVersion, ID: events.NewID(), Rule: "visitor_burst", Code: code,
			Owner: "acme", WindowStart: from, WindowEnd: from, Count: 10 + i, Threshold: 5, Time: from}
		cb, _ := json.Marshal(c)
		ab, _ := json.Marshal(a)
		ack, err := js.Publish(ctx, events.ClickSubject(c.Owner, c.Code), cb, jetstream.WithMsgID(c.ID))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.Publish(ctx, events.FraudAlertSubject(a.Code), ab, jetstream.WithMsgID(a.ID)); err != nil {
			t.Fatal(err)
		}
		if code == "a1" {
			want[c.ID], want[a.ID] = 1, 1
		}
		if i == 0 {
			// Live intake queued the first click before the endpoint was
			// disabled; it was never delivered.
			added, _, err := store.Enqueue(ctx, redisstore.DedupSeq, 0, map[string][]redisstore.Event{ep.ID: {
				{Seq: ack.Sequence, ID: c.ID, Type: endpoint.TypeClick, Time: c.Time, Data: cb}}})
			if err != nil || added[ep.ID] != 1 {
				t.Fatalf("queue the first click: %v, added %v", err, added)
			}
		}
	}
	if _, _, err := store.Update(ctx, ep.ID, func(e *endpoint.Endpoint, _ redisstore.State) (redisstore.Write, error) {
		e.DisabledAt, e.DisabledReason = time.Now().UTC(), "failing since ...: HTTP 500"
		return redisstore.WriteConfig, nil
	}); err != nil {
		t.Fatal(err)
	}

	if err := admin.Replay(ctx, "acme", ep.ID, from); err != nil {
		t.Fatalf("replay: %v", err)
	}
	var got redisstore.Replay
	if !testenv.Poll(30*time.Second, func() bool {
		s, err := admin.Get(ctx, "acme", ep.ID)
		got = s.Replay
		return err == nil && (got.State == redisstore.ReplayFailed || got.State == redisstore.ReplayDone)
	}) || got.State != redisstore.ReplayDone || got.Events != len(want) {
		t.Errorf("the disabled endpoint's replay: %+v, want done with %d events", got, len(want))
	}
	queued := queuedIDs(t, store, ep.ID)
	if d := cmp.Diff(want, queued); d != "" {
		t.Errorf("the disabled endpoint's queue after its replay, event IDs (-want +got):\n%s", d)
	}
}

// TestAReplayLeavesNoConsumerBehind: a replay copies CLICKS and FRAUD
// with an ordered consumer on each, which it deletes when done: after 3
// replays both streams have as many consumers as before them. Before,
// each stayed until the server dropped it as inactive (nats.go's default
// for an ordered consumer, 5 minutes), so replays asked again and again
// piled consumers up on both streams.
func TestAReplayLeavesNoConsumerBehind(t *testing.T) {
	t.Parallel()
	js := testenv.StartNATS(t).JetStream(t)
	rdb := servers.RedisClient(t)
	ctx := t.Context()
	o := topology.Defaults()
	o.Storage = jetstream.MemoryStorage
	if err := topology.Apply(ctx, js, o); err != nil {
		t.Fatal(err)
	}
	store := redisstore.New(rdb, 100_000)
	ep := endpoint.Endpoint{ID: "ep_replay_consumers", Owner: "acme", URL: "https://example.com/hook",
		Types: []string{endpoint.TypeClick, endpoint.TypeFraudAlert}}
	if err := store.Put(ctx, ep); err != nil {
		t.Fatal(err)
	}
	m, err := delivery.NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	replayer := delivery.NewReplayer(js, store, delivery.NewIntake(store, m), slog.New(slog.DiscardHandler),
		delivery.ReplayerConfig{Pending: 4, Partitions: o.Partitions, Instance: "i1", LeaseTTL: 3 * time.Second})
	admin := &delivery.Admin{Store: store, Replayer: replayer}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- replayer.Run(rctx) }()
	t.Cleanup(func() { stop(); <-done })

	from := time.Now().UTC()
	for i := range 3 {
		c := events.Click{V: events.ClickVersion, ID: events.NewID(), Time: time.Now().UTC(), Code: "a1",
			Owner: "acme", Target: "https://example.com/", Visitor: "visitor", Country: "NL"}
		a := events.FraudAlert{V: events.FraudVersion, ID: events.NewID(), Rule: "visitor_burst", Code: "a1",
			Owner: "acme", WindowStart: from, WindowEnd: from, Count: 10 + i, Threshold: 5, Time: from}
		cb, _ := json.Marshal(c)
		ab, _ := json.Marshal(a)
		if _, err := js.Publish(ctx, events.ClickSubject(c.Owner, c.Code), cb, jetstream.WithMsgID(c.ID)); err != nil {
			t.Fatal(err)
		}
		if _, err := js.Publish(ctx, events.FraudAlertSubject(a.Code), ab, jetstream.WithMsgID(a.ID)); err != nil {
			t.Fatal(err)
		}
	}
	consumers := func() string {
		var out []string
		for _, name := range []string{events.ClicksStream, events.FraudStream} {
			s, err := js.Stream(ctx, name)
			if err != nil {
				return err.Error()
			}
			info, err := s.Info(ctx)
			if err != nil {
				return err.Error()
			}
			out = append(out, fmt.Sprintf("%s %d", name, info.State.Consumers))
		}
		return strings.Join(out, ", ")
	}
	before := consumers()
	var last string // the replay before, done
	for i := range 3 {
		if err := admin.Replay(ctx, "acme", ep.ID, from); err != nil {
			t.Fatalf("replay %d: %v", i, err)
		}
		var got redisstore.Replay
		if !testenv.Poll(30*time.Second, func() bool {
			s, err := admin.Get(ctx, "acme", ep.ID)
			got = s.Replay
			return err == nil && got.ID != last && got.State == redisstore.ReplayDone && got.Events == 6
		}) {
			t.Fatalf("replay %d: %+v, want done with 6 events", i, got)
		}
		last = got.ID
	}
	now := before
	if !testenv.Poll(20*time.Second, func() bool { now = consumers(); return now == before }) {
		t.Errorf("consumers 20 s after 3 replays: %s, want %s as before them", now, before)
	}
}

// TestAReplayKeepsTheTestEventsQueued: a replay clears the queue up to its
// cut and refills it from the streams, where a test event never is: it
// dropped the test events queued, so one the owner asked for (and was
// answered its event ID) just before a replay was never sent. It keeps
// them, and drops and refills the clicks as before.
func TestAReplayKeepsTheTestEventsQueued(t *testing.T) {
	t.Parallel()
	js := testenv.StartNATS(t).JetStream(t)
	rdb := servers.RedisClient(t)
	ctx := t.Context()
	o := topology.Defaults()
	o.Storage = jetstream.MemoryStorage
	if err := topology.Apply(ctx, js, o); err != nil {
		t.Fatal(err)
	}
	store := redisstore.New(rdb, 100_000)
	ep := endpoint.Endpoint{ID: "ep_replay_test_event", Owner: "acme", URL: "https://example.com/hook", Types: []string{endpoint.TypeClick}}
	if err := store.Put(ctx, ep); err != nil {
		t.Fatal(err)
	}
	m, err := delivery.NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	intake := delivery.NewIntake(store, m)
	replayer := delivery.NewReplayer(js, store, intake, slog.New(slog.DiscardHandler),
		delivery.ReplayerConfig{Pending: 4, Partitions: o.Partitions, Instance: "i1", LeaseTTL: 3 * time.Second})
	admin := &delivery.Admin{Store: store, Replayer: replayer, Intake: intake}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- replayer.Run(rctx) }()
	t.Cleanup(func() { stop(); <-done })

	from := time.Now().UTC()
	want := map[string]int{}
	for i := range 3 {
		c := events.Click{V: events.ClickVersion, ID: events.NewID(), Time: time.Now().UTC(), Code: "a1",
			Owner: "acme", Target: "https://example.com/", Visitor: "visitor", Country: "NL"}
		cb, _ := json.Marshal(c)
		ack, err := js.Publish(ctx, events.ClickSubject(c.Owner, c.Code), cb, jetstream.WithMsgID(c.ID))
		if err != nil {
			t.Fatal(err)
		}
		want[c.ID] = 1
		if i == 0 {
			// Queued by live intake: the replay drops it and copies it again.
			if _, _, err := store.Enqueue(ctx, redisstore.DedupSeq, 0, map[string][]redisstore.Event{ep.ID: {
				{Seq: ack.Sequence, ID: c.ID, Type: endpoint.TypeClick, Time: c.Time, Data: cb}}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	test, err := admin.SendTest(ctx, "acme", ep.ID)
	if err != nil {
		t.Fatalf("test event: %v", err)
	}
	want[test] = 1

	if err := admin.Replay(ctx, "acme", ep.ID, from); err != nil {
		t.Fatalf("replay: %v", err)
	}
	var got redisstore.Replay
	if !testenv.Poll(30*time.Second, func() bool {
		s, err := admin.Get(ctx, "acme", ep.ID)
		got = s.Replay
		return err == nil && (got.State == redisstore.ReplayFailed || got.State == redisstore.ReplayDone)
	}) || got.State != redisstore.ReplayDone {
		t.Fatalf("the replay: %+v, want done", got)
	}
	queued := queuedIDs(t, store, ep.ID)
	if d := cmp.Diff(want, queued); d != "" {
		t.Errorf("the queue after the replay, event IDs (-want +got; the test event is %s):\n%s", test, d)
	}
}

// queuedIDs reads endpoint id's whole queue: how often each event ID is
// queued.
func queuedIDs(t *testing.T, store *redisstore.Store, id string) map[string]int {
	t.Helper()
	evs, err := store.Read(t.Context(), id, "0", 1000, 1<<30, 0)
	if err != nil {
		t.Fatal(err)
	}
	queued := map[string]int{}
	for _, e := range evs {
		queued[e.ID]++
	}
	return queued
}
