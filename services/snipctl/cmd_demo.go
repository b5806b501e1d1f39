package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/natsconn"
	"github.com/snipdev/snip/pkg/owners"
	"github.com/snipdev/snip/pkg/redisconn"
	"github.com/snipdev/snip/pkg/service"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// The demo owner's API key. It is fixed so the printed curl commands work
// every time; it is for the local demo only.
const (
	demoOwner  = "demo"
	demoAPIKey = "snip_demo_local_only_0123456789"
)

// demoService is one Snip service the demo runs as a child process.
type demoService struct {
	name string // folder under services/ and binary name
	port int    // HTTP port offset from --http-base (8080)
	env  func(d *demo) []string
}

// demoServices in start order: the redirect first (it creates the links),
// the readers after it.
var demoServices = []demoService{
	{name: "redirect", port: 0, env: func(d *demo) []string {
		// The demo's traffic and `make loadtest` come from this machine and
		// carry each visitor's address in X-Forwarded-For: trust it from here.
		env := []string{"SNIP_BOOTSTRAP_OWNERS=" + demoOwner + ":" + demoAPIKey, "SNIP_TRUSTED_PROXIES=127.0.0.1/32"}
		if d.redisReplicas {
			// Acknowledged clicks, links and keys wait for the replica.
			env = append(env, "SNIP_OUTBOX_WAIT_REPLICAS=1")
		}
		return env
	}},
	{name: "preview", port: 4, env: func(d *demo) []string {
		// The demo's links point at the local demo site; let the fetcher in.
		return []string{"PREVIEW_ALLOW_CIDRS=127.0.0.1/32"}
	}},
	{name: "clickcounter", port: 1, env: func(d *demo) []string {
		if d.redisReplicas {
			// Verdicts and LINKS records wait for the replica before the ack.
			return []string{"CLICKCOUNTER_WAIT_REPLICAS=1"}
		}
		return nil
	}},
	{name: "fraud", port: 2, env: func(d *demo) []string {
		if d.redisReplicas {
			// Statistics and alerts wait for the replica before the ack.
			return []string{"FRAUD_WAIT_REPLICAS=1"}
		}
		return nil
	}},
	{name: "warehouse", port: 3, env: func(d *demo) []string {
		return []string{"CLICKHOUSE_ADDR=" + d.clickhouseAddr, "CLICKHOUSE_DATABASE=snip"}
	}},
	{name: "console", port: 5, env: func(d *demo) []string {
		return []string{"CLICKHOUSE_ADDR=" + d.clickhouseAddr, "CLICKHOUSE_DATABASE=snip"}
	}},
	{name: "webhooks", port: 7, env: func(d *demo) []string {
		// The demo's receiver listens on this machine over plain http.
		env := []string{"WEBHOOKS_HTTP_HOSTS=127.0.0.1", "WEBHOOKS_ALLOW_CIDRS=127.0.0.1/32"}
		if d.redisReplicas {
			env = append(env, "WEBHOOKS_WAIT_REPLICAS=1")
		}
		return env
	}},
}

type demo struct {
	env            *Env
	dir, bin       string
	natsURL        string
	redisURL       string
	clickhouseAddr string
	siteURL        string
	httpBase       int
	natsHTTP       int
	// natsProf is the embedded NATS server's profiling port (0: off).
	natsProf int
	// redisReplicas: Redis runs with a replica per master (--cluster), so
	// the services wait for it before they acknowledge.
	redisReplicas bool
	// shrinkRetention: --shrink-retention, the topology may shorten the
	// retention of the streams an earlier demo left in --dir.
	shrinkRetention bool
	// readyWait is how long the demo waits for every service's /readyz
	// before it prints the banner (20 s).
	readyWait time.Duration
	procs     []*demoProc
	// stopping is set when the demo stops its children; a child that exits
	// before is reported.
	stopping atomic.Bool
	outMu    sync.Mutex
}

type demoPort struct {
	what string
	port int
}

// portsFree says which of the demo's ports is taken, if one is
// (*portInUseError).
func portsFree(ports []demoPort) error {
	release, err := holdPorts(ports)
	if err == nil {
		release()
	}
	return err
}

// holdPorts listens on each of the demo's ports, or says which is taken
// (*portInUseError), and keeps them until release: the clusters started
// meanwhile draw free ports of their own, and must not draw one of these
// (a NATS node on a service's port made the service fail to bind).
func holdPorts(ports []demoPort) (release func(), err error) {
	var held []net.Listener
	release = func() {
		for _, l := range held {
			l.Close()
		}
	}
	for _, p := range ports {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)))
		if err != nil {
			release()
			return nil, &portInUseError{port: p, err: err}
		}
		held = append(held, l)
	}
	return release, nil
}

// portInUseError is the demo refusing to start on a port that is taken.
type portInUseError struct {
	port demoPort
	err  error
}

