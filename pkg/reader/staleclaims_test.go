package reader_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// groupGauge is a member's gauge name (one series: its group's).
func groupGauge(t *testing.T, reg prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}

// A lease written after the member's lease went (a heartbeat nats.go kept
// while it reconnected and sent once back, or one of a process frozen past
// its lease) claims what the member held before: the others count the
// member live again but not its claims, which the partitions' owners gave
// up for nothing before (the stale claimant outranking them), while the
// member read none of them.
func TestClaimsInALeaseWrittenAfterItWentAreIgnored(t *testing.T) {
	t.Parallel()
	const group, partitions = "stale", 2
	n, js := setup(t, partitions)
	ctx := t.Context()
	regs := map[string]*prometheus.Registry{"a": prometheus.NewRegistry(), "b": prometheus.NewRegistry()}
	for id, reg := range regs {
		startMember(t, n, reader.Config{Group: group, Member: id, Metrics: reg},
			func(context.Context, int, []reader.Event) error { return nil })
	}
	seen := func(live float64) func() bool {
		return func() bool {
			for _, reg := range regs {
				if groupGauge(t, reg, "snip_reader_live_members") != live {
					return false
				}
			}
			return true
		}
	}
	var holders []reader.Lease
	testenv.WaitFor(t, 30*time.Second, "a and b holding one partition each", func() bool {
		var err error
		holders, err = reader.Members(ctx, js, group)
		return err == nil && len(holders) == 2 && len(holders[0].Owned) == 1 && len(holders[1].Owned) == 1 && seen(2)()
	})
	claims := map[string][]int{}
	for _, l := range holders {
		claims[l.Member] = l.Owned
	}
	// A third member that, claiming both partitions, would take one of
	// them from its holder, and claiming none takes nothing (the bound is
	// one partition each).
	x := ""
	for i := 0; x == "" && i < 1000; i++ {
		c := fmt.Sprintf("x%d", i)
		members := []string{"a", "b", c}
		now := reader.AssignSticky(group, partitions, members, map[string][]int{"a": claims["a"], "b": claims["b"]})
		stale := reader.AssignSticky(group, partitions, members, map[string][]int{"a": claims["a"], "b": claims["b"], c: {0, 1}})
		if !slices.Contains(now, c) && slices.Contains(stale, c) {
			x = c
		}
	}
	if x == "" {
		t.Fatal("no member name found whose stale claims would move a partition")
	}
	writeLease := func(owned []int) {
		t.Helper()
		b, _ := json.Marshal(reader.Lease{Member: x, Host: "h", PID: 1, Since: time.Now().UTC(), Instance: "i", Owned: owned})
		subj := "$KV." + topology.MembersBucket + "." + group + ".members." + x
		if _, err := js.Publish(ctx, subj, b, jetstream.WithMsgTTL(time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	// x lives and holds nothing, then its lease lapses.
	writeLease([]int{})
	testenv.WaitFor(t, 30*time.Second, "a and b seeing x live", seen(3))
	testenv.WaitFor(t, 30*time.Second, "a and b seeing x's lease lapse", seen(2))
	before := map[string]float64{}
	for id, reg := range regs {
		before[id] = gathered(t, reg, "snip_reader_rebalances_total")
	}
	// Its heartbeat of before the lapse is stored now.
	writeLease([]int{0, 1})
	testenv.WaitFor(t, 30*time.Second, "a and b seeing x live again", seen(3))
	testenv.WaitFor(t, 30*time.Second, "a and b seeing x's lease lapse again", seen(2))
	for id, reg := range regs {
		if got := gathered(t, reg, "snip_reader_rebalances_total"); got != before[id] {
			t.Errorf("member %s's partitions changed %g times on %s's lease written after it lapsed, claiming what it held before; want none",
				id, got-before[id], x)
		}
		if owned := groupGauge(t, reg, "snip_reader_owned_partitions"); owned != 1 {
			t.Errorf("member %s owns %g partitions, want 1", id, owned)
		}
	}
}
