package redirect

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	cache   *otter.Cache[string, link.Link]
	timeout time.Duration
	m       *Metrics
	// invalidations counts Invalidate calls. A cache miss that saw it
	// change while it read the store drops what it cached: the link it read
	// may be one the invalidation was for (deleted after the read).
	invalidations atomic.Uint64
}

// NewResolver returns a resolver whose cache holds at most size links, each
// for at most ttl. A lookup in the store (a cache miss) is bounded by
// timeout (0: by ctx alone), so a stopped Redis costs a visitor whose link
// is not cached that long, then a 503.
func NewResolver(store LinkGetter, size int, ttl, timeout time.Duration, m *Metrics) *Resolver {
	c := otter.Must(&otter.Options[string, link.Link]{
		MaximumSize:      size,
		ExpiryCalculator: otter.ExpiryWriting[string, link.Link](ttl),
	})
	return &Resolver{store: store, cache: c, timeout: timeout, m: m}
}

// Close stops the cache's maintenance goroutines.
func (r *Resolver) Close() { r.cache.StopAllGoroutines() }

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
func (r *Resolver) Resolve(ctx context.Context, code string) (link.Link, error) {
	if l, ok := r.cache.GetIfPresent(code); ok {
		r.m.CacheHits.Inc()
		return l, nil
	}
	r.m.CacheMisses.Inc()
	gen := r.invalidations.Load()
	l, err := r.get(ctx, code)
	if errors.Is(err, linkstore.ErrNotFound) {
		return link.Link{}, fmt.Errorf("resolve %q: %w", code, ErrNotFound)
	}
	if err != nil {
		return link.Link{}, fmt.Errorf("resolve %q: %w", code, err)
	}
	r.cache.Set(code, l)
	if r.invalidations.Load() != gen {
		r.cache.Invalidate(code)
	}
	return l, nil
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