func (e *portInUseError) Error() string {
	return fmt.Sprintf("demo: port %d (%s) is in use: is another demo running, or still stopping? "+
		"Stop it, or choose other ports (snipctl demo -h): %v", e.port.port, e.port.what, e.err)
}

func (e *portInUseError) Unwrap() error { return e.err }

// demoProc is one child process. A service is supervised: when it exits
// while the demo runs, it is started again after a backoff (1 s, doubling
// to 30 s; back to 1 s after a minute up), and the terminal and its log say
// so. Redis and ClickHouse are reported, not restarted.
type demoProc struct {
	name    string
	bin     string
	env     []string
	args    []string
	restart bool

	mu       sync.Mutex
	cmd      *exec.Cmd // the current run
	stopped  bool      // no further run starts
	restarts int

	stop chan struct{} // closed by stopAll: ends a backoff wait
	// firstExit closes when the first run exits: the health check stops
	// waiting for it.
	firstExit chan struct{}
	// done closes when the process has exited for good.
	done chan struct{}
}

// Restart backoff of a supervised service.
const (
	restartMin   = time.Second
	restartMax   = 30 * time.Second
	restartReset = time.Minute
)

// maxDemoRate bounds --rate: the trickle sends one click at a time, and a
// rate whose interval rounds to nothing would make its ticker panic.
const maxDemoRate = 10_000

// errStopped: the demo is stopping, nothing more starts.
var errStopped = errors.New("the demo is stopping")

// cmdDemo runs the whole system on this machine with no Docker: an embedded
// NATS server, Redis and ClickHouse from the local binaries (data under
// --dir), every service binary found in --bin, a demo owner, demo links, a
// small site for the previews to fetch, and a trickle of traffic.
//
// Stopped (Ctrl-C, SIGTERM) while it starts, it stops what it started and
// returns nil, as a stop once it runs does: the start-up step the stop cut
// short failed for it, not for a fault the operator should look for.
func cmdDemo(ctx context.Context, env *Env, args []string) (err error) {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	fs.Usage = func() { demoUsage(fs) }
	dir := fs.String("dir", ".demo", "folder for the demo's data and logs")
	bin := fs.String("bin", ".demo/bin", "folder with the service binaries (make build)")
	natsPort := fs.Int("nats-port", 4222, "NATS client port")
	natsHTTP := fs.Int("nats-monitor-port", 8222, "NATS monitoring port")
	httpBase := fs.Int("http-base", 8080, "HTTP port of the redirect service; the others follow (counter +1, fraud +2, warehouse +3, preview +4, console +5, webhooks +7)")
	redisPort := fs.Int("redis-port", 6390, "Redis port")
	chPort := fs.Int("clickhouse-port", 19000, "ClickHouse native port")
	sitePort := fs.Int("site-port", 8089, "port of the local demo site the links point at")
	rate := fs.Float64("rate", 5, "demo clicks per second (0 for none; at most 10000)")
	natsProf := fs.Int("nats-prof-port", 0, "serve the demo process's Go profiles (/debug/pprof/: its embedded NATS server's heap and CPU) on this loopback port, as nats-server's prof_port does (0: off; not with --cluster)")
	shrink := fs.Bool("shrink-retention", false, "let the topology shorten the retention of the streams an earlier demo left in --dir (a shorter SNIP_CLICKS_MAX_AGE or SNIP_CLICKS_MAX_BYTES than that run's), discarding the events that fall outside")
	cluster := fs.Bool("cluster", false, "run on a 3-node NATS cluster (streams with 3 replicas) and a Redis Cluster (3 masters, 3 replicas) on free ports, to kill or freeze a node and watch; --nats-port, --nats-monitor-port, --nats-prof-port and --redis-port are not used")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil // -h: the demo's usage, printed once by fs.Usage
		}
		return fmt.Errorf("demo: %w", errUsageShown) // the flag package printed the error and the demo's usage
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("demo: unexpected arguments %q: %w", fs.Args(), errUsage)
	}
	if !*cluster && env.Cfg.Replicas > 1 {
		// One embedded server keeps one copy: the topology would fail
		// after NATS, Redis and ClickHouse started, with the server's
		// "replicas > 1 not supported in non-clustered mode".
		return fmt.Errorf("demo: SNIP_REPLICAS=%d needs --cluster (three NATS servers); without it the demo runs one, which keeps one copy: unset SNIP_REPLICAS, or add --cluster: %w", env.Cfg.Replicas, errUsage)
	}
	if !(*rate >= 0 && *rate <= maxDemoRate) { // NaN too
		return fmt.Errorf("demo: --rate %g: want 0 (no clicks) to %d clicks per second: %w", *rate, maxDemoRate, errUsage)
	}
	defer func() {
		if err != nil && ctx.Err() != nil {
			err = nil
		}
	}()
	d := &demo{env: env, dir: *dir, bin: *bin, httpBase: *httpBase, natsHTTP: *natsHTTP, natsProf: *natsProf, shrinkRetention: *shrink, readyWait: 20 * time.Second}
	// Every port first: a demo still running (or still stopping) would
	// otherwise answer the new demo's health checks while the new services
	// fail to bind, and the banner would say all is well.
	ports := []demoPort{{"clickhouse", *chPort}, {"demo site", *sitePort}}
	if !*cluster {
		ports = append(ports, demoPort{"nats", *natsPort}, demoPort{"nats monitoring", *natsHTTP}, demoPort{"redis", *redisPort})
		if *natsProf > 0 {
			ports = append(ports, demoPort{"nats profiling", *natsProf})
		}
	}
	for _, s := range demoServices {
		ports = append(ports, demoPort{s.name, *httpBase + s.port})
	}
	release, err := holdPorts(ports)
	if err != nil {
		return err
	}
	defer release() // on an early return; closing twice is harmless
	if !*cluster {
		release()
	}
	stopWithParent()
	d.logf("starting the demo: data and logs in %s (Ctrl-C, or SIGTERM to pid %d, stops it)", d.dir, os.Getpid())
	for _, sub := range []string{"nats", "redis", "clickhouse", "logs"} {
		if err := os.MkdirAll(filepath.Join(d.dir, sub), 0o755); err != nil {
			return fmt.Errorf("demo: %w", err)
		}
	}
	// Deferred first, so it runs last: once every child and NATS stopped.
	defer d.logf("snip demo stopped")
	defer d.stopAll()

	var cl *demoCluster
	if *cluster {
		cl, err = d.startCluster()
		release() // the clusters have their ports; the services bind theirs next
		if err != nil {
			return err
		}
		d.redisReplicas = true
		// The services stop first, while the clusters still answer.
		defer func() {
			d.stopAll()
			cl.Close()
		}()
	} else {
		ns, err := d.startNATS(*natsPort)
		if err != nil {
			return err
		}
		// The services stop first, while NATS still answers their last acks
		// and their leaving the groups; then NATS.
		defer func() {
			d.stopAll()
			ns.Shutdown()
		}()
		if err := d.startRedis(ctx, *redisPort); err != nil {
			return err
		}
	}
	d.startClickHouse(*chPort)
	site, err := d.startSite(*sitePort)
	if err != nil {
		return err
	}
	defer site.Close()

	if err := d.prepare(ctx); err != nil {
		return err
	}
	started := d.startServices(ctx)
	links, err := d.createLinks(ctx)
	if err != nil {
		return err
	}
	waiting := d.readiness(ctx, started)
	defer d.joinWebhooks(ctx, started)()
	d.banner(started, waiting, links)
	if cl != nil {
		d.clusterBanner(cl)
		go d.watchCluster(ctx, cl)
	}
	if len(waiting) > 0 {
		go d.watchReadiness(ctx, waiting)
	}
	if *rate > 0 {
		go d.trickle(ctx, links, *rate)
	}
	<-ctx.Done()
	d.logf("\nstopping the demo: the services first, then Redis and ClickHouse, then NATS...")
	return nil
}

