package webhookstate_test

import (
	"os"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/console/internal/webhookstate"
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

// TestSnapshotReadsTheDocumentedLayout writes what the webhooks service
// writes (its redisstore package documents the keys) and reads it back.
func TestSnapshotReadsTheDocumentedLayout(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	ctx := t.Context()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	put := func(id, cfg string, fields ...any) {
		rdb.SAdd(ctx, "snip:wh:endpoints", id)
		rdb.HSet(ctx, "snip:wh:{"+id+"}:ep", append([]any{"cfg", cfg}, fields...)...)
	}
	put("ep_ok", `{"id":"ep_ok","owner":"acme","url":"https://hooks.acme.example/secret-path"}`)
	put("ep_dead", `{"id":"ep_dead","owner":"bob","url":"https://bob.example/h","disabled_at":"2026-12-01T11:00:00Z","disabled_reason":"failing since 2026-11-28: HTTP 500"}`,
		"failing_since", now.Add(-72*time.Hour).UnixMilli(), "last_error", "HTTP 500")
	put("ep_paused", `{"id":"ep_paused","owner":"acme","url":"https://p.example/h","paused":true}`)
	rdb.XAdd(ctx, &redis.XAddArgs{Stream: "snip:wh:{ep_dead}:q", Values: []any{"id", "e1", "t", "click", "ts", now.Add(-2 * time.Hour).UnixNano(), "d", "{}"}})
	rdb.XAdd(ctx, &redis.XAddArgs{Stream: "snip:wh:{ep_dead}:q", Values: []any{"id", "e2", "t", "click", "ts", now.Add(-time.Hour).UnixNano(), "d", "{}"}})
	rdb.SAdd(ctx, "snip:wh:endpoints", "ep_gone") // deleted meanwhile: skipped

	s, err := webhookstate.New(rdb).Snapshot(ctx, now)
	if err != nil {
		t.Fatal(err)
	}
	want := webhookstate.Snapshot{
		Total: 3, Disabled: 1, Failing: 1, Backlog: 2,
		Endpoints: []webhookstate.Endpoint{
			{ID: "ep_dead", Owner: "bob", Host: "bob.example", Status: "disabled", DisabledReason: "failing since 2026-11-28: HTTP 500",
				Backlog: 2, OldestAge: 2 * time.Hour, FailingFor: 72 * time.Hour, OldestAgeS: 7200, FailingForS: 72 * 3600, LastError: "HTTP 500"},
			{ID: "ep_ok", Owner: "acme", Host: "hooks.acme.example", Status: "active"},
			{ID: "ep_paused", Owner: "acme", Host: "p.example", Status: "paused"},
		},
	}
	if diff := cmp.Diff(want, s); diff != "" {
		t.Errorf("snapshot (-want +got):\n%s", diff)
	}
}
