package testenv

import (
	"context"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
)

// onCluster is set while RunOnRedisCluster runs a package's tests again on
// its shared Redis Cluster.
var onCluster atomic.Bool

// RedisClient returns the Redis a test runs on: a database of its own on the
// shared redis-server, or, while RunOnRedisCluster runs the test, a client of
// the shared Redis Cluster (flushed first).
func (s *Servers) RedisClient(tb testing.TB) redis.UniversalClient {
	tb.Helper()
	if onCluster.Load() {
		return s.RedisCluster.Client(tb)
	}
	rdb, _ := s.Redis.NewDB(tb)
	return rdb
}

// OnRedisCluster reports whether the test is running on the Redis Cluster.
func OnRedisCluster() bool { return onCluster.Load() }

// Parallel is t.Parallel, except on the Redis Cluster, where a package's
// tests share one keyspace and run one at a time.
func Parallel(t *testing.T) {
	t.Helper()
	if !onCluster.Load() {
		t.Parallel()
	}
}

// RunOnRedisCluster runs tests again, one at a time, on the package's shared
// Redis Cluster (Main with WithRedisCluster), so every key layout, MULTI and
// script of a store is checked against cluster slots (CROSSSLOT) with the
// same assertions. The tests take their client from Servers.Redis and call
// Parallel, not t.Parallel. Call it from a test that is not parallel.
func (s *Servers) RunOnRedisCluster(t *testing.T, tests ...func(*testing.T)) {
	t.Helper()
	if s.RedisCluster == nil {
		t.Fatal("testenv: RunOnRedisCluster needs Main(..., WithRedisCluster())")
	}
	onCluster.Store(true)
	defer onCluster.Store(false)
	for _, f := range tests {
		name := runtime.FuncForPC(reflect.ValueOf(f).Pointer()).Name()
		name = name[strings.LastIndex(name, ".")+1:]
		t.Run(name, f)
	}
}

// AnotherClient opens a second client, with its own connections, on the
// Redis rdb talks to (a server's database or a cluster), and closes it when
// the test ends: a second process, or one to kill.
func AnotherClient(tb testing.TB, rdb redis.UniversalClient) redis.UniversalClient {
	tb.Helper()
	var c redis.UniversalClient
	switch r := rdb.(type) {
	case *redis.Client:
		c = redis.NewClient(r.Options())
	case *redis.ClusterClient:
		c = redis.NewClusterClient(r.Options())
	default:
		tb.Fatalf("testenv: AnotherClient of a %T", rdb)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Keys lists the keys matching pattern on a server's database or on every
// master of a cluster (KEYS on a cluster client asks one node only).
func Keys(tb testing.TB, rdb redis.UniversalClient, pattern string) []string {
	tb.Helper()
	var (
		mu  sync.Mutex
		out []string
	)
	one := func(ctx context.Context, c *redis.Client) error {
		keys, err := c.Keys(ctx, pattern).Result()
		mu.Lock()
		out = append(out, keys...)
		mu.Unlock()
		return err
	}
	var err error
	switch r := rdb.(type) {
	case *redis.ClusterClient:
		err = r.ForEachMaster(tb.Context(), one)
	case *redis.Client:
		err = one(tb.Context(), r)
	default:
		tb.Fatalf("testenv: Keys on a %T", rdb)
	}
	if err != nil {
		tb.Fatalf("testenv: keys %s: %v", pattern, err)
	}
	return out
}
