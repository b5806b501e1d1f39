package outboxstate_test

import (
	"errors"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/console/internal/outboxstate"
)

var servers *testenv.Servers

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, &servers, testenv.WithRedis(), testenv.WithRedisCluster()))
}

// TestOnRedisCluster runs the store's tests on a Redis Cluster.
func TestOnRedisCluster(t *testing.T) {
	servers.RunOnRedisCluster(t,
		TestSnapshotReadsTheDocumentedLayout,
	)
}

func level(d time.Duration) string {
	if d >= time.Minute {
		return "alarm"
	}
	return "ok"
}

// The outbox as the redirect service lays it out (services/redirect README,
// "Redis keys"): two shards, clicks waiting in both (the oldest 90 s old),
// one link event, a parked entry, one shard leased, one live relay.
func TestSnapshotReadsTheDocumentedLayout(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	ctx := t.Context()
	r := outboxstate.New(rdb, level)
	if _, err := r.Snapshot(ctx); !errors.Is(err, outboxstate.ErrNoOutbox) {
		t.Fatalf("before the redirect started: err = %v, want ErrNoOutbox", err)
	}
	now := time.Now()
	id := func(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) + "-0" }
	add := func(key, entryID string) {
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: key, ID: entryID, Values: []any{"id", "x", "subject", "s", "data", "{}"}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	rdb.Set(ctx, "snip:outbox:shards", 2, 0)
	add("snip:{s0}:outbox:clicks", id(now.Add(-90*time.Second)))
	add("snip:{s0}:outbox:clicks", id(now.Add(-time.Second)))
	add("snip:{s1}:outbox:clicks", id(now.Add(-2*time.Second)))
	add("snip:{s1}:outbox:links", "*")
	add("snip:{s1}:outbox:dead", "*")
	rdb.Set(ctx, "snip:{s0}:outbox:lease", "token", time.Minute)
	rdb.ZAdd(ctx, "snip:outbox:relays", redis.Z{Score: float64(now.Add(time.Minute).UnixMilli()), Member: "live"},
		redis.Z{Score: float64(now.Add(-time.Minute).UnixMilli()), Member: "dead"})

	got, err := r.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := outboxstate.Snapshot{
		Shards: 2, Dead: 1, Relays: 1, Unleased: 1,
		Lanes: []outboxstate.Lane{
			{Name: "clicks", Entries: 3, OldestAge: 90, Level: "alarm"},
			{Name: "links", Entries: 1, Level: "ok"},
			{Name: "jobs", Entries: 0, Level: "ok"},
		},
	}
	if d := cmp.Diff(want, got, cmpopts.EquateApprox(0, 5)); d != "" {
		t.Errorf("snapshot (-want +got):\n%s", d)
	}
}
