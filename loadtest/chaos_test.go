package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/loadtest/internal/chaos"
	"github.com/snipdev/snip/loadtest/internal/oracle"
	"github.com/snipdev/snip/loadtest/internal/series"
	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

const chaosKey = "snip_chaos_key_0123456789abcdef"

// service is a Snip service binary running as a child process.
type service struct {
	t    *testing.T
	name string
	bin  string
	env  []string
	url  string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// binDir holds the service binaries the tests run, each built once for the
// package by buildService; TestMain makes it and removes it.
var binDir string

// builds is, by service name, its build: run once, by the first test that
// asks for it, while the others wait for it.
var builds sync.Map // string -> func() (string, error)

// buildService builds services/<name> into binDir once for the package
// (with the environment's GOWORK, so it also builds with GOWORK=off) and
// returns the binary. Tests that run the same service share it: each runs
// a process of its own.
func buildService(t *testing.T, name string) string {
	t.Helper()
	build, _ := builds.LoadOrStore(name, sync.OnceValues(func() (string, error) {
		bin := filepath.Join(binDir, name)
		cmd := exec.Command("go", "build", "-C", filepath.Join("..", "services", name), "-o", bin, ".")
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("build %s: %v\n%s", name, err, out)
		}
		return bin, nil
	}))
	bin, err := build.(func() (string, error))()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

func startService(t *testing.T, name, bin string, env ...string) *service {
	t.Helper()
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	s := &service{t: t, name: name, bin: bin, url: "http://127.0.0.1:" + strconv.Itoa(port),
		env: append([]string{"HTTP_ADDR=127.0.0.1:" + strconv.Itoa(port), "LOG_LEVEL=warn"}, env...)}
	s.start()
	t.Cleanup(s.stop)
	return s
}

func (s *service) start() {
	s.t.Helper()
	logf, err := os.OpenFile(filepath.Join(s.t.TempDir(), s.name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		s.t.Fatal(err)
	}
	cmd := exec.Command(s.bin)
	cmd.Env = append(os.Environ(), s.env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("start %s: %v", s.name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	testenv.WaitFor(s.t, 60*time.Second, s.name+" to answer /readyz", func() bool {
		select {
		case <-done:
			b, _ := os.ReadFile(logf.Name())
			s.t.Fatalf("%s exited during start:\n%s", s.name, b)
		default:
		}
		resp, err := http.Get(s.url + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

func (s *service) pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd.Process.Pid
}

func (s *service) stop() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// TestChaosRedisFreezeAndKill9LoseNothing is the chaos suite's short form:
// the redirect and click counter binaries against a real redis-server and
// an embedded NATS, a stand-in warehouse loader on ClickHouse, HTTP load
// from the load test, and two faults judged by the oracle: Redis frozen
// (SIGSTOP by its PID) for 4 s, and kill -9 of the click counter with a
// restart. Every run must pass: lost 0, doubled 0 in CLICKS, the counter
// and the warehouse.
func TestChaosRedisFreezeAndKill9LoseNothing(t *testing.T) {
	t.Parallel()
	var r *testenv.RedisServer
	var n *testenv.NATS
	rig := startChaosRig(t, func() chaosServers {
		r, n = testenv.StartRedis(t), testenv.StartNATS(t)
		return chaosServers{natsURL: n.URL, js: n.JetStream(t), env: []string{"REDIS_URL=" + r.URL(0)}}
	})

	freeze, err := chaos.Parse("freeze:redis:" + strconv.Itoa(r.PID()) + ":4s")
	if err != nil {
		t.Fatal(err)
	}
	counter := rig.counter
	kill, err := chaos.Parse("kill:clickcounter:" + strconv.Itoa(counter.pid()))
	if err != nil {
		t.Fatal(err)
	}
	kill.Recover = func(context.Context) error {
		<-counter.done // reaped: then start a new one, as a supervisor would
		counter.start()
		return nil
	}
	kill.Inject = func(ctx context.Context) error { // the pid at injection time, confirmed dead
		return chaos.Kill(ctx, counter.pid())
	}
	rig.judge(t, freeze, kill)
}

// TestChaosOnClustersLoseNothing is the chaos suite on clusters: the
// redirect and click counter binaries against a 3-node NATS cluster
// (streams with 3 replicas) and a Redis Cluster (3 masters, 3 replicas),
// the redirect's group commit waiting for one replica (WAIT), and three
// faults judged by the oracle one after the other: kill -9 of the
// nats-server leading CLICKS (started again after 5 s), that leader frozen
// (SIGSTOP) for 10 s, and kill -9 of a Redis master holding outbox shards
// (its replica takes over; the old master is started again after 5 s and
// rejoins as a replica). Every run must pass: lost 0, doubled 0 in CLICKS,
// the counter and the warehouse.
func TestChaosOnClustersLoseNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("the cluster chaos suite takes about two minutes; make test runs it")
	}
	t.Parallel()
	var nc *testenv.NATSCluster
	var rc *testenv.RedisCluster
	rig := startChaosRig(t, func() chaosServers {
		var wg sync.WaitGroup
		wg.Go(func() { nc = testenv.StartNATSCluster(t) })
		wg.Go(func() { rc = testenv.StartRedisCluster(t) })
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		return chaosServers{natsURL: nc.URL, js: nc.JetStream(t),
			// The counter's feeds wait for the Redis replicas too.
			env: []string{"REDIS_URL=" + rc.URL(), "SNIP_REPLICAS=3", "CLICKCOUNTER_WAIT_REPLICAS=1"},
			// The replica wait, with a bound generous on a loaded machine
			// (less than the outbox wait, as the redirect requires). The
			// direct publish keeps its default bound: a PubAck later than it
			// is asked for again with the same Nats-Msg-Id. The commit
			// timeout exceeds the validity plus the wait, as the redirect
			// requires.
			redirectEnv: []string{"SNIP_OUTBOX_WAIT_REPLICAS=1", "SNIP_OUTBOX_WAIT_REPLICAS_TIMEOUT=500ms",
				"SNIP_OUTBOX_WAIT=1s", "SNIP_OUTBOX_VALIDITY=2s", "SNIP_COMMIT_TIMEOUT=4s"}}
	})
	js := nc.JetStream(t)
	leader := func(ctx context.Context) (*testenv.NATSNode, error) {
		// Polled: after the last fault's recovery the stream may still be
		// electing its leader.
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			node, err := nc.StreamLeader(ctx, js, events.ClicksStream)
			if err == nil {
				return node, nil
			}
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("leader of %s: %w", events.ClicksStream, err)
			case <-tick.C:
			}
		}
	}
	// leaderFault breaks the nats-server leading CLICKS at injection time
	// and mends it at the end; then every node must be healthy again.
	leaderFault := func(name string, hold time.Duration, brk func(context.Context, *testenv.NATSNode) error, mend func(*testenv.NATSNode) error) chaos.Fault {
		var node *testenv.NATSNode
		return chaos.Fault{Name: name, Hold: hold,
			Inject: func(ctx context.Context) (err error) {
				if node, err = leader(ctx); err == nil {
					err = brk(ctx, node)
				}
				return err
			},
			Recover: func(context.Context) error {
				if err := mend(node); err != nil {
					return err
				}
				return nc.WaitHealthy(60 * time.Second)
			}}
	}
	// Each fault is confirmed: the node's process is gone, or stopped.
	killLeader := leaderFault("kill -9 nats CLICKS leader", 5*time.Second, func(ctx context.Context, n *testenv.NATSNode) error {
		return chaos.Kill(ctx, n.PID())
	}, (*testenv.NATSNode).Start)
	freezeLeader := leaderFault("freeze nats CLICKS leader 10s", 10*time.Second, func(ctx context.Context, n *testenv.NATSNode) error {
		return chaos.Freeze(ctx, n.PID())
	}, func(n *testenv.NATSNode) error { n.Resume(); return nil })
	var master *testenv.RedisServer
	killMaster := chaos.Fault{Name: "kill -9 redis master (outbox shard 0)", Hold: 5 * time.Second,
		Inject: func(ctx context.Context) (err error) {
			// The master of outbox shard 0's hash tag (the redirect's key layout).
			if master, err = rc.MasterOf(ctx, "snip:{s0}:outbox:clicks"); err == nil {
				master.Kill()
			}
			return err
		},
		Recover: func(context.Context) error {
			if err := master.Start(); err != nil { // it rejoins as a replica
				return err
			}
			return rc.WaitHealthy(60 * time.Second)
		}}
	rig.judge(t, killLeader, freezeLeader, killMaster)
}

// chaosServers are the servers a chaos rig runs on: where NATS is, a
// JetStream client of it for the warehouse stand-in, and the environment
// both services get (Redis), plus the redirect's own.
type chaosServers struct {
	natsURL     string
	js          jetstream.JetStream
	env         []string
	redirectEnv []string
}

// chaosRig is the system a chaos test breaks: the redirect and click
// counter binaries, the stand-in warehouse loader on a fresh ClickHouse
// database, and the load test's plan and sinks against them.
type chaosRig struct {
	redirect, counter *service
	natsURL, db       string
}

// startChaosRig builds the redirect and click counter while start starts
// the servers, then starts both services and the warehouse stand-in.
func startChaosRig(t *testing.T, start func() chaosServers) *chaosRig {
	t.Helper()
	var redirectBin, counterBin string
	var wg sync.WaitGroup
	wg.Go(func() { redirectBin = buildService(t, "redirect") })
	wg.Go(func() { counterBin = buildService(t, "clickcounter") })
	srv := start()
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	common := append([]string{"NATS_URL=" + srv.natsURL, "SNIP_PARTITIONS=4", "SNIP_BOOTSTRAP_OWNERS=chaos:" + chaosKey}, srv.env...)
	rig := &chaosRig{natsURL: srv.natsURL}
	rig.redirect = startService(t, "redirect", redirectBin, slices.Concat(common, []string{"SNIP_OUTBOX_SHARDS=4",
		"SNIP_RELAY_LEASE_TTL=1s", "SNIP_TRUSTED_PROXIES=127.0.0.1/32", "SNIP_INSTANCE=chaos"}, srv.redirectEnv)...)
	rig.counter = startService(t, "clickcounter", counterBin, append(common, "CLICKCOUNTER_LEASE_TTL=1s")...)

	// The warehouse: the stand-in loader of main_test.go on a fresh database.
	conn, db := servers.ClickHouse.NewDB(t)
	if err := conn.Exec(t.Context(), clicksDDL); err != nil {
		t.Fatalf("create clicks: %v", err)
	}
	rig.db = db
	ctx, cancel := context.WithCancel(context.Background())
	var readers sync.WaitGroup
	t.Cleanup(func() { cancel(); readers.Wait() })
	readers.Go(func() {
		cfg := reader.Config{Group: topology.GroupWarehouseLoader, Linger: 20 * time.Millisecond, Start: reader.StartAtOldest()}
		if err := reader.Run(ctx, srv.js, cfg, (&loader{conn: conn}).handle); err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("warehouse stand-in: %v", err)
		}
	})
	return rig
}

// judge runs the faults one after the other under HTTP load, each judged by
// the oracle, logs the results table, and requires of every fault: passed,
// lost 0, doubled 0, every sent click in CLICKS, counted and loaded.
func (rig *chaosRig) judge(t *testing.T, faults ...chaos.Fault) {
	t.Helper()
	env := &Env{Cfg: Config{NATSURL: rig.natsURL, APIKey: chaosKey}, Stdout: &lockedBuffer{}, Stderr: &lockedBuffer{}, Log: slog.New(slog.DiscardHandler)}
	p := &chaosPlan{target: rig.redirect.url, rate: 100, warmup: 3 * time.Second, tail: 6 * time.Second, timeout: 5 * time.Second, xff: true}
	p.wf = workloadFlags{links: 20, zipf: 1.1, botShare: 0.05, countryShare: 0.9, seed: 7, linkBase: demoSite}
	p.sf = sinkFlags{counter: rig.counter.url, clickhouse: "clickhouse://" + servers.ClickHouse.Addr + "/" + rig.db, fraud: off,
		deadline: 90 * time.Second, setLimit: 1_000_000}
	p.require = []string{"counter", "warehouse"}
	sys, err := connect(t.Context(), env, &p.sf)
	if err != nil {
		t.Fatal(err)
	}
	defer sys.close()

	var results []chaosResult
	for i, f := range faults {
		res := runChaos(t.Context(), env, sys, f, p, filepath.Join(t.TempDir(), strconv.Itoa(i)+"-truth.json"))
		results = append(results, res)
	}
	var table lockedBuffer
	if err := writeChaosTable(&table, results); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", table.String())
	for _, res := range results {
		if res.Err != nil || !res.Passed || res.Lost != 0 || res.Doubled != 0 {
			t.Errorf("%s: passed %v, lost %d, doubled %d, err %v\nprogress:\n%s", res.Fault, res.Passed, res.Lost, res.Doubled, res.Err, env.Stderr.(*lockedBuffer).String())
		}
		in := strconv.FormatUint(res.InClicks, 10)
		if res.Sent == 0 || res.InClicks < res.Sent || res.Counted != in || res.Loaded != in {
			t.Errorf("%s: sent %d, in CLICKS %d, counted %s, loaded %s: want every sent click in CLICKS, and CLICKS counted and loaded", res.Fault, res.Sent, res.InClicks, res.Counted, res.Loaded)
		}
	}
}

// TestRecoveredByWantsAFreshBacklogRead: recovery is judged on a second
// after the fault's end without failures or missing 302s, and on a backlog
// read that began after the system had a second to settle: a read begun
// during the fault (slow on a loaded machine, and still the latest) shows
// the backlog before the fault's effect, and must not count.
func TestRecoveredByWantsAFreshBacklogRead(t *testing.T) {
	t.Parallel()
	end := time.Date(2026, 12, 6, 1, 0, 0, 0, time.UTC)
	good := series.Second{Offered: 1000, Sent: 1000, OK: 980}
	tests := []struct {
		name    string
		s       series.Second
		now     time.Time
		began   time.Time
		backlog uint64
		want    bool
	}{
		{"recovered", good, end.Add(3 * time.Second), end.Add(2 * time.Second), 900, true},
		{"read began during the fault", good, end.Add(3 * time.Second), end.Add(-time.Second), 900, false},
		{"read began before the second to settle", good, end.Add(3 * time.Second), end.Add(500 * time.Millisecond), 900, false},
		{"the second right after the fault", good, end.Add(time.Second), end.Add(2 * time.Second), 900, false},
		{"a request failed", series.Second{Offered: 1000, Sent: 1000, OK: 980, Errors: 1}, end.Add(3 * time.Second), end.Add(2 * time.Second), 900, false},
		{"302s missing", series.Second{Offered: 1000, Sent: 1000, OK: 900}, end.Add(3 * time.Second), end.Add(2 * time.Second), 900, false},
		{"backlog over normal", good, end.Add(3 * time.Second), end.Add(2 * time.Second), 1001, false},
		// After the schedule the driver waits for its last answers: a
		// second in which none came (requests hanging) offers nothing and
		// shows nothing recovered.
		{"a second after the schedule", series.Second{}, end.Add(3 * time.Second), end.Add(2 * time.Second), 900, false},
	}
	for _, tc := range tests {
		if got := recoveredBy(tc.s, tc.now, end, tc.began, tc.backlog, 1000); got != tc.want {
			t.Errorf("%s: recoveredBy = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestChaosTallyNamesEveryDoubleAndLoss: a fault's row says how many
// clicks were lost and doubled in the log, the counter and the warehouse.
// The counter keeps no copies: a click it counted twice shows as a count
// above the log's (its totals' extra), and is doubled all the same.
func TestChaosTallyNamesEveryDoubleAndLoss(t *testing.T) {
	t.Parallel()
	log := oracle.Result{Sink: oracle.SinkLog, Expected: 100, Got: 100, Status: oracle.Pass}
	counter := oracle.Result{Sink: oracle.SinkCounter, Expected: 100, Got: 100, Status: oracle.Pass}
	warehouse := oracle.Result{Sink: oracle.SinkWarehouse, Expected: 100, Got: 100, Status: oracle.Pass}
	with := func(r oracle.Result, f func(*oracle.Result)) oracle.Result {
		f(&r)
		r.Status = oracle.Fail
		return r
	}
	tests := []struct {
		name string
		rows []oracle.Result
		want chaosResult
	}{
		{
			name: "nothing_lost_or_doubled",
			rows: []oracle.Result{log, counter, warehouse},
			want: chaosResult{InClicks: 100, Counted: "100", Loaded: "100"},
		},
		{
			name: "counter_counted_a_click_twice",
			rows: []oracle.Result{log, with(counter, func(r *oracle.Result) { r.Got, r.Extra = 101, 1 }), warehouse},
			want: chaosResult{InClicks: 100, Counted: "101", Loaded: "100", Doubled: 1},
		},
		{
			name: "click_stored_twice_in_the_log",
			rows: []oracle.Result{with(log, func(r *oracle.Result) { r.Dup = 2 }), counter, warehouse},
			want: chaosResult{InClicks: 100, Counted: "100", Loaded: "100", Doubled: 2},
		},
		{
			name: "warehouse_lost_three",
			rows: []oracle.Result{log, counter, with(warehouse, func(r *oracle.Result) { r.Got, r.Missing = 97, 3 })},
			want: chaosResult{InClicks: 100, Counted: "100", Loaded: "97", Lost: 3},
		},
		{
			// A sink not checked says so: 0 would read as a sink that
			// counted and loaded nothing.
			name: "skipped_sinks",
			rows: []oracle.Result{log, {Sink: oracle.SinkCounter, Status: oracle.Skipped}, {Sink: oracle.SinkWarehouse, Status: oracle.Skipped}},
			want: chaosResult{InClicks: 100, Counted: "skipped", Loaded: "skipped"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var got chaosResult
			got.tally(tc.rows)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("tally (-want +got):\n%s", diff)
			}
		})
	}
}

// When the tail does not show the system recovered (here a tail too short
// for a second after the fault's end), the time to recover is the catch-up
// after the load, watched from the load's end: not the oracle's own time
// added to it. The oracle here waits out its whole deadline (fraud is
// required and off: a row that fails until then), as a slow verification
// of a large run does, while the readers caught up long before.
func TestChaosRecoveryAfterTheLoadLeavesOutTheVerification(t *testing.T) {
	t.Parallel()
	rig := startChaosRig(t, func() chaosServers {
		r, n := testenv.StartRedis(t), testenv.StartNATS(t)
		return chaosServers{natsURL: n.URL, js: n.JetStream(t), env: []string{"REDIS_URL=" + r.URL(0)}}
	})
	env := &Env{Cfg: Config{NATSURL: rig.natsURL, APIKey: chaosKey}, Stdout: &lockedBuffer{}, Stderr: &lockedBuffer{}, Log: slog.New(slog.DiscardHandler)}
	const deadline = 20 * time.Second
	p := &chaosPlan{target: rig.redirect.url, rate: 100, warmup: 2 * time.Second, tail: 100 * time.Millisecond, timeout: 5 * time.Second, xff: true}
	p.wf = workloadFlags{links: 20, zipf: 1.1, botShare: 0.05, countryShare: 0.9, seed: 7, linkBase: demoSite}
	p.sf = sinkFlags{counter: rig.counter.url, clickhouse: "clickhouse://" + servers.ClickHouse.Addr + "/" + rig.db, fraud: off,
		deadline: deadline, setLimit: 1_000_000}
	p.require = []string{"counter", "warehouse", "fraud"}
	sys, err := connect(t.Context(), env, &p.sf)
	if err != nil {
		t.Fatal(err)
	}
	defer sys.close()
	nothing := chaos.Fault{Name: "nothing", Inject: func(context.Context) error { return nil }}
	res := runChaos(t.Context(), env, sys, nothing, p, filepath.Join(t.TempDir(), "truth.json"))
	if res.InClicks == 0 || res.Counted != strconv.FormatUint(res.InClicks, 10) {
		t.Fatalf("in CLICKS %d, counted %s: want the run's clicks stored and counted\nprogress:\n%s", res.InClicks, res.Counted, env.Stderr.(*lockedBuffer).String())
	}
	t.Logf("time to recover %s (the oracle took its %s)", res.Recover, deadline)
	if res.Recover < 0 || res.Recover >= deadline/2 {
		t.Errorf("time to recover %s: want the readers' catch-up after the load, well under the oracle's %s (its wait counted in)\nprogress:\n%s",
			res.Recover, deadline, env.Stderr.(*lockedBuffer).String())
	}
}

// TestAChaosRunStoppedIsNotJudged: Ctrl-C during a fault's run (Redis
// frozen under load, the real redirect binary) stops it before the oracle's
// verdict: its row says NOT JUDGED, the faults after it are not run, and
// loadtest chaos exits 3, not judged, as loadtest http --verify does, not 1
// for a failure it never saw.
func TestAChaosRunStoppedIsNotJudged(t *testing.T) {
	t.Parallel()
	bin := buildService(t, "redirect")
	r, n := testenv.StartRedis(t), testenv.StartNATS(t)
	redirect := startService(t, "redirect", bin, "NATS_URL="+n.URL, "REDIS_URL="+r.URL(0), "SNIP_PARTITIONS=4",
		"SNIP_BOOTSTRAP_OWNERS=chaos:"+chaosKey, "SNIP_INSTANCE=chaos")
	// The redirect is ready once it can take clicks (into its outbox),
	// which may be before it has applied the topology; loadtest chaos
	// looks CLICKS up when it starts.
	js := n.JetStream(t)
	testenv.WaitFor(t, time.Minute, "the redirect to apply the topology (CLICKS)", func() bool {
		_, err := js.Stream(t.Context(), events.ClicksStream)
		return err == nil
	})
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	var out, progress lockedBuffer
	done := make(chan error, 1)
	go func() {
		freeze := "freeze:redis:" + strconv.Itoa(r.PID()) + ":1m"
		done <- run(ctx, []string{"chaos", "--fault", freeze, "--fault", freeze, "--target", redirect.url,
			"--rate", "50", "--warmup", "1s", "--tail", "1s", "--out", t.TempDir(),
			"--counter-url", "off", "--clickhouse", "off", "--fraud", "off"},
			[]string{"NATS_URL=" + n.URL, "SNIP_API_KEY=" + chaosKey}, &out, &progress, slog.New(slog.DiscardHandler))
	}()
	// Injected, and a progress line since: the fault holds.
	held := func() bool {
		_, after, ok := strings.Cut(progress.String(), "inject: freeze redis")
		_, next, _ := strings.Cut(after, "\n")
		return ok && strings.Contains(next, "\n")
	}
	var err error
	ended := false
	if !testenv.Poll(time.Minute, func() bool {
		select {
		case err = <-done:
			ended = true
			return true
		default:
			return held()
		}
	}) || ended {
		t.Fatalf("no fault held within a minute (loadtest chaos ended: %v, %v):\n%s\n%s", ended, err, progress.String(), out.String())
	}
	stop() // Ctrl-C while Redis is frozen
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		t.Fatalf("loadtest chaos did not return within a minute of the stop:\n%s\n%s", out.String(), progress.String())
	}
	if code := exitCode(err); code != exitNotJudged {
		t.Errorf("exit status %d (err %v), want %d: not judged\n%s", code, err, exitNotJudged, out.String())
	}
	if got := strings.Count(out.String(), "NOT JUDGED"); got != 2 || strings.Contains(out.String(), "FAIL") || !strings.Contains(out.String(), "not run: stopped") {
		t.Errorf("want both rows NOT JUDGED (the second not run), none FAIL:\n%s", out.String())
	}
}
