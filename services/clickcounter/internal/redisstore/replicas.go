package redisstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/redisconn"
	"github.com/snipdev/snip/services/clickcounter/internal/counter"
)

// WaitForReplicas makes Replicated wait for n replicas of each master it
// asks, for at most timeout; 0 (the default) turns it off. Call it before
// the store is used.
func (s *Store) WaitForReplicas(n int, timeout time.Duration) {
	s.waitN, s.waitTimeout = n, timeout
}

// barrierTTL is how long a replica barrier key lives: long enough to
// outlive its WAIT, short enough that the keys of codes never pile up.
const barrierTTL = time.Minute

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
	// One barrier per master: a write confirmed on a master confirms every
	// earlier write there.
	barriers := keys[:1]
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		barriers = nil
		seen := map[*redis.Client]bool{}
		for _, k := range keys {
			node, err := cc.MasterForKey(ctx, k)
			if err != nil {
				return fmt.Errorf("replica wait: master of %s: %w: %w", k, err, counter.ErrNotReplicated)
			}
			if !seen[node] {
				seen[node] = true
				barriers = append(barriers, k)
			}
		}
	}
	var errs []error
	for _, k := range barriers {
		got, werr, err := redisconn.WriteAndWait(ctx, s.rdb, k, s.waitN, s.waitTimeout, func(p redis.Pipeliner) {
			p.Set(ctx, k, "1", barrierTTL)
		})
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("barrier %s: %w", k, err))
		case werr != nil:
			errs = append(errs, fmt.Errorf("wait after %s: %w", k, werr))
		case got < int64(s.waitN):
			errs = append(errs, fmt.Errorf("after %s: %d of %d replicas within %s", k, got, s.waitN, s.waitTimeout))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("replica wait: %w: %w", errors.Join(errs...), counter.ErrNotReplicated)
	}
	return nil
}
