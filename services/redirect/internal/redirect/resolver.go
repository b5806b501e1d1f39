package redirect

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/maypok86/otter/v2"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/services/redirect/internal/link"
	"github.com/snipdev/snip/services/redirect/internal/linkstore"
)

// LinkGetter is what the resolver needs of the link store.
type LinkGetter interface {
	Get(ctx context.Context, code string) (link.Link, error)
}

// Resolver finds links, from the cache when it can.
type Resolver struct {
	store   LinkGetter
	cache   *otter.Cache[string, cached]
	ttl     time.Duration
	timeout time.Duration
	// stale is SNIP_CACHE_STALE_IF_ERROR: an entry stays in the cache that
	// long past its TTL, and serves only when the store fails. While it is
	// on, now is a coarse clock (monoNow, set every tick by keepTime, never
	// ahead of the real one) that tells a hit whether its entry is fresh
	// without reading the clock per click.
	stale time.Duration
	now   atomic.Int64
	stop  chan struct{}
	once  sync.Once
	m     *Metrics
	// invalidations counts Invalidate calls. A cache miss that saw it
	// change while it read the store drops what it cached: the link it read
	// may be one the invalidation was for (deleted after the read).
	invalidations atomic.Uint64
	// failing is set when a lookup in the store failed (an error or the
	// timeout, not "not found") and cleared when one is answered: while it
	// is set, an entry past its TTL answers from its stale link at once,
	// and one lookup at a time (revalidating, in the background) finds out
	// whether the store answers again.
	failing      atomic.Bool
	revalidating atomic.Bool
	// bg is the context of the background lookups (revalidate), cancelled
	// by Close, which then waits for them (inflight) to end. closed, set by
	// Close under mu, keeps a lookup from starting after Close waited.
	bg       context.Context
	stopBG   context.CancelFunc
	mu       sync.Mutex
	closed   bool
	inflight sync.WaitGroup
}

// cached is a cache entry: the link, and until when (monoNow) it is
// fresh, SNIP_CACHE_TTL after it was read.
type cached struct {
	link.Link
	freshUntil int64
}

// NewResolver returns a resolver whose cache holds at most size links, each
// fresh for ttl. A lookup in the store (a cache miss) is bounded by
// timeout (0: by ctx alone), so a stopped Redis costs a visitor whose link
// is not cached that long, then a 503.
//
// staleIfError (0: off) is how long past its ttl an entry still serves
// when the store fails to answer its lookup (stale-if-error, as RFC 5861
// has it for HTTP caches): the entry stays in the cache for ttl +
// staleIfError, and a lookup of it after ttl goes to the store as a miss
// does; only if the store fails (an error or the timeout, not "not found")
// is the stale link returned. The cache's size bounds the entries as
// before: a stale entry is one of them, evicted as any other.
func NewResolver(store LinkGetter, size int, ttl, staleIfError, timeout time.Duration, m *Metrics) *Resolver {
	staleIfError = max(staleIfError, 0)
	c := otter.Must(&otter.Options[string, cached]{
		MaximumSize:      size,
		ExpiryCalculator: otter.ExpiryWriting[string, cached](ttl + staleIfError),
	})
	r := &Resolver{store: store, cache: c, ttl: ttl, timeout: timeout, stale: staleIfError, stop: make(chan struct{}), m: m}
	r.bg, r.stopBG = context.WithCancel(context.Background())
	if staleIfError > 0 {
		r.now.Store(monoNow())
		go r.keepTime(clockTick(ttl))
	}
	return r
}

// epoch is what monoNow counts from.
var epoch = time.Now()

// monoNow is the monotonic clock in nanoseconds since epoch: a step of the
// wall clock moves no entry's freshness.
func monoNow() int64 { return int64(time.Since(epoch)) }

// clockTick is how often the coarse clock is set: a tenth of the TTL, at
// most a second, so an entry is taken for fresh at most that much (and
// the goroutine's scheduling delay) past its TTL.
func clockTick(ttl time.Duration) time.Duration {
	return min(max(ttl/10, time.Millisecond), time.Second)
}

// keepTime sets the coarse clock every tick until Close.
func (r *Resolver) keepTime(tick time.Duration) {
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
			r.now.Store(monoNow())
		}
	}
}

