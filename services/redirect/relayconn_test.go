package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/natsconn"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/redirect/internal/outbox"
)

// TestRelayKeepsLaneOrderAcrossAConnectionBreak: the relay's NATS connection
// breaks in the middle of a batch of 10 clicks of one link, after the first
// 4 went out on a wire that lost them. The relay's connection, opened as the
// service opens it, must not store a later click of the batch before the
// lost ones, whether the client is still reconnecting when the relay
// publishes the rest (the reconnect buffer would keep them and store them at
// the reconnect) or has reconnected already (they would go out on the new
// connection). The lost clicks are retried, and CLICKS holds the 10 once,
// in order.
func TestRelayKeepsLaneOrderAcrossAConnectionBreak(t *testing.T) {
	t.Parallel()
	for _, reconnected := range []bool{false, true} {
		t.Run(fmt.Sprintf("reconnected=%t", reconnected), func(t *testing.T) {
			t.Parallel()
			relayOrderAcrossBreak(t, reconnected)
		})
	}
}

// TestRelayPublishesOnItsOwnConnection: the service's relay publishes on
// the connection relayNATS opens (no reconnect buffer), not on the one that
// applies the topology and follows LINKS.
func TestRelayPublishesOnItsOwnConnection(t *testing.T) {
	t.Parallel()
	_, db := servers.Redis.NewDB(t)
	n := testenv.StartNATS(t)
	cfg := testConfig(servers.Redis.URL(db), n.URL)
	cfg.Instance = "own-conn"
	in := startInstance(t, cfg)
	code := createLink(t, in.URL, "https://example.com/", "")
	for range 3 {
		if r := do(t, "GET", in.URL+"/"+code, ""); r.Status != http.StatusFound {
			t.Fatalf("GET = %d", r.Status)
		}
	}
	js := n.JetStream(t)
	testenv.WaitFor(t, 30*time.Second, "3 clicks, the link event and its job relayed", func() bool {
		return streamCount(js, events.ClicksStream) == 3 && streamCount(js, events.LinksStream) == 1 &&
			streamCount(js, events.PreviewJobsStream) == 1
	})
	conns, err := n.Server().Connz(&server.ConnzOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range conns.Conns {
		names = append(names, c.Name)
		if c.Name == "redirect relay own-conn" {
			if c.InMsgs < 5 {
				t.Fatalf("the relay's connection sent %d messages, want the 5 relayed at least", c.InMsgs)
			}
			return
		}
	}
	t.Fatalf("no connection named %q among %q", "redirect relay own-conn", names)
}

func relayOrderAcrossBreak(t *testing.T, reconnected bool) {
	const clicks, lostFirst = 10, 4
	rdb := servers.RedisClient(t)
	n := testenv.StartNATS(t)
	js := n.JetStream(t)
	cfg := testConfig("", n.URL)
	cfg.PublishTimeout = time.Second
	if err := topology.Apply(t.Context(), js, cfg.Topology.Options()); err != nil {
		t.Fatal(err)
	}
	layout := outbox.NewLayout(1)
	var ids []string
	pipe := rdb.Pipeline()
	for i := range clicks {
		c := events.Click{V: events.ClickVersion, ID: events.NewID(), Time: time.Now().UTC(), Code: "abc", Owner: "acme",
			Target: "https://example.com/", Visitor: "v", RequestID: fmt.Sprint(i)}
		data, _ := json.Marshal(c)
		outbox.Add(t.Context(), pipe, layout.OutboxKey(0, outbox.LaneClicks), c.ID, events.ClickSubject("acme", "abc"), data)
		ids = append(ids, c.ID)
	}
	if _, err := pipe.Exec(t.Context()); err != nil {
		t.Fatal(err)
	}

	// The relay's connection as the service opens it (relayNATS), through
	// a proxy that can lose what the client sends and break the connection.
	p := newLossyProxy(t, n.URL[len("nats://"):])
	cfg.NATS.URL = "nats://" + p.addr()
	nc, err := natsconn.Connect(cfg.NATS.Conn("redirect relay test"), slog.New(slog.DiscardHandler),
		append(cfg.NATS.Options, relayNATSOptions...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	rjs, err := relayJetStream(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	fault := &breakMidBatch{JetStream: rjs, t: t, nc: nc, p: p, at: lostFirst, last: clicks - 1, reconnected: reconnected}
	relay := outbox.NewRelay(rdb, fault, nc.IsConnected, layout, relayConfig(cfg, nc),
		slog.New(slog.DiscardHandler), outbox.NewMetrics(prometheus.NewRegistry()))
	rr := startRelay(relay)
	t.Cleanup(rr.stop)

	testenv.WaitFor(t, 30*time.Second, "the outbox to empty", func() bool {
		return rdb.XLen(t.Context(), layout.OutboxKey(0, outbox.LaneClicks)).Val() == 0
	})
	if !fault.broke.Load() {
		t.Fatal("the connection never broke mid-batch")
	}
	var got []string
	for _, m := range readStream(t, js, events.ClicksStream) {
		got = append(got, m.Headers().Get(events.HeaderMsgID))
	}
	pos := map[string]int{}
	for i, id := range ids {
		pos[id] = i
	}
	var order []int
	for _, id := range got {
		order = append(order, pos[id])
	}
	if len(got) != clicks {
		t.Fatalf("CLICKS holds %d clicks (outbox positions %v), want %d", len(got), order, clicks)
	}
	for i := range order {
		if order[i] != i {
			t.Fatalf("CLICKS holds the outbox's clicks in the order %v, want 0..%d", order, clicks-1)
		}
	}
}

// breakMidBatch is the relay's JetStream with a connection break in its
// first batch: the wire loses what the first at publishes send, and the
// connection breaks after them, before the relay publishes the next. With
// reconnected, the relay goes on once the client has reconnected; without,
// while the client is reconnecting, and the proxy refuses the client until
// the batch is done.
type breakMidBatch struct {
	outbox.JetStream
	t           *testing.T
	nc          *nats.Conn
	p           *lossyProxy
	at, last    int
	reconnected bool
	calls       atomic.Int64
	broke       atomic.Bool
}

func (f *breakMidBatch) PublishMsgAsync(msg *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	i := int(f.calls.Add(1)) - 1
	if i == 0 {
		f.p.drop.Store(true)
	}
	fut, err := f.JetStream.PublishMsgAsync(msg, opts...)
	if i == f.at-1 {
		f.breakConn()
	}
	if i >= f.at && (err != nil || i >= f.last) {
		f.p.refuse.Store(false) // the batch is done: let the client reconnect
	}
	return fut, err
}

// breakConn breaks the connection between two publishes of the batch, once
// everything sent so far has left the client (and is lost).
func (f *breakMidBatch) breakConn() {
	f.until("the first publishes written out", func() bool { n, err := f.nc.Buffered(); return err == nil && n == 0 })
	before := f.nc.Stats().Reconnects
	f.p.refuse.Store(!f.reconnected)
	f.p.cut()
	if f.reconnected {
		f.p.drop.Store(false)
		f.until("the client to reconnect", func() bool {
			return f.nc.Stats().Reconnects > before && f.nc.Status() == nats.CONNECTED
		})
	} else {
		f.until("the client to notice the break", func() bool { return f.nc.Status() == nats.RECONNECTING })
		f.p.drop.Store(false)
	}
	f.broke.Store(true)
}

// until polls cond for at most 10 s (on the relay's goroutine: it reports
// with Errorf, not Fatal).
func (f *breakMidBatch) until(what string, cond func() bool) {
	if !testenv.Poll(10*time.Second, cond) {
		f.t.Errorf("timed out waiting for %s", what)
	}
}

// lossyProxy forwards TCP connections to target. While drop is set, what
// the client sends is lost; while refuse is set, new connections are closed
// at once; cut breaks every connection.
type lossyProxy struct {
	ln     net.Listener
	target string
	drop   atomic.Bool
	refuse atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
}

func newLossyProxy(t *testing.T, target string) *lossyProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &lossyProxy{ln: ln, target: target}
	go p.accept()
	t.Cleanup(func() { _ = ln.Close(); p.cut() })
	return p
}

func (p *lossyProxy) addr() string { return p.ln.Addr().String() }

func (p *lossyProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.refuse.Load() {
			_ = c.Close()
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		go func() { _, _ = io.Copy(c, s); _ = c.Close() }()
		go func() {
			buf := make([]byte, 64<<10)
			for {
				n, err := c.Read(buf)
				if n > 0 && !p.drop.Load() {
					if _, werr := s.Write(buf[:n]); werr != nil {
						break
					}
				}
				if err != nil {
					break
				}
			}
			_ = s.Close()
		}()
	}
}

func (p *lossyProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

// runningRelay is a relay running in a goroutine.
type runningRelay struct {
	stop func()
}

func startRelay(r *outbox.Relay) runningRelay {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	return runningRelay{stop: func() { cancel(); <-done }}
}
