package clicklog_test

import (
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/fraud/internal/clicklog"
	"github.com/snipdev/snip/services/fraud/internal/traffic"
)

// TestScansOnAThreeNodeCluster: on an R3 CLICKS in a three-node cluster,
// repeated scans of every partition return every click of it, in order. (An
// ordered consumer's pull can meet "no responders" on a cluster while its
// consumer is being created on another node; Scan retries it.)
func TestScansOnAThreeNodeCluster(t *testing.T) {
	t.Parallel()
	c := testenv.StartNATSCluster(t)
	js := c.JetStream(t)
	ctx := t.Context()
	o := topology.Defaults()
	o.Partitions, o.Replicas = 4, 3
	c.ApplyTopology(t, js, o)
	clicks := traffic.Generate(traffic.Spec{Seed: 1, Start: time.Now().Add(-time.Minute), Duration: 20 * time.Second, HumanRate: 20, Links: 20, Owners: 2})
	if err := traffic.Publish(ctx, js, clicks, 256); err != nil {
		t.Fatal(err)
	}
	l := clicklog.NewWithFetch(js, 4, 7)
	for round := range 5 {
		for p := range 4 {
			var want []uint64
			for i, c := range clicks {
				if events.Partition(c.Code, 4) == p {
					want = append(want, uint64(i+1))
				}
			}
			var got []uint64
			n, err := l.Scan(ctx, p, time.Now().Add(-time.Hour), 1<<62, func(ev reader.Event) { got = append(got, ev.Seq) })
			if err != nil {
				t.Fatalf("round %d, scan of partition %d: %v (after %d clicks)", round, p, err, n)
			}
			if len(got) != len(want) {
				t.Fatalf("round %d, partition %d: %d clicks scanned, want %d", round, p, len(got), len(want))
			}
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("round %d, partition %d: click %d has sequence %d, want %d", round, p, i, got[i], want[i])
				}
			}
		}
	}
}
