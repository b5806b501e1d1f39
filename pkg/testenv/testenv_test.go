package testenv_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/testenv"
)

var servers *testenv.Servers

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, &servers, testenv.WithRedis(), testenv.WithClickHouse()))
}

func TestRedisDatabasesAreIsolated(t *testing.T) {
	t.Parallel()
	a, _ := servers.Redis.NewDB(t)
	b, _ := servers.Redis.NewDB(t)
	if err := a.Set(t.Context(), "k", "a", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n := b.Exists(t.Context(), "k").Val(); n != 0 {
		t.Fatalf("key written in one test database is visible in another (exists=%d)", n)
	}
}

// A restored snapshot is the database as it was: keys written since are
// gone, keys changed since are back, and a key's time to live is kept.
func TestRedisSnapshotRestoresTheDatabase(t *testing.T) {
	t.Parallel()
	c, _ := servers.Redis.NewDB(t)
	ctx := t.Context()
	if err := c.Set(ctx, "plain", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.HSet(ctx, "hash", "f", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ctx, "expiring", "1", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	snap := testenv.SnapshotRedis(t, c)
	// Every change after the snapshot must have happened, or the restore
	// has nothing to undo and the checks below pass without it.
	for _, err := range []error{
		c.Set(ctx, "plain", "2", 0).Err(),
		c.HSet(ctx, "hash", "f", "2").Err(),
		c.Set(ctx, "new", "x", 0).Err(),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := c.Persist(ctx, "expiring").Result(); err != nil || !ok {
		t.Fatalf("PERSIST expiring = %v, %v; want true", ok, err)
	}
	snap.Restore(t, c)
	if got := c.Get(ctx, "plain").Val(); got != "1" {
		t.Errorf("plain = %q, want 1", got)
	}
	if got := c.HGet(ctx, "hash", "f").Val(); got != "1" {
		t.Errorf("hash f = %q, want 1", got)
	}
	if n := c.Exists(ctx, "new").Val(); n != 0 {
		t.Errorf("a key written after the snapshot survived the restore")
	}
	if ttl := c.TTL(ctx, "expiring").Val(); ttl <= 50*time.Minute || ttl > time.Hour {
		t.Errorf("expiring's TTL = %s, want about an hour", ttl)
	}
}

func TestRedisRestartKeepsData(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	c, _ := r.NewDB(t)
	if err := c.Set(t.Context(), "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	r.Stop()
	if err := c.Get(t.Context(), "k").Err(); err == nil {
		t.Fatal("GET succeeded while Redis was stopped")
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	if got := c.Get(t.Context(), "k").Val(); got != "v" {
		t.Fatalf("after restart GET k = %q, want %q", got, "v")
	}
}

func TestClickHouseDatabase(t *testing.T) {
	t.Parallel()
	conn, name := servers.ClickHouse.NewDB(t)
	var db string
	if err := conn.QueryRow(t.Context(), "SELECT currentDatabase()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	if db != name {
		t.Fatalf("currentDatabase() = %q, want %q", db, name)
	}
}

func TestNATSRestartKeepsStreams(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t)
	js := n.JetStream(t)
	ctx := t.Context()
	if _, err := js.CreateStream(ctx, jsStream("T", "t.>")); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "t.1", []byte("x")); err != nil {
		t.Fatal(err)
	}
	n.Restart()
	testenv.WaitFor(t, 10*time.Second, "stream T with 1 message after restart", func() bool {
		s, err := js.Stream(ctx, "T")
		return err == nil && s.CachedInfo().State.Msgs == 1
	})
}

// TestRedisPauseFreezesAndResumeThaws: a paused Redis (SIGSTOP on its PID)
// accepts no answer until it is resumed, and keeps its data.
func TestRedisPauseFreezesAndResumeThaws(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	if r.PID() <= 1 {
		t.Fatalf("PID() = %d", r.PID())
	}
	c, _ := r.NewDB(t)
	if err := c.Set(t.Context(), "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	r.Pause()
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	err := c.Get(ctx, "k").Err()
	cancel()
	if err == nil {
		t.Fatal("GET answered while Redis was paused")
	}
	r.Resume()
	testenv.WaitFor(t, 10*time.Second, "redis to answer after resume", func() bool {
		return c.Get(t.Context(), "k").Val() == "v"
	})
}
