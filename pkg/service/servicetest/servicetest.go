// Package servicetest starts a service in-process for a test, the one way
// every service's tests do: run in a goroutine, wait until its HTTP server
// listens, stop it (as SIGTERM would) when the test ends. A test of real
// signals runs a command as a child process instead (StartProcess).
package servicetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// Running is a service started by Start.
type Running struct {
	// Addr is where its HTTP server listens (host:port).
	Addr string

	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

// StartTimeout and StopTimeout bound the wait for a service to listen and
// to stop.
const (
	StartTimeout = 60 * time.Second
	StopTimeout  = 2 * time.Minute
)

// Start calls run in a goroutine with a context and the hook to call with
// the HTTP address once the service listens (the service's Config.Ready,
// called once its routes are served; Config.Listening, called before
// setup, for a test of the start itself), and returns once it was called. It fails the test if run returns first or
// the address does not come within StartTimeout. When the test ends the
// service is stopped; an error it stops with fails the test, unless the
// test called Stop itself (and judged the error).
//
//	svc := servicetest.Start(t, func(ctx context.Context, ready func(string)) error {
//		cfg.Ready = ready
//		return run(ctx, log, cfg)
//	})
func Start(tb testing.TB, run func(ctx context.Context, ready func(addr string)) error) *Running {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &Running{cancel: cancel, done: make(chan error, 1)}
	addr := make(chan string, 1)
	go func() {
		r.done <- run(ctx, func(a string) {
			select {
			case addr <- a:
			default: // a restart of its server: the address is known
			}
		})
	}()
	select {
	case r.Addr = <-addr:
	case err := <-r.done:
		cancel()
		r.once.Do(func() { r.err = err })
		tb.Fatalf("servicetest: the service stopped at start: %v", err)
	case <-time.After(StartTimeout):
		cancel()
		tb.Fatalf("servicetest: the service did not listen within %s", StartTimeout)
	}
	tb.Cleanup(func() {
		stopped := false
		r.once.Do(func() { r.err, stopped = r.wait(), true })
		if stopped && r.err != nil {
			tb.Errorf("servicetest: the service stopped with: %v", r.err)
		}
	})
	return r
}

// URL is "http://" and Addr.
func (r *Running) URL() string { return "http://" + r.Addr }

// Stop stops the service as SIGTERM would (its context ends), waits for it
// within StopTimeout, and returns what run returned. Later calls return the
// same.
func (r *Running) Stop() error {
	r.once.Do(func() { r.err = r.wait() })
	return r.err
}

// ErrStopTimeout is Stop's error when run did not return within StopTimeout.
var ErrStopTimeout = errors.New("servicetest: the service did not stop in time")

// Cancel tells the service to stop, as SIGTERM would, without waiting
// (Stop waits).
func (r *Running) Cancel() { r.cancel() }

func (r *Running) wait() error {
	r.cancel()
	select {
	case err := <-r.done:
		return err
	case <-time.After(StopTimeout):
		return fmt.Errorf("%w (%s)", ErrStopTimeout, StopTimeout)
	}
}
