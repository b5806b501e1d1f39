package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// portArg in newRedisServer's extra arguments stands for a free port.
const portArg = "{free-port}"

// RedisClusterNodeTimeout is the cluster-node-timeout of test clusters: a
// master silent this long is marked failed and its replica is promoted.
const RedisClusterNodeTimeout = 1500 * time.Millisecond

// RedisCluster is a Redis Cluster of three masters with one replica each:
// six redis-server child processes on loopback, all 16384 slots assigned
// (about a third to each master), each replica attached to its master.
type RedisCluster struct {
	// Masters[i]'s replica is Replicas[i] when the cluster starts; a
	// failover swaps their roles (Master finds the current one).
	Masters  []*RedisServer
	Replicas []*RedisServer
	// IDs are the nodes' cluster IDs by address.
	IDs map[string]string
}

// NewRedisCluster starts the six servers with their data under dir, forms the
// cluster and waits until every node reports cluster_state:ok and every
// replica is in sync. The caller closes it.
func NewRedisCluster(dir string) (*RedisCluster, error) {
	c := &RedisCluster{IDs: map[string]string{}}
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		errs []error
	)
	servers := make([]*RedisServer, 6)
	for i := range servers {
		wg.Go(func() {
			d := filepath.Join(dir, "node"+strconv.Itoa(i))
			if err := os.MkdirAll(d, 0o755); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
				return
			}
			r, err := newRedisServer(d, []string{
				"--cluster-enabled", "yes",
				"--cluster-config-file", "nodes.conf",
				"--cluster-node-timeout", strconv.Itoa(int(RedisClusterNodeTimeout.Milliseconds())),
				"--cluster-port", portArg,
				// A master waits this long for more replicas before a
				// diskless full sync (5 s by default): the longest part of
				// forming a test cluster.
				"--repl-diskless-sync-delay", "0",
				// CLUSTER SLOTS lists a replica only once its replication
				// offset is above 0, which on an idle master takes the
				// master's next PING to its replicas (every 10 s by default).
				"--repl-ping-replica-period", "1",
			})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			servers[i] = r
		})
	}
	wg.Wait()
	c.Masters, c.Replicas = servers[:3], servers[3:]
	if len(errs) > 0 {
		c.Close()
		return nil, fmt.Errorf("redis cluster: %v", errs[0])
	}
	if err := c.form(); err != nil {
		c.Close()
		return nil, fmt.Errorf("redis cluster: %w", err)
	}
	return c, nil
}

// StartRedisCluster starts a Redis Cluster for one test (or a package's tests,
// one at a time) and stops it at the end.
func StartRedisCluster(tb testing.TB) *RedisCluster {
	tb.Helper()
	c, err := NewRedisCluster(tb.TempDir())
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	tb.Cleanup(c.Close)
	return c
}

func (c *RedisCluster) all() []*RedisServer {
	return append(append([]*RedisServer{}, c.Masters...), c.Replicas...)
}

func node(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, DialTimeout: time.Second, ReadTimeout: 2 * time.Second})
}

// clusterPort is the node's cluster bus port, from its arguments.
func (r *RedisServer) clusterPort() string {
	for i, a := range r.proc.args {
		if a == "--cluster-port" && i+1 < len(r.proc.args) {
			return r.proc.args[i+1]
		}
	}
	return ""
}

