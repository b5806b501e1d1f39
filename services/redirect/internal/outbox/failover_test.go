package outbox

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/redisconn"
	"github.com/snipdev/snip/pkg/testenv"
)

// TestRedisMasterKilledUnderCommitLoad measures what a Redis Cluster master's
// SIGKILL costs the outbox: clicks are appended by the group commit (through
// a client opened by redisconn from a redis+cluster:// URL, as the redirect
// opens it) while the master of some shards dies. Appends to its shards fail
// until its replica is promoted, then resume; no click is stored twice; and a
// click the dead master acknowledged but had not yet sent to its replica is
// lost (Redis replication is asynchronous). The test asserts that any such
// loss is of clicks acknowledged in the last moments before the kill (the
// replication lag), and logs the count and the gap.
func TestRedisMasterKilledUnderCommitLoad(t *testing.T) {
	t.Parallel()
	rc := testenv.StartRedisCluster(t)
	rdb, err := redisconn.Open(rc.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	l := NewLayout(16)
	c := NewCommitter(rdb, l, CommitterConfig{MaxBatch: 64, Workers: 2, MaxEntries: 1 << 40, Timeout: 500 * time.Millisecond, Cooldown: 50 * time.Millisecond},
		NewMetrics(prometheus.NewRegistry()))
	c.Start()
	defer c.Close()
	ctx := t.Context()
	victim, err := rc.MasterOf(ctx, l.LeaseKey(0))
	if err != nil {
		t.Fatal(err)
	}

	var (
		mu            sync.Mutex
		ackedAt       = map[string]time.Time{}
		onVictim      = map[string]bool{} // the click's shard was on the victim when appended
		lastVictimAck atomic.Int64
		stop          atomic.Bool
		wg            sync.WaitGroup
		failures      atomic.Int64
	)
	victimShards := map[int]bool{}
	for s := range l.Shards {
		if m, err := rc.MasterOf(ctx, l.LeaseKey(s)); err == nil && m == victim {
			victimShards[s] = true
		}
	}
	started := time.Now()
	for w := range 16 {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				code := fmt.Sprintf("w%dc%d", w, i%50)
				shard := l.Shard(code)
				id := fmt.Sprintf("w%d-%d", w, i)
				actx, cancel := context.WithTimeout(ctx, time.Second)
				err := c.Append(actx, shard, []byte(id), []byte("0.clicks.acme."+code), []byte(`{}`))
				cancel()
				if err != nil {
					if failures.Add(1) == 1 {
						t.Logf("first refused append: %v", err)
					}
					time.Sleep(time.Millisecond) // a refused click's client retries later
					continue
				}
				now := time.Now()
				mu.Lock()
				ackedAt[id] = now
				onVictim[id] = victimShards[shard]
				mu.Unlock()
				if victimShards[shard] {
					lastVictimAck.Store(now.UnixNano())
				}
			}
		})
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(ackedAt) }
	testenv.WaitFor(t, 30*time.Second, "3000 clicks appended before the kill", func() bool {
		return count() >= 3000
	})
	rate := float64(count()) / time.Since(started).Seconds()
	killedAt := time.Now()
	victim.Kill()
	testenv.WaitFor(t, 60*time.Second, "appends to the dead master's shards to resume", func() bool {
		return time.Unix(0, lastVictimAck.Load()).After(killedAt.Add(100 * time.Millisecond))
	})
	resumed := time.Unix(0, lastVictimAck.Load())
	before := count()
	testenv.WaitFor(t, 30*time.Second, "1000 more clicks appended", func() bool { return count() >= before+1000 })
	stop.Store(true)
	wg.Wait()

	stored := map[string]int{}
	for s := range l.Shards {
		msgs, err := rdb.XRange(ctx, l.OutboxKey(s, LaneClicks), "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			id, _ := m.Values[fieldID].(string)
			stored[id]++
		}
	}
	var lost, lostOnVictim int
	var earliestLost time.Time
	for id, at := range ackedAt {
		if stored[id] == 0 {
			lost++
			if onVictim[id] {
				lostOnVictim++
			}
			if earliestLost.IsZero() || at.Before(earliestLost) {
				earliestLost = at
			}
		}
	}
	for id, n := range stored {
		if n > 1 {
			t.Errorf("click %s stored %d times", id, n)
		}
	}
	t.Logf("%.0f clicks/s before the kill; killed %s (master of %d of 16 shards); %d clicks acknowledged, %d refused or timed out while it was down; appends to its shards resumed %s after the kill; acknowledged but lost: %d",
		rate, victim.Addr, len(victimShards), len(ackedAt), failures.Load(), resumed.Sub(killedAt).Round(time.Millisecond), lost)
	if lost != lostOnVictim {
		t.Errorf("%d acknowledged clicks lost, %d of them on the killed master's shards; want every loss there", lost, lostOnVictim)
	}
	if lost > 0 && earliestLost.Before(killedAt.Add(-time.Second)) {
		t.Errorf("a click acknowledged %s before the kill was lost: more than the replication lag", killedAt.Sub(earliestLost))
	}
}
