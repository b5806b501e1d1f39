package outbox

import (
	"fmt"
	"testing"
)

// TestShardsSpreadOverTheClusterMasters: with the default 16 shards, every
// master of a three-master Redis Cluster serves some shards, so the outbox's
// writes and relays are spread over all of them; and each shard's keys (its
// lanes, lease, dead letters and links) share one slot, as its MULTI and
// scripts need.
func TestShardsSpreadOverTheClusterMasters(t *testing.T) {
	rc := servers.RedisCluster
	rdb := rc.Client(t)
	ctx := t.Context()
	l := NewLayout(16)
	perMaster := map[string]int{}
	for s := range l.Shards {
		keys := []string{l.LeaseKey(s), l.DeadKey(s)}
		for _, lane := range Lanes {
			keys = append(keys, l.OutboxKey(s, lane))
		}
		for i := 0; len(keys) < 10; i++ {
			if code := fmt.Sprintf("c%d", i); l.Shard(code) == s {
				keys = append(keys, l.LinkKey(code))
			}
		}
		slot := int64(-1)
		for _, k := range keys {
			ks, err := rdb.ClusterKeySlot(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			if slot >= 0 && ks != slot {
				t.Fatalf("shard %d: key %s in slot %d, the shard's other keys in %d", s, k, ks, slot)
			}
			slot = ks
		}
		m, err := rc.MasterOf(ctx, l.LeaseKey(s))
		if err != nil {
			t.Fatal(err)
		}
		perMaster[m.Addr]++
	}
	t.Logf("shards per master: %v", perMaster)
	if len(perMaster) != 3 {
		t.Fatalf("16 shards on %d masters (%v), want all 3", len(perMaster), perMaster)
	}
	for addr, n := range perMaster {
		if n < 3 {
			t.Errorf("master %s serves %d of 16 shards; want at least 3", addr, n)
		}
	}
}
