package service

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/webserver"
)

// listened waits for the address Listening is called with.
func listened(t *testing.T, listening <-chan string, done <-chan error) string {
	t.Helper()
	select {
	case a := <-listening:
		return a
	case err := <-done:
		t.Fatalf("Run returned at start: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("nothing listens on HTTP_ADDR 30s after the start")
	}
	return ""
}

// get answers method path at addr on a new connection: status, body.
func get(t *testing.T, method, addr, path string) (int, string) {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	req, err := http.NewRequest(method, "http://"+addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// A service whose NATS is down at start answers on HTTP_ADDR at once:
// /healthz 200 (a liveness probe, the healthcheck subcommand, must not
// restart a process that waits), /readyz 503 naming what it waits for and
// why (NATS: the refused dial), /metrics, and 503 "starting" on its own
// routes. Once NATS is up the service's routes are served on the same
// address, and it turns ready; once NATS goes away again, /readyz names
// the refused dial again.
func TestRunAnswersOnHTTPAddrWhileSetupWaitsForNATS(t *testing.T) {
	t.Parallel()
	ns := testenv.StartNATS(t)
	ns.Stop() // its port is kept: Start brings it back there
	type config struct {
		Base
		NATS
		Topology
	}
	listening, ready := make(chan string, 1), make(chan string, 1)
	cfg := config{
		Base: Base{HTTPAddr: "127.0.0.1:0", ShutdownTimeout: 5 * time.Second,
			Listening: func(a string) { listening <- a }, Ready: func(a string) { ready <- a }},
		NATS:     NATS{URL: ns.URL},
		Topology: Topology{ApplyTopology: true, Partitions: 2, Replicas: 1, ClicksMaxAge: time.Hour, ClicksMaxBytes: -1, Storage: jetstream.MemoryStorage},
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, discard, "test", cfg, func(ctx context.Context, g *Group) error {
			nc, js, err := g.NATS(cfg.NATS, "test")
			if err != nil {
				return err
			}
			if err := cfg.Topology.Prepare(ctx, discard, js); err != nil {
				return err
			}
			web := webserver.New(discard, prometheus.NewRegistry())
			web.AddReadiness("nats", NATSReady(nc))
			web.Echo.GET("/api/thing", func(c echo.Context) error { return c.String(http.StatusOK, "thing") })
			g.Go(Intake, "http", g.HTTP(web))
			return nil
		})
	}()
	addr := listened(t, listening, done)

	if code, body := get(t, "GET", addr, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz while waiting for NATS = %d %s, want 200", code, body)
	}
	if err := webserver.Probe(addr); err != nil {
		t.Errorf("the healthcheck subcommand's probe while waiting for NATS: %v", err)
	}
	var readyz map[string]string
	// The last error comes once an attempt has failed: the first waits
	// DefaultBackoff.Attempt, 10s, for a JetStream answer.
	if !testenv.Poll(40*time.Second, func() bool {
		code, body := get(t, "GET", addr, "/readyz")
		readyz = nil
		_ = json.Unmarshal([]byte(body), &readyz)
		return code == http.StatusServiceUnavailable && readyz["starting"] != "" &&
			readyz["waiting_for"] == "apply topology" && readyz["last_error"] != "" &&
			strings.HasPrefix(readyz["nats test"], "nats RECONNECTING: dial tcp ") &&
			strings.HasSuffix(readyz["nats test"], "connection refused")
	}) {
		t.Fatalf("/readyz while waiting for NATS says %v, want 503 starting, waiting for apply topology, with its last error and why NATS is down (the refused dial)", readyz)
	}
	t.Logf("/readyz while waiting for NATS: %v", readyz)
	if code, body := get(t, "GET", addr, "/metrics"); code != http.StatusOK || !strings.Contains(body, "go_goroutines") {
		t.Errorf("/metrics while waiting for NATS = %d, want 200 with the process's metrics", code)
	}
	for _, path := range []string{"/api/thing", "/nope"} {
		code, body := get(t, "GET", addr, path)
		var e webserver.ErrorBody
		_ = json.Unmarshal([]byte(body), &e)
		if code != http.StatusServiceUnavailable || e.Error.Code != webserver.CodeStarting || !strings.Contains(e.Error.Message, "apply topology") {
			t.Errorf("GET %s while waiting for NATS = %d %s, want 503 starting, naming the wait", path, code, body)
		}
	}
	select {
	case a := <-ready:
		t.Fatalf("Ready(%s) while NATS is down: the routes are not served yet", a)
	default:
	}

	ns.Start()
	select {
	case a := <-ready:
		if a != addr {
			t.Errorf("Ready(%s), want the address bound at start, %s", a, addr)
		}
	case err := <-done:
		t.Fatalf("Run returned: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("the routes not served 60s after NATS came up")
	}
	if code, body := get(t, "GET", addr, "/api/thing"); code != http.StatusOK || body != "thing" {
		t.Errorf("GET /api/thing once started = %d %s, want 200 thing", code, body)
	}
	if code, body := get(t, "GET", addr, "/nope"); code != http.StatusNotFound {
		t.Errorf("GET /nope once started = %d %s, want 404", code, body)
	}
	testenv.WaitFor(t, 20*time.Second, "/readyz 200", func() bool {
		code, _ := get(t, "GET", addr, "/readyz")
		return code == http.StatusOK
	})

	// Once it runs, a NATS that goes away is named as well.
	ns.Stop()
	if !testenv.Poll(20*time.Second, func() bool {
		code, body := get(t, "GET", addr, "/readyz")
		readyz = nil
		_ = json.Unmarshal([]byte(body), &readyz)
		return code == http.StatusServiceUnavailable &&
			strings.HasPrefix(readyz["nats"], "nats RECONNECTING: dial tcp ") && strings.HasSuffix(readyz["nats"], "connection refused")
	}) {
		t.Fatalf("/readyz once NATS went away says %v, want 503 with why NATS is down (the refused dial)", readyz)
	}
	t.Logf("/readyz once NATS went away: %v", readyz)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run still running 30s after the stop")
	}
}

// A stop during setup returns promptly, as before HTTP_ADDR answered in
// setup, and closes the listener.
func TestRunStoppedDuringSetupClosesTheListener(t *testing.T) {
	t.Parallel()
	listening := make(chan string, 1)
	cfg := testConfig{Base: Base{HTTPAddr: "127.0.0.1:0", ShutdownTimeout: 5 * time.Second, Listening: func(a string) { listening <- a }}}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, discard, "test", cfg, func(ctx context.Context, g *Group) error {
			g.Go(Intake, "http", g.HTTP(webserver.New(discard, prometheus.NewRegistry())))
			return Retry(ctx, discard, "wait for a server", func(context.Context) error { return errors.New("connection refused") })
		})
	}()
	addr := listened(t, listening, done)
	testenv.WaitFor(t, 10*time.Second, "/readyz naming the wait", func() bool {
		_, body := get(t, "GET", addr, "/readyz")
		return strings.Contains(body, `"last_error":"connection refused"`) && strings.Contains(body, `"waiting_for":"wait for a server"`)
	})
	stopped := time.Now()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v, want nil", err)
		}
		if took := time.Since(stopped); took > 5*time.Second {
			t.Errorf("Run took %s to return after the stop", took)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run still running 30s after a stop during setup")
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Fatal("the listener still takes connections after Run returned")
	}
}

// A service that adds no HTTP component closes the listener once setup has
// returned: nothing would ever serve its routes there.
func TestRunClosesTheListenerNoHTTPTakes(t *testing.T) {
	t.Parallel()
	listening := make(chan string, 1)
	cfg := testConfig{Base: Base{HTTPAddr: "127.0.0.1:0", ShutdownTimeout: 5 * time.Second, Listening: func(a string) { listening <- a }}}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	running := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, discard, "test", cfg, func(ctx context.Context, g *Group) error {
			g.Go(Intake, "idle", func(ctx context.Context) error { close(running); <-ctx.Done(); return nil })
			return nil
		})
	}()
	addr := listened(t, listening, done)
	<-running
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Error("the listener still takes connections with no HTTP component")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}
}
