package redirect_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/redirect/internal/link"
	"github.com/snipdev/snip/services/redirect/internal/linkstore"
	"github.com/snipdev/snip/services/redirect/internal/outbox"
	"github.com/snipdev/snip/services/redirect/internal/redirect"
)

// slowReply is the link store as a cache miss sees it when Redis's reply
// is slow to reach the resolver: the first Get reads the link from Redis
// (the real store), then holds it until release, as a reply is held by a
// loaded network or a descheduled goroutine. Later Gets are not held.
type slowReply struct {
	*linkstore.Store
	held    *atomic.Bool
	read    chan struct{}
	release chan struct{}
}

func (s slowReply) Get(ctx context.Context, code string) (link.Link, error) {
	l, err := s.Store.Get(ctx, code)
	if s.held.CompareAndSwap(false, true) {
		close(s.read)
		<-s.release
	}
	return l, err
}

// TestInvalidationDuringACacheMissIsNotUndone: a link deleted, and
// invalidated, while a cache miss for it was reading it from Redis is not
// cached by that miss on its return. The miss's own request may still get
// the link (it was read before the delete), but the next request must find
// it deleted, not a cached live link for SNIP_CACHE_TTL.
func TestInvalidationDuringACacheMissIsNotUndone(t *testing.T) {
	t.Parallel()
	rdb, _ := servers.Redis.NewDB(t)
	layout := outbox.NewLayout(1)
	store := linkstore.New(rdb, layout, 1<<40)
	l, err := store.Create(t.Context(), "acme", "https://example.com/deleted-soon", "")
	if err != nil {
		t.Fatal(err)
	}
	slow := slowReply{Store: store, held: new(atomic.Bool), read: make(chan struct{}), release: make(chan struct{})}
	res := redirect.NewResolver(slow, 10, time.Hour, 0, time.Minute, redirect.NewMetrics(prometheus.NewRegistry()))
	defer res.Close()

	missed := make(chan error, 1)
	go func() {
		_, err := res.Resolve(t.Context(), l.Code)
		missed <- err
	}()
	<-slow.read // the miss has read the live link
	if err := store.Delete(t.Context(), "acme", l.Code); err != nil {
		t.Fatal(err)
	}
	res.Invalidate(l.Code) // as the API and LINKS do after a delete
	close(slow.release)
	if err := <-missed; err != nil {
		t.Fatalf("the miss that read the link before the delete: %v", err)
	}

	if _, err := res.Resolve(t.Context(), l.Code); !errors.Is(err, redirect.ErrNotFound) {
		t.Fatalf("resolve after the delete: %v; want ErrNotFound (the miss that read the link before the delete cached it after the invalidation)", err)
	}
}