func (c *RedisCluster) form() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	all := c.all()
	clients := make([]*redis.Client, len(all))
	for i, s := range all {
		clients[i] = node(s.Addr)
		defer clients[i].Close()
		id, err := clients[i].ClusterMyID(ctx).Result()
		if err != nil {
			return fmt.Errorf("%s cluster myid: %w", s.Addr, err)
		}
		c.IDs[s.Addr] = id
	}
	const slots = 16384
	for i := range 3 {
		lo, hi := i*slots/3, (i+1)*slots/3-1
		if err := clients[i].Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			return fmt.Errorf("%s addslotsrange %d-%d: %w", all[i].Addr, lo, hi, err)
		}
		// Distinct epochs, so no collision has to be resolved before the
		// cluster is ok.
		if err := clients[i].Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
			return fmt.Errorf("%s set-config-epoch: %w", all[i].Addr, err)
		}
	}
	host, port, _ := net.SplitHostPort(all[0].Addr)
	for i := 1; i < len(all); i++ {
		if err := clients[i].Do(ctx, "CLUSTER", "MEET", host, port, all[0].clusterPort()).Err(); err != nil {
			return fmt.Errorf("%s cluster meet: %w", all[i].Addr, err)
		}
	}
	// Every node must know every other before a replica can name its master.
	// Gossip spreads what each node learnt from its MEET with the first one,
	// but a handshake that times out on a loaded machine can leave a node
	// without one of the others for good: a node found missing some is
	// introduced to them again (at most once a second), also while it shows
	// an entry in handshake or without an address (a MEET to an address
	// whose handshake is under way is a no-op). Waiting while such an entry
	// showed was the one way this loop stopped introducing a node, and a CI
	// run had a node knowing 5 of 6 until the deadline.
	lastMeet := make([]time.Time, len(all))
	if err := poll(ctx, "every node to know all six", func() error {
		for i, cl := range clients {
			nodes, err := cl.ClusterNodes(ctx).Result()
			if err != nil {
				return err
			}
			known := map[string]bool{}
			for line := range strings.SplitSeq(strings.TrimSpace(nodes), "\n") {
				f := strings.Fields(line)
				if len(f) < 3 {
					continue
				}
				if strings.Contains(f[2], "handshake") || strings.Contains(f[2], "noaddr") {
					continue
				}
				known[strings.SplitN(f[1], "@", 2)[0]] = true
			}
			if len(known) == len(all) {
				continue
			}
			if time.Since(lastMeet[i]) > time.Second {
				lastMeet[i] = time.Now()
				for _, other := range all {
					if known[other.Addr] {
						continue
					}
					h, p, _ := net.SplitHostPort(other.Addr)
					if err := cl.Do(ctx, "CLUSTER", "MEET", h, p, other.clusterPort()).Err(); err != nil {
						return fmt.Errorf("%s cluster meet %s: %w", all[i].Addr, other.Addr, err)
					}
				}
			}
			return fmt.Errorf("%s knows %d of %d nodes", all[i].Addr, len(known), len(all))
		}
		return nil
	}); err != nil {
		return err
	}
	for i, r := range c.Replicas {
		master := c.IDs[c.Masters[i].Addr]
		if err := clients[3+i].ClusterReplicate(ctx, master).Err(); err != nil {
			return fmt.Errorf("%s cluster replicate %s: %w", r.Addr, master, err)
		}
	}
	return c.waitOK(ctx)
}

// WaitHealthy waits up to timeout until every running node reports
// cluster_state:ok with three masters serving all slots, each with a replica
// whose link is up. After a failover the promoted replica has no replica
// until its old master comes back; WaitHealthy then waits for that.
func (c *RedisCluster) WaitHealthy(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return c.waitOK(ctx)
}

func (c *RedisCluster) waitOK(ctx context.Context) error {
	return poll(ctx, "redis cluster ok with 3 masters and 3 replicas in sync", func() error {
		masters, replicas := 0, 0
		for _, s := range c.all() {
			cl := node(s.Addr)
			info, err := cl.ClusterInfo(ctx).Result()
			if err != nil {
				cl.Close()
				return fmt.Errorf("%s: %w", s.Addr, err)
			}
			if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_slots_ok:16384") {
				cl.Close()
				return fmt.Errorf("%s: cluster not ok", s.Addr)
			}
			slots, err := cl.ClusterSlots(ctx).Result()
			if err != nil {
				cl.Close()
				return fmt.Errorf("%s: %w", s.Addr, err)
			}
			for _, r := range slots {
				if len(r.Nodes) != 2 {
					cl.Close()
					return fmt.Errorf("%s: slots %d-%d served by %d nodes", s.Addr, r.Start, r.End, len(r.Nodes))
				}
			}
			repl, err := cl.Info(ctx, "replication").Result()
			cl.Close()
			if err != nil {
				return fmt.Errorf("%s: %w", s.Addr, err)
			}
			switch {
			case strings.Contains(repl, "role:master"):
				masters++
			case strings.Contains(repl, "master_link_status:up"):
				replicas++
			default:
				return fmt.Errorf("%s: replica not in sync", s.Addr)
			}
		}
		if masters != 3 || replicas != 3 {
			return fmt.Errorf("%d masters and %d replicas in sync", masters, replicas)
		}
		return nil
	})
}

