package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/snipdev/snip/pkg/testenv"
)

// clusterReplicas is the streams' replication factor in the cluster demo:
// every stream on all three NATS nodes.
const clusterReplicas = 3

// demoCluster is what `snipctl demo --cluster` runs instead of one NATS and
// one Redis: three nats-server processes with routes and JetStream, and a
// Redis Cluster of three masters with a replica each, started by the same
// pkg/testenv code the cluster tests use. Nodes are processes of their own,
// so a user can kill or freeze one with kill(1) and watch the system go on.
type demoCluster struct {
	nats  *testenv.NATSCluster
	redis *testenv.RedisCluster

	mu sync.Mutex
	// down holds the nodes seen dead, by name, with the PID they had.
	down map[string]int
}

// clusterNode is one node of either cluster as the demo reports it.
type clusterNode struct {
	name    string // "nats n1", "redis 127.0.0.1:6379"
	pid     func() int
	running func() bool
	start   func() error
}

// startCluster starts both clusters under dir/cluster, emptied first: the
// starters pick free ports each run, and a node's stored cluster state
// names the ports of the last run.
func (d *demo) startCluster() (*demoCluster, error) {
	root, _ := filepath.Abs(filepath.Join(d.dir, "cluster"))
	if err := os.RemoveAll(root); err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	d.logf("starting a 3-node NATS cluster and a Redis Cluster (3 masters, 3 replicas) in %s...", root)
	nc, err := testenv.NewNATSCluster(filepath.Join(root, "nats"))
	if err != nil {
		return nil, fmt.Errorf("demo: nats cluster: %w", err)
	}
	rc, err := testenv.NewRedisCluster(filepath.Join(root, "redis"))
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("demo: redis cluster: %w", err)
	}
	d.natsURL, d.redisURL = nc.URL, rc.URL()
	d.env.Cfg.Replicas = clusterReplicas
	d.logf("nats         %s (3 nodes, streams with %d replicas)", d.natsURL, clusterReplicas)
	d.logf("redis        %s", d.redisURL)
	return &demoCluster{nats: nc, redis: rc, down: map[string]int{}}, nil
}

func (c *demoCluster) nodes() []clusterNode {
	var out []clusterNode
	for _, n := range c.nats.Nodes {
		out = append(out, clusterNode{name: "nats " + n.Name, pid: n.PID, running: n.Running, start: n.Start})
	}
	for _, r := range append(append([]*testenv.RedisServer{}, c.redis.Masters...), c.redis.Replicas...) {
		out = append(out, clusterNode{name: "redis " + r.Addr, pid: r.PID, running: r.Running, start: r.Start})
	}
	return out
}

// Close stops every node, frozen ones included.
func (c *demoCluster) Close() {
	c.nats.Close()
	c.redis.Close()
}

// clusterBanner lists every node with its PID and ports, and how to crash,
// freeze and restart one.
func (d *demo) clusterBanner(c *demoCluster) {
	var b strings.Builder
	b.WriteString("\n  the cluster: kill or freeze any node and watch the system go on.\n")
	for _, n := range c.nats.Nodes {
		fmt.Fprintf(&b, "    nats %-3s  pid %-7d client %s  monitoring http://%s\n", n.Name, n.PID(), n.URL, n.Monitor)
	}
	for i, r := range c.redis.Masters {
		fmt.Fprintf(&b, "    redis      pid %-7d %s master   (replica: %s)\n", r.PID(), r.Addr, c.redis.Replicas[i].Addr)
	}
	for i, r := range c.redis.Replicas {
		fmt.Fprintf(&b, "    redis      pid %-7d %s replica  (of %s)\n", r.PID(), r.Addr, c.redis.Masters[i].Addr)
	}
	fmt.Fprintf(&b, `
    kill -9 PID           crash a node: NATS elects new stream leaders, a Redis replica
                          takes over its master's slots (about 2 s); the services reconnect
    kill -STOP PID        freeze a node, as a hung machine; kill -CONT PID thaws it
    kill -USR1 %d    start every crashed node again, with its data
    %s    who leads each stream (any live node's monitoring)
    redis-cli -p %s cluster nodes                          who is master of what`,
		os.Getpid(), leadersCommand(c.nats.Nodes[0].Monitor), strings.TrimPrefix(c.redis.Masters[0].Addr, "127.0.0.1:"))
	d.logf("%s", b.String())
}

// leadersCommand is the shell line the banner gives to see who leads each
// stream, from the NATS node whose monitoring listens at monitor: each
// stream's name is two lines above its "cluster" object in /jsz, and the
// leader three lines into it.
func leadersCommand(monitor string) string {
	return fmt.Sprintf(`curl -s http://%s/jsz?streams=1 | grep -B2 -A3 '"cluster"'`, monitor)
}

// watchCluster says on the terminal when a node dies, and starts every dead
// node again on SIGUSR1. The demo does not restart nodes by itself: the
// point is to watch the system run without one.
func (d *demo) watchCluster(ctx context.Context, c *demoCluster) {
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	defer signal.Stop(usr1)
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.noteDead(d)
		case <-usr1:
			c.noteDead(d)
			c.restartDead(d)
		}
	}
}

// noteDead reports each node that died since the last look.
func (c *demoCluster) noteDead(d *demo) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.nodes() {
		if _, seen := c.down[n.name]; seen || n.running() {
			continue
		}
		c.down[n.name] = n.pid()
		d.logf("%-12s DOWN (pid %d): the cluster goes on without it; kill -USR1 %d starts it again", n.name, n.pid(), os.Getpid())
	}
}

// restartDead starts every dead node again and waits until each is healthy.
func (c *demoCluster) restartDead(d *demo) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.down) == 0 {
		d.logf("SIGUSR1: every cluster node is running; nothing to restart")
		return
	}
	var wg sync.WaitGroup
	for _, n := range c.nodes() {
		if _, dead := c.down[n.name]; !dead {
			continue
		}
		wg.Go(func() {
			d.logf("%-12s restarting...", n.name)
			if err := n.start(); err != nil {
				d.logf("%-12s did not restart: %v", n.name, err)
				return
			}
			d.logf("%-12s restarted (pid %d)", n.name, n.pid())
		})
	}
	wg.Wait()
	for _, n := range c.nodes() {
		if n.running() {
			delete(c.down, n.name)
		}
	}
}
