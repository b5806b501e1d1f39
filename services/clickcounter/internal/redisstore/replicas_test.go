package redisstore_test

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/redisconn"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/clickcounter/internal/redisstore"
)

// Replicated waits for the replicas of every master holding the partitions
// and LINKS records named, whichever connection wrote there: on Redis
// Cluster the replica has a partition's and a code's keys written through
// the store's client once it returns; on a single Redis (no replica) it
// says the replicas fell short. Off, it does nothing.
func TestReplicatedWaitsForTheReplicas(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	ctx := t.Context()
	s := redisstore.New(rdb)
	if err := s.Replicated(ctx, []int{0, 1}, []string{"abc"}); err != nil {
		t.Fatalf("wait off: Replicated = %v, want nil", err)
	}
	if keys := testenv.Keys(t, rdb, "*replicated*"); len(keys) != 0 {
		t.Fatalf("wait off: barrier keys written: %v", keys)
	}
	timeout, cluster := testenv.ReplicaWaitTimeout(rdb)
	s.WaitForReplicas(1, timeout)
	written := []string{"cc:{p2}:probe", "cc:link:abc"}
	for _, k := range written {
		if err := rdb.HSet(ctx, k, "f", "v").Err(); err != nil {
			t.Fatal(err)
		}
	}
	err := s.Replicated(ctx, []int{2}, []string{"abc"})
	if !cluster {
		if !errors.Is(err, redisconn.ErrNotReplicated) {
			t.Fatalf("one Redis, no replica: Replicated = %v, want ErrNotReplicated", err)
		}
		return
	}
	if err != nil {
		t.Fatalf("cluster: Replicated = %v, want nil", err)
	}
	for _, k := range written {
		if n := servers.RedisCluster.ReplicaClient(t, k).Exists(ctx, k).Val(); n != 1 {
			t.Errorf("the replica does not have %s when Replicated returns", k)
		}
	}
}

// With the replica of a partition's master cut off (frozen, and dropped by
// its master), Replicated says so within its timeout; once the replica is
// back and has caught up it confirms again.
func TestReplicatedSaysWhenAReplicaIsCutOff(t *testing.T) {
	t.Parallel()
	rc := testenv.StartRedisCluster(t)
	rdb := rc.Client(t)
	ctx := t.Context()
	s := redisstore.New(rdb)
	s.WaitForReplicas(1, 100*time.Millisecond)
	const key = "cc:{p2}:probe"
	master, err := rc.MasterOf(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	var replica *testenv.RedisServer
	for i, m := range rc.Masters {
		if m == master {
			replica = rc.Replicas[i]
		}
	}
	if err := s.Replicated(ctx, []int{2}, nil); err != nil {
		t.Fatalf("healthy: Replicated = %v, want nil", err)
	}
	replica.Pause()
	defer replica.Resume()
	mc := redis.NewClient(&redis.Options{Addr: master.Addr})
	defer mc.Close()
	if err := mc.Do(ctx, "CLIENT", "KILL", "TYPE", "replica").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HSet(ctx, key, "f", "v").Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Replicated(ctx, []int{2}, nil); !errors.Is(err, redisconn.ErrNotReplicated) {
		t.Fatalf("replica cut off: Replicated = %v, want ErrNotReplicated", err)
	}
	replica.Resume()
	testenv.WaitFor(t, 30*time.Second, "the replica to be back and confirm", func() bool {
		return s.Replicated(ctx, []int{2}, nil) == nil
	})
}
