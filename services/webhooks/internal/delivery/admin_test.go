package delivery_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/services/webhooks/internal/delivery"
	"github.com/snipdev/snip/services/webhooks/internal/endpoint"
	"github.com/snipdev/snip/services/webhooks/internal/redisstore"
)

// beforePipeline is a go-redis hook that calls before ahead of each
// pipeline the client sends: a test puts another writer's change between
// a caller's read and its write, on the real server.
type beforePipeline struct {
	before func(ctx context.Context, cmds []redis.Cmder)
}

func (h beforePipeline) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h beforePipeline) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h beforePipeline) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.before(ctx, cmds)
		return next(ctx, cmds)
	}
}

var _ redis.Hook = beforePipeline{}

// TestATestEventForAnEndpointDeletedMeanwhileIsNotFound: a test event
// asked for while the endpoint is being deleted (the delete lands between
// SendTest's read of the endpoint and its queue write) is queued nowhere,
// since the store writes no queue for a deleted endpoint. It was answered
// with an event ID all the same, for an event that would never come; it
// is endpoint.ErrNotFound (a 404), as for an endpoint that was never there.
func TestATestEventForAnEndpointDeletedMeanwhileIsNotFound(t *testing.T) {
	t.Parallel()
	rdb := servers.RedisClient(t)
	ctx := t.Context()
	store := redisstore.New(rdb, 1000)
	m, err := delivery.NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	admin := &delivery.Admin{Store: store, Intake: delivery.NewIntake(store, m)}
	ep := endpoint.Endpoint{ID: "ep_test_event", Owner: "acme", URL: "https://example.com/hook", Types: []string{endpoint.TypeClick}}
	if err := store.Put(ctx, ep); err != nil {
		t.Fatal(err)
	}
	queue := "snip:wh:{" + ep.ID + "}:q"
	var armed atomic.Bool
	rdb.AddHook(beforePipeline{before: func(ctx context.Context, cmds []redis.Cmder) {
		writesQueue := slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return slices.Contains(c.Args(), any(queue)) })
		// The delete's own pipeline passes through: armed is false by then.
		if writesQueue && armed.CompareAndSwap(true, false) {
			if err := store.Delete(ctx, ep); err != nil {
				t.Errorf("delete between the read and the queue write: %v", err)
			}
		}
	}})

	id, err := admin.SendTest(ctx, "acme", ep.ID)
	if err != nil || id == "" {
		t.Fatalf("test event for a live endpoint: %q, %v; want its ID", id, err)
	}
	if n, _, err := store.Backlog(ctx, ep.ID); err != nil || n != 1 {
		t.Fatalf("backlog after a test event: %d, %v; want 1", n, err)
	}

	armed.Store(true)
	id, err = admin.SendTest(ctx, "acme", ep.ID)
	if armed.Load() {
		t.Fatal("the endpoint was not deleted before the queue write; the test proves nothing")
	}
	if !errors.Is(err, endpoint.ErrNotFound) || id != "" {
		t.Errorf("test event for an endpoint deleted before its queue write: %q, %v; want no ID and not found", id, err)
	}
	if n, err := rdb.Exists(ctx, queue).Result(); err != nil || n != 0 {
		t.Errorf("queue of the deleted endpoint exists: %d, %v; want none", n, err)
	}
}

// failingRead is a go-redis hook that fails, while armed, the pipeline
// reading endpoint key's hash whole (Store.Get's): Redis failing that one
// read.
type failingRead struct {
	key   string
	armed atomic.Bool
}

var errReadFailed = errors.New("redis: read failed")

func (h *failingRead) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *failingRead) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *failingRead) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.armed.Load() && slices.ContainsFunc(cmds, func(c redis.Cmder) bool {
			return c.Name() == "hgetall" && slices.Contains(c.Args(), any(h.key))
		}) {
			for _, c := range cmds {
				c.SetErr(errReadFailed)
			}
			return errReadFailed
		}
		return next(ctx, cmds)
	}
}

// TestAListWhoseReadFailsIsAnError: the list skips an endpoint deleted
// between the listing and its read; it skipped one whose read failed
// too, and answered the owner's list without it, as if it were deleted.
// A failed read fails the list (a 500 the owner retries).
func TestAListWhoseReadFailsIsAnError(t *testing.T) {
	t.Parallel()
	rdb := servers.RedisClient(t)
	ctx := t.Context()
	store := redisstore.New(rdb, 1000)
	admin := &delivery.Admin{Store: store}
	for _, id := range []string{"ep_list1", "ep_list2"} {
		if err := store.Put(ctx, endpoint.Endpoint{ID: id, Owner: "acme", URL: "https://example.com/hook", Types: []string{endpoint.TypeClick}}); err != nil {
			t.Fatal(err)
		}
	}
	hook := &failingRead{key: "snip:wh:{ep_list2}:ep"}
	rdb.AddHook(hook)
	if l, err := admin.List(ctx, "acme"); err != nil || len(l) != 2 {
		t.Fatalf("list: %d endpoints, %v; want 2", len(l), err)
	}
	hook.armed.Store(true)
	l, err := admin.List(ctx, "acme")
	if !errors.Is(err, errReadFailed) {
		ids := make([]string, len(l))
		for i, s := range l {
			ids[i] = s.ID
		}
		t.Errorf("list with ep_list2's read failing: %q, %v; want the read's error", ids, err)
	}
}
