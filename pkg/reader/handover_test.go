package reader_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
)

// A member that gives its partition up finishes its batch first, however
// long its handler takes: the next owner must not start on the partition
// meanwhile. Here the first owner leaves while its handler holds a batch
// for three lease TTLs (well past the server's pinned TTL, which is the
// lease TTL, and within DrainTimeout); the next owner's handler must not
// run while it does.
func TestTheNextOwnerWaitsForASlowHandlerOfTheOneThatLeft(t *testing.T) {
	t.Parallel()
	n, js := setup(t, 1)
	const ttl = time.Second
	var mu sync.Mutex
	inHandler := map[string]bool{}
	var overlaps []string
	handled := map[string]int{}
	held := make(chan struct{})
	var once sync.Once
	h := func(member string) reader.Handler {
		return func(ctx context.Context, _ int, b []reader.Event) error {
			mu.Lock()
			for other, in := range inHandler {
				if in && other != member {
					overlaps = append(overlaps, member+" while "+other+" handled")
				}
			}
			inHandler[member] = true
			mu.Unlock()
			if member == "first" {
				once.Do(func() {
					close(held)
					t := time.NewTimer(3 * ttl)
					defer t.Stop()
					select {
					case <-t.C:
					case <-ctx.Done():
					}
				})
			}
			mu.Lock()
			inHandler[member] = false
			handled[member] += len(b)
			mu.Unlock()
			return nil
		}
	}
	first := startMember(t, n, reader.Config{Group: "g", Member: "first", LeaseTTL: ttl, BatchSize: 5}, h("first"))
	ids := publish(t, js, 1, 20, 0)
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("the first member's handler was never called")
	}
	startMember(t, n, reader.Config{Group: "g", Member: "next", LeaseTTL: ttl, BatchSize: 5}, h("next"))
	testenv.WaitFor(t, 30*time.Second, "the next member has joined", func() bool {
		ls, err := reader.Members(t.Context(), js, "g")
		return err == nil && len(ls) == 2
	})
	first.stop(t)
	testenv.WaitFor(t, 30*time.Second, "every event handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return handled["first"]+handled["next"] >= len(ids)
	})
	mu.Lock()
	defer mu.Unlock()
	if len(overlaps) > 0 {
		t.Errorf("two members handled the partition at once: %v", overlaps)
	}
}
