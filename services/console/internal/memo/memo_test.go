package memo_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/console/internal/memo"
)

func TestValueComputesOncePerTTL(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	v := memo.New(time.Hour, func(context.Context) (int32, error) { return calls.Add(1), nil })
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			if got, err := v.Get(t.Context()); got != 1 || err != nil {
				t.Errorf("Get = %d, %v; want 1, nil", got, err)
			}
		})
	}
	wg.Wait()
	v.Forget()
	if got, _ := v.Get(t.Context()); got != 2 {
		t.Errorf("Get after Forget = %d, want a new computation (2)", got)
	}
}

func TestErrorsAreRememberedUntilTheTTLPasses(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	down := errors.New("down")
	// Long enough that three calls in a row fit in it on a loaded machine
	// (50 ms did not always), short enough to wait out below.
	v := memo.New(2*time.Second, func(context.Context) (int, error) { calls.Add(1); return 0, down })
	for range 3 {
		if _, err := v.Get(t.Context()); !errors.Is(err, down) {
			t.Fatalf("err = %v", err)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("%d computations within the TTL, want 1", n)
	}
	testenv.WaitFor(t, 10*time.Second, "a new computation after the TTL", func() bool {
		_, _ = v.Get(t.Context())
		return calls.Load() >= 2
	})
}

// A caller that goes away (a closed tab) while the value is computed does
// not cancel the computation: the next caller gets the real answer, not the
// first caller's cancellation.
func TestACancelledCallerDoesNotSpoilTheValueForOthers(t *testing.T) {
	t.Parallel()
	started, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	v := memo.New(time.Hour, func(ctx context.Context) (int, error) {
		if calls.Add(1) == 1 {
			close(started)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-release:
			return 42, nil
		}
	})
	actx, cancelA := context.WithCancel(t.Context())
	aDone := make(chan error, 1)
	go func() {
		_, err := v.Get(actx)
		aDone <- err
	}()
	<-started
	cancelA()
	if err := <-aDone; !errors.Is(err, context.Canceled) {
		t.Errorf("the cancelled caller got %v, want context.Canceled", err)
	}
	close(release)
	if got, err := v.Get(t.Context()); got != 42 || err != nil {
		t.Errorf("the next caller got %d, %v; want 42, nil", got, err)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("%d computations, want 1", n)
	}
}

// Forget during a computation makes the next caller compute afresh: what
// started before an action may not show its effect.
func TestForgetDuringAComputationStartsANewOne(t *testing.T) {
	t.Parallel()
	started, release := make(chan struct{}, 2), make(chan struct{})
	var calls atomic.Int32
	v := memo.New(time.Hour, func(ctx context.Context) (int32, error) {
		n := calls.Add(1)
		started <- struct{}{}
		if n == 1 {
			<-release
		}
		return n, nil
	})
	first := make(chan int32, 1)
	go func() {
		n, _ := v.Get(t.Context())
		first <- n
	}()
	<-started
	second := make(chan int32, 1)
	go func() {
		v.Forget()
		n, _ := v.Get(t.Context())
		second <- n
	}()
	select {
	case got := <-second:
		if got != 2 {
			t.Errorf("Get after Forget = %d, want a new computation (2)", got)
		}
	case <-time.After(10 * time.Second):
		t.Error("Forget and Get waited for the computation that started before")
	}
	close(release)
	if got := <-first; got != 1 {
		t.Errorf("the first caller got %d, want its own computation (1)", got)
	}
	if got, _ := v.Get(t.Context()); got != 2 {
		t.Errorf("remembered %d, want the computation after Forget (2)", got)
	}
}