// demoUsage prints the demo's usage once: what it runs, its flags, and the
// environment it reads.
func demoUsage(fs *flag.FlagSet) {
	w := fs.Output()
	fmt.Fprint(w, `usage: snipctl demo [flags]

Runs the whole system on this machine: an embedded NATS server, Redis and
ClickHouse from the local binaries, every service binary found in --bin
(make build), a local site the demo links point at, a demo owner with five
links, and a trickle of clicks. A service that exits is restarted (with
backoff). Ctrl-C or SIGTERM stops everything.

With --cluster it runs on three nats-server processes (streams with 3
replicas) and a Redis Cluster of three masters and three replicas, on free
ports of 127.0.0.1, started empty each time; the banner lists every node's
PID and ports. Kill (kill -9) or freeze (kill -STOP) a node and watch the
services go on; kill -USR1 to snipctl starts every killed node again.

flags:
`)
	fs.PrintDefaults()
	fmt.Fprint(w, `
environment:
  SNIP_PARTITIONS        CLICKS partitions (default 8)
  SNIP_REPLICAS          stream replicas (default 1; 3 with --cluster)
  SNIP_CLICKS_MAX_AGE    CLICKS retention by age (default 168h)
  SNIP_CLICKS_MAX_BYTES  CLICKS retention by size (default: none)
  SNIPCTL_TIMEOUT        timeout of each setup call and HTTP call to a service (default 30s)
The demo starts its own NATS and Redis: NATS_URL and REDIS_URL are not read.
Its streams stay in --dir from run to run (not with --cluster): a shorter
retention than an earlier run's needs --shrink-retention, another partition
count an empty --dir/nats.
`)
}

func (d *demo) logf(format string, a ...any) {
	d.outMu.Lock()
	defer d.outMu.Unlock()
	fmt.Fprintf(d.env.Stdout, format+"\n", a...)
}

