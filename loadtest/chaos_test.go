package main

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/snipdev/snip/loadtest/internal/chaos"
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

// buildService builds services/<name> into a temporary folder (with the
// environment's GOWORK, so it also builds with GOWORK=off).
func buildService(t *testing.T, name string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), name)
	cmd := exec.Command("go", "build", "-C", filepath.Join("..", "services", name), "-o", bin, ".")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", name, err, out)
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
	var redirectBin, counterBin string
	var wg sync.WaitGroup
	wg.Go(func() { redirectBin = buildService(t, "redirect") })
	wg.Go(func() { counterBin = buildService(t, "clickcounter") })
	r := testenv.StartRedis(t)
	n := testenv.StartNATS(t)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	common := []string{"REDIS_URL=" + r.URL(0), "NATS_URL=" + n.URL, "SNIP_PARTITIONS=4", "SNIP_BOOTSTRAP_OWNERS=chaos:" + chaosKey}
	redirect := startService(t, "redirect", redirectBin, append(common, "SNIP_OUTBOX_SHARDS=4",
		"SNIP_RELAY_LEASE_TTL=1s", "SNIP_TRUSTED_PROXIES=127.0.0.1/32", "SNIP_INSTANCE=chaos")...)
	counter := startService(t, "clickcounter", counterBin, append(common, "CLICKCOUNTER_LEASE_TTL=1s")...)

	// The warehouse: the stand-in loader of main_test.go on a fresh database.
	conn, db := servers.ClickHouse.NewDB(t)
	if err := conn.Exec(t.Context(), clicksDDL); err != nil {
		t.Fatalf("create clicks: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var readers sync.WaitGroup
	t.Cleanup(func() { cancel(); readers.Wait() })
	readers.Go(func() {
		cfg := reader.Config{Group: topology.GroupWarehouseLoader, Linger: 20 * time.Millisecond, Start: reader.StartAtOldest()}
		if err := reader.Run(ctx, n.JetStream(t), cfg, (&loader{conn: conn}).handle); err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("warehouse stand-in: %v", err)
		}
	})

	freeze, err := chaos.Parse("freeze:redis:" + strconv.Itoa(r.PID()) + ":4s")
	if err != nil {
		t.Fatal(err)
	}
	kill, err := chaos.Parse("kill:clickcounter:" + strconv.Itoa(counter.pid()))
	if err != nil {
		t.Fatal(err)
	}
	kill.Recover = func(context.Context) error {
		<-counter.done // reaped: then start a new one, as a supervisor would
		counter.start()
		return nil
	}
	kill.Inject = func(ctx context.Context) error { // the pid at injection time
		return chaos.Signal(counter.pid(), syscall.SIGKILL)
	}

	env := &Env{Cfg: Config{NATSURL: n.URL, APIKey: chaosKey}, Stdout: &lockedBuffer{}, Stderr: &lockedBuffer{}, Log: slog.New(slog.DiscardHandler)}
	p := &chaosPlan{target: redirect.url, rate: 100, warmup: 3 * time.Second, tail: 6 * time.Second, timeout: 5 * time.Second, xff: true}
	p.wf = workloadFlags{links: 20, zipf: 1.1, botShare: 0.05, countryShare: 0.9, seed: 7, linkBase: demoSite}
	p.sf = sinkFlags{counter: counter.url, clickhouse: "clickhouse://" + servers.ClickHouse.Addr + "/" + db, fraud: off,
		deadline: 90 * time.Second, setLimit: 1_000_000}
	p.require = []string{"counter", "warehouse"}
	sys, err := connect(t.Context(), env, &p.sf)
	if err != nil {
		t.Fatal(err)
	}
	defer sys.close()

	var results []chaosResult
	for i, f := range []chaos.Fault{freeze, kill} {
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
