package reader_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/snipdev/snip/pkg/reader"
)

func members(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("member-%d", i)
	}
	return out
}

func TestAssignBoundsLoad(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name             string
		partitions, mems int
		wantActive       int
	}{
		{name: "six_partitions_ten_members_six_active", partitions: 6, mems: 10, wantActive: 6},
		{name: "eight_partitions_three_members_all_active", partitions: 8, mems: 3, wantActive: 3},
		{name: "eight_partitions_eight_members_one_each", partitions: 8, mems: 8, wantActive: 8},
		{name: "one_member_takes_all", partitions: 8, mems: 1, wantActive: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			owner := reader.Assign("g", tc.partitions, members(tc.mems))
			load := map[string]int{}
			for p, m := range owner {
				if m == "" {
					t.Fatalf("partition %d has no owner", p)
				}
				load[m]++
			}
			limit := (tc.partitions + tc.mems - 1) / tc.mems
			for m, n := range load {
				if n > limit {
					t.Errorf("%s owns %d partitions, limit %d", m, n, limit)
				}
			}
			if len(load) != tc.wantActive {
				t.Errorf("%d members active, want %d (%v)", len(load), tc.wantActive, owner)
			}
		})
	}
}

func TestAssignIsDeterministic(t *testing.T) {
	t.Parallel()
	ms := members(7)
	want := reader.Assign("g", 12, ms)
	for range 20 {
		shuffled := slices.Clone(ms)
		rand.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		if got := reader.Assign("g", 12, shuffled); !slices.Equal(got, want) {
			t.Fatalf("assignment depends on member order: %v vs %v", got, want)
		}
	}
	if reader.Assign("g", 8, nil) != nil {
		t.Fatal("assignment with no members is not nil")
	}
}

// When a member leaves, the partitions it owned must move; few others should.
func TestAssignMovesLittleWhenAMemberLeaves(t *testing.T) {
	t.Parallel()
	for trial := range 200 {
		p := 8 + trial%9
		ms := members(2 + trial%9)
		before := reader.Assign("g", p, ms)
		gone := ms[trial%len(ms)]
		after := reader.Assign("g", p, slices.DeleteFunc(slices.Clone(ms), func(m string) bool { return m == gone }))
		owned, moved := 0, 0
		for i := range before {
			if before[i] == gone {
				owned++
			}
			if before[i] != after[i] {
				moved++
			}
		}
		if moved > 3*owned+1 {
			t.Errorf("trial %d: %d partitions over %d members: removing one owning %d moved %d", trial, p, len(ms), owned, moved)
		}
	}
}

// claimsOf turns an assignment into the claims its members publish.
func claimsOf(owner []string) map[string][]int {
	c := map[string][]int{}
	for p, m := range owner {
		c[m] = append(c[m], p)
	}
	return c
}

// When a member dies and idle members exist, only its partitions move, each
// to a member that was idle; every healthy member keeps its partitions.
// Rendezvous hashing alone fails this in some of these trials (a busy
// member takes the dead one's partition and gives its own up), and the test
// checks that it does, so the trials keep exercising that case.
func TestAssignStickyMovesOnlyTheDeadMembersPartitions(t *testing.T) {
	t.Parallel()
	const trials = 300
	cascades := 0
	for trial := range trials {
		parts := 2 + trial%8
		ms := members(parts + 1 + trial%4)
		before := reader.AssignSticky("g", parts, ms, nil)
		dead := before[trial%parts]
		alive := slices.DeleteFunc(slices.Clone(ms), func(m string) bool { return m == dead })
		busy := map[string]bool{}
		for _, m := range before {
			busy[m] = true
		}
		// wrong says how after breaks the rule, or "" if it keeps it.
		wrong := func(after []string) string {
			for p := range parts {
				switch {
				case before[p] != dead && after[p] != before[p]:
					return fmt.Sprintf("healthy %s lost partition %d to %s", before[p], p, after[p])
				case before[p] == dead && busy[after[p]]:
					return fmt.Sprintf("the dead member's partition %d went to busy %s while idle members exist", p, after[p])
				}
			}
			return ""
		}
		after := reader.AssignSticky("g", parts, alive, claimsOf(before))
		if w := wrong(after); w != "" {
			t.Fatalf("trial %d: %s (before %v, after %v)", trial, w, before, after)
		}
		if wrong(reader.Assign("g", parts, alive)) != "" {
			cascades++
		}
	}
	if cascades == 0 {
		t.Fatalf("rendezvous hashing alone kept the rule in all %d trials: they no longer exercise the case AssignSticky exists for", trials)
	}
	t.Logf("rendezvous hashing alone would have broken the rule in %d of %d trials", cascades, trials)
}

