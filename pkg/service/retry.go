package service

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Backoff is how Retry paces its attempts: the first wait is First, each
// next one twice the last up to Max, each spread by up to a fifth either
// way; every attempt may take at most Attempt. Zero fields take
// DefaultBackoff's.
type Backoff struct {
	First, Max time.Duration
	Attempt    time.Duration
}

// DefaultBackoff is what services wait for their servers with at start:
// 250ms, doubling to 5s, attempts of at most 10s.
var DefaultBackoff = Backoff{First: 250 * time.Millisecond, Max: 5 * time.Second, Attempt: 10 * time.Second}

// Permanent marks an error that no retry can cure (a configuration that
// contradicts what exists): Retry returns it at once.
func Permanent(err error) error { return backoff.Permanent(err) }

// Retry is DefaultBackoff.Retry.
func Retry(ctx context.Context, log *slog.Logger, what string, f func(ctx context.Context) error) error {
	return DefaultBackoff.Retry(ctx, log, what, f)
}

// Retry calls f until it returns nil, returns an error marked Permanent, or
// ctx ends, logging each failure as "<what>: retrying". It returns nil, the
// permanent error, or ctx's error with the last failure, each prefixed with
// what. Run takes an error that wraps ctx's own, once ctx has ended, for a
// clean stop, so a caller just returns what Retry returned. Called with
// the context Run gives setup, it also tells the service's /readyz, while
// it starts, what it waits for (what) and the last failure.
func (b Backoff) Retry(ctx context.Context, log *slog.Logger, what string, f func(ctx context.Context) error) error {
	d := DefaultBackoff
	if b.First > 0 {
		d.First = b.First
	}
	if b.Max > 0 {
		d.Max = b.Max
	}
	if b.Attempt > 0 {
		d.Attempt = b.Attempt
	}
	eb := backoff.NewExponentialBackOff()
	eb.InitialInterval, eb.MaxInterval, eb.Multiplier, eb.RandomizationFactor = d.First, d.Max, 2, 0.2
	st, _ := ctx.Value(startupKey{}).(*startup)
	if st != nil {
		defer st.enter(what)()
	}
	var last error
	_, err := backoff.Retry(ctx, func() (struct{}, error) {
		actx, cancel := context.WithTimeout(ctx, d.Attempt)
		defer cancel()
		last = f(actx)
		if st != nil && last != nil {
			st.failed(what, last)
		}
		return struct{}{}, last
	}, backoff.WithBackOff(eb), backoff.WithMaxElapsedTime(0), backoff.WithNotify(func(err error, wait time.Duration) {
		log.Warn(what+": retrying", "err", err, "in", wait.Round(time.Millisecond))
	}))
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil && last != nil && err != last:
		return fmt.Errorf("%s: %w (last error: %v)", what, err, last)
	}
	return fmt.Errorf("%s: %w", what, err)
}
