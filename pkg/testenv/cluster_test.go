package testenv_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/testenv"
)

// TestNATSClusterReplicatesAndSurvivesLeaderKill: an R3 stream on the
// three-node cluster has a leader and two current replicas; after SIGKILL of
// its leader another node leads, publishes resume, and the restarted node
// catches up.
func TestNATSClusterReplicatesAndSurvivesLeaderKill(t *testing.T) {
	t.Parallel()
	c := testenv.StartNATSCluster(t)
	if len(c.Nodes) != 3 || strings.Count(c.URL, ",") != 2 {
		t.Fatalf("cluster has %d nodes, URL %q", len(c.Nodes), c.URL)
	}
	js := c.JetStream(t)
	ctx := t.Context()
	cfg := jsStream("T", "t.>")
	cfg.Replicas = 3
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "t.1", []byte("x")); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 20*time.Second, "stream T with a leader and 2 replicas", func() bool {
		s, err := js.Stream(ctx, "T")
		if err != nil {
			return false
		}
		cl := s.CachedInfo().Cluster
		return cl != nil && cl.Leader != "" && len(cl.Replicas) == 2
	})
	leader, err := c.StreamLeader(ctx, js, "T")
	if err != nil {
		t.Fatal(err)
	}
	leader.Kill()
	if leader.Running() {
		t.Fatal("killed node still running")
	}
	testenv.WaitFor(t, 30*time.Second, "a publish to T after the leader's death", func() bool {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := js.Publish(pctx, "t.2", []byte("y"))
		return err == nil
	})
	testenv.WaitFor(t, 10*time.Second, "a new leader of T", func() bool {
		n, err := c.StreamLeader(ctx, js, "T")
		return err == nil && n != leader
	})
	if err := leader.Start(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "every replica of T current with 2 messages", func() bool {
		s, err := js.Stream(ctx, "T")
		if err != nil {
			return false
		}
		info := s.CachedInfo()
		if info.State.Msgs != 2 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
			return false
		}
		for _, r := range info.Cluster.Replicas {
			if !r.Current || r.Offline {
				return false
			}
		}
		return true
	})
}

// TestRedisClusterServesAllSlotsWithReplicas: six nodes, three masters with
// a replica each; a cluster client writes keys that land on every master and
// the replicas receive them.
func TestRedisClusterServesAllSlotsWithReplicas(t *testing.T) {
	t.Parallel()
	rc := testenv.StartRedisCluster(t)
	if len(rc.Addrs()) != 6 || !strings.HasPrefix(rc.URL(), "redis+cluster://") {
		t.Fatalf("addrs %v url %s", rc.Addrs(), rc.URL())
	}
	cl := rc.Client(t)
	ctx := t.Context()
	slots, err := cl.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	covered := 0
	for _, s := range slots {
		if len(s.Nodes) != 2 {
			t.Fatalf("slots %d-%d served by %d nodes, want master and replica", s.Start, s.End, len(s.Nodes))
		}
		covered += int(s.End - s.Start + 1)
	}
	if covered != 16384 || len(slots) != 3 {
		t.Fatalf("%d ranges cover %d slots, want 3 covering 16384", len(slots), covered)
	}
	masters := map[string]bool{}
	for i := range 30 {
		k := fmt.Sprintf("k%d", i)
		if err := cl.Set(ctx, k, "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
		m, err := rc.MasterOf(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		masters[m.Addr] = true
	}
	if len(masters) != 3 {
		t.Fatalf("30 keys landed on %d masters, want 3", len(masters))
	}
	testenv.WaitFor(t, 10*time.Second, "replicas to hold the 30 keys", func() bool {
		total := int64(0)
		for _, r := range rc.Replicas {
			n, err := redis.NewClient(&redis.Options{Addr: r.Addr}).DBSize(ctx).Result()
			if err != nil {
				return false
			}
			total += n
		}
		return total == 30
	})
}

// TestRedisClusterFailsOverAKilledMaster: after SIGKILL of a master its
// replica is promoted and the cluster client writes to the slot again.
func TestRedisClusterFailsOverAKilledMaster(t *testing.T) {
	t.Parallel()
	rc := testenv.StartRedisCluster(t)
	cl := rc.Client(t)
	ctx := t.Context()
	if err := cl.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	m, err := rc.MasterOf(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	m.Kill()
	killed := time.Now()
	testenv.WaitFor(t, 30*time.Second, "a write to k's slot after its master died", func() bool {
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		return cl.Set(wctx, "k", "w", 0).Err() == nil
	})
	t.Logf("writes to the killed master's slots resumed after %s (cluster-node-timeout %s)", time.Since(killed).Round(time.Millisecond), testenv.RedisClusterNodeTimeout)
	// The node MasterOf asks may learn of the promotion by gossip a moment
	// after the new master takes writes: ask until a node names it.
	testenv.WaitFor(t, 30*time.Second, "a master of k other than the killed "+m.Addr, func() bool {
		now, err := rc.MasterOf(ctx, "k")
		return err == nil && now != m
	})
}
