package service

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/testenv"
)

// lockedBuffer is a log destination safe for concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// records returns the JSON log records written so far.
func (l *lockedBuffer) records(t *testing.T) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for line := range strings.Lines(l.b.String()) {
		var r map[string]any
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, r)
	}
	return out
}

// A Redis that may evict keys is named in an error log with its policy; one
// that may not is logged as such and draws no error; one that refuses
// CONFIG GET is logged as unchecked.
func TestRedisThatMayEvictKeysIsLoggedAsAnError(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = admin.Close() })
	if err := admin.ACLSetUser(t.Context(), "noconfig", "on", ">pw", "~*", "+@all", "-config").Err(); err != nil {
		t.Fatal(err)
	}
	check := func(t *testing.T, rdb redis.UniversalClient) []map[string]any {
		t.Helper()
		var buf lockedBuffer
		done := make(chan struct{})
		go func() {
			checkEviction(t.Context(), slog.New(slog.NewJSONHandler(&buf, nil)), rdb, time.Second)
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("the check did not end within 30s with Redis up")
		}
		return buf.records(t)
	}
	levels := func(recs []map[string]any) (out []string) {
		for _, r := range recs {
			out = append(out, r["level"].(string)+" "+r["msg"].(string))
		}
		return out
	}

	for _, policy := range []string{"allkeys-lru", "volatile-ttl"} {
		if err := admin.ConfigSet(t.Context(), "maxmemory-policy", policy).Err(); err != nil {
			t.Fatal(err)
		}
		recs := check(t, admin)
		if len(recs) != 1 || recs[0]["level"] != "ERROR" || recs[0]["maxmemory_policy"] != policy || recs[0]["server"] != srv.Addr {
			t.Fatalf("policy %s: logged %v; want one ERROR naming the server and the policy", policy, recs)
		}
	}

	if err := admin.ConfigSet(t.Context(), "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if got := levels(check(t, admin)); len(got) != 1 || got[0] != "INFO redis evicts no keys" {
		t.Fatalf("noeviction: logged %q; want only INFO redis evicts no keys", got)
	}

	limited := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "noconfig", Password: "pw"})
	t.Cleanup(func() { _ = limited.Close() })
	recs := check(t, limited)
	if got := levels(recs); len(got) != 1 || !strings.HasPrefix(got[0], "WARN redis maxmemory-policy not checked") {
		t.Fatalf("CONFIG refused: logged %q; want one WARN that it was not checked", got)
	}
}

// The check waits for a Redis that is not up yet (had it given up, it
// would have logged nothing), and ends with its context if Redis never
// comes.
func TestEvictionCheckWaitsForRedisAndEndsWithItsContext(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	srv.Stop()

	run := func(ctx context.Context, buf *lockedBuffer) <-chan struct{} {
		done := make(chan struct{})
		go func() {
			checkEviction(ctx, slog.New(slog.NewJSONHandler(buf, nil)), rdb, 200*time.Millisecond)
			close(done)
		}()
		return done
	}

	ctx, cancel := context.WithCancel(t.Context())
	var stopped lockedBuffer
	done := run(ctx, &stopped)
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the check did not end within 10s of its context with Redis down")
	}
	if recs := stopped.records(t); len(recs) != 0 {
		t.Fatalf("logged %v with Redis down; want nothing", recs)
	}

	var buf lockedBuffer
	done = run(t.Context(), &buf)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the check did not end within 30s of Redis coming up")
	}
	if recs := buf.records(t); len(recs) != 1 || recs[0]["msg"] != "redis evicts no keys" {
		t.Fatalf("logged %v; want only that redis evicts no keys", recs)
	}
}
