package testenv

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/topology"
)

// NATSCluster is a JetStream cluster of three nats-server child processes on
// loopback, with routes between all of them. Nodes are real processes (not
// embedded servers) so a test can SIGKILL or SIGSTOP one, as a crash or a hung
// machine would: an embedded server can only be shut down politely, which
// hands its leaderships over first and hides the election a crash causes.
type NATSCluster struct {
	Nodes []*NATSNode
	// URL lists every node's client URL, comma-separated, as services take
	// it in NATS_URL.
	URL string
}

// NATSNode is one server of a NATSCluster. Its ports and store survive Kill
// and Start.
type NATSNode struct {
	proc process
	// Name is the server name, as StreamInfo's Cluster.Leader reports it.
	Name string
	// URL is the node's client URL.
	URL string
	// Monitor is the node's HTTP monitoring address (host:port).
	Monitor string
}

const natsNodeConfig = `server_name: %[1]s
listen: 127.0.0.1:%[2]d
http: 127.0.0.1:%[3]d
max_payload: 1MB
jetstream {
  store_dir: %[4]q
  max_memory_store: 1GB
  max_file_store: 8GB
}
`

const natsClusterBlock = `cluster {
  name: %s
  listen: 127.0.0.1:%d
  routes: [%s]
}
`

var natsBin struct {
	once sync.Once
	path string
	err  error
}

// NATSServerBinary returns the path of a nats-server binary of the version
// the module requires: $SNIP_NATS_SERVER if set, else one built once with
// `go build` from the module cache (offline) and kept in the temporary folder
// for later test binaries.
func NATSServerBinary() (string, error) {
	natsBin.once.Do(func() {
		if p := os.Getenv("SNIP_NATS_SERVER"); p != "" {
			natsBin.path = p
			return
		}
		p := filepath.Join(os.TempDir(), "snip-nats-server-"+server.VERSION)
		if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
			natsBin.path = p
			return
		}
		tmp := fmt.Sprintf("%s.%d.tmp", p, os.Getpid())
		gocmd := "go"
		if _, err := exec.LookPath(gocmd); err != nil {
			// `go test` run by absolute path, with no go on PATH.
			gocmd = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		out, err := exec.Command(gocmd, "build", "-o", tmp, "github.com/nats-io/nats-server/v2").CombinedOutput()
		if err != nil {
			natsBin.err = fmt.Errorf("build nats-server %s (needs the go command and the module cache; or set SNIP_NATS_SERVER): %v: %s",
				server.VERSION, err, out)
			return
		}
		if err := os.Rename(tmp, p); err != nil {
			natsBin.err = fmt.Errorf("install nats-server binary: %w", err)
			return
		}
		natsBin.path = p
	})
	return natsBin.path, natsBin.err
}

// NewNATSCluster starts three nats-servers with their stores under dir and
// waits until every node is healthy and the cluster has a JetStream meta
// leader. The caller closes it.
func NewNATSCluster(dir string) (*NATSCluster, error) { return retryNATS(dir, 3) }

// NewNATSProcess starts one nats-server process with JetStream and no
// cluster, in the NATSCluster shape (one node), for comparisons with a
// cluster on the same machine.
func NewNATSProcess(dir string) (*NATSCluster, error) { return retryNATS(dir, 1) }

// retryNATS starts the nodes, and once more on new ports if they do not
// become healthy: another process can take a port between FreePort and the
// server's bind.
func retryNATS(dir string, n int) (*NATSCluster, error) {
	c, err := newNATSNodes(filepath.Join(dir, "a"), n)
	if err == nil {
		return c, nil
	}
	c, err2 := newNATSNodes(filepath.Join(dir, "b"), n)
	if err2 != nil {
		return nil, fmt.Errorf("%w; and on new ports: %w", err, err2)
	}
	return c, nil
}