// BenchmarkResolveCached is the cache's part of every click: a link found
// fresh in the cache, with stale-if-error on (as by default).
func BenchmarkResolveCached(b *testing.B) {
	rdb, _ := servers.Redis.NewDB(b)
	store := linkstore.New(rdb, outbox.NewLayout(1), 1<<40)
	l, err := store.Create(b.Context(), "acme", "https://example.com/landing", "")
	if err != nil {
		b.Fatal(err)
	}
	res := redirect.NewResolver(store, 1000, time.Hour, time.Hour, time.Second, redirect.NewMetrics(prometheus.NewRegistry()))
	defer res.Close()
	if _, err := res.Resolve(b.Context(), l.Code); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			if _, err := res.Resolve(ctx, l.Code); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// counting is the link store counting its lookups.
type counting struct {
	*linkstore.Store
	gets *atomic.Int64
}

func (c counting) Get(ctx context.Context, code string) (link.Link, error) {
	c.gets.Add(1)
	return c.Store.Get(ctx, code)
}

// TestStaleIfErrorServesAnExpiredLinkWhileRedisIsDown: with Redis frozen
// (SIGSTOP), a link whose cache entry passed its TTL still resolves, from
// the stale entry, until TTL + the stale-if-error bound have passed since
// it was cached, and not after; a link never cached fails.
func TestStaleIfErrorServesAnExpiredLinkWhileRedisIsDown(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	rdb, _ := r.NewDB(t)
	store := linkstore.New(rdb, outbox.NewLayout(1), 1<<40)
	cached, err := store.Create(t.Context(), "acme", "https://example.com/steady", "")
	if err != nil {
		t.Fatal(err)
	}
	never, err := store.Create(t.Context(), "acme", "https://example.com/never-clicked", "")
	if err != nil {
		t.Fatal(err)
	}
	const ttl, stale = 200 * time.Millisecond, 2 * time.Second
	m := redirect.NewMetrics(prometheus.NewRegistry())
	res := redirect.NewResolver(store, 10, ttl, stale, 100*time.Millisecond, m)
	defer res.Close()
	cachedAt := time.Now()
	if _, err := res.Resolve(t.Context(), cached.Code); err != nil {
		t.Fatal(err)
	}
	r.Pause()
	defer r.Resume()

	testenv.WaitFor(t, 10*time.Second, "the cached link served stale", func() bool {
		l, err := res.Resolve(t.Context(), cached.Code)
		if err != nil {
			t.Fatalf("resolve %s after %s with Redis frozen: %v; want it from the stale entry", cached.Code, time.Since(cachedAt), err)
		}
		if l.Target != cached.Target {
			t.Fatalf("stale link %+v, want %+v", l, cached)
		}
		return testutil.ToFloat64(m.CacheStaleServed) >= 1
	})
	if _, err := res.Resolve(t.Context(), never.Code); !errors.Is(err, linkstore.ErrUnavailable) {
		t.Fatalf("resolve a link never cached with Redis frozen: %v; want ErrUnavailable", err)
	}

	// Past the bound the entry is gone: the lookup's failure is the answer.
	bound := cachedAt.Add(ttl + stale)
	testenv.WaitFor(t, 10*time.Second, "the stale entry to pass its bound", func() bool {
		_, err := res.Resolve(t.Context(), cached.Code)
		if err == nil {
			return false
		}
		if now := time.Now(); now.Before(bound) {
			t.Fatalf("resolve failed %s before the stale bound: %v", bound.Sub(now), err)
		}
		if !errors.Is(err, linkstore.ErrUnavailable) {
			t.Fatalf("resolve past the bound: %v; want ErrUnavailable", err)
		}
		return true
	})
}

// TestStaleIfErrorNeverServesADeletedLink: a link whose entry is dropped
// (Invalidate, as LINKS's link.deleted does) is not served stale while Redis
// is frozen, and with Redis up an expired entry is looked up again: a link
// deleted meanwhile (its LINKS event missed) is not found, and its entry
// does not serve later when Redis is down.
func TestStaleIfErrorNeverServesADeletedLink(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	rdb, _ := r.NewDB(t)
	base := linkstore.New(rdb, outbox.NewLayout(1), 1<<40)
	store := counting{Store: base, gets: new(atomic.Int64)}
	invalidated, err := base.Create(t.Context(), "acme", "https://example.com/invalidated", "")
	if err != nil {
		t.Fatal(err)
	}
	missed, err := base.Create(t.Context(), "acme", "https://example.com/event-missed", "")
	if err != nil {
		t.Fatal(err)
	}
	const ttl = 100 * time.Millisecond
	m := redirect.NewMetrics(prometheus.NewRegistry())
	res := redirect.NewResolver(store, 10, ttl, time.Hour, 100*time.Millisecond, m)
	defer res.Close()
	for _, l := range []link.Link{invalidated, missed} {
		if _, err := res.Resolve(t.Context(), l.Code); err != nil {
			t.Fatal(err)
		}
	}
	if err := base.Delete(t.Context(), "acme", missed.Code); err != nil {
		t.Fatal(err)
	}
	// Redis up: once the TTL has passed the link is asked for again, and
	// Redis says it is deleted.
	before := store.gets.Load()
	testenv.WaitFor(t, 10*time.Second, "the expired entry looked up again", func() bool {
		_, err := res.Resolve(t.Context(), missed.Code)
		if err != nil && !errors.Is(err, redirect.ErrNotFound) {
			t.Fatalf("resolve with Redis up: %v", err)
		}
		return err != nil
	})
	if got := store.gets.Load() - before; got != 1 {
		t.Fatalf("%d lookups in Redis for the expired entry, want 1", got)
	}

	res.Invalidate(invalidated.Code)
	r.Pause()
	defer r.Resume()
	for _, l := range []link.Link{invalidated, missed} {
		if _, err := res.Resolve(t.Context(), l.Code); !errors.Is(err, linkstore.ErrUnavailable) {
			t.Errorf("resolve deleted %s with Redis frozen: %v; want ErrUnavailable, not the stale link", l.Code, err)
		}
	}
	if got := testutil.ToFloat64(m.CacheStaleServed); got != 0 {
		t.Errorf("cache_stale_served_total = %v, want 0", got)
	}
}

// TestStaleIfErrorAnswersAtOnceWhileRedisIsKnownToFail: once a lookup of an
// expired entry has failed (Redis frozen), later requests for expired
// entries answer from them at once instead of each waiting for a lookup of
// its own to time out, with at most one lookup in Redis at a time; once
// Redis answers again, expired entries are looked up again (a link deleted
// meanwhile, its LINKS event missed, is found deleted).
func TestStaleIfErrorAnswersAtOnceWhileRedisIsKnownToFail(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	rdb, _ := r.NewDB(t)
	base := linkstore.New(rdb, outbox.NewLayout(1), 1<<40)
	store := counting{Store: base, gets: new(atomic.Int64)}
	var links []link.Link
	for i := range 3 {
		l, err := base.Create(t.Context(), "acme", "https://example.com/steady-"+string(rune('a'+i)), "")
		if err != nil {
			t.Fatal(err)
		}
		links = append(links, l)
	}
	const ttl, timeout = 50 * time.Millisecond, 500 * time.Millisecond
	m := redirect.NewMetrics(prometheus.NewRegistry())
	res := redirect.NewResolver(store, 10, ttl, time.Hour, timeout, m)
	defer res.Close()
	// Cached last to first: once links[0] is past its TTL, so are the others.
	for i := len(links) - 1; i >= 0; i-- {
		if _, err := res.Resolve(t.Context(), links[i].Code); err != nil {
			t.Fatal(err)
		}
	}
	r.Pause()

	// The first expired entry finds out: its lookup fails after the timeout.
	testenv.WaitFor(t, 10*time.Second, "links[0] served stale", func() bool {
		if l, err := res.Resolve(t.Context(), links[0].Code); err != nil || l.Target != links[0].Target {
			t.Fatalf("resolve with Redis frozen: %+v, %v", l, err)
		}
		return testutil.ToFloat64(m.CacheStaleServed) == 1
	})
	before := store.gets.Load()
	const n = 30
	start := time.Now()
	for i := range n {
		l := links[i%len(links)]
		if got, err := res.Resolve(t.Context(), l.Code); err != nil || got.Target != l.Target {
			t.Fatalf("stale resolve %d: %+v, %v", i, got, err)
		}
	}
	if took := time.Since(start); took >= timeout {
		t.Errorf("%d stale answers took %s with Redis known to fail; each waited for a lookup (timeout %s)", n, took, timeout)
	}
	if got := store.gets.Load() - before; got > 1 {
		t.Errorf("%d lookups in Redis during %d stale answers, want at most 1 (one at a time)", got, n)
	}
	if got := testutil.ToFloat64(m.CacheStaleServed); got != n+1 {
		t.Errorf("cache_stale_served_total = %v, want %d", got, n+1)
	}

	// Redis answers again, and says links[1] is deleted (its LINKS event
	// missed): within a few requests it is looked up and found so.
	r.Resume()
	if err := base.Delete(t.Context(), "acme", links[1].Code); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the deleted link found deleted", func() bool {
		_, err := res.Resolve(t.Context(), links[1].Code)
		if err != nil && !errors.Is(err, redirect.ErrNotFound) {
			t.Fatalf("resolve with Redis back: %v", err)
		}
		return errors.Is(err, redirect.ErrNotFound)
	})
	testenv.WaitFor(t, 10*time.Second, "a fresh answer from Redis", func() bool {
		hits := testutil.ToFloat64(m.CacheHits)
		_, err := res.Resolve(t.Context(), links[2].Code)
		return err == nil && testutil.ToFloat64(m.CacheHits) > hits
	})
}

