package owners

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/redisconn"
)

// WaitForReplicas makes the store's writes that decide who is let in (an
// owner created, an API key stored, a key revoked) wait until n replicas of
// their Redis master have them (WAIT on the write's own connection), for at
// most timeout. Redis replicates asynchronously: without the wait, a
// revocation its master acknowledged and lost before the replica had it is
// undone by the failover, and the revoked key works again. A wait that
// counts fewer replicas, or fails, fails nothing (the write is on the
// master, as with the wait off); short (if not nil) is told the operation
// (create_owner, store_key, revoke_key), the replicas counted and the
// error. Call it before the store is used.
func (s *Store) WaitForReplicas(n int, timeout time.Duration, short func(op string, got int64, err error)) {
	s.waitN, s.waitTimeout, s.short = n, timeout, short
}

// write sends the commands queue adds, all in key's slot, and with the
// replica wait on, WAIT after them on the same connection to key's master
// (redisconn.WriteAndWait: one wait covers what this call wrote on that
// master before, too). It returns the first command's error, never the
// wait's.
func (s *Store) write(ctx context.Context, op, key string, queue func(p redis.Pipeliner)) error {
	if s.waitN <= 0 {
		_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error { queue(p); return nil })
		return err
	}
	got, werr, err := redisconn.WriteAndWait(ctx, s.rdb, key, s.waitN, s.waitTimeout, queue)
	if err != nil {
		return err
	}
	if (werr != nil || got < int64(s.waitN)) && s.short != nil {
		s.short(op, got, werr)
	}
	return nil
}