// Close stops the cache's maintenance goroutines and the coarse clock, and
// a background lookup (revalidate) that runs: its context is cancelled and
// Close waits for it to end, at once, not by the lookup timeout. (Its read
// in Redis, abandoned as get abandons one at its deadline, ends when the
// Redis client is closed or by the client's read timeout.) No background
// lookup starts after Close.
func (r *Resolver) Close() {
	r.once.Do(func() {
		close(r.stop)
		r.mu.Lock()
		r.closed = true
		r.mu.Unlock()
		r.stopBG()
	})
	r.inflight.Wait()
	r.cache.StopAllGoroutines()
}

// Resolve returns the live link with code, or ErrNotFound. Unknown codes are
// not cached (a link created a moment later must work at once); Redis
// answers a miss in one round trip.
//
// A link deleted while a miss read it (Invalidate called meanwhile) is not
// left in the cache by that miss: it was read before the delete, and cached
// after the invalidation it would redirect for the cache's TTL. The miss
// caches the link, then drops it again if an invalidation came since it
// began; Invalidate counts before it drops, so either the miss sees the
// count change or the invalidation comes after the miss cached the link.
//
// An entry past its TTL (kept for stale-if-error) is a miss: the store is
// asked again. Its answer replaces the entry, or "not found" drops it; a
// failed lookup returns the stale link instead of the error, unless the
// entry went meanwhile (an invalidation came while the lookup ran: the
// link may be the deleted one; or its stale bound passed).
//
// Once a lookup has failed, the store is taken for failing until a lookup
// is answered: an entry past its TTL then answers from its stale link at
// once, without waiting for a lookup that would most likely fail after the
// timeout too, and starts one lookup of its code in the background unless
// one runs already (revalidate). The first answer the store gives (to that
// lookup, or to a miss's) ends the failing state, and entries past their
// TTL are looked up again before they answer.
func (r *Resolver) Resolve(ctx context.Context, code string) (link.Link, error) {
	c, ok := r.cache.GetIfPresent(code)
	if ok && (r.stale == 0 || c.freshUntil > r.now.Load()) {
		r.m.CacheHits.Inc()
		return c.Link, nil
	}
	r.m.CacheMisses.Inc()
	if ok && r.failing.Load() {
		r.revalidate(code)
		r.m.CacheStaleServed.Inc()
		return c.Link, nil
	}
	gen := r.invalidations.Load()
	l, err := r.get(ctx, code)
	r.answered(ctx, err)
	if errors.Is(err, linkstore.ErrNotFound) {
		if ok {
			r.cache.Invalidate(code) // deleted: its stale entry must not serve later
		}
		return link.Link{}, fmt.Errorf("resolve %q: %w", code, ErrNotFound)
	}
	if err != nil {
		if ok && r.invalidations.Load() == gen {
			if _, still := r.cache.GetIfPresent(code); still {
				r.m.CacheStaleServed.Inc()
				return c.Link, nil
			}
		}
		return link.Link{}, fmt.Errorf("resolve %q: %w", code, err)
	}
	r.cache.Set(code, cached{Link: l, freshUntil: monoNow() + int64(r.ttl)})
	if r.invalidations.Load() != gen {
		r.cache.Invalidate(code)
	}
	return l, nil
}

// answered records how the store answered a lookup: failing (an error or
// the timeout, while the caller still waited) or answering (the link, or
// "not found").
func (r *Resolver) answered(ctx context.Context, err error) {
	switch {
	case err == nil || errors.Is(err, linkstore.ErrNotFound):
		if r.failing.Load() {
			r.failing.Store(false)
		}
	case ctx.Err() == nil && r.stale > 0:
		r.failing.Store(true)
	}
}

