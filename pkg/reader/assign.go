package reader

import (
	"hash/fnv"
	"slices"
	"strconv"
)

// Assign maps each partition to one of the live members: rendezvous
// (highest-random-weight) hashing with bounded load. Every member computes it
// from the same inputs and gets the same answer, with no coordinator.
//
// For each partition in order, the members are ranked by a hash of (group,
// partition, member) and the partition goes to the highest-ranked member that
// has fewer than ceil(partitions/members) partitions. The bound spreads the
// work as evenly as possible (6 partitions over 10 members: 6 members get
// one each); the hash makes the result stable, so when a member joins or
// leaves most partitions stay where they are.
//
// It returns owner[p] = member, or nil when there are no members. It is
// AssignSticky with no claims: what a group computes when nobody holds
// anything yet.
func Assign(group string, partitions int, members []string) []string {
	return AssignSticky(group, partitions, members, nil)
}

// AssignSticky is Assign for a running group: claims are the partitions each
// member holds now (published with its heartbeat), and a live member keeps
// what it holds, up to the bound ceil(partitions/members), before anything
// else is assigned. So when a member dies while idle members exist, only its
// partitions move, each to the best-ranked member with room (an idle one),
// and no healthy member gives a partition up: rendezvous hashing alone would
// let the dead member's partition go to a busy member that then gives up its
// own (a cascade that stops two partitions instead of one).
//
// A partition claimed by more than one live member (a handover in progress)
// counts for the best-ranked of them; a member claiming more than the bound
// (members joined) keeps its best-ranked partitions. Claims of members not
// in members are ignored: a dead member's partitions are free. Everything
// not kept is assigned as Assign does. Every member computes the same answer
// from the same live set and claims.
func AssignSticky(group string, partitions int, members []string, claims map[string][]int) []string {
	if len(members) == 0 || partitions <= 0 {
		return nil
	}
	members = slices.Clone(members)
	slices.Sort(members)
	members = slices.Compact(members)
	limit := (partitions + len(members) - 1) / len(members)
	load := make(map[string]int, len(members))
	owner := make([]string, partitions)

	// Keep claims: per partition the best-ranked live claimant, then per
	// member its best-ranked partitions up to the bound.
	if len(claims) > 0 {
		claimant := make([]string, partitions)
		for _, m := range members {
			for _, p := range claims[m] {
				if p < 0 || p >= partitions {
					continue
				}
				if c := claimant[p]; c == "" || score(group, p, m) > score(group, p, c) {
					claimant[p] = m
				}
			}
		}
		kept := map[string][]int{}
		for p, m := range claimant {
			if m != "" {
				kept[m] = append(kept[m], p)
			}
		}
		for m, ps := range kept {
			slices.SortFunc(ps, func(a, b int) int {
				sa, sb := score(group, a, m), score(group, b, m)
				switch {
				case sa > sb:
					return -1
				case sa < sb:
					return 1
				}
				return a - b
			})
			for _, p := range ps[:min(len(ps), limit)] {
				owner[p] = m
				load[m]++
			}
		}
	}

	ranked := make([]string, len(members))
	scores := make(map[string]uint64, len(members))
	for p := range partitions {
		if owner[p] != "" {
			continue
		}
		for _, m := range members {
			scores[m] = score(group, p, m)
		}
		copy(ranked, members)
		slices.SortFunc(ranked, func(a, b string) int {
			switch sa, sb := scores[a], scores[b]; {
			case sa > sb:
				return -1
			case sa < sb:
				return 1
			}
			return 0
		})
		for _, m := range ranked {
			if load[m] < limit {
				owner[p] = m
				load[m]++
				break
			}
		}
	}
	return owner
}

// score is FNV-1a 64 of the triple, finished with a 64-bit mixer so that
// nearby inputs (partition 1, 2, 3) give unrelated scores.
func score(group string, p int, member string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(group))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write(strconv.AppendInt(nil, int64(p), 10))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(member))
	x := h.Sum64()
	// splitmix64 finaliser
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
