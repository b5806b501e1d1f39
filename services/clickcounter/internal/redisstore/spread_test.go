package redisstore_test

import (
	"fmt"
	"testing"
)

// TestPartitionsSpreadOverTheClusterMasters: the default 8 CLICKS partitions'
// hash tags ({p0}..{p7}) land on every master of a three-master Redis
// Cluster, so the counter's per-partition scripts are spread over all of
// them.
func TestPartitionsSpreadOverTheClusterMasters(t *testing.T) {
	rc := servers.RedisCluster
	rc.Client(t)
	perMaster := map[string][]int{}
	for p := range 8 {
		m, err := rc.MasterOf(t.Context(), fmt.Sprintf("cc:{p%d}:meta", p))
		if err != nil {
			t.Fatal(err)
		}
		perMaster[m.Addr] = append(perMaster[m.Addr], p)
	}
	t.Logf("partitions per master: %v", perMaster)
	if len(perMaster) != 3 {
		t.Fatalf("8 partitions on %d masters (%v), want all 3", len(perMaster), perMaster)
	}
}
