package service

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/natsconn"
	"github.com/snipdev/snip/pkg/owners"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/webserver"
)

type testConfig struct {
	Base
	NATS
	Secret string `env:"TEST_SECRET" secret:"true"`
}

// testDefaults are testConfig's defaults, as a service's loadConfig gives
// its own.
var testDefaults = testConfig{Base: Base{ShutdownTimeout: time.Second}}

var discard = slog.New(slog.DiscardHandler)

// A value of a block's variable that no service can run with is refused
// when the configuration is loaded, naming the variable, rather than
// running with it: a SHUTDOWN_TIMEOUT of 0 or less would end every stage
// of the stop at once, a negative SHUTDOWN_READY_DELAY means nothing, and a
// topology that topology.Apply refuses would be
// retried at start for ever.
func TestLoadConfigRefusesBlockValuesNoServiceRunsWith(t *testing.T) {
	t.Parallel()
	type config struct {
		Base
		Topology
	}
	defaults := config{Base: Base{ShutdownTimeout: 15 * time.Second}}
	if _, err := LoadConfig(nil, defaults, nil); err != nil {
		t.Fatalf("the defaults: %v", err)
	}
	for _, c := range []struct{ env, want string }{
		{"SHUTDOWN_TIMEOUT=0s", "load config: SHUTDOWN_TIMEOUT 0s: want more than 0"},
		{"SHUTDOWN_TIMEOUT=-5s", "load config: SHUTDOWN_TIMEOUT -5s: want more than 0"},
		{"SHUTDOWN_TIMEOUT=5", "load config: SHUTDOWN_TIMEOUT: unable to parse duration"},
		{"SHUTDOWN_READY_DELAY=-1s", "load config: SHUTDOWN_READY_DELAY -1s: want 0 or more"},
		{"SNIP_PARTITIONS=0", "load config: SNIP_PARTITIONS 0: want 1..1024"},
		{"SNIP_REPLICAS=-1", "load config: SNIP_REPLICAS -1: want 1..5"},
		{"SNIP_CLICKS_MAX_AGE=-1h", "load config: SNIP_CLICKS_MAX_AGE -1h0m0s: want at least"},
		{"SNIP_CLICKS_MAX_BYTES=0", "load config: SNIP_CLICKS_MAX_BYTES 0: want more than 0, or -1 for no cap"},
		{"SNIP_CLICKS_MAX_BYTES=-2", "load config: SNIP_CLICKS_MAX_BYTES -2: want more than 0, or -1 for no cap"},
	} {
		if _, err := LoadConfig([]string{c.env}, defaults, nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.env, err, c.want)
		}
	}
	// A Config literal that never set it, loaded as it is.
	if _, err := LoadConfig(nil, config{}, nil); err == nil || !strings.Contains(err.Error(), "SHUTDOWN_TIMEOUT 0s") {
		t.Errorf("no SHUTDOWN_TIMEOUT at all: %v, want the refusal", err)
	}
}

// What setup opened is closed when setup fails, and its error returned.
func TestRunClosesWhatAFailedSetupOpened(t *testing.T) {
	t.Parallel()
	var closed, flushed bool
	errSetup := errors.New("bad configuration")
	err := Run(t.Context(), discard, "test", testConfig{}, func(ctx context.Context, g *Group) error {
		g.Close("store", func() error { closed = true; return nil })
		g.OnStop(Work, "flush", func() { flushed = true })
		g.Go(Intake, "never started", func(context.Context) error { t.Error("a component started after setup failed"); return nil })
		return errSetup
	})
	if !errors.Is(err, errSetup) || !closed || !flushed {
		t.Fatalf("Run = %v, store closed %v, flushed %v; want the setup error, both true", err, closed, flushed)
	}
}

// A stop during setup (a Retry waiting for a server) is a clean stop.
func TestRunStoppedDuringSetupIsClean(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	err := Run(ctx, discard, "test", testConfig{}, func(ctx context.Context, g *Group) error {
		return Retry(ctx, discard, "wait for a server", func(context.Context) error {
			cancel()
			return errors.New("connection refused")
		})
	})
	if err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
}