// startNATS, startRedis and startClickHouse start the servers as the tests
// do (pkg/testenv: the same options, arguments and configuration), on the
// demo's ports, with the data under --dir.
func (d *demo) startNATS(port int) (*server.Server, error) {
	o := testenv.NATSOptions(port, filepath.Join(d.dir, "nats"))
	o.ServerName, o.HTTPHost, o.HTTPPort = "snip-demo", "127.0.0.1", d.natsHTTP
	// Durability is a stated choice (docs/durability.md): fsync every
	// second rather than the server's default two minutes.
	o.SyncInterval = time.Second
	o.ProfPort = d.natsProf
	ns, err := testenv.RunNATSServer(o)
	if err != nil {
		// The ports were free at the demo's check, but another program can
		// take one before the server listens on it (the server then never
		// becomes ready): say which, as the check would have.
		ports := []demoPort{{"nats", port}, {"nats monitoring", d.natsHTTP}}
		if d.natsProf > 0 {
			ports = append(ports, demoPort{"nats profiling", d.natsProf})
		}
		if inUse := portsFree(ports); inUse != nil {
			return nil, inUse
		}
		return nil, fmt.Errorf("demo: %w", err)
	}
	d.natsURL = ns.ClientURL()
	d.logf("nats         %s (monitoring http://127.0.0.1:%d)", d.natsURL, d.natsHTTP)
	if d.natsProf > 0 {
		d.logf("profiles     http://127.0.0.1:%d/debug/pprof/ (this process: the NATS server)", d.natsProf)
	}
	return ns, nil
}

func (d *demo) startRedis(ctx context.Context, port int) error {
	bin, err := testenv.FindBinary("redis-server", "redis-server")
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	dir, _ := filepath.Abs(filepath.Join(d.dir, "redis"))
	if _, err := d.spawn("redis", bin, nil, false, testenv.RedisArgs(port, dir)...); err != nil {
		return err
	}
	d.redisURL = fmt.Sprintf("redis://127.0.0.1:%d/0", port)
	rdb := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port)})
	defer rdb.Close()
	if err := waitUntil(ctx, 15*time.Second, func() error { return rdb.Ping(ctx).Err() }); err != nil {
		return fmt.Errorf("demo: redis did not start on port %d: %w (see %s)", port, err, d.logPath("redis"))
	}
	d.logf("redis        %s (data in %s)", d.redisURL, dir)
	return nil
}

// startClickHouse starts clickhouse-server when there is one. Without it the
// warehouse loader waits and catches up from the log once one appears.
func (d *demo) startClickHouse(port int) {
	d.clickhouseAddr = fmt.Sprintf("127.0.0.1:%d", port)
	bin, err := testenv.FindBinary("clickhouse-server", "clickhouse-server")
	if err != nil {
		d.logf("clickhouse   not found: the warehouse loader will wait for %s and catch up from CLICKS when it appears", d.clickhouseAddr)
		return
	}
	dir, _ := filepath.Abs(filepath.Join(d.dir, "clickhouse"))
	cfg, err := testenv.WriteClickHouseConfig(dir, port)
	if err != nil {
		d.logf("clickhouse   not started: %v", err)
		return
	}
	if _, err := d.spawn("clickhouse", bin, nil, false, "--config-file="+cfg); err != nil {
		d.logf("clickhouse   not started: %v", err)
		return
	}
	d.logf("clickhouse   %s (native protocol; data in %s)", d.clickhouseAddr, dir)
}

