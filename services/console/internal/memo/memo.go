// Package memo remembers a computed value for a short time, so that many
// browsers polling the console's panels cost JetStream, Redis and ClickHouse
// one computation per interval, not one per browser.
package memo

import (
	"context"
	"sync"
	"time"
)

// Limit bounds one computation. A computation is shared by every caller
// that asks while it runs, so it runs apart from the request that started
// it: a request that ends (a closed tab) stops waiting for it, but does not
// cancel it, and its result is what the next caller gets. Otherwise the
// value would remember that request's cancellation and serve it to every
// other caller until the TTL passed.
const Limit = 20 * time.Second

// Value holds the result of fn for ttl. Concurrent callers wait for one
// computation instead of starting their own. It is safe for concurrent use.
type Value[T any] struct {
	ttl time.Duration
	fn  func(ctx context.Context) (T, error)

	mu   sync.Mutex
	at   time.Time
	val  T
	err  error
	have bool
	// running is the computation in progress, if any.
	running *call[T]
}

// call is one computation; done closes when val and err are set.
type call[T any] struct {
	done chan struct{}
	val  T
	err  error
}

// New returns a Value that computes with fn and keeps the result for ttl.
func New[T any](ttl time.Duration, fn func(ctx context.Context) (T, error)) *Value[T] {
	return &Value[T]{ttl: ttl, fn: fn}
}

// Get returns the remembered result if it is younger than ttl, else
// computes it (or waits for the computation another caller started).
// Errors are remembered too: a dependency that is down is asked once per
// ttl, not once per request. The computation gets ctx's values but not its
// cancellation, and at most Limit; if ctx ends first, Get returns ctx's
// error and the computation goes on for the next caller.
func (v *Value[T]) Get(ctx context.Context) (T, error) {
	v.mu.Lock()
	if v.have && time.Since(v.at) < v.ttl {
		defer v.mu.Unlock()
		return v.val, v.err
	}
	c := v.running
	if c == nil {
		c = &call[T]{done: make(chan struct{})}
		v.running = c
		go v.compute(context.WithoutCancel(ctx), c)
	}
	v.mu.Unlock()
	select {
	case <-c.done:
		return c.val, c.err
	case <-ctx.Done():
		var zero T
		return zero, ctx.Err()
	}
}

func (v *Value[T]) compute(ctx context.Context, c *call[T]) {
	ctx, cancel := context.WithTimeout(ctx, Limit)
	defer cancel()
	c.val, c.err = v.fn(ctx)
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.running == c { // not forgotten meanwhile
		v.val, v.err = c.val, c.err
		v.at, v.have = time.Now(), true
		v.running = nil
	}
	close(c.done)
}

// Forget drops the remembered result, so the next Get computes (after an
// action changed what it shows) rather than using a computation that
// started before the action.
func (v *Value[T]) Forget() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.have = false
	v.running = nil
}
