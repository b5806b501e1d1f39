package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// waitingCommitter is a started committer with WaitReplicas set.
// WAIT returns as soon as enough replicas acknowledged, so a generous
// timeout costs nothing where they do, and keeps a loaded test machine's
// slow replica from falling short.
func waitingCommitter(t *testing.T, rdb redis.UniversalClient, l Layout, replicas int, timeout time.Duration) *Committer {
	t.Helper()
	c := NewCommitter(rdb, l, CommitterConfig{MaxBatch: 64, Workers: 2, MaxEntries: 1 << 40, Timeout: timeout + 5*time.Second,
		Cooldown: 50 * time.Millisecond, WaitReplicas: replicas, WaitTimeout: timeout},
		NewMetrics(prometheus.NewRegistry()))
	c.Start()
	t.Cleanup(c.Close)
	return c
}

// appendAll appends one click per shard per round from concurrent
// goroutines (so batches mix shards, and masters), and returns each
// click's error by ID.
func appendAll(t *testing.T, c *Committer, l Layout, prefix string, rounds int) map[string]error {
	t.Helper()
	var (
		mu   sync.Mutex
		errs = map[string]error{}
		wg   sync.WaitGroup
	)
	for s := range l.Shards {
		wg.Go(func() {
			for i := range rounds {
				id := fmt.Sprintf("%s-s%d-%d", prefix, s, i)
				err := c.Append(t.Context(), s, []byte(id), []byte("clicks.acme.x"), []byte(`{}`))
				mu.Lock()
				errs[id] = err
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errs
}

// storedIDs returns the IDs in every shard's clicks lane, with the shard
// each is in.
func storedByID(t *testing.T, rdb redis.UniversalClient, l Layout) map[string]int {
	t.Helper()
	out := map[string]int{}
	for s := range l.Shards {
		msgs, err := rdb.XRange(t.Context(), l.OutboxKey(s, LaneClicks), "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			id, _ := m.Values[fieldID].(string)
			if _, dup := out[id]; dup {
				t.Fatalf("click %s stored twice", id)
			}
			out[id] = s
		}
	}
	return out
}

// With WaitReplicas, a batch goes to each Redis Cluster master it touches as
// one pipeline ending with WAIT: with one replica per master, WAIT 1 is met
// for every shard (spread over the three masters), and WAIT 2 never is, so
// every click is stored but reported ErrNotReplicated with its stored time.
func TestCommitterWaitsForReplicasOnEachMaster(t *testing.T) {
	rdb := servers.RedisCluster.Client(t)
	l := NewLayout(16)
	masters := map[string]bool{}
	for s := range l.Shards {
		m, err := rdb.MasterForKey(t.Context(), l.OutboxKey(s, LaneClicks))
		if err != nil {
			t.Fatal(err)
		}
		masters[m.Options().Addr] = true
	}
	if len(masters) != 3 {
		t.Fatalf("16 shards on %d masters, want 3", len(masters))
	}

	errs := appendAll(t, waitingCommitter(t, rdb, l, 1, 5*time.Second), l, "one", 20)
	stored := storedByID(t, rdb, l)
	for id, err := range errs {
		if err != nil {
			t.Fatalf("WAIT 1 with a replica per master: append %s: %v", id, err)
		}
		if _, ok := stored[id]; !ok {
			t.Fatalf("click %s acknowledged but not stored", id)
		}
	}

	c := waitingCommitter(t, rdb, l, 2, 20*time.Millisecond)
	errs = appendAll(t, c, l, "two", 5)
	stored = storedByID(t, rdb, l)
	for id, err := range errs {
		if !errors.Is(err, ErrNotReplicated) {
			t.Fatalf("WAIT 2 with one replica per master: append %s: %v, want ErrNotReplicated", id, err)
		}
		if _, ok := stored[id]; !ok {
			t.Fatalf("click %s reported not replicated, but not stored on the master either", id)
		}
	}
	tk, err := c.Submit(t.Context(), 3, []byte("ticket"), []byte("clicks.acme.x"), []byte(`{}`), 0)
	if err != nil {
		t.Fatal(err)
	}
	at, err := tk.Wait(t.Context())
	if !errors.Is(err, ErrNotReplicated) || at < time.Now().Add(-time.Minute).UnixMilli() {
		t.Fatalf("Wait = %d, %v; want the stored time and ErrNotReplicated", at, err)
	}
	tk.Release()
}

// On a Redis without replicas WAIT 1 always falls short: the click is in
// the outbox all the same (the relay will publish it), and Append says it is
// on one server only. A Redis that is down is still ErrUnavailable.
func TestCommitterWaitOnARedisWithoutReplicas(t *testing.T) {
	t.Parallel()
	rdb, _ := servers.Redis.NewDB(t)
	l := NewLayout(4)
	errs := appendAll(t, waitingCommitter(t, rdb, l, 1, 20*time.Millisecond), l, "single", 3)
	stored := storedByID(t, rdb, l)
	for id, err := range errs {
		if !errors.Is(err, ErrNotReplicated) || errors.Is(err, ErrUnavailable) {
			t.Fatalf("append %s: %v, want ErrNotReplicated", id, err)
		}
		if _, ok := stored[id]; !ok {
			t.Fatalf("click %s not stored", id)
		}
	}

	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", DialTimeout: 100 * time.Millisecond, MaxRetries: -1})
	defer dead.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	err := waitingCommitter(t, dead, l, 1, 20*time.Millisecond).Append(ctx, 0, []byte("x"), []byte("clicks.acme.x"), []byte(`{}`))
	if !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrNotReplicated) {
		t.Fatalf("append to a dead redis: %v, want ErrUnavailable", err)
	}
}
