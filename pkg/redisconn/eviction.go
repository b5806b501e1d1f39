package redisconn

import (
	"context"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"
)

// NoEviction is the only maxmemory-policy under which Redis keeps every
// key Snip writes. Under any other, a full Redis drops keys to make room:
// the allkeys-* policies any key (an outbox entry, a link, a counter's
// record of event IDs, a relay's lease), the volatile-* ones any key with an
// expiry (the records of event IDs, leases, the visitor salt), and with them
// the guarantees that nothing is lost or counted twice. Full under
// noeviction, Redis refuses writes instead, which the services see as
// errors and handle as an outage (the redirect's outbox is bounded below
// that, and its second durable path takes over).
const NoEviction = "noeviction"

// EvictingServers returns, for every server that holds Snip's keys (the
// masters of a cluster), its address and maxmemory-policy where that is
// not NoEviction; empty when none evicts. It needs CONFIG GET, which a
// managed Redis may refuse: that is an error.
func EvictingServers(ctx context.Context, rdb redis.UniversalClient) (map[string]string, error) {
	out := map[string]string{}
	var mu sync.Mutex
	check := func(ctx context.Context, c *redis.Client) error {
		res, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
		if err != nil {
			return fmt.Errorf("config get maxmemory-policy on %s: %w", c.Options().Addr, err)
		}
		if p := res["maxmemory-policy"]; p != NoEviction {
			mu.Lock()
			out[c.Options().Addr] = p
			mu.Unlock()
		}
		return nil
	}
	var err error
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, check)
	case *redis.Client:
		err = check(ctx, c)
	default:
		return nil, fmt.Errorf("check maxmemory-policy: unsupported client %T", rdb)
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}
