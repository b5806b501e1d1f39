package redisstore

import (
	"context"
	"time"

	"github.com/snipdev/snip/pkg/redisconn"
)

// WaitForReplicas makes Enqueue, Put and Update, after their writes, wait
// until n replicas of each Redis master they wrote to have them, for at
// most timeout (redisconn.Barrier: a short-lived key written in the slot of
// each, then WAIT): the intake then acks a CLICKS batch only once its
// queued events are on a replica, and an endpoint created or its secret
// rotated is not undone by a failover. A wait that falls short fails
// nothing; short (if not nil) is told the operation (enqueue, put, update)
// and why. 0 turns it off. Call it before the store is used.
func (s *Store) WaitForReplicas(n int, timeout time.Duration, short func(op string, err error)) {
	s.waitN, s.waitTimeout, s.short = n, timeout, short
}

// replicated is the replica wait after op wrote to keys.
func (s *Store) replicated(ctx context.Context, op string, keys []string) {
	if s.waitN <= 0 || len(keys) == 0 {
		return
	}
	if err := redisconn.Barrier(ctx, s.rdb, keys, s.waitN, s.waitTimeout); err != nil && s.short != nil {
		s.short(op, err)
	}
}