// revalidations counts the goroutines running a background lookup
// (Resolver.revalidate), not those they started.
func revalidations() int {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		for line := range strings.SplitSeq(g, "\n") {
			if strings.Contains(line, "(*Resolver).revalidate.func") && !strings.HasPrefix(line, "created by") {
				n++
				break
			}
		}
	}
	return n
}

// TestCloseEndsABackgroundLookup: Close ends the background lookup a stale
// answer started while Redis does not answer, and waits for it, at once,
// not by the lookup timeout: shutdown leaves no lookup running. Not
// parallel: it counts the process's goroutines.
func TestCloseEndsABackgroundLookup(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb, _ := r.NewDB(t)
	store := linkstore.New(rdb, outbox.NewLayout(1), 1<<40)
	l, err := store.Create(t.Context(), "acme", "https://example.com/steady", "")
	if err != nil {
		t.Fatal(err)
	}
	const ttl, timeout = 50 * time.Millisecond, time.Minute
	m := redirect.NewMetrics(prometheus.NewRegistry())
	res := redirect.NewResolver(store, 10, ttl, time.Hour, timeout, m)
	defer res.Close()
	if _, err := res.Resolve(t.Context(), l.Code); err != nil {
		t.Fatal(err)
	}
	// Redis gone: a lookup past the TTL fails at once (connection refused),
	// and the store is taken for failing.
	r.Kill()
	testenv.WaitFor(t, 10*time.Second, "the link served stale", func() bool {
		if got, err := res.Resolve(t.Context(), l.Code); err != nil || got.Target != l.Target {
			t.Fatalf("resolve with Redis killed: %+v, %v", got, err)
		}
		return testutil.ToFloat64(m.CacheStaleServed) >= 1
	})
	// Redis back but frozen: a background lookup waits for its answer.
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	r.Pause()
	defer r.Resume()
	testenv.WaitFor(t, 10*time.Second, "a background lookup waiting for Redis", func() bool {
		if _, err := res.Resolve(t.Context(), l.Code); err != nil {
			t.Fatalf("resolve with Redis frozen: %v", err)
		}
		return revalidations() == 1
	})

	start := time.Now()
	res.Close()
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Close took %s", took)
	}
	if !testenv.Poll(2*time.Second, func() bool { return revalidations() == 0 }) {
		t.Fatalf("%d background lookups still run after Close (lookup timeout %s)", revalidations(), timeout)
	}
}