// Retry cut short by its context says so and keeps the last failure.
func TestRetryEndsWithItsContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	var log bytes.Buffer
	tries := 0
	err := Backoff{First: 10 * time.Millisecond, Max: 20 * time.Millisecond}.Retry(ctx, slog.New(slog.NewTextHandler(&log, nil)), "wait for redis", func(context.Context) error {
		tries++
		return errors.New("connection refused")
	})
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "wait for redis") || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("Retry = %v, want the deadline, what and the last error", err)
	}
	if tries < 3 || !strings.Contains(log.String(), "wait for redis: retrying") {
		t.Fatalf("%d tries, log %q: want several, each logged", tries, log.String())
	}
}

// Each attempt is bounded by Backoff.Attempt.
func TestRetryBoundsEachAttempt(t *testing.T) {
	t.Parallel()
	tries := 0
	err := Backoff{First: time.Millisecond, Attempt: 20 * time.Millisecond}.Retry(t.Context(), discard, "hang", func(ctx context.Context) error {
		if tries++; tries == 1 {
			<-ctx.Done() // a server that does not answer
			return ctx.Err()
		}
		return nil
	})
	if err != nil || tries != 2 {
		t.Fatalf("Retry = %v after %d tries, want nil after 2", err, tries)
	}
}

// A component's failure stops the service in stages: Work components run
// until the intake has returned; the error is the component's, named.
func TestFirstFailureStopsTheRestInStages(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var order []string
	note := func(s string) { mu.Lock(); order = append(order, s); mu.Unlock() }
	errBroken := errors.New("broken")
	err := Run(t.Context(), discard, "test", testConfig{}, func(ctx context.Context, g *Group) error {
		g.Go(Work, "sender", func(ctx context.Context) error { <-ctx.Done(); note("sender"); return nil })
		g.Go(Intake, "consumer", func(ctx context.Context) error {
			<-ctx.Done()
			time.Sleep(50 * time.Millisecond) // the batch in hand
			note("consumer")
			return ctx.Err() // a stop is not a failure
		})
		g.Go(Intake, "reader", func(context.Context) error { return errBroken })
		g.OnStop(Intake, "end streams", func() { note("streams") })
		g.Close("redis", func() error { note("redis"); return nil })
		return nil
	})
	if !errors.Is(err, errBroken) || err.Error() != "reader: broken" {
		t.Fatalf("Run = %v, want reader: broken", err)
	}
	if got := strings.Join(order, ","); got != "streams,consumer,sender,redis" {
		t.Fatalf("stop order %s, want streams,consumer,sender,redis", got)
	}
}