// startSite serves a few article pages with Open Graph tags, so the preview
// workers have something real to fetch without the internet.
func (d *demo) startSite(port int) (*http.Server, error) {
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return nil, fmt.Errorf("demo: site: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/articles/{slug}", func(w http.ResponseWriter, r *http.Request) {
		slug := r.PathValue("slug")
		title := strings.ToUpper(slug[:1]) + strings.ReplaceAll(slug[1:], "-", " ")
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, `<!doctype html><html><head><title>%[1]s | Demo Site</title>
<meta property="og:title" content="%[1]s">
<meta property="og:description" content="A demo article about %[1]s, served by snipctl demo.">
<meta property="og:image" content="/images/%[2]s.png">
<meta property="og:site_name" content="Snip Demo Site">
</head><body><h1>%[1]s</h1></body></html>`, title, slug)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	d.siteURL = "http://" + ln.Addr().String()
	return srv, nil
}

// prepare applies the topology and creates the demo owner, so everything
// exists before the services start.
func (d *demo) prepare(ctx context.Context) error {
	nc, err := natsconn.Connect(natsconn.Config{URL: d.natsURL, Name: "snipctl-demo"}, d.env.Log)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	tctx, cancel := context.WithTimeout(ctx, d.env.Cfg.Timeout)
	defer cancel()
	// A cluster just started may not place replicated assets for a moment
	// (topology.NoPeersYet); anything else is the demo's error at once.
	o := d.env.Cfg.Topology.Options()
	o.ShrinkRetention = d.shrinkRetention
	err = service.Backoff{Attempt: d.env.Cfg.Timeout}.Retry(tctx, d.env.Log, "apply topology", func(ctx context.Context) error {
		err := topology.Apply(ctx, js, o)
		if err != nil && !topology.NoPeersYet(err) {
			return service.Permanent(err)
		}
		return err
	})
	if err != nil {
		return d.topologyError(err)
	}
	rdb, err := redisconn.Open(d.redisURL)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	defer rdb.Close()
	if err := owners.NewStore(rdb).Ensure(tctx, demoOwner, demoAPIKey); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	return nil
}

// topologyError is the demo's error for a topology it could not apply.
// The streams of an earlier demo stay in --dir/nats; one started with a
// longer SNIP_CLICKS_MAX_AGE (or a larger SNIP_CLICKS_MAX_BYTES, or another
// SNIP_PARTITIONS) than this one is refused by the topology, whose error
// names `snipctl topology apply`'s flags: the demo's NATS runs only while
// the demo does, so the error says what works for the demo instead.
func (d *demo) topologyError(err error) error {
	data := filepath.Join(d.dir, "nats")
	fresh := fmt.Sprintf("or remove %s (rm -rf %s) to start with empty streams", data, data)
	// What differs, without the retry's prefixes and the sentinel's hint.
	what := func(sentinel error) string {
		s := strings.TrimSuffix(err.Error(), ": "+sentinel.Error())
		for {
			rest, ok := strings.CutPrefix(s, "apply topology: ")
			if !ok {
				return s
			}
			s = rest
		}
	}
	switch {
	case errors.Is(err, topology.ErrRetentionShrinks):
		return &demoTopologyError{err: err, msg: fmt.Sprintf("demo: the streams an earlier demo left in %s keep more than this one's settings would (%s), "+
			"and the demo discards no events unless told to: start it with that run's SNIP_CLICKS_MAX_AGE and SNIP_CLICKS_MAX_BYTES; "+
			"or with --shrink-retention (make demo DEMO_FLAGS=--shrink-retention) to discard what falls outside; %s", data, what(topology.ErrRetentionShrinks), fresh)}
	case errors.Is(err, topology.ErrPartitionsChanged):
		return &demoTopologyError{err: err, msg: fmt.Sprintf("demo: CLICKS as an earlier demo left it in %s has another partition count than SNIP_PARTITIONS=%d (%s): "+
			"start the demo with that run's SNIP_PARTITIONS, %s", data, d.env.Cfg.Partitions, what(topology.ErrPartitionsChanged), fresh)}
	}
	return fmt.Errorf("demo: %w", err)
}

// demoTopologyError is topologyError's message around the topology's error.
type demoTopologyError struct {
	msg string
	err error
}

func (e *demoTopologyError) Error() string { return e.msg }
func (e *demoTopologyError) Unwrap() error { return e.err }

// startServices starts every service whose binary is in --bin and returns
// the names of those started.
func (d *demo) startServices(ctx context.Context) []string {
	var started []string
	common := []string{
		"NATS_URL=" + d.natsURL,
		"REDIS_URL=" + d.redisURL,
		"SNIP_PARTITIONS=" + strconv.Itoa(d.env.Cfg.Partitions),
		"SNIP_REPLICAS=" + strconv.Itoa(d.env.Cfg.Replicas),
		"LOG_LEVEL=info",
	}
	for _, s := range demoServices {
		bin := filepath.Join(d.bin, s.name)
		if _, err := os.Stat(bin); err != nil {
			d.logf("%-12s not built (%s missing); skipped", s.name, bin)
			continue
		}
		env := append(slices.Clone(common), "HTTP_ADDR="+d.addr(s.port))
		if s.env != nil {
			env = append(env, s.env(d)...)
		}
		if _, err := d.spawn(s.name, bin, env, true); err != nil {
			d.logf("%-12s failed to start: %v", s.name, err)
			continue
		}
		started = append(started, s.name)
	}
	for _, s := range demoServices {
		if !slices.Contains(started, s.name) {
			continue
		}
		url := "http://" + d.addr(s.port) + "/healthz"
		p := d.proc(s.name)
		if err := waitUntil(ctx, 30*time.Second, func() error {
			select {
			case <-p.firstExit:
				return stopWaiting{fmt.Errorf("exited; it is restarted with backoff")}
			default:
			}
			return httpOK(ctx, d.httpClient(), url)
		}); err != nil {
			d.logf("%-12s not healthy yet: %v (see %s)", s.name, err, d.logPath(s.name))
			continue
		}
		d.logf("%-12s http://%s (pid %d, log %s)", s.name, d.addr(s.port), p.pid(), d.logPath(s.name))
	}
	return started
}

type demoLink struct {
	Code   string `json:"code"`
	Target string `json:"target"`
}

// createLinks creates (or finds) the demo links through the redirect API.
func (d *demo) createLinks(ctx context.Context) ([]demoLink, error) {
	var links []demoLink
	for _, slug := range []string{"nats-jetstream", "queues-and-logs", "the-outbox", "consumer-groups", "dead-letters"} {
		body, _ := json.Marshal(map[string]string{"url": d.siteURL + "/articles/" + slug, "code": slug})
		var code int
		var resp []byte
		err := waitUntil(ctx, 30*time.Second, func() error {
			var err error
			code, resp, err = httpPost(ctx, d.httpClient(), "http://"+d.addr(0)+"/api/links", demoAPIKey, body)
			if err == nil && code == http.StatusServiceUnavailable {
				// Starting (its listener answers before Redis does), or
				// Redis away: try again.
				return fmt.Errorf("%d %s", code, bytes.TrimSpace(resp))
			}
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("demo: create link %s: %w (is the redirect service running? see %s)", slug, err, d.logPath("redirect"))
		}
		if code != http.StatusCreated && code != http.StatusConflict {
			return nil, fmt.Errorf("demo: create link %s: %d %s", slug, code, resp)
		}
		links = append(links, demoLink{Code: slug, Target: d.siteURL + "/articles/" + slug})
	}
	return links, nil
}

// readiness waits a little for every started service's /readyz, and
// returns those not ready then, with the reason each gives (the warehouse
// waits for ClickHouse, which takes a few seconds to start).
func (d *demo) readiness(ctx context.Context, started []string) map[string]string {
	d.logf("waiting for the services to be ready (/readyz)...")
	waiting := map[string]string{}
	deadline := time.Now().Add(d.readyWait)
	for _, name := range started {
		var why string
		_ = waitUntil(ctx, time.Until(deadline), func() error {
			if ctx.Err() != nil {
				return stopWaiting{ctx.Err()}
			}
			why = d.notReady(ctx, name)
			if why != "" {
				return errors.New(why)
			}
			return nil
		})
		if why != "" {
			waiting[name] = why
		}
	}
	return waiting
}

// notReady is why a service's /readyz does not answer 200; "" when it does.
// The request ends with ctx (the demo stopping), or after 2 s.
func (d *demo) notReady(ctx context.Context, name string) string {
	s := demoServiceNamed(name)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+d.addr(s.port)+"/readyz", nil)
	if err != nil {
		return err.Error()
	}
	resp, err := (&http.Client{Timeout: 2 * time.Second}).Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		return ""
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
	return strings.TrimSpace(resp.Status + " " + string(b))
}

// watchReadiness says on the terminal when each waiting service turns ready.
func (d *demo) watchReadiness(ctx context.Context, waiting map[string]string) {
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for len(waiting) > 0 {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, name := range slices.Sorted(maps.Keys(waiting)) {
			if d.notReady(ctx, name) == "" {
				delete(waiting, name)
				d.logf("%-12s ready now", name)
			}
		}
	}
	d.logf("every service is ready")
}

func demoServiceNamed(name string) demoService {
	for _, s := range demoServices {
		if s.name == name {
			return s
		}
	}
	return demoService{name: name}
}

func (d *demo) banner(started []string, waiting map[string]string, links []demoLink) {
	var ready []string
	for _, name := range started {
		if _, w := waiting[name]; !w {
			ready = append(ready, name)
		}
	}
	if len(waiting) == 0 {
		d.logf("\nSnip is running: %s (all ready)", strings.Join(started, ", "))
	} else {
		d.logf("\nSnip is starting. Ready: %s.", strings.Join(ready, ", "))
		for _, name := range slices.Sorted(maps.Keys(waiting)) {
			note := ""
			if name == "warehouse" || name == "console" {
				note = " (ClickHouse takes a few seconds to start; nothing is lost meanwhile: clicks wait in CLICKS)"
			}
			d.logf("Still waiting: %s: %s%s", name, waiting[name], note)
		}
		d.logf("This terminal says when each one is ready.")
	}
	if slices.Contains(started, "console") {
		d.logf("\n  console:   http://%s/", d.addr(5))
	}
	d.logf(`
  demo owner: %[1]s   API key: %[2]s
  demo site:  %[8]s (the links point at its pages; the preview workers fetch them)

  try:
    curl -i http://%[6]s/%[3]s
    curl -s -o /dev/null -w '%%{http_code}\n' -A 'Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0' http://%[6]s/%[3]s
    curl -s -H 'Authorization: Bearer %[2]s' -H 'Content-Type: application/json' \
         -d '{"target":"%[8]s/articles/hello"}' http://%[6]s/api/links
    curl -s -H 'Authorization: Bearer %[2]s' http://%[6]s/api/links/%[3]s
    curl -s -H 'Authorization: Bearer %[2]s' http://%[7]s/api/links/%[3]s/stats
    NATS_URL=%[4]s %[10]s lag
    clickhouse-client --port %[9]s --database snip -q 'SELECT code, uniqExact(event_id) AS clicks, sum(bot) AS bot_rows FROM clicks GROUP BY code ORDER BY clicks DESC'%[12]s

  curl's own clicks count as bots (its user agent is a tool's): the second
  line sends a browser's user agent and counts as a person. curl -I sends
  HEAD, which answers 302 but is not counted as a click. Stats follow within
  a second or two.

  logs in %[5]s; Ctrl-C (or SIGTERM to pid %[11]d) stops everything.`,
		demoOwner, demoAPIKey, links[0].Code, d.natsURL, filepath.Join(d.dir, "logs"), d.addr(0), d.addr(1),
		d.siteURL, clickhousePort(d.clickhouseAddr), filepath.Join(d.bin, "snipctl"), os.Getpid(),
		clickhouseClientMissing())
}

// clickhouseClientMissing is the banner's line under its clickhouse-client
// command when no clickhouse-client is on the PATH: on Debian and Ubuntu the
// client is a package of its own, which clickhouse-server does not bring, so
// a newcomer who installed the server alone would otherwise meet "command
// not found" and no hint.
func clickhouseClientMissing() string {
	if _, err := exec.LookPath("clickhouse-client"); err == nil {
		return ""
	}
	return "\n      (clickhouse-client is not on the PATH: on Debian and Ubuntu it is a package of its own,\n       apt-get install clickhouse-client; clickhouse-server does not bring it)"
}

func clickhousePort(addr string) string {
	_, port, _ := net.SplitHostPort(addr)
	return port
}

// trickle sends demo clicks: people from many addresses (sent in
// X-Forwarded-For, which the demo's redirect trusts from this machine), a
// share of crawlers and link unfurlers, and once a minute a burst from one
// visitor for the fraud detector to find.
func (d *demo) trickle(ctx context.Context, links []demoLink, rate float64) {
	client := &http.Client{Timeout: 5 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	browsers := []string{
		"Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0 Safari/537.36",
		"Mozilla/5.0 (iPhone; CPU iPhone OS 18_0 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.0 Mobile/15E148 Safari/604.1",
		"Mozilla/5.0 (Macintosh; Intel Mac OS X 14_5) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.5 Safari/605.1.15",
		"Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:133.0) Gecko/20100101 Firefox/133.0",
	}
	bots := []string{
		"Slackbot-LinkExpanding 1.0 (+https://api.slack.com/robots)",
		"Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
	}
	countries := []string{"DE", "US", "FR", "GB", "BR", "IN", "JP"}
	click := func(code, ip, ua string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+d.addr(0)+"/"+code, nil)
		req.Header.Set("User-Agent", ua)
		req.Header.Set("X-Forwarded-For", ip)
		req.Header.Set("X-Country", countries[rand.IntN(len(countries))])
		req.Header.Set("Referer", "https://news.example/item/"+strconv.Itoa(rand.IntN(50)))
		if resp, err := client.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	t := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer t.Stop()
	burst := time.NewTicker(time.Minute)
	defer burst.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-burst.C:
			// One visitor, one link, 30 clicks in a few seconds: more than the
			// 20 a minute fraud detection allows a person.
			l := links[rand.IntN(len(links))]
			for range 30 {
				click(l.Code, "198.51.100.66", browsers[0])
			}
		case <-t.C:
			l := links[rand.IntN(len(links))]
			ip := fmt.Sprintf("203.0.%d.%d", rand.IntN(256), 1+rand.IntN(254))
			ua := browsers[rand.IntN(len(browsers))]
			if rand.IntN(10) == 0 {
				ua = bots[rand.IntN(len(bots))]
			}
			click(l.Code, ip, ua)
		}
	}
}