// A member keeps no more than the bound when members join, and claims of
// members that are gone are ignored.
func TestAssignStickyBoundsAndIgnoresTheDead(t *testing.T) {
	t.Parallel()
	ms := members(2)
	before := reader.AssignSticky("g", 8, ms, nil)
	joined := append(slices.Clone(ms), "member-9")
	after := reader.AssignSticky("g", 8, joined, claimsOf(before))
	load := map[string]int{}
	kept := 0
	for p, m := range after {
		load[m]++
		if before[p] == m {
			kept++
		}
	}
	for m, n := range load {
		if n > 3 {
			t.Errorf("%s owns %d partitions after a join, bound 3", m, n)
		}
	}
	if kept != 6 {
		t.Errorf("%d partitions stayed, want 6 (each old member keeps 3)", kept)
	}
	ghost := reader.AssignSticky("g", 4, []string{"a", "b"}, map[string][]int{"dead": {0, 1, 2, 3}})
	if d := cmp.Diff(reader.Assign("g", 4, []string{"a", "b"}), ghost); d != "" {
		t.Errorf("a dead member's claims changed the assignment (-want +got):\n%s", d)
	}
}

// Settled is true only for a layout the group keeps: one holder per
// partition, within the bound, as AssignSticky computes from the leases.
func TestSettled(t *testing.T) {
	held := func(owned ...[]int) []reader.Lease {
		var ls []reader.Lease
		for i, o := range owned {
			ls = append(ls, reader.Lease{Member: fmt.Sprintf("m%d", i), Owned: o})
		}
		return ls
	}
	for _, c := range []struct {
		name   string
		leases []reader.Lease
		want   bool
	}{
		{"one each, an idle member", held([]int{0}, []int{1}, []int{2}, []int{3}, nil), true},
		{"two each", held([]int{0, 1}, []int{2, 3}), true},
		{"a partition unheld", held([]int{0}, []int{1}, []int{2}, nil), false},
		{"a partition held twice", held([]int{0, 1}, []int{1, 2}, []int{3}), false},
		{"a member over the bound, another idle", held([]int{0, 1, 2}, []int{3}, nil), false},
		{"a partition out of range", held([]int{0, 1}, []int{2, 3, 4}), false},
		{"no members", nil, false},
	} {
		if got := reader.Settled("g", 4, c.leases); got != c.want {
			t.Errorf("%s: Settled = %v, want %v", c.name, got, c.want)
		}
	}
}

// RestWatch counts how long the group has been settled on the same
// holders: a change of holders, or a moment unsettled, starts it over.
func TestRestWatch(t *testing.T) {
	a := []reader.Lease{{Member: "m0", Owned: []int{0, 1}}, {Member: "m1", Owned: []int{2, 3}}}
	b := []reader.Lease{{Member: "m0", Owned: []int{2, 3}}, {Member: "m1", Owned: []int{0, 1}}}
	unsettled := []reader.Lease{{Member: "m0", Owned: []int{0, 1}}}
	t0 := time.Unix(1000, 0)
	var w reader.RestWatch
	for i, step := range []struct {
		leases []reader.Lease
		at     time.Duration
		want   time.Duration
	}{
		{a, 0, 0},
		{a, time.Second, time.Second},
		{b, 2 * time.Second, 0}, // other holders
		{b, 3 * time.Second, time.Second},
		{unsettled, 4 * time.Second, 0},
		{b, 5 * time.Second, 0}, // settled again: from now
		{b, 7 * time.Second, 2 * time.Second},
	} {
		if got := w.Observe("g", 4, step.leases, t0.Add(step.at)); got != step.want {
			t.Errorf("step %d: Observe = %s, want %s", i, got, step.want)
		}
	}
}
