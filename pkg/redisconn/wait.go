package redisconn

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// WriteAndWait sends the commands queue adds, all in key's slot, on one
// connection to the master that serves key (rdb itself for a single
// server), followed on that connection by WAIT replicas timeout. It returns
// the first command's error (redis.Nil aside), and what WAIT answered: the
// replicas that acknowledged, and its error. Redis replicates each master's
// writes in order, so a replica that has the last write on a master has
// every earlier write there, from any connection: one WriteAndWait after a
// series of writes on one master speaks for all of them. WAIT speaks only
// for the writes of its own connection, which is why the writes and the
// wait share one here.
func WriteAndWait(ctx context.Context, rdb redis.UniversalClient, key string, replicas int, timeout time.Duration,
	queue func(p redis.Pipeliner)) (acked int64, waitErr, err error) {
	var pipe redis.Pipeliner
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		node, err := cc.MasterForKey(ctx, key)
		if err != nil {
			return 0, nil, err
		}
		pipe = node.Pipeline()
	} else {
		pipe = rdb.Pipeline()
	}
	queue(pipe)
	wait := redis.NewIntCmd(ctx, "wait", replicas, timeout.Milliseconds())
	_ = pipe.Process(ctx, wait)
	cmds, _ := pipe.Exec(ctx)
	for _, c := range cmds {
		if c == wait {
			continue
		}
		if err := c.Err(); err != nil && !errors.Is(err, redis.Nil) {
			return 0, nil, err
		}
	}
	acked, waitErr = wait.Result()
	return acked, waitErr, nil
}
