package natsconn_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/snipdev/snip/pkg/natsconn"
	"github.com/snipdev/snip/pkg/testenv"
)

// Drain lets pending publishes reach the stream and returns once the
// connection is closed.
func TestDrainDeliversPendingPublishesAndCloses(t *testing.T) {
	t.Parallel()
	ns := testenv.StartNATS(t)
	nc, err := natsconn.Connect(natsconn.Config{URL: ns.URL, Name: "drain-test"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	reader := ns.Connect(t)
	sub, err := reader.SubscribeSync("drain.test")
	if err != nil {
		t.Fatal(err)
	}
	if err := reader.Flush(); err != nil {
		t.Fatal(err)
	}
	const n = 1000
	for range n {
		if err := nc.Publish("drain.test", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := natsconn.Drain(ctx, nc); err != nil {
		t.Fatalf("Drain: %v", err)
	}
	if !nc.IsClosed() {
		t.Error("connection not closed after Drain")
	}
	for i := range n {
		if _, err := sub.NextMsg(5 * time.Second); err != nil {
			t.Fatalf("message %d of %d published before Drain: %v", i+1, n, err)
		}
	}
}

// When the context ends before the drain does, the connection is closed at
// once and the context's error returned. The drain cannot finish here: a
// subscription's handler holds a message until the test ends, and nats.go
// would wait 30 s (its drain timeout) for it.
func TestDrainClosesWhenTheContextEnds(t *testing.T) {
	t.Parallel()
	ns := testenv.StartNATS(t)
	nc, err := natsconn.Connect(natsconn.Config{URL: ns.URL, Name: "drain-test"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	held, release := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { close(release) })
	if _, err := nc.Subscribe("drain.held", func(*nats.Msg) {
		close(held)
		<-release
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish("drain.held", []byte("x")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler was not handed the message")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = natsconn.Drain(ctx, nc)
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Drain with a handler still holding a message: %v, want context.DeadlineExceeded", err)
	}
	if !nc.IsClosed() {
		t.Error("Drain returned and the connection is not closed")
	}
	if took > 5*time.Second {
		t.Errorf("Drain took %s with a 200ms context", took)
	}
}

// A connection as a user replies on the user's own inbox prefix (the only
// one deploy/nats lets it subscribe to); the configured prefix wins.
func TestInboxPrefixIsTheUsers(t *testing.T) {
	t.Parallel()
	ns := testenv.StartNATS(t)
	for _, c := range []struct {
		cfg  natsconn.Config
		want string
	}{
		{natsconn.Config{URL: ns.URL, User: "fraud"}, "_INBOX_fraud."},
		{natsconn.Config{URL: ns.URL, User: "a.b*c"}, "_INBOX_a_b_c."},
		{natsconn.Config{URL: ns.URL, User: "fraud", InboxPrefix: "_R_fraud"}, "_R_fraud."},
		{natsconn.Config{URL: ns.URL}, "_INBOX."},
	} {
		// The test server has no users and ignores the user name.
		nc, err := natsconn.Connect(c.cfg, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		if got := nc.NewInbox(); !strings.HasPrefix(got, c.want) {
			t.Errorf("%+v: inbox %q, want prefix %q", c.cfg, got, c.want)
		}
		nc.Close()
	}
}

// TestLeavesAFrozenNodeForAnother: a client connected to a cluster node that
// is frozen (SIGSTOP: its socket stays open, nothing is answered) notices by
// its pings and reconnects to another node, well before nats.go's default of
// two minutes would.
func TestLeavesAFrozenNodeForAnother(t *testing.T) {
	t.Parallel()
	c := testenv.StartNATSCluster(t)
	nc, err := natsconn.Connect(natsconn.Config{URL: c.URL, Name: "freeze-test"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	testenv.WaitFor(t, 10*time.Second, "connected", nc.IsConnected)
	frozenURL := nc.ConnectedUrl()
	var frozen *testenv.NATSNode
	for _, n := range c.Nodes {
		if strings.TrimPrefix(n.URL, "nats://") == strings.TrimPrefix(frozenURL, "nats://") {
			frozen = n
		}
	}
	if frozen == nil {
		t.Fatalf("connected to %s, which is no node of the cluster", frozenURL)
	}
	frozen.Pause()
	t.Cleanup(frozen.Resume)
	start := time.Now()
	limit := natsconn.PingInterval*(natsconn.MaxPingsOut+1) + 10*time.Second
	testenv.WaitFor(t, limit, "reconnected to another node", func() bool {
		return nc.IsConnected() && nc.ConnectedUrl() != frozenURL
	})
	t.Logf("left the frozen node after %s for %s", time.Since(start).Round(100*time.Millisecond), nc.ConnectedUrl())
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		t.Fatalf("flush on the new node: %v", err)
	}
}

// A connection that fails at once (here: a credentials file that is not
// there) is reported without the URL's password or token, which services
// log.
func TestConnectErrorHidesTheURLPassword(t *testing.T) {
	t.Parallel()
	ns := testenv.StartNATS(t)
	for _, url := range []string{
		strings.Replace(ns.URL, "nats://", "nats://app:s3cret@", 1) + "," + ns.URL,
		strings.Replace(ns.URL, "nats://", "nats://s3cret@", 1) + "," + ns.URL,
		// No scheme: nats.go reads nats://; url.Parse alone reads "app:" as
		// the scheme and the rest, password included, as opaque.
		strings.Replace(ns.URL, "nats://", "app:s3cret@", 1),
		strings.Replace(ns.URL, "nats://", "nats://app:s3%2Fcret@", 1),
	} {
		nc, err := natsconn.Connect(natsconn.Config{URL: url, CredsFile: t.TempDir() + "/missing.creds"}, slog.New(slog.DiscardHandler))
		if err == nil {
			nc.Close()
			t.Fatal("Connect with a missing credentials file succeeded")
		}
		if strings.Contains(err.Error(), "s3cret") || !strings.Contains(err.Error(), "xxxxx") {
			t.Errorf("Connect error shows the secret, or no URL: %v", err)
		}
	}
}

// A NATS_URL that does not parse is refused naming the bad entry by its
// place, and no piece of its password or token is shown: nats.go's own
// error quotes the whole entry, and url.Parse's may quote a piece of the
// password as the port.
func TestMalformedURLErrorNamesTheEntryAndHidesThePassword(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, url, entry string
		pieces           []string // what must not be shown
	}{
		{"port_not_a_number", "nats://app:hunter2@localhost:bad", "entry 1 of 1", []string{"hunter2"}},
		{"space_in_the_second_host", "nats://app:hunter2@localhost:4222,nats://app:hunter2@local host:4222", "entry 2 of 2", []string{"hunter2"}},
		{"unescaped_slash_in_password", "nats://app:hun/ter2@localhost:4222", "entry 1 of 1", []string{"hun", "ter2"}},
		{"unescaped_hash_in_password", "nats://localhost:4222,nats://app:hun#ter2@localhost:4222", "entry 2 of 2", []string{"hun", "ter2"}},
		{"no_scheme_bad_port", "app:hunter2@localhost:42x22", "entry 1 of 1", []string{"hunter2"}},
		{"token_unclosed_bracket", "nats://hunter2@[::1:4222", "entry 1 of 1", []string{"hunter2"}},
		{"bad_escape_in_password", "nats://app:hunter2%zz@localhost:4222", "entry 1 of 1", []string{"hunter2"}},
		{"control_character", "nats://app:hunter2@local\x7fhost:4222", "entry 1 of 1", []string{"hunter2"}},
		{"stray_character_between_urls", "nats://localhost:4222, ,nats://app:hunter2@localhost:4222|nats://localhost:4223", "entry 3 of 3", []string{"hunter2"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var logged strings.Builder
			nc, err := natsconn.Connect(natsconn.Config{URL: tc.url, Name: "bad-url"}, slog.New(slog.NewJSONHandler(&logged, nil)))
			if err == nil {
				nc.Close()
				t.Fatalf("Connect(%q) succeeded", tc.url)
			}
			if !strings.Contains(err.Error(), tc.entry) {
				t.Errorf("Connect error does not name %q: %v", tc.entry, err)
			}
			for _, p := range tc.pieces {
				if strings.Contains(err.Error(), p) || strings.Contains(logged.String(), p) {
					t.Errorf("Connect error or log shows %q: %v\n%s", p, err, logged.String())
				}
			}
		})
	}
}

// A server that refuses the connection's credentials for a while (an
// account a node that just started has not loaded yet, a reload with a
// wrong password) and then accepts them again is reconnected to: nats.go
// by default closes the connection for good at the second refusal in a
// row, and a service would then run on, never ready, its consumers idle,
// until someone restarted it. Each refusal is logged.
func TestReconnectsOnceTheServerAcceptsTheCredentialsAgain(t *testing.T) {
	t.Parallel()
	// The server binds a port of the kernel's choosing: one drawn free
	// and bound later can be taken in between by another test binary.
	opts := testenv.NATSOptions(server.RANDOM_PORT, t.TempDir())
	opts.JetStream = false
	opts.Users = []*server.User{{Username: "app", Password: "right"}}
	srv, err := testenv.RunNATSServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	opts.Port = srv.Addr().(*net.TCPAddr).Port // a reload keeps the port
	var refusals atomic.Int64
	log := slog.New(countHandler{Handler: slog.DiscardHandler, n: &refusals, text: "authorization violation"})
	url := srv.ClientURL()
	nc, err := natsconn.Connect(natsconn.Config{URL: url, Name: "auth-test", User: "app", Password: "right"}, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	testenv.WaitFor(t, 10*time.Second, "connected", nc.IsConnected)

	reload := func(password string) {
		t.Helper()
		o := opts
		o.Users = []*server.User{{Username: "app", Password: password}}
		if err := srv.ReloadOptions(&o); err != nil {
			t.Fatalf("reload: %v", err)
		}
	}
	reload("changed")
	testenv.WaitFor(t, 10*time.Second, "three refusals logged, or the connection closed", func() bool {
		return refusals.Load() >= 3 || nc.IsClosed()
	})
	reload("right")
	if !testenv.Poll(10*time.Second, nc.IsConnected) {
		t.Fatalf("not reconnected 10s after the server accepts the credentials again: %s, last error %v, %d refusals logged",
			nc.Status(), nc.LastError(), refusals.Load())
	}
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		t.Fatalf("flush after the reconnect: %v", err)
	}
}

// countHandler counts the records whose attributes' text holds text.
type countHandler struct {
	slog.Handler
	n    *atomic.Int64
	text string
}

func (h countHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h countHandler) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if strings.Contains(strings.ToLower(a.Value.String()), h.text) {
			h.n.Add(1)
			return false
		}
		return true
	})
	return nil
}

// A connection that is not connected (yet) holds publishes in its reconnect
// buffer rather than failing them; given nats.ReconnectBufSize(-1) it fails
// them at once, which is what the redirect's relay and direct path rely on.
func TestPublishWhileNotConnectedWaitsUnlessTheBufferIsOff(t *testing.T) {
	t.Parallel()
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("nats://127.0.0.1:%d", port) // nothing listens
	log := slog.New(slog.DiscardHandler)
	buffered, err := natsconn.Connect(natsconn.Config{URL: url, Name: "buffered"}, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(buffered.Close)
	if err := buffered.Publish("x", []byte("held")); err != nil {
		t.Errorf("publish before the first connect: %v, want it held in the reconnect buffer", err)
	}
	unbuffered, err := natsconn.Connect(natsconn.Config{URL: url, Name: "unbuffered"}, log, nats.ReconnectBufSize(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(unbuffered.Close)
	if err := unbuffered.Publish("x", []byte("refused")); !errors.Is(err, nats.ErrReconnectBufExceeded) {
		t.Errorf("publish without a reconnect buffer before the first connect: %v, want %v", err, nats.ErrReconnectBufExceeded)
	}
}

// While a connection is down, ConnectError says why its last attempt
// failed, from the first connect on (nats.go's LastError is empty then:
// it is cleared at each attempt); nil once connected, again once the
// server goes away, and nil after the close.
func TestConnectErrorSaysWhyTheLastAttemptFailed(t *testing.T) {
	t.Parallel()
	ns := testenv.StartNATS(t)
	ns.Stop() // its port is kept: Start brings it back there
	nc, err := natsconn.Connect(natsconn.Config{URL: ns.URL, Name: "connerr-test"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	refused := func(what string) {
		t.Helper()
		var got error
		if !testenv.Poll(10*time.Second, func() bool {
			got = natsconn.ConnectError(nc)
			return got != nil && strings.Contains(got.Error(), "connection refused")
		}) {
			t.Fatalf("ConnectError %s = %v (status %s, last error %v), want the refused dial", what, got, nc.Status(), nc.LastError())
		}
		t.Logf("ConnectError %s: %v", what, got)
	}
	refused("while the server is not up yet")

	ns.Start()
	testenv.WaitFor(t, 20*time.Second, "connected, and ConnectError nil", func() bool {
		return nc.IsConnected() && natsconn.ConnectError(nc) == nil
	})

	ns.Stop()
	refused("once the server went away")

	nc.Close()
	testenv.WaitFor(t, 10*time.Second, "ConnectError nil once closed", func() bool { return natsconn.ConnectError(nc) == nil })
}
