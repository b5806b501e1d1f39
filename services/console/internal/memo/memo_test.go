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