// The NATS connection Group.NATS opened is drained in the third stage: a
// publish made by the last stage before it reaches the server.
func TestNATSIsDrainedAfterTheWork(t *testing.T) {
	t.Parallel()
	ns := testenv.StartNATS(t)
	reader := ns.Connect(t)
	sub, err := reader.SubscribeSync("stop.test")
	if err != nil {
		t.Fatal(err)
	}
	if err := reader.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	err = Run(ctx, discard, "test", testConfig{Base: Base{ShutdownTimeout: 5 * time.Second}, NATS: NATS{URL: ns.URL}}, func(ctx context.Context, g *Group) error {
		nc, _, err := g.NATS(NATS{URL: ns.URL}, "test")
		if err != nil {
			return err
		}
		g.Go(Work, "publisher", func(ctx context.Context) error {
			<-ctx.Done()
			return nc.Publish("stop.test", []byte("last words"))
		})
		g.Close("check", func() error {
			if !nc.IsClosed() {
				t.Error("NATS not closed before the stores")
			}
			return nil
		})
		cancel()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := sub.NextMsg(5 * time.Second); err != nil || string(m.Data) != "last words" {
		t.Fatalf("last publish: %v, %v", m, err)
	}
}

// `healthcheck` probes /healthz at HTTP_ADDR; a wrong configuration exits 2.
func TestMainHealthcheckAndConfigErrors(t *testing.T) {
	t.Parallel()
	web := webserver.New(discard, prometheus.NewRegistry())
	addr := make(chan string, 1)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- web.Serve(ctx, "127.0.0.1:0", func(a string) { addr <- a }, time.Second) }()
	a := <-addr
	t.Cleanup(func() { cancel(); <-done })

	load := func(environ, _ []string) (testConfig, error) { return LoadConfig(environ, testDefaults, nil) }
	run := func(context.Context, *slog.Logger, testConfig) error { return errors.New("failed") }
	var stderr bytes.Buffer
	for _, c := range []struct {
		args, environ []string
		want          int
		says          string
	}{
		{[]string{"healthcheck"}, []string{"HTTP_ADDR=" + a}, 0, ""},
		{[]string{"healthcheck"}, []string{"HTTP_ADDR=127.0.0.1:1"}, 1, "test healthcheck: probe"},
		{nil, []string{"LOG_LEVEL=loud"}, 2, "test: load config: LOG_LEVEL"},
		{nil, nil, 1, `"msg":"test stopped","err":"failed"`},
	} {
		stderr.Reset()
		if got := exitCode(t.Context(), "test", c.args, c.environ, &stderr, load, run); got != c.want || !strings.Contains(stderr.String(), c.says) {
			t.Errorf("%v %v: exit %d, %q; want %d, %q", c.args, c.environ, got, stderr.String(), c.want, c.says)
		}
	}
	resp, err := http.Get("http://" + a + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
}

// PPROF_ADDR serves the runtime's profiles on an address of its own while
// the service runs; without it nothing listens.
func TestMainServesPprofOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	load := func(environ, _ []string) (testConfig, error) { return LoadConfig(environ, testDefaults, nil) }
	var served bool
	run := func(ctx context.Context, _ *slog.Logger, _ testConfig) error {
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			resp, err := http.Get("http://" + addr + "/debug/pprof/cmdline")
			if err == nil {
				resp.Body.Close()
				served = resp.StatusCode == http.StatusOK
				return nil
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
		return errors.New("pprof never answered")
	}
	var stderr bytes.Buffer
	if got := exitCode(t.Context(), "test", nil, []string{"PPROF_ADDR=" + addr}, &stderr, load, run); got != 0 || !served {
		t.Fatalf("with PPROF_ADDR: exit %d, pprof answered 200: %v; log %s", got, served, stderr.String())
	}
	if strings.Contains(func() string {
		stderr.Reset()
		exitCode(t.Context(), "test", nil, nil, &stderr, load, func(context.Context, *slog.Logger, testConfig) error { return nil })
		return stderr.String()
	}(), "pprof listening") {
		t.Errorf("without PPROF_ADDR pprof was started: %s", stderr.String())
	}
}

// A PPROF_ADDR that cannot be bound (in use here) stops the start, naming
// the variable, before run is called: profiling asked for is not silently
// missing.
func TestMainRefusesAPprofAddrItCannotBind(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	addr := ln.Addr().String()
	load := func(environ, _ []string) (testConfig, error) { return LoadConfig(environ, testDefaults, nil) }
	ran := false
	run := func(context.Context, *slog.Logger, testConfig) error { ran = true; return nil }
	var stderr bytes.Buffer
	got := exitCode(t.Context(), "test", nil, []string{"PPROF_ADDR=" + addr}, &stderr, load, run)
	if got != 1 || ran || !strings.Contains(stderr.String(), "PPROF_ADDR "+addr) {
		t.Errorf("PPROF_ADDR in use: exit %d, run called %v, log %s; want exit 1 before run, naming PPROF_ADDR %s", got, ran, stderr.String(), addr)
	}
}

// The configuration log masks secrets and URL passwords, and names every
// variable.
func TestLogValueMasksSecrets(t *testing.T) {
	t.Parallel()
	cfg, err := LoadConfig([]string{"TEST_SECRET=hunter2", "NATS_URL=nats://u:s3cret@n:4222", "NATS_PASSWORD=pw"}, testDefaults, nil)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	slog.New(slog.NewJSONHandler(&b, nil)).Info("starting", "config", LogValue(cfg))
	for _, secret := range []string{"hunter2", "s3cret", `"pw"`} {
		if strings.Contains(b.String(), secret) {
			t.Errorf("logged %s: %s", secret, b.String())
		}
	}
	for _, name := range []string{"nats_url", "nats_password", "test_secret", "log_level", "shutdown_timeout"} {
		if !strings.Contains(b.String(), `"`+name+`"`) {
			t.Errorf("%s not logged: %s", name, b.String())
		}
	}
}

// A bootstrap spec that is not id:key is refused at once, not retried.
func TestBootstrapRefusesAMalformedSpec(t *testing.T) {
	t.Parallel()
	err := Owners{BootstrapOwners: "acme:key1, acme"}.Bootstrap(t.Context(), discard, nil)
	if err == nil || !strings.Contains(err.Error(), "SNIP_BOOTSTRAP_OWNERS") {
		t.Fatalf("Bootstrap = %v, want an error naming SNIP_BOOTSTRAP_OWNERS", err)
	}
}

// A bootstrap key or owner ID that no retry can make valid is refused at
// once, not retried until the service is stopped; the error does not show
// the key.
func TestBootstrapRefusesABadKeyAtOnce(t *testing.T) {
	t.Parallel()
	rdb, _ := testenv.StartRedis(t).NewDB(t)
	store := owners.NewStore(rdb)
	const short = "snip_tooshort"
	for _, spec := range []string{"acme:" + short, "bad.id:snip_long_enough_key_0123456789"} {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		start := time.Now()
		err := Owners{BootstrapOwners: spec}.Bootstrap(ctx, discard, store)
		cancel()
		if err == nil || errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "SNIP_BOOTSTRAP_OWNERS") {
			t.Errorf("Bootstrap(%q) = %v after %s, want an error naming SNIP_BOOTSTRAP_OWNERS at once", spec, err, time.Since(start).Round(time.Millisecond))
		}
		if err != nil && strings.Contains(err.Error(), short) {
			t.Errorf("Bootstrap error shows the key: %v", err)
		}
	}
}

// A bootstrap key that belongs to another owner is refused at once, not
// retried until the service is stopped, and the key stays its owner's.
func TestBootstrapRefusesAKeyOfAnotherOwnerAtOnce(t *testing.T) {
	t.Parallel()
	rdb, _ := testenv.StartRedis(t).NewDB(t)
	store := owners.NewStore(rdb)
	const key = "snip_owned_key_0123456789abcdef"
	if err := store.Ensure(t.Context(), "acme", key); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	start := time.Now()
	err := Owners{BootstrapOwners: "globex:" + key}.Bootstrap(ctx, discard, store)
	if !errors.Is(err, owners.ErrKeyTaken) || !strings.Contains(err.Error(), "SNIP_BOOTSTRAP_OWNERS") || !strings.Contains(err.Error(), "entry 1") {
		t.Fatalf("Bootstrap = %v after %s, want ErrKeyTaken naming SNIP_BOOTSTRAP_OWNERS and entry 1 at once", err, time.Since(start).Round(time.Millisecond))
	}
	if strings.Contains(err.Error(), key[5:15]) {
		t.Errorf("Bootstrap error shows the key: %v", err)
	}
	if o, err := store.Authenticate(t.Context(), key); err != nil || o.ID != "acme" {
		t.Errorf("the key authenticates as %+v, %v; want acme", o, err)
	}
}

// A password with a character that ends a URL's host part ('/', '?', '#')
// when unescaped is still masked: the log never shows it.
func TestMaskHidesPasswordsWithURLDelimiters(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, secret string }{
		{"redis://:pa#ss@h:6379/0", "pa#ss"},
		{"redis://u:pa/ss@h:6379/0", "pa/ss"},
		{"nats://app:s?cret@n1:4222,nats://app:s?cret@n2:4222", "s?cret"},
		{"nats://t/ok#en@n1:4222", "t/ok#en"},
		{"app:s3cret@n1:4222", "s3cret"},
		{"nats://n1:4222,app:s3cret@n2:4222", "s3cret"},
	} {
		if got := Mask(tc.in, false); strings.Contains(got, tc.secret) || !strings.Contains(got, "***") {
			t.Errorf("Mask(%q) = %q, shows %q", tc.in, got, tc.secret)
		}
	}
	for in, want := range map[string]string{
		"redis://u:pw@h:6379/0":    "redis://u:***@h:6379/0",
		"redis://127.0.0.1:6379/0": "redis://127.0.0.1:6379/0",
		"app:pw@n1:4222":           "app:***@n1:4222",
		"127.0.0.1:4222":           "127.0.0.1:4222",
	} {
		if got := Mask(in, false); got != want {
			t.Errorf("Mask(%q) = %q, want %q", in, got, want)
		}
	}
}

