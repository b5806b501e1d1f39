package webserver_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/snipdev/snip/pkg/webserver"
)

func TestServeReadyzAndShutdown(t *testing.T) {
	t.Parallel()
	s := webserver.New(slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	var failing atomic.Bool
	failing.Store(true)
	s.AddReadiness("redis", func(context.Context) error {
		if failing.Load() {
			return errors.New("redis: connection refused")
		}
		return nil
	})

	ctx, cancel := context.WithCancel(t.Context())
	addrc := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, "127.0.0.1:0", func(a string) { addrc <- a }, 5*time.Second) }()
	addr := <-addrc

	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Errorf("/healthz = %d, want 200", code)
	}
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "connection refused") {
		t.Errorf("/readyz with failing check = %d %s, want 503 naming the error", code, body)
	}
	failing.Store(false)
	if code, _ := get("/readyz"); code != 200 {
		t.Errorf("/readyz with passing check = %d, want 200", code)
	}
	if code, body := get("/metrics"); code != 200 || !strings.Contains(body, "go_goroutines") {
		t.Errorf("/metrics = %d, want 200 with Go metrics", code)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve returned %v after cancel, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after cancel")
	}
}

func TestProbe(t *testing.T) {
	t.Parallel()
	s := webserver.New(slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	addrc := make(chan string, 1)
	go func() { _ = s.Serve(ctx, "127.0.0.1:0", func(a string) { addrc <- a }, time.Second) }()
	addr := <-addrc
	if err := webserver.Probe(addr); err != nil {
		t.Fatalf("Probe(%s) = %v, want nil", addr, err)
	}
	cancel()
	testenvWait(t, func() bool { return webserver.Probe(addr) != nil })
}

func testenvWait(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("Probe still succeeds after the server stopped")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestRequestIDAndPanicRecovery(t *testing.T) {
	t.Parallel()
	s := webserver.New(slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	s.Echo.GET("/id", func(c echo.Context) error {
		return c.String(http.StatusOK, c.Response().Header().Get(echo.HeaderXRequestID))
	})
	s.Echo.GET("/boom", func(echo.Context) error { panic("boom") })
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()

	get := func(path, id string) (*http.Response, string) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		if id != "" {
			req.Header.Set(echo.HeaderXRequestID, id)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	_, a := get("/id", "")
	_, b := get("/id", "")
	if a == "" || a == b {
		t.Fatalf("generated request IDs %q and %q, want two different non-empty IDs", a, b)
	}
	if _, got := get("/id", "caller-42"); got != "caller-42" {
		t.Fatalf("request ID = %q, want the caller's caller-42", got)
	}
	resp, body := get("/boom", "")
	if resp.StatusCode != http.StatusInternalServerError || !strings.Contains(body, "internal") {
		t.Fatalf("panicking handler answered %d %s, want 500 with a JSON error", resp.StatusCode, body)
	}
	if _, got := get("/id", ""); got == "" {
		t.Fatal("server stopped answering after a panic")
	}
}

// A slow check does not take the others down with it: each check has its
// own 2 s. Here "a-slow" waits out its deadline; "b-fast" answers at once,
// reporting its context's state, which run one after another under one
// deadline was already expired.
func TestReadyzChecksDoNotShareOneDeadline(t *testing.T) {
	t.Parallel()
	s := webserver.New(slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	s.AddReadiness("a-slow", func(ctx context.Context) error {
		<-ctx.Done()
		return ctx.Err()
	})
	s.AddReadiness("b-fast", func(ctx context.Context) error { return ctx.Err() })
	rec := httptest.NewRecorder()
	s.Echo.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	var got map[string]string
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
		t.Fatalf("/readyz body %q: %v", rec.Body, err)
	}
	if rec.Code != http.StatusServiceUnavailable || got["b-fast"] != "ok" || !strings.Contains(got["a-slow"], "deadline") {
		t.Errorf("/readyz = %d %v, want 503 with a-slow timed out and b-fast ok", rec.Code, got)
	}
}

// Load balancers often probe with HEAD. A probe route answers it as GET
// (status only), also beside a service's catch-all route (the redirect's
// "/:code"), which would otherwise take HEAD /healthz as a link's code.
func TestProbesAnswerHEAD(t *testing.T) {
	t.Parallel()
	for _, catchAll := range []bool{false, true} {
		s := webserver.New(slog.New(slog.DiscardHandler), prometheus.NewRegistry())
		s.AddReadiness("ok", func(context.Context) error { return nil })
		if catchAll {
			notFound := func(c echo.Context) error { return c.NoContent(http.StatusNotFound) }
			s.Echo.GET("/:code", notFound)
			s.Echo.HEAD("/:code", notFound)
		}
		for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
			rec := httptest.NewRecorder()
			s.Echo.ServeHTTP(rec, httptest.NewRequest(http.MethodHead, path, nil))
			if rec.Code != http.StatusOK {
				t.Errorf("HEAD %s (beside a catch-all route: %v) = %d, want 200", path, catchAll, rec.Code)
			}
		}
	}
}

// Once the server is stopping, /readyz answers 503 "stopping" whatever its
// checks say, and /healthz still 200: the process is going away, not
// broken.
func TestReadyzAnswers503OnceStopping(t *testing.T) {
	t.Parallel()
	s := webserver.New(slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	s.AddReadiness("ok", func(context.Context) error { return nil })
	get := func(path string) (int, string) {
		rec := httptest.NewRecorder()
		s.Echo.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := get("/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz before Stopping = %d %s, want 200", code, body)
	}
	s.Stopping()
	if code, body := get("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, `"stopping":"the service is stopping"`) {
		t.Errorf("/readyz once stopping = %d %s, want 503 saying it is stopping", code, body)
	}
	if code, body := get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz once stopping = %d %s, want 200", code, body)
	}
}

// A Listener answers from the moment it is bound: while the service starts,
// /healthz 200, /readyz 503 saying what it waits for, /metrics, and 503
// "starting" elsewhere; then the Server's routes, on the same listener and
// the same keep-alive connection.
func TestListenerServesStartingThenTheServer(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.DiscardHandler)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector())
	status := func() webserver.Startup {
		return webserver.Startup{WaitingFor: "apply topology", LastError: errors.New("look up stream CLICKS: context deadline exceeded"),
			Down: map[string]string{"nats test": "nats RECONNECTING: dial tcp 127.0.0.1:4222: connect: connection refused"}}
	}
	l, err := webserver.Listen(log, "127.0.0.1:0", webserver.Starting(log, reg, status))
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr()
	var conns atomic.Int32
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
			conns.Add(1)
			return (&net.Dialer{}).DialContext(ctx, network, a)
		},
	}}
	do := func(method, path string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, "http://"+addr+path, nil)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := do("GET", "/healthz"); code != 200 {
		t.Errorf("/healthz while starting = %d %s, want 200", code, body)
	}
	if code, _ := do("HEAD", "/healthz"); code != 200 {
		t.Errorf("HEAD /healthz while starting = %d, want 200", code)
	}
	if err := webserver.Probe(addr); err != nil {
		t.Errorf("Probe while starting: %v", err)
	}
	code, body := do("GET", "/readyz")
	var ready map[string]string
	if err := json.Unmarshal([]byte(body), &ready); err != nil {
		t.Fatalf("/readyz body %q: %v", body, err)
	}
	want := map[string]string{"starting": "the service is starting", "waiting_for": "apply topology",
		"last_error": "look up stream CLICKS: context deadline exceeded", "nats test": "nats RECONNECTING: dial tcp 127.0.0.1:4222: connect: connection refused"}
	if code != 503 || !maps.Equal(ready, want) {
		t.Errorf("/readyz while starting = %d %v, want 503 %v", code, ready, want)
	}
	if code, body := do("GET", "/metrics"); code != 200 || !strings.Contains(body, "go_goroutines") {
		t.Errorf("/metrics while starting = %d, want 200 with Go metrics", code)
	}
	for _, path := range []string{"/api/links", "/"} {
		code, body := do("POST", path)
		var e webserver.ErrorBody
		_ = json.Unmarshal([]byte(body), &e)
		if code != 503 || e.Error.Code != webserver.CodeStarting || !strings.Contains(e.Error.Message, "(apply topology)") {
			t.Errorf("POST %s while starting = %d %s, want 503 starting, naming the wait", path, code, body)
		}
	}

	s := webserver.New(log, prometheus.NewRegistry())
	s.Echo.POST("/api/links", func(c echo.Context) error { return c.NoContent(http.StatusCreated) })
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	readyAddr := make(chan string, 1)
	go func() { done <- l.Serve(ctx, s, func(a string) { readyAddr <- a }, 5*time.Second) }()
	if a := <-readyAddr; a != addr {
		t.Errorf("ready with %s, want the address bound, %s", a, addr)
	}
	if code, body := do("GET", "/readyz"); code != 200 {
		t.Errorf("/readyz once served = %d %s, want 200", code, body)
	}
	if code, body := do("POST", "/api/links"); code != http.StatusCreated {
		t.Errorf("POST /api/links once served = %d %s, want 201", code, body)
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("%d connections dialled, want 1: the one kept alive from the start on", n)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Serve = %v", err)
	}
	if _, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		t.Error("the listener still takes connections after Serve returned")
	}
}
