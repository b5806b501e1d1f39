package redisconn_test

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/redisconn"
	"github.com/snipdev/snip/pkg/testenv"
)

var servers *testenv.Servers

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, &servers, testenv.WithRedis(), testenv.WithRedisCluster()))
}

func TestWriteAndWaitOnRedisCluster(t *testing.T) {
	servers.RunOnRedisCluster(t, TestWriteAndWait, TestBarrier, TestWriteAndWaitOutlastsTheReadTimeout)
}

// WriteAndWait writes and then waits on the same connection to the key's
// master: on Redis Cluster the replica acknowledges, and has the write when
// it returns; on a single Redis none does, and the write stands. A command
// that fails is the error, whatever the wait said.
func TestWriteAndWait(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	ctx := t.Context()
	timeout, cluster := testenv.ReplicaWaitTimeout(rdb)
	const key = "wait:{a}:k"
	acked, werr, err := redisconn.WriteAndWait(ctx, rdb, key, 1, timeout, func(p redis.Pipeliner) {
		p.Set(ctx, key, "v", 0)
		p.HSet(ctx, "wait:{a}:h", "f", "v") // same slot
	})
	if err != nil || werr != nil {
		t.Fatalf("WriteAndWait = %d, %v, %v", acked, werr, err)
	}
	want := int64(0)
	if cluster {
		want = 1
		if n := servers.RedisCluster.ReplicaClient(t, key).Exists(ctx, key, "wait:{a}:h").Val(); n != 2 {
			t.Errorf("the replica has %d of the 2 keys when WriteAndWait returns", n)
		}
	}
	if acked != want {
		t.Errorf("replicas acknowledged = %d, want %d", acked, want)
	}
	if got := rdb.Get(ctx, key).Val(); got != "v" {
		t.Errorf("GET %s = %q, want v", key, got)
	}
	_, _, err = redisconn.WriteAndWait(ctx, rdb, key, 1, timeout, func(p redis.Pipeliner) {
		p.HSet(ctx, key, "f", "v") // a string, not a hash
	})
	if err == nil {
		t.Error("a failing command: WriteAndWait returned no error")
	}
}

