package reader_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

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
