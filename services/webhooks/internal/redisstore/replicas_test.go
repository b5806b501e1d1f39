package redisstore_test

import (
	"errors"
	"sync"
	"testing"

	"github.com/snipdev/snip/pkg/redisconn"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/webhooks/internal/endpoint"
	"github.com/snipdev/snip/services/webhooks/internal/redisstore"
)

// With the replica wait on, Enqueue and Put return once the replicas of
// every master they wrote to have the writes: on Redis Cluster the queues of
// three endpoints and an endpoint's configuration are on the replicas the
// moment the calls return, and no wait falls short; on a single Redis each
// call's wait falls short, is reported, and the writes stand.
func TestWritesWaitForReplicas(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	ctx := t.Context()
	timeout, cluster := testenv.ReplicaWaitTimeout(rdb)
	s := redisstore.New(rdb, 1000)
	// Events are queued only for endpoints that exist.
	for _, id := range []string{"ep1", "ep2", "ep3"} {
		if err := s.Put(ctx, endpoint.Endpoint{ID: id, Owner: "acme", URL: "https://example.com/" + id}); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	var shorts []string
	s.WaitForReplicas(1, timeout, func(op string, err error) {
		mu.Lock()
		defer mu.Unlock()
		if !errors.Is(err, redisconn.ErrNotReplicated) {
			t.Errorf("%s: %v, want ErrNotReplicated", op, err)
		}
		shorts = append(shorts, op)
	})
	byEndpoint := map[string][]redisstore.Event{"ep1": {ev(1, "a")}, "ep2": {ev(1, "b")}, "ep3": {ev(1, "c")}}
	if _, _, err := s.Enqueue(ctx, redisstore.DedupSeq, 0, byEndpoint); err != nil {
		t.Fatal(err)
	}
	e := endpoint.Endpoint{ID: "ep1", Owner: "acme", URL: "https://example.com/hook"}
	if err := s.Put(ctx, e); err != nil {
		t.Fatal(err)
	}
	if cluster {
		for id := range byEndpoint {
			q := "snip:wh:{" + id + "}:q"
			if n := servers.RedisCluster.ReplicaClient(t, q).Exists(ctx, q).Val(); n != 1 {
				t.Errorf("the replica does not have %s's queue when Enqueue returns", id)
			}
		}
		for _, key := range []string{"snip:wh:{ep1}:ep", "snip:wh:owner:acme", "snip:wh:endpoints"} {
			if n := servers.RedisCluster.ReplicaClient(t, key).Exists(ctx, key).Val(); n != 1 {
				t.Errorf("the replica does not have %s when Put returns", key)
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{"enqueue", "put"}
	if cluster {
		want = nil
	}
	if len(shorts) != len(want) || (len(want) > 0 && (shorts[0] != want[0] || shorts[1] != want[1])) {
		t.Errorf("short waits = %v, want %v", shorts, want)
	}
}