// addr is the listen address of the service at a port offset.
func (d *demo) addr(offset int) string { return "127.0.0.1:" + strconv.Itoa(d.httpBase+offset) }

func (d *demo) logPath(name string) string { return filepath.Join(d.dir, "logs", name+".log") }

// spawn starts a child process with its output in the demo's log folder,
// and supervises it (restart: start it again when it dies). The kernel
// kills it if snipctl dies.
func (d *demo) spawn(name, bin string, env []string, restart bool, args ...string) (*demoProc, error) {
	p := &demoProc{name: name, bin: bin, env: env, args: args, restart: restart,
		stop: make(chan struct{}), firstExit: make(chan struct{}), done: make(chan struct{})}
	cmd, logf, err := d.startOnce(p)
	if err != nil {
		return nil, err
	}
	d.procs = append(d.procs, p)
	go d.supervise(p, cmd, logf)
	return p, nil
}

// startOnce starts one run of p, unless the demo is stopping.
func (d *demo) startOnce(p *demoProc) (*exec.Cmd, *os.File, error) {
	logf, err := os.OpenFile(d.logPath(p.name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, fmt.Errorf("demo: %s log: %w", p.name, err)
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		logf.Close()
		return nil, nil, errStopped
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, nil, fmt.Errorf("demo: start %s: %w", p.name, err)
	}
	p.cmd = cmd
	return cmd, logf, nil
}

// supervise waits for p's runs and restarts a service that exits while the
// demo runs.
func (d *demo) supervise(p *demoProc, cmd *exec.Cmd, logf *os.File) {
	defer close(p.done)
	backoff := restartMin
	first := true
	for {
		started := time.Now()
		err := cmd.Wait()
		up := time.Since(started).Round(100 * time.Millisecond)
		logf.Close()
		if first {
			close(p.firstExit)
			first = false
		}
		if d.stopping.Load() || p.isStopped() {
			return
		}
		if !p.restart {
			d.logf("%-12s EXITED (%v); the demo goes on without it: see %s", p.name, err, d.logPath(p.name))
			return
		}
		if up >= restartReset {
			backoff = restartMin
		}
		for {
			p.mu.Lock()
			p.restarts++
			n := p.restarts
			p.mu.Unlock()
			msg := fmt.Sprintf("%s exited (%v) after %s; restarting it in %s (restart %d)", p.name, err, up, backoff, n)
			d.logf("%-12s EXITED (%v) after %s; restarting it in %s (restart %d; log %s)", p.name, err, up, backoff, n, d.logPath(p.name))
			d.noteInLog(p.name, msg)
			select {
			case <-p.stop:
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, restartMax)
			cmd, logf, err = d.startOnce(p)
			if errors.Is(err, errStopped) {
				return
			}
			if err == nil {
				d.logf("%-12s restarted (pid %d)", p.name, cmd.Process.Pid)
				d.noteInLog(p.name, fmt.Sprintf("%s restarted (pid %d, restart %d)", p.name, cmd.Process.Pid, n))
				break
			}
			up = 0
		}
	}
}

// pid is the current run's process ID.
func (p *demoProc) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd.Process.Pid
}