// revalidate looks code up in the background, unless a lookup of this kind
// runs already (one at a time, whatever the code), while requests answer
// from stale entries: an answer refreshes the entry (or drops it: not
// found, or invalidated while the lookup ran) and ends the failing state;
// a failure keeps it.
func (r *Resolver) revalidate(code string) {
	if !r.revalidating.CompareAndSwap(false, true) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		r.revalidating.Store(false)
		return
	}
	r.inflight.Add(1)
	go func() {
		defer r.inflight.Done()
		defer r.revalidating.Store(false)
		ctx := r.bg
		if r.timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, r.timeout)
			defer cancel()
		}
		gen := r.invalidations.Load()
		l, err := r.getUntilDone(ctx, code)
		r.answered(r.bg, err) // the lookup timeout is a failure of the store
		switch {
		case r.bg.Err() != nil:
			// Closed while the lookup ran: it tells nothing of the store.
		case errors.Is(err, linkstore.ErrNotFound):
			r.m.CacheRevalidated.Inc()
			r.cache.Invalidate(code)
		case err != nil:
			r.m.CacheRevalidationFailed.Inc()
		default:
			r.m.CacheRevalidated.Inc()
			r.cache.Set(code, cached{Link: l, freshUntil: monoNow() + int64(r.ttl)})
			if r.invalidations.Load() != gen {
				r.cache.Invalidate(code)
			}
		}
	}()
}

// get reads a link from the store within the timeout. The Redis client
// bounds its reads by its own read timeout, not by ctx, so the read runs
// on its own goroutine and is abandoned at the deadline (it ends by the
// client's read timeout).
func (r *Resolver) get(ctx context.Context, code string) (link.Link, error) {
	if r.timeout <= 0 {
		return r.store.Get(ctx, code)
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	return r.getUntilDone(ctx, code)
}

// getUntilDone reads a link from the store until ctx is done, then
// abandons the read (as get does at its deadline).
func (r *Resolver) getUntilDone(ctx context.Context, code string) (link.Link, error) {
	type result struct {
		l   link.Link
		err error
	}
	ch := make(chan result, 1)
	go func() {
		l, err := r.store.Get(ctx, code)
		ch <- result{l, err}
	}()
	select {
	case res := <-ch:
		return res.l, res.err
	case <-ctx.Done():
		if errors.Is(ctx.Err(), context.Canceled) {
			return link.Link{}, fmt.Errorf("look up link: %w", ctx.Err())
		}
		return link.Link{}, fmt.Errorf("look up link: no answer within %s: %w", r.timeout, linkstore.ErrUnavailable)
	}
}

// Invalidate drops code from the cache, also when a cache miss reading it
// from the store at the moment would cache it later (Resolve).
func (r *Resolver) Invalidate(code string) {
	r.invalidations.Add(1)
	if _, ok := r.cache.Invalidate(code); ok {
		r.m.CacheInvalidations.Inc()
	}
}

// WatchLinks follows LINKS from now on with an ordered consumer and drops
// every deleted code from the cache, until ctx ends. It retries
// while the stream or NATS is not there; the cache TTL covers the gap.
func WatchLinks(ctx context.Context, js jetstream.JetStream, r *Resolver, log *slog.Logger) {
	for ctx.Err() == nil {
		err := watchLinks(ctx, js, r, log)
		if ctx.Err() != nil {
			return
		}
		log.Debug("watch LINKS; retrying", "err", err)
		t := time.NewTimer(250 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func watchLinks(ctx context.Context, js jetstream.JetStream, r *Resolver, log *slog.Logger) error {
	cons, err := js.OrderedConsumer(ctx, events.LinksStream, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverNewPolicy,
	})
	if err != nil {
		return fmt.Errorf("ordered consumer on %s: %w", events.LinksStream, err)
	}
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		ev, err := events.DecodeLinkEvent(msg.Data())
		if err != nil {
			log.Warn("undecodable LINKS event ignored", "subject", msg.Subject(), "err", err)
			return
		}
		// Only a deletion can make a cached link wrong: codes are never
		// reused (deleted links stay as tombstones) and misses are not
		// cached, so link.created needs nothing.
		if ev.Kind == events.LinkDeleted {
			r.Invalidate(ev.Code)
		}
	}, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		log.Debug("consume LINKS", "err", err)
	}))
	if err != nil {
		return fmt.Errorf("consume %s: %w", events.LinksStream, err)
	}
	log.Info("following LINKS for cache invalidation")
	r.m.Following.Set(1)
	defer r.m.Following.Set(0)
	<-ctx.Done()
	cc.Stop()
	return nil
}
