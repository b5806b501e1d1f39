package owners

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
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

// write sends the commands queue adds, all on key's slot, on one
// connection to key's master, then (with the replica wait on) WAIT on the
// same connection: a replica that has the last write on a master has every
// earlier one, so one wait covers what this call wrote there before too.
// It returns the first command's error, never the wait's.
func (s *Store) write(ctx context.Context, op, key string, queue func(p redis.Pipeliner)) error {
	if s.waitN <= 0 {
		_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error { queue(p); return nil })
		return err
	}
	var pipe redis.Pipeliner
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		node, err := cc.MasterForKey(ctx, key)
		if err != nil {
			return err
		}
		pipe = node.Pipeline()
	} else {
		pipe = s.rdb.Pipeline()
	}
	queue(pipe)
	wait := redis.NewIntCmd(ctx, "wait", s.waitN, s.waitTimeout.Milliseconds())
	_ = pipe.Process(ctx, wait)
	cmds, _ := pipe.Exec(ctx)
	for _, c := range cmds {
		if c == wait {
			continue
		}
		if err := c.Err(); err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
	}
	if got, err := wait.Result(); (err != nil || got < int64(s.waitN)) && s.short != nil {
		s.short(op, got, err)
	}
	return nil
}