// stopWithParent asks the kernel to send the demo SIGTERM when its parent
// dies. `make demo` runs it as make's child: under nohup, or from a script,
// make ignores SIGINT and a SIGTERM kills make alone, which would leave the
// demo running with no terminal. With this, stopping make stops the demo
// the normal way (services first, then the servers, then "stopped").
func stopWithParent() {
	before := os.Getppid()
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_PDEATHSIG, uintptr(syscall.SIGTERM), 0)
	if os.Getppid() != before {
		// The parent died before the request took effect.
		_ = syscall.Kill(os.Getpid(), syscall.SIGTERM)
	}
}

func (p *demoProc) isStopped() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stopped
}

// noteInLog appends one line from the demo to a child's log, in the JSON
// shape of the services' own lines.
func (d *demo) noteInLog(name, msg string) {
	f, err := os.OpenFile(d.logPath(name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	line, _ := json.Marshal(map[string]string{"time": time.Now().Format(time.RFC3339Nano), "level": "WARN", "source": "snipctl demo", "msg": msg})
	_, _ = f.Write(append(line, '\n'))
}

// proc is the child started under name.
func (d *demo) proc(name string) *demoProc {
	for _, p := range d.procs {
		if p.name == name {
			return p
		}
	}
	return nil
}

// stopAll stops the children in reverse start order: services before the
// servers they use, each with SIGTERM and a deadline. A service waiting to
// be restarted is not started again.
func (d *demo) stopAll() {
	d.stopping.Store(true)
	for i := len(d.procs) - 1; i >= 0; i-- {
		p := d.procs[i]
		p.mu.Lock()
		if !p.stopped {
			p.stopped = true
			close(p.stop)
		}
		cmd := p.cmd
		p.mu.Unlock()
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			d.logf("%s did not stop in 30s; killing it", p.name)
			_ = cmd.Process.Kill()
			<-p.done
		}
	}
	d.procs = nil
}

// stopWaiting, returned by a waitUntil condition, ends the wait at once:
// waiting longer cannot help.
type stopWaiting struct{ error }

// waitUntil calls f every 200 ms until it returns nil or a stopWaiting, or
// timeout has passed (f's last error), or ctx ends (ctx's error): a demo
// stopped while it starts does not go on waiting.
func waitUntil(ctx context.Context, timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		err := f()
		var stop stopWaiting
		if errors.As(err, &stop) {
			return stop.error
		}
		if err == nil || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-t.C:
		}
	}
}

// httpClient is the demo's client for the services' HTTP APIs (health,
// links, webhook endpoints): every call ends after SNIPCTL_TIMEOUT, as the
// commands' NATS and Redis calls do, so a hung service fails the call and
// is reported instead of hanging the demo.
func (d *demo) httpClient() *http.Client {
	return &http.Client{Timeout: d.env.Cfg.Timeout}
}

// httpOK gets url and fails unless it answers 200. The request ends with
// ctx (Ctrl-C stops a wait for a hung service at once) or after c's
// timeout, whichever comes first.
func httpOK(ctx context.Context, c *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status)
	}
	return nil
}

func httpPost(ctx context.Context, c *http.Client, url, key string, body []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b, nil
}
