package testenv

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NATS is an embedded nats-server with JetStream. It keeps its port and
// store across Stop and Start, so a test can take NATS away and bring it back
// with its data.
type NATS struct {
	tb   testing.TB
	mu   sync.Mutex
	opts server.Options
	srv  *server.Server
	// URL is the client URL, stable across restarts.
	URL string
}

// StartNATS starts an embedded JetStream server on a free port with its store
// under tb.TempDir(), and shuts it down when the test ends.
func StartNATS(tb testing.TB) *NATS {
	tb.Helper()
	// The server picks its port when it binds (a port found free and bound
	// later can be taken in between by another test binary, and the server
	// then never becomes ready); restarts reuse the port it got.
	n := &NATS{
		tb:   tb,
		opts: NATSOptions(server.RANDOM_PORT, filepath.Join(tb.TempDir(), "jetstream")),
	}
	n.Start()
	tb.Cleanup(n.Stop)
	addr, ok := n.Server().Addr().(*net.TCPAddr)
	if !ok {
		tb.Fatalf("testenv: nats: listening on %v, not TCP", n.Server().Addr())
	}
	n.opts.Port = addr.Port
	n.URL = "nats://127.0.0.1:" + strconv.Itoa(addr.Port)
	return n
}

// Start starts the server (again) on the same port and store.
func (n *NATS) Start() {
	n.tb.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.srv != nil {
		return
	}
	srv, err := RunNATSServer(n.opts)
	if err != nil {
		n.tb.Fatalf("testenv: %v", err)
	}
	n.srv = srv
}

// NATSOptions are the options of Snip's embedded test server: loopback only,
// JetStream on with its store in storeDir, no logs, no signal handlers.
// Tools that run real components outside a test (snipctl scenario) use it
// with RunNATSServer.
func NATSOptions(port int, storeDir string) server.Options {
	return server.Options{
		ServerName: "snip-test",
		Host:       "127.0.0.1",
		Port:       port,
		NoLog:      true,
		NoSigs:     true,
		JetStream:  true,
		StoreDir:   storeDir,
		// Room for the message IDs of large duplicate windows in load tests.
		JetStreamMaxMemory: 1 << 30,
		JetStreamMaxStore:  8 << 30,
	}
}

// RunNATSServer starts an embedded server with a copy of opts and waits until
// it accepts connections. The caller shuts it down.
func RunNATSServer(opts server.Options) (*server.Server, error) {
	srv, err := server.NewServer(&opts) // the server keeps and mutates its options
	if err != nil {
		return nil, fmt.Errorf("nats: new server: %w", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(20 * time.Second) {
		srv.Shutdown()
		return nil, fmt.Errorf("nats: not ready on %s:%d after 20s", opts.Host, opts.Port)
	}
	return srv, nil
}

// Stop shuts the server down; clients see a disconnect and reconnect when
// Start is called.
func (n *NATS) Stop() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.srv == nil {
		return
	}
	n.srv.Shutdown()
	n.srv.WaitForShutdown()
	n.srv = nil
}

// Restart is Stop followed by Start.
func (n *NATS) Restart() {
	n.tb.Helper()
	n.Stop()
	n.Start()
}

// Server returns the running server, or nil while stopped.
func (n *NATS) Server() *server.Server {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.srv
}

// Connect opens a client connection that reconnects forever (so it survives
// Restart) and closes it when the test ends.
func (n *NATS) Connect(tb testing.TB, opts ...nats.Option) *nats.Conn {
	tb.Helper()
	return connect(tb, n.URL, opts...)
}

// JetStream returns a JetStream context on a new connection.
func (n *NATS) JetStream(tb testing.TB) jetstream.JetStream {
	tb.Helper()
	return newJetStream(tb, n.Connect(tb))
}

// connect opens a connection to url (one or more servers, comma-separated)
// that reconnects forever, and closes it when the test ends.
func connect(tb testing.TB, url string, opts ...nats.Option) *nats.Conn {
	tb.Helper()
	base := []nats.Option{
		nats.Name(tb.Name()),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(50 * time.Millisecond),
		nats.RetryOnFailedConnect(true),
	}
	nc, err := nats.Connect(url, append(base, opts...)...)
	if err != nil {
		tb.Fatalf("testenv: nats connect %s: %v", url, err)
	}
	tb.Cleanup(nc.Close)
	return nc
}

func newJetStream(tb testing.TB, nc *nats.Conn) jetstream.JetStream {
	tb.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatalf("testenv: jetstream: %v", err)
	}
	return js
}

// FreePort returns a TCP port on 127.0.0.1 that nothing listens on, for a
// server a test starts. Another process could take it before it is used;
// starters retry on a bind failure.
//
// The port is drawn from below the kernel's ephemeral range (the ports it
// gives outgoing connections), not from the kernel's own free-port choice,
// which lies inside it: a port handed out for a server started seconds later
// could meanwhile become the local port of one of the thousands of
// connections a busy test run opens, and the server then cannot bind it for
// as long as that connection lives. That failed a demo test once (a service's
// /healthz never answered).
func FreePort() (int, error) { return FreePortRange(1) }

// FreePortRange returns the first of n consecutive free ports on 127.0.0.1,
// all below the kernel's ephemeral range (see FreePort).
func FreePortRange(n int) (int, error) {
	lo, hi := listenPorts()
	if hi-lo < 1000+n {
		// No room below the ephemeral range: let the kernel choose, or
		// draw from every unprivileged port.
		if n == 1 {
			return kernelFreePort()
		}
		lo, hi = 1024, 65536
	}
	for range 200 {
		base := lo + rand.IntN(hi-lo-n)
		if portsFree(base, n) {
			return base, nil
		}
	}
	return 0, fmt.Errorf("find free port: no %d free consecutive ports in %d-%d", n, lo, hi)
}

// listenPorts is the range FreePortRange draws from: 10000 up to the start
// of the ephemeral range (/proc/sys/net/ipv4/ip_local_port_range; 32768 on
// most systems).
func listenPorts() (lo, hi int) {
	lo, hi = 10000, 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if eph, err := strconv.Atoi(f[0]); err == nil {
				hi = eph
			}
		}
	}
	return lo, hi
}

func portsFree(base, n int) bool {
	for p := base; p < base+n; p++ {
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			return false
		}
		l.Close()
	}
	return true
}

func kernelFreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// WaitFor polls cond every 10ms until it returns true or the timeout passes,
// then fails the test with what. Use it instead of sleeping.
func WaitFor(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	if !Poll(timeout, cond) {
		tb.Fatalf("testenv: timed out after %s waiting for %s", timeout, what)
	}
}

// Poll is WaitFor for a goroutine other than the test's (where t.Fatal may
// not be called): it polls cond every 10ms and reports whether it returned
// true before the timeout passed.
func Poll(timeout time.Duration, cond func() bool) bool {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		if cond() {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}
