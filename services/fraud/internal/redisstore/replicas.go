package redisstore

import (
	"context"
	"time"

	"github.com/snipdev/snip/pkg/redisconn"
)

// WaitForReplicas makes Apply, after its script, wait until n replicas of
// the partition's Redis master have what it wrote, for at most timeout,
// before the batch is acked: a master that dies after the ack then takes
// no statistics or alerts with it. The wait is a barrier: a short-lived key
// written in the partition's slot and WAIT on that connection (Redis
// replicates a master's writes in order, so a replica that has the barrier
// has the script's writes too, and a retried batch whose script wrote
// nothing still waits for the first attempt's). A wait that falls short
// fails nothing; short (if not nil) is told the partition and why
// (redisconn.Barrier's error). 0 turns it off. Call it before the store is used.
func (s *Store) WaitForReplicas(n int, timeout time.Duration, short func(partition int, err error)) {
	s.waitN, s.waitTimeout, s.short = n, timeout, short
}

// replicated is the replica wait after Apply wrote partition p.
func (s *Store) replicated(ctx context.Context, p int) {
	if s.waitN <= 0 {
		return
	}
	err := redisconn.Barrier(ctx, s.rdb, []string{hwmKey(p)}, s.waitN, s.waitTimeout)
	if err != nil && s.short != nil {
		s.short(p, err)
	}
}
