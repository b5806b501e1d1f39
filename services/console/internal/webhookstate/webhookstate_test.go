package webhookstate_test

import (
	"encoding/json"
	"errors"
	"net/url"
	"os"
	"strings"
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
		TestErrorsShowTheEndpointsHostOnly,
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

// TestErrorsShowTheEndpointsHostOnly: the webhooks service stores its HTTP
// client's error as the last error (and in a disabled endpoint's reason),
// and that error quotes the endpoint's whole URL, whose path and query may
// carry the owner's token. The panel shows the host, as it does for the
// endpoint itself.
func TestErrorsShowTheEndpointsHostOnly(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	ctx := t.Context()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	const secretURL = "https://hooks.acme.example/t/tok_SECRET123?sig=SIG456"
	lastErr := (&url.Error{Op: "Post", URL: secretURL, Err: errors.New("dial tcp 203.0.113.7:443: connect: connection refused")}).Error()
	cfg, _ := json.Marshal(map[string]any{"id": "ep_1", "owner": "acme", "url": secretURL,
		"disabled_at": "2026-12-01T11:00:00Z", "disabled_reason": "failing since 2026-11-28T00:00:00Z: " + lastErr})
	rdb.SAdd(ctx, "snip:wh:endpoints", "ep_1")
	rdb.HSet(ctx, "snip:wh:{ep_1}:ep", "cfg", cfg, "failing_since", now.Add(-72*time.Hour).UnixMilli(), "last_error", lastErr)

	s, err := webhookstate.New(rdb).Snapshot(ctx, now)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Endpoints) != 1 {
		t.Fatalf("endpoints %+v", s.Endpoints)
	}
	e := s.Endpoints[0]
	const wantErr = `Post "https://hooks.acme.example/…": dial tcp 203.0.113.7:443: connect: connection refused`
	if e.LastError != wantErr || e.DisabledReason != "failing since 2026-11-28T00:00:00Z: "+wantErr {
		t.Errorf("last error %q, disabled reason %q; want both with %q", e.LastError, e.DisabledReason, wantErr)
	}
	b, _ := json.Marshal(s)
	for _, secret := range []string{"tok_SECRET123", "SIG456", "/t/"} {
		if strings.Contains(string(b), secret) {
			t.Errorf("the panel shows %q of the endpoint's URL: %s", secret, b)
		}
	}
}

func TestHostsOnly(t *testing.T) {
	for in, want := range map[string]string{
		"HTTP 500":                            "HTTP 500",
		`Post "https://h.example": EOF`:       `Post "https://h.example": EOF`,
		`Post "https://h.example/": EOF`:      `Post "https://h.example": EOF`,
		`Post "https://h.example:8443/a?b=c"`: `Post "https://h.example:8443/…"`,
		`Post "https://u:***@h.example/p": x`: `Post "https://h.example/…": x`,
		"timed out: Post \"https://h.example/a/b\": context deadline exceeded; then https://g.example/x": "timed out: Post \"https://h.example/…\": context deadline exceeded; then https://g.example/…",
	} {
		if got := webhookstate.HostsOnly(in); got != want {
			t.Errorf("HostsOnly(%q) = %q, want %q", in, got, want)
		}
	}
}