func newNATSNodes(dir string, n int) (*NATSCluster, error) {
	bin, err := NATSServerBinary()
	if err != nil {
		return nil, err
	}
	ports := make([]int, 0, 3*n)
	for range 3 * n {
		p, err := FreePort()
		if err != nil {
			return nil, err
		}
		ports = append(ports, p)
	}
	routes := make([]string, n)
	for i := range n {
		routes[i] = fmt.Sprintf("nats-route://127.0.0.1:%d", ports[3*i+2])
	}
	c := &NATSCluster{}
	clusterName := fmt.Sprintf("snip-test-%d-%d", os.Getpid(), ports[0])
	urls := make([]string, n)
	for i := range n {
		name := "n" + strconv.Itoa(i+1)
		client, mon, route := ports[3*i], ports[3*i+1], ports[3*i+2]
		nd := filepath.Join(dir, name)
		if err := os.MkdirAll(nd, 0o755); err != nil {
			return nil, err
		}
		cfg := filepath.Join(nd, "nats.conf")
		body := fmt.Sprintf(natsNodeConfig, name, client, mon, filepath.Join(nd, "jetstream"))
		if n > 1 {
			// A name of its own, so a route that reaches another test's
			// cluster (a port reused) is refused rather than merged.
			body += fmt.Sprintf(natsClusterBlock, clusterName, route, strings.Join(routes, ", "))
		}
		if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
			return nil, fmt.Errorf("write nats config: %w", err)
		}
		node := &NATSNode{
			Name:    name,
			URL:     "nats://127.0.0.1:" + strconv.Itoa(client),
			Monitor: "127.0.0.1:" + strconv.Itoa(mon),
			proc:    process{name: "nats-" + name, bin: bin, dir: nd, args: []string{"-c", cfg}},
		}
		urls[i] = node.URL
		c.Nodes = append(c.Nodes, node)
	}
	c.URL = strings.Join(urls, ",")
	for _, node := range c.Nodes {
		if err := node.proc.start(); err != nil {
			c.Close()
			return nil, err
		}
	}
	err = c.WaitHealthy(60 * time.Second)
	if err == nil && n > 1 {
		err = c.waitPlaceable(60 * time.Second)
	}
	if err != nil {
		var logs strings.Builder
		for _, node := range c.Nodes {
			fmt.Fprintf(&logs, "\n--- %s (exited: %v):\n%s", node.Name, node.proc.exited(), node.proc.tailLog())
		}
		c.Close()
		return nil, fmt.Errorf("%w; every node's log:%s", err, logs.String())
	}
	return c, nil
}

// StartNATSCluster starts a three-node cluster for one test and stops it at
// the end.
func StartNATSCluster(tb testing.TB) *NATSCluster {
	tb.Helper()
	c, err := NewNATSCluster(tb.TempDir())
	if err != nil {
		tb.Fatalf("testenv: nats cluster: %v", err)
	}
	tb.Cleanup(c.Close)
	return c
}

// WaitHealthy waits until every running node answers /healthz (JetStream up
// and current with the meta group) and JetStream answers an account request
// (a meta leader is elected).
func (c *NATSCluster) WaitHealthy(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for _, node := range c.Nodes {
		if node.proc.exited() {
			continue
		}
		if err := node.proc.waitReady(time.Until(deadline), node.healthy); err != nil {
			return err
		}
	}
	return nil
}

func (n *NATSNode) healthy() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+n.Monitor+"/healthz", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s /healthz: %s", n.Name, resp.Status)
	}
	nc, js, err := connectJetStream(n.URL)
	if err != nil {
		return err
	}
	defer nc.Close()
	_, err = js.AccountInfo(ctx)
	return err
}

// connectJetStream connects to url for one check; the caller closes nc.
func connectJetStream(url string) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(url, nats.Timeout(time.Second))
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// waitPlaceable waits until the cluster can place a stream with a replica
// on every node. /healthz says each node is up and current with the meta
// group, but the meta leader places only on peers whose statistics it has
// heard, which can come a few seconds later (topology.NoPeersYet); a test
// that creates an R3 stream at once would fail on a slow machine.
func (c *NATSCluster) waitPlaceable(timeout time.Duration) error {
	nc, js, err := connectJetStream(c.URL)
	if err != nil {
		return err
	}
	defer nc.Close()
	const probe = "TESTENV_PLACEMENT"
	return c.Nodes[0].proc.waitReady(timeout, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{
			Name: probe, Subjects: []string{"testenv.placement"}, Storage: jetstream.MemoryStorage, Replicas: len(c.Nodes),
		})
		if err != nil {
			return fmt.Errorf("a stream with %d replicas: %w", len(c.Nodes), err)
		}
		return js.DeleteStream(ctx, probe)
	})
}

