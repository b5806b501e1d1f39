package redisconn

import (
	"context"
	"errors"
	"fmt"
	"strings"
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
// wait share one here. The pipeline's replies are awaited for timeout
// more than the client's read timeout, so a wait longer than that timeout
// is waited out rather than cut short (and the pipeline sent again).
func WriteAndWait(ctx context.Context, rdb redis.UniversalClient, key string, replicas int, timeout time.Duration,
	queue func(p redis.Pipeliner)) (acked int64, waitErr, err error) {
	var pipe redis.Pipeliner
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		node, err := c.MasterForKey(ctx, key)
		if err != nil {
			return 0, nil, err
		}
		pipe = outlasting(node, timeout).Pipeline()
	case *redis.Client:
		pipe = outlasting(c, timeout).Pipeline()
	default:
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

// outlasting is c, or c on the same connections with its read (and write)
// timeout longer by wait and by waitSlack, so that a WAIT of wait is
// answered before the client gives up on the reply. go-redis reads a
// pipeline's replies within the client's read timeout whatever the
// commands (its own Wait raises the bound only when sent alone), and a
// pipeline whose replies time out it sends again, writes included: with
// one read timeout of slack (100 ms in a test) a WAIT answered a little
// late on a busy machine had its writes run twice.
func outlasting(c *redis.Client, wait time.Duration) *redis.Client {
	rt := c.Options().ReadTimeout
	if rt <= 0 || wait <= 0 { // no read deadline: nothing cuts the wait short
		return c
	}
	return c.WithTimeout(rt + wait + max(rt, waitSlack))
}

// waitSlack is the least time WriteAndWait waits for WAIT's answer beyond
// its timeout: Redis answers at the timeout, and a reply that has not come
// a second after that is from a server or a connection that is stuck, not
// from one that is slow to be scheduled.
const waitSlack = time.Second

// ErrNotReplicated means the replicas did not confirm a write in time: it
// is on its master alone until they catch up.
var ErrNotReplicated = errors.New("not confirmed by the replicas")

// BarrierTTL is how long a barrier key lives: long enough to outlive its
// WAIT, short enough that barrier keys never pile up.
const BarrierTTL = time.Minute

// BarrierKey names the barrier key of key: in key's slot, beside it. A key
// with a hash tag keeps its tag ("cc:{p1}:meta" -> "cc:{p1}:replicated");
// one without becomes the tag ("cc:link:abc" -> "{cc:link:abc}:replicated").
// Keys with an empty tag or a '}' before any '{' are not supported.
func BarrierKey(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[:i+j+2] + ":replicated"
		}
	}
	return "{" + key + "}:replicated"
}

// Barrier waits until replicas replicas have every write made so far on
// the masters that serve keys (the data written, whose slots the barriers
// share). Per master it writes one barrier key (BarrierKey of one of its
// keys, value 1, BarrierTTL) and sends WAIT on that connection
// (WriteAndWait): a replica that has the barrier has everything its master
// wrote before it, whichever connection wrote it. A WAIT without a write of
// its own would not do: it speaks only for its connection's writes, and for
// none when a retried script wrote nothing. The error wraps
// ErrNotReplicated when a master's replicas fell short or did not answer.
func Barrier(ctx context.Context, rdb redis.UniversalClient, keys []string, replicas int, timeout time.Duration) error {
	if len(keys) == 0 {
		return nil
	}
	barriers := []string{BarrierKey(keys[0])}
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		barriers = nil
		seen := map[*redis.Client]bool{}
		for _, k := range keys {
			node, err := cc.MasterForKey(ctx, k)
			if err != nil {
				return fmt.Errorf("replica barrier: master of %s: %w: %w", k, err, ErrNotReplicated)
			}
			if !seen[node] {
				seen[node] = true
				barriers = append(barriers, BarrierKey(k))
			}
		}
	}
	var errs []error
	for _, k := range barriers {
		got, werr, err := WriteAndWait(ctx, rdb, k, replicas, timeout, func(p redis.Pipeliner) {
			p.Set(ctx, k, "1", BarrierTTL)
		})
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("barrier %s: %w", k, err))
		case werr != nil:
			errs = append(errs, fmt.Errorf("wait after %s: %w", k, werr))
		case got < int64(replicas):
			errs = append(errs, fmt.Errorf("after %s: %d of %d replicas within %s", k, got, replicas, timeout))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("replica barrier: %w: %w", errors.Join(errs...), ErrNotReplicated)
	}
	return nil
}
