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
// It returns owner[p] = member, or nil when there are no members.
func Assign(group string, partitions int, members []string) []string {
	if len(members) == 0 || partitions <= 0 {
		return nil
	}
	members = slices.Clone(members)
	slices.Sort(members)
	members = slices.Compact(members)
	limit := (partitions + len(members) - 1) / len(members)
	load := make(map[string]int, len(members))
	owner := make([]string, partitions)
	ranked := make([]string, len(members))
	scores := make(map[string]uint64, len(members))
	for p := range partitions {
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
