package redirect_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

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
	res := redirect.NewResolver(slow, 10, time.Hour, time.Minute, redirect.NewMetrics(prometheus.NewRegistry()))
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