// ApplyTopology applies o on the cluster (topology.Apply), again while
// JetStream answers that it has no peers to place a replicated asset on
// (topology.NoPeersYet: a fresh cluster's meta leader that has not heard a
// peer's statistics yet), for up to a minute; any other error fails tb.
func (c *NATSCluster) ApplyTopology(tb testing.TB, js jetstream.JetStream, o topology.Options) {
	tb.Helper()
	logged := false
	WaitFor(tb, time.Minute, "the topology applied on the cluster", func() bool {
		err := topology.Apply(tb.Context(), js, o)
		if err != nil && !topology.NoPeersYet(err) {
			tb.Fatal(err)
		}
		if err != nil && !logged {
			tb.Logf("topology: %v; again until the cluster places it", err)
			logged = true
		}
		return err == nil
	})
}

// Close stops every node for good.
func (c *NATSCluster) Close() {
	var wg sync.WaitGroup
	for _, n := range c.Nodes {
		wg.Go(func() {
			n.proc.resume()
			n.proc.stop(10 * time.Second)
		})
	}
	wg.Wait()
}

// Connect opens a client connection to all nodes that reconnects forever and
// closes it when the test ends.
func (c *NATSCluster) Connect(tb testing.TB, opts ...nats.Option) *nats.Conn {
	tb.Helper()
	return connect(tb, c.URL, opts...)
}

// JetStream returns a JetStream context on a new connection to the cluster.
func (c *NATSCluster) JetStream(tb testing.TB) jetstream.JetStream {
	tb.Helper()
	return newJetStream(tb, c.Connect(tb))
}

// Node returns the node called name, or nil.
func (c *NATSCluster) Node(name string) *NATSNode {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// ErrNoLeader is returned by StreamLeader while a stream has no leader.
var ErrNoLeader = errors.New("no leader")

// StreamLeader returns the node that leads stream, as the cluster reports it.
func (c *NATSCluster) StreamLeader(ctx context.Context, js jetstream.JetStream, stream string) (*NATSNode, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, err
	}
	info := s.CachedInfo()
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return nil, fmt.Errorf("stream %s: %w", stream, ErrNoLeader)
	}
	if n := c.Node(info.Cluster.Leader); n != nil {
		return n, nil
	}
	return nil, fmt.Errorf("stream %s: leader %q is not a node of this cluster", stream, info.Cluster.Leader)
}

// ConsumerLeader returns the node that leads a durable consumer.
func (c *NATSCluster) ConsumerLeader(ctx context.Context, js jetstream.JetStream, stream, consumer string) (*NATSNode, error) {
	cons, err := js.Consumer(ctx, stream, consumer)
	if err != nil {
		return nil, err
	}
	info := cons.CachedInfo()
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return nil, fmt.Errorf("consumer %s: %w", consumer, ErrNoLeader)
	}
	if n := c.Node(info.Cluster.Leader); n != nil {
		return n, nil
	}
	return nil, fmt.Errorf("consumer %s: leader %q is not a node of this cluster", consumer, info.Cluster.Leader)
}

// Kill is kill -9: the node loses what it had not written, its peers elect
// new leaders for what it led.
func (n *NATSNode) Kill() { n.proc.kill() }

// Stop shuts the node down gracefully (SIGTERM).
func (n *NATSNode) Stop() { n.proc.stop(20 * time.Second) }

// Start starts a stopped or killed node again with its store and waits until
// it is healthy.
func (n *NATSNode) Start() error {
	if err := n.proc.start(); err != nil {
		return err
	}
	return n.proc.waitReady(60*time.Second, n.healthy)
}

// Pause freezes the node (SIGSTOP); Resume thaws it.
func (n *NATSNode) Pause()  { n.proc.pause() }
func (n *NATSNode) Resume() { n.proc.resume() }

// PID is the node's process ID, 0 when it is not running.
func (n *NATSNode) PID() int { return n.proc.pid() }

// Running reports whether the node's process is running.
func (n *NATSNode) Running() bool { return !n.proc.exited() }
