package redisstore

import (
	"context"
	"time"

	"github.com/snipdev/snip/pkg/redisconn"
)

// WaitForReplicas makes Replicated wait for n replicas of each master it
// asks, for at most timeout; 0 (the default) turns it off. Call it before
// the store is used.
func (s *Store) WaitForReplicas(n int, timeout time.Duration) {
	s.waitN, s.waitTimeout = n, timeout
}

// Replicated waits until the replicas have every write made so far on the
// Redis masters that hold the given partitions' keys and the given codes'
// LINKS records (redisconn.Barrier: per master, one short-lived barrier key
// in the slot of one of them, then WAIT on that connection). It returns an
// error wrapping redisconn.ErrNotReplicated when a master's replicas fell
// short or did not answer; nil at once when the wait is off.
func (s *Store) Replicated(ctx context.Context, partitions []int, codes []string) error {
	if s.waitN <= 0 || len(partitions)+len(codes) == 0 {
		return nil
	}
	keys := make([]string, 0, len(partitions)+len(codes))
	for _, p := range partitions {
		keys = append(keys, metaKey(p))
	}
	for _, code := range codes {
		keys = append(keys, registryKey(code))
	}
	return redisconn.Barrier(ctx, s.rdb, keys, s.waitN, s.waitTimeout)
}
