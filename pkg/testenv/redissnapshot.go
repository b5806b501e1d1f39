package testenv

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisSnapshot is every key of one Redis database as DUMP gave it, with
// its time to live.
type RedisSnapshot map[string]struct {
	Value string
	TTL   time.Duration // 0: none
}

// SnapshotRedis dumps every key of rdb's database. Taken while a service
// writes, then restored, it plays a replica promoted after its master died
// before the writes since the snapshot reached it: Redis replicates
// asynchronously, and what a replica has is a prefix of its master's
// writes.
func SnapshotRedis(tb testing.TB, rdb *redis.Client) RedisSnapshot {
	tb.Helper()
	ctx := tb.Context()
	keys, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		tb.Fatalf("testenv: snapshot redis: %v", err)
	}
	s := RedisSnapshot{}
	for _, k := range keys {
		v, err := rdb.Dump(ctx, k).Result()
		if err == redis.Nil {
			continue // expired since KEYS
		}
		if err != nil {
			tb.Fatalf("testenv: snapshot redis: dump %s: %v", k, err)
		}
		ttl, err := rdb.PTTL(ctx, k).Result()
		if err != nil {
			tb.Fatalf("testenv: snapshot redis: pttl %s: %v", k, err)
		}
		e := s[k]
		e.Value, e.TTL = v, max(ttl, 0)
		s[k] = e
	}
	return s
}

// Restore makes rdb's database hold exactly the snapshot.
func (s RedisSnapshot) Restore(tb testing.TB, rdb *redis.Client) {
	tb.Helper()
	ctx := tb.Context()
	if err := rdb.FlushDB(ctx).Err(); err != nil {
		tb.Fatalf("testenv: restore redis: %v", err)
	}
	for k, e := range s {
		if err := rdb.Restore(ctx, k, e.TTL, e.Value).Err(); err != nil {
			tb.Fatalf("testenv: restore redis: %s: %v", k, err)
		}
	}
}

// ShortWaits records the replica waits a store reports short (the short
// callback of WaitForReplicas in linkstore and owners), as "op:got:err".
type ShortWaits struct {
	mu  sync.Mutex
	got []string
}

// Record is the short callback.
func (w *ShortWaits) Record(op string, got int64, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.got = append(w.got, fmt.Sprintf("%s:%d:%v", op, got, err))
}

// Got returns what was recorded, in order.
func (w *ShortWaits) Got() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.got)
}

// ReplicaWaitTimeout is the wait a test gives a store on rdb: short on a
// single Redis (no replica will ever answer), long on a cluster (a healthy
// replica answers at once, so the wait never runs out there). cluster
// reports which rdb is.
func ReplicaWaitTimeout(rdb redis.UniversalClient) (timeout time.Duration, cluster bool) {
	if _, ok := rdb.(*redis.ClusterClient); ok {
		return 5 * time.Second, true
	}
	return 20 * time.Millisecond, false
}
