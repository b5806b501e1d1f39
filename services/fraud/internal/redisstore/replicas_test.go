package redisstore_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/redisconn"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/fraud/internal/fraud"
	"github.com/snipdev/snip/services/fraud/internal/redisstore"
)

// With the replica wait on, Apply returns once the partition's replica has
// its statistics: on Redis Cluster the replica holds the partition's
// high-water mark and the link's counts the moment it returns, and no wait
// falls short; on a single Redis every wait falls short, is reported with
// its partition, and the statistics stand.
func TestApplyWaitsForReplicas(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	ctx := t.Context()
	timeout, cluster := testenv.ReplicaWaitTimeout(rdb)
	s := redisstore.New(rdb, 4, 100)
	var shorts []int
	s.WaitForReplicas(1, timeout, func(p int, err error) {
		if !errors.Is(err, redisconn.ErrNotReplicated) {
			t.Errorf("short wait of partition %d: %v, want ErrNotReplicated", p, err)
		}
		shorts = append(shorts, p)
	})
	p := events.Partition("abc", 4)
	if err := s.Apply(ctx, p, fraud.Batch{Judgements: judgements("abc", "acme", 1, 10)}); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(ctx, p, fraud.Batch{Judgements: judgements("abc", "acme", 1, 10)}); err != nil { // redelivered: writes nothing, still waits
		t.Fatal(err)
	}
	if got, err := s.LinkStats(ctx, "abc"); err != nil || got.Total != 10 {
		t.Fatalf("stats: %+v, %v; want 10 judged", got, err)
	}
	want := []int{p, p} // Apply runs on the test's goroutine: no lock needed
	if cluster {
		want = nil
		hwm := fmt.Sprintf("fraud:{p%d}:hwm", p)
		if v := servers.RedisCluster.ReplicaClient(t, hwm).Get(ctx, hwm).Val(); v != "10" {
			t.Errorf("the replica's high-water mark is %q when Apply returns, want 10", v)
		}
	}
	if d := cmp.Diff(want, shorts); d != "" {
		t.Errorf("short waits (-want +got):\n%s", d)
	}
}