// A wait longer than the client's read timeout is waited out: WAIT answers
// when its own timeout ends, with the replicas it has (more are asked for
// here than there are), and the writes before it go out once. A client's
// read timeout is 2s by default (a REDIS_URL may set less), and the
// services take replica waits of up to 10s: cut at the read timeout, the
// wait failed early and go-redis sent the pipeline again, writes and wait,
// until its retries ran out.
func TestWriteAndWaitOutlastsTheReadTimeout(t *testing.T) {
	testenv.Parallel(t)
	const readTimeout, wait = 100 * time.Millisecond, 600 * time.Millisecond
	url, replicas, want := "", 1, int64(0) // one Redis: no replica
	if testenv.OnRedisCluster() {
		url, replicas, want = servers.RedisCluster.URL(), 2, 1 // one replica per master
		servers.RedisCluster.Client(t)                         // flushes the masters
	} else {
		_, db := servers.Redis.NewDB(t)
		url = servers.Redis.URL(db)
	}
	rdb, err := redisconn.OpenWithTimeout(url, readTimeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := t.Context()
	const key = "outlast:{a}:n"
	start := time.Now()
	acked, werr, err := redisconn.WriteAndWait(ctx, rdb, key, replicas, wait, func(p redis.Pipeliner) {
		p.Incr(ctx, key)
	})
	took := time.Since(start)
	if err != nil || werr != nil || acked != want {
		t.Fatalf("WriteAndWait (wait %s, read timeout %s) = %d, %v, %v after %s; want %d, nil, nil",
			wait, readTimeout, acked, werr, err, took.Round(time.Millisecond), want)
	}
	if took < wait {
		t.Errorf("WriteAndWait returned after %s, before WAIT's timeout of %s", took, wait)
	}
	if n := rdb.Get(ctx, key).Val(); n != "1" {
		t.Errorf("the write before the wait ran %s times, want once", n)
	}
	// Barrier falls short as WAIT says (too few replicas within the wait),
	// not with a client's read timing out.
	err = redisconn.Barrier(ctx, rdb, []string{key}, replicas, wait)
	if !errors.Is(err, redisconn.ErrNotReplicated) || !strings.Contains(fmt.Sprint(err), fmt.Sprintf("%d of %d replicas within %s", want, replicas, wait)) {
		t.Errorf("Barrier (wait %s, read timeout %s) = %v; want %d of %d replicas within %s", wait, readTimeout, err, want, replicas, wait)
	}
}

// Barrier confirms what other connections wrote on every master it is
// asked about: on Redis Cluster the replicas hold the data of six slots
// (spread over the three masters) when it returns; on a single Redis it
// says the replicas fell short. Its keys expire.
func TestBarrier(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	ctx := t.Context()
	timeout, cluster := testenv.ReplicaWaitTimeout(rdb)
	var data []string
	for _, tag := range []string{"a", "b", "c", "d", "e", "f"} {
		k := "barrier:{" + tag + "}:data"
		if err := rdb.Set(ctx, k, "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
		data = append(data, k)
	}
	err := redisconn.Barrier(ctx, rdb, data, 1, timeout)
	if !cluster {
		if !errors.Is(err, redisconn.ErrNotReplicated) {
			t.Fatalf("one Redis: Barrier = %v, want ErrNotReplicated", err)
		}
		if ttl := rdb.TTL(ctx, redisconn.BarrierKey(data[0])).Val(); ttl <= 0 || ttl > redisconn.BarrierTTL {
			t.Errorf("barrier key TTL = %s, want at most %s", ttl, redisconn.BarrierTTL)
		}
		return
	}
	if err != nil {
		t.Fatalf("cluster: Barrier = %v, want nil", err)
	}
	for _, k := range data {
		if n := servers.RedisCluster.ReplicaClient(t, k).Exists(ctx, k).Val(); n != 1 {
			t.Errorf("the replica does not have %s when Barrier returns", k)
		}
	}
	// A healthy replica has the data at once anyway, so the check above
	// would pass without a barrier on every master. Freeze the replica of
	// a master other than the first key's: the barrier must wait on it too,
	// and say it fell short.
	first, err := servers.RedisCluster.MasterOf(ctx, data[0])
	if err != nil {
		t.Fatal(err)
	}
	var other string
	for _, k := range data[1:] {
		if m, err := servers.RedisCluster.MasterOf(ctx, k); err == nil && m != first {
			other = k
			break
		}
	}
	if other == "" {
		t.Fatalf("the keys %v all live on %s; want them spread over the masters", data, first.Addr)
	}
	addr := servers.RedisCluster.ReplicaClient(t, other).Options().Addr
	var replica *testenv.RedisServer
	for _, s := range append(slices.Clone(servers.RedisCluster.Replicas), servers.RedisCluster.Masters...) {
		if s.Addr == addr {
			replica = s
		}
	}
	if replica == nil {
		t.Fatalf("the replica of %s's master, %s, is no node of the cluster", other, addr)
	}
	replica.Pause()
	err = redisconn.Barrier(ctx, rdb, data, 1, 300*time.Millisecond)
	replica.Resume()
	if !errors.Is(err, redisconn.ErrNotReplicated) || !strings.Contains(fmt.Sprint(err), redisconn.BarrierKey(other)) {
		t.Errorf("cluster, the replica of %s's master frozen: Barrier = %v, want ErrNotReplicated naming %s", other, err, redisconn.BarrierKey(other))
	}
	// The tests after this one want every replica answering again.
	testenv.WaitFor(t, 30*time.Second, "the thawed replica to confirm a barrier", func() bool {
		return redisconn.Barrier(ctx, rdb, data, 1, time.Second) == nil
	})
}

// A barrier key shares its data key's slot: the key's own tag, or the whole
// key as the tag.
func TestBarrierKey(t *testing.T) {
	t.Parallel()
	for key, want := range map[string]string{
		"cc:{p1}:meta":   "cc:{p1}:replicated",
		"fraud:{p3}:hwm": "fraud:{p3}:replicated",
		"cc:link:abc":    "{cc:link:abc}:replicated",
		"snip:wh:{ep}:q": "snip:wh:{ep}:replicated",
	} {
		if got := redisconn.BarrierKey(key); got != want {
			t.Errorf("BarrierKey(%q) = %q, want %q", key, got, want)
		}
		node := redis.NewClient(&redis.Options{Addr: servers.RedisCluster.Addrs()[0]})
		a, err1 := node.ClusterKeySlot(t.Context(), key).Result()
		b, err2 := node.ClusterKeySlot(t.Context(), want).Result()
		node.Close()
		if err1 != nil || err2 != nil || a != b {
			t.Errorf("slots of %q and %q: %d, %d (%v, %v); want one", key, want, a, b, err1, err2)
		}
	}
}