// poll retries check every 25ms until it succeeds or ctx ends.
func poll(ctx context.Context, what string, check func() error) error {
	t := time.NewTicker(25 * time.Millisecond)
	defer t.Stop()
	for {
		err := check()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("timed out waiting for %s: %v", what, err)
		case <-t.C:
		}
	}
}

// Addrs lists every node's address, masters first.
func (c *RedisCluster) Addrs() []string {
	var out []string
	for _, s := range c.all() {
		out = append(out, s.Addr)
	}
	return out
}

// URL is the redis+cluster:// URL services take in REDIS_URL.
func (c *RedisCluster) URL() string {
	return "redis+cluster://" + strings.Join(c.Addrs(), ",")
}

// Client returns a cluster client that follows redirections and failovers,
// flushes every master first, and closes the client when the test ends.
// Tests sharing one cluster must not run in parallel with each other.
func (c *RedisCluster) Client(tb testing.TB) *redis.ClusterClient {
	tb.Helper()
	cl := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:        c.Addrs(),
		MaxRedirects: 16,
		// As pkg/redisconn: see a failover within a second.
		ClusterStateReloadInterval: time.Second,
	})
	err := cl.ForEachMaster(tb.Context(), func(ctx context.Context, m *redis.Client) error {
		return m.FlushAll(ctx).Err()
	})
	if err != nil {
		cl.Close()
		tb.Fatalf("testenv: redis cluster flush: %v", err)
	}
	tb.Cleanup(func() { _ = cl.Close() })
	return cl
}

// slotNodes returns the nodes that serve key's slot now, master first,
// as a live node of the cluster sees them.
func (c *RedisCluster) slotNodes(ctx context.Context, key string) ([]redis.ClusterNode, error) {
	for _, s := range c.all() {
		if s.proc.exited() {
			continue
		}
		cl := node(s.Addr)
		slots, err := cl.ClusterSlots(ctx).Result()
		slot, err2 := cl.ClusterKeySlot(ctx, key).Result()
		cl.Close()
		if err != nil || err2 != nil {
			continue
		}
		for _, r := range slots {
			if int64(r.Start) <= slot && slot <= int64(r.End) && len(r.Nodes) > 0 {
				return r.Nodes, nil
			}
		}
	}
	return nil, fmt.Errorf("no node serves the slot of %q", key)
}

// MasterOf returns the server that currently serves key's slot as master.
func (c *RedisCluster) MasterOf(ctx context.Context, key string) (*RedisServer, error) {
	nodes, err := c.slotNodes(ctx, key)
	if err != nil {
		return nil, err
	}
	return c.server(nodes[0].Addr)
}

// ReplicaClient returns a read-only client (READONLY on every connection)
// on a replica of the master that serves key's slot, closed when the test
// ends: what a promoted replica would have.
func (c *RedisCluster) ReplicaClient(tb testing.TB, key string) *redis.Client {
	tb.Helper()
	nodes, err := c.slotNodes(tb.Context(), key)
	if err != nil || len(nodes) < 2 {
		tb.Fatalf("testenv: no replica serves the slot of %q (%v)", key, err)
	}
	rc := redis.NewClient(&redis.Options{Addr: nodes[1].Addr,
		OnConnect: func(ctx context.Context, cn *redis.Conn) error { return cn.ReadOnly(ctx).Err() }})
	tb.Cleanup(func() { _ = rc.Close() })
	return rc
}

func (c *RedisCluster) server(addr string) (*RedisServer, error) {
	for _, s := range c.all() {
		if s.Addr == addr {
			return s, nil
		}
	}
	return nil, fmt.Errorf("%s is not a node of this cluster", addr)
}

// Close stops every node for good.
func (c *RedisCluster) Close() {
	var wg sync.WaitGroup
	for _, s := range c.all() {
		if s != nil {
			wg.Go(s.Close)
		}
	}
	wg.Wait()
}