// An instance that stops behind a load balancer fails its readiness probe
// first: from the stop on, /readyz answers 503 "stopping" on new
// connections, which the listener takes for SHUTDOWN_READY_DELAY, so that
// the balancer takes the instance out before connections are refused;
// then the listener closes and the stop goes on.
func TestReadyzFailsBeforeTheListenerCloses(t *testing.T) {
	t.Parallel()
	const delay = 2 * time.Second
	web := webserver.New(discard, prometheus.NewRegistry())
	addrs := make(chan string, 1)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	cfg := testConfig{Base: Base{HTTPAddr: "127.0.0.1:0", ShutdownTimeout: 5 * time.Second, ShutdownReadyDelay: delay,
		Ready: func(a string) { addrs <- a }}}
	go func() {
		done <- Run(ctx, discard, "test", cfg, func(ctx context.Context, g *Group) error {
			g.Go(Intake, "http", g.HTTP(web))
			return nil
		})
	}()
	var addr string
	select {
	case addr = <-addrs:
	case err := <-done:
		t.Fatalf("Run returned at start: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the HTTP server did not listen within 30s")
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	readyz := func() (int, string, error) { // on a new connection each time
		resp, err := client.Get("http://" + addr + "/readyz")
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	if code, body, err := readyz(); code != http.StatusOK {
		t.Fatalf("/readyz before the stop = %d %s %v, want 200", code, body, err)
	}
	stopped := time.Now()
	cancel()
	for {
		code, body, err := readyz()
		if err != nil {
			t.Fatalf("%s after the stop began, /readyz: %v: the listener closed before readiness failed", time.Since(stopped), err)
		}
		if code == http.StatusServiceUnavailable && strings.Contains(body, `"stopping"`) {
			break
		}
		if time.Since(stopped) > delay/2 {
			t.Fatalf("/readyz %s after the stop began = %d %s, want 503 stopping", time.Since(stopped), code, body)
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v", err)
		}
		if took := time.Since(stopped); took < delay {
			t.Fatalf("the stop took %s, less than SHUTDOWN_READY_DELAY %s", took, delay)
		}
	case <-time.After(delay + 30*time.Second):
		t.Fatalf("Run still running %s after the stop began", delay+30*time.Second)
	}
	if _, _, err := readyz(); err == nil {
		t.Fatal("the listener still takes connections after Run returned")
	}
}

// A NATS connection the server closes for good (nats.go does not reconnect
// after some server errors, here a control line over the server's limit,
// whatever MaxReconnects says) stops the service with an error that names
// the connection and why, instead of leaving it up, never ready, for ever.
func TestNATSClosedForGoodStopsTheService(t *testing.T) {
	t.Parallel()
	// The server binds a port of the kernel's choosing: one drawn free
	// and bound later can be taken in between by another test binary.
	opts := testenv.NATSOptions(server.RANDOM_PORT, t.TempDir())
	opts.JetStream = false
	opts.MaxControlLine = 1024
	srv, err := testenv.RunNATSServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	url := srv.ClientURL()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var conn atomic.Pointer[nats.Conn]
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, discard, "test", testConfig{Base: Base{ShutdownTimeout: 5 * time.Second}, NATS: NATS{URL: url}}, func(ctx context.Context, g *Group) error {
			nc, _, err := g.NATS(NATS{URL: url}, "test")
			if err != nil {
				return err
			}
			conn.Store(nc)
			g.Go(Intake, "oversized publish", func(ctx context.Context) error {
				if err := nc.Publish(strings.Repeat("s", 2048), nil); err != nil {
					return err
				}
				<-ctx.Done()
				return nil
			})
			return nil
		})
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "nats test: connection closed for good") ||
			!strings.Contains(strings.ToLower(err.Error()), "maximum control line exceeded") {
			t.Fatalf("Run = %v, want the connection named, closed for good, with the server's error", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the service still runs 30s after the server closed its NATS connection (status %s, last error %v)",
			conn.Load().Status(), conn.Load().LastError())
	}
}

// A NATS server that refuses the service's credentials from the start is
// named in /readyz's reason: the refusals of a first connection are not
// logged (the error handler logs them only once it had connected), so
// nothing else says why the service waits.
func TestNATSReadySaysWhyItIsNotConnected(t *testing.T) {
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
	nc, err := natsconn.Connect(NATS{URL: srv.ClientURL(), User: "app", Password: "wrong"}.Conn("test"), discard)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ready := NATSReady(nc)
	var last error
	if !testenv.Poll(10*time.Second, func() bool {
		last = ready(t.Context())
		return last != nil && strings.Contains(strings.ToLower(last.Error()), "authorization violation")
	}) {
		t.Fatalf("readiness says %v, want it to name the refused credentials", last)
	}
}
