// Package memo remembers a computed value for a short time, so that many
// browsers polling the console's panels cost JetStream, Redis and ClickHouse
// one computation per interval, not one per browser.
package memo

import (
	"context"
	"sync"
	"time"
)

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
}

// New returns a Value that computes with fn and keeps the result for ttl.
func New[T any](ttl time.Duration, fn func(ctx context.Context) (T, error)) *Value[T] {
	return &Value[T]{ttl: ttl, fn: fn}
}

// Get returns the remembered result if it is younger than ttl, else
// computes it. Errors are remembered too: a dependency that is down is asked
// once per ttl, not once per request.
func (v *Value[T]) Get(ctx context.Context) (T, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.have && time.Since(v.at) < v.ttl {
		return v.val, v.err
	}
	v.val, v.err = v.fn(ctx)
	v.at, v.have = time.Now(), true
	return v.val, v.err
}

// Forget drops the remembered result, so the next Get computes (after an
// action changed what it shows).
func (v *Value[T]) Forget() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.have = false
}
