package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/snipdev/snip/pkg/redisconn"
	"github.com/snipdev/snip/services/clickcounter/internal/counter"
)

// WaitForReplicas makes Replicated wait for n replicas of each master it
// asks, for at most timeout; 0 (the default) turns it off. Call it before
// the store is used.
func (s *Store) WaitForReplicas(n int, timeout time.Duration) {
	s.waitN, s.waitTimeout = n, timeout
}

// Replicated waits until the replicas have every write made so far on the
// Redis masters that hold the given partitions' keys and the given codes'
// LINKS records. Per master it writes one short-lived barrier key in the
// slot of one of them and sends WAIT on that connection: Redis replicates
// each master's writes in order, so a replica that has the barrier has
// everything written on that master before it, whichever connection wrote
// it (a WAIT alone would speak only for its own connection's writes, and
// for none when a retried script wrote nothing). It returns an error
// wrapping counter.ErrNotReplicated when a master's replicas fell short or
// did not answer; nil at once when the wait is off.
func (s *Store) Replicated(ctx context.Context, partitions []int, codes []string) error {
	if s.waitN <= 0 || len(partitions)+len(codes) == 0 {
		return nil
	}
	keys := make([]string, 0, len(partitions)+len(codes))
	for _, p := range partitions {
		keys = append(keys, partPrefix(p)+"replicated")
	}
	for _, code := range codes {
		// The tag is the record's whole name: the barrier shares its slot.
		keys = append(keys, "{"+registryKey(code)+"}:replicated")
	}
	if err := redisconn.Barrier(ctx, s.rdb, keys, s.waitN, s.waitTimeout); err != nil {
		return fmt.Errorf("%w: %w", err, counter.ErrNotReplicated)
	}
	return nil
}
