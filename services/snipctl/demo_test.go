package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// syncBuffer collects the demo's output for the failure message.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// freeRange finds n consecutive free ports.
func freeRange(t *testing.T, n int) int {
	t.Helper()
	base, err := testenv.FreePortRange(n)
	if err != nil {
		t.Fatal(err)
	}
	return base
}

// built holds the service binaries the demo tests run (and snipctl's own),
// built once for the package; TestMain removes them.
var built struct {
	once sync.Once
	dir  string
	err  error
}

// allBuilt holds every service of the demo, for the cluster demo test, in
// a folder of its own: the other demo tests expect redirect and clickcounter
// alone. TestMain removes it.
var allBuilt struct {
	once sync.Once
	dir  string
	err  error
}

// allDemoBinaries builds every service of the demo once and returns their
// folder.
func allDemoBinaries(t *testing.T) string {
	t.Helper()
	allBuilt.once.Do(func() {
		if allBuilt.dir, allBuilt.err = os.MkdirTemp("", "snipctl-demo-all-"); allBuilt.err != nil {
			return
		}
		for _, s := range demoServices {
			out, err := exec.Command("go", "build", "-o", filepath.Join(allBuilt.dir, s.name), "../"+s.name).CombinedOutput()
			if err != nil {
				allBuilt.err = fmt.Errorf("build %s: %v\n%s", s.name, err, out)
				return
			}
		}
	})
	if allBuilt.err != nil {
		t.Fatal(allBuilt.err)
	}
	return allBuilt.dir
}

// demoBinaries builds redirect, clickcounter and snipctl once and returns
// their folder: the demo's --bin, with snipctl beside them.
func demoBinaries(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "snipctl-demo-bin-"); built.err != nil {
			return
		}
		for _, pkg := range []string{"../redirect", "../clickcounter", "."} {
			name := filepath.Base(pkg)
			if pkg == "." {
				name = "snipctl"
			}
			out, err := exec.Command("go", "build", "-o", filepath.Join(built.dir, name), pkg).CombinedOutput()
			if err != nil {
				built.err = fmt.Errorf("build %s: %v\n%s", pkg, err, out)
				return
			}
		}
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.dir
}

// counted is the counter's total of clicks on code (people and bots), -1
// when the counter does not answer.
func counted(client *http.Client, counter, code string) int {
	req, _ := http.NewRequest(http.MethodGet, counter+"/api/links/"+code+"/stats", nil)
	req.Header.Set("Authorization", "Bearer "+demoAPIKey)
	resp, err := client.Do(req)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var st struct {
		Totals struct{ Human, Bot int }
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &st) != nil {
		return -1
	}
	return st.Totals.Human + st.Totals.Bot
}

// demoArgs are a demo's flags on free ports; base is the redirect's port
// (the counter's is base+1).
func demoArgs(t *testing.T, bin, dir string) (args []string, base, chPort, sitePort int) {
	t.Helper()
	port := func() int {
		p, err := testenv.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	base, chPort, sitePort = freeRange(t, 8), port(), port() // http-base .. +7 (webhooks)
	args = []string{"demo", "--dir", dir, "--bin", bin, "--rate", "0",
		"--nats-port", strconv.Itoa(port()), "--nats-monitor-port", strconv.Itoa(port()), "--redis-port", strconv.Itoa(port()),
		"--clickhouse-port", strconv.Itoa(chPort), "--site-port", strconv.Itoa(sitePort), "--http-base", strconv.Itoa(base)}
	return args, base, chPort, sitePort
}

// demoRun is a demo started in this process by startDemo.
type demoRun struct {
	out    *syncBuffer
	done   chan error // what run returned
	cancel context.CancelFunc
}

// startDemo runs the demo with the flags newArgs makes, each call on fresh
// free ports, and returns once the demo is past its check that its ports
// are free and its NATS server is up. A port testenv.FreePort handed out can
// be taken by another test's server before the demo checks it, or between
// the check and the NATS server's listen; the demo then refuses
// (*portInUseError), and is started again on new ports, three times at most.
func startDemo(t *testing.T, env []string, newArgs func() []string) *demoRun {
	t.Helper()
	for try := 1; ; try++ {
		d := &demoRun{out: &syncBuffer{}, done: make(chan error, 1)}
		var ctx context.Context
		ctx, d.cancel = context.WithCancel(context.Background())
		args := newArgs()
		go func() { d.done <- run(ctx, args, env, d.out, d.out, slog.New(slog.DiscardHandler)) }()
		var err error
		returned := false
		// Past its port check and its NATS server's start: a port drawn by
		// another program between the check and the server's listen is
		// reported then (the tests beside this one draw free ports too).
		testenv.WaitFor(t, 2*time.Minute, "the demo past its port check and NATS's start", func() bool {
			select {
			case err = <-d.done:
				returned = true
				return true
			default:
				out := d.out.String()
				return strings.Contains(out, "starting the demo") && strings.Contains(out, "\nnats ")
			}
		})
		if !returned {
			return d
		}
		d.cancel()
		var inUse *portInUseError
		if !errors.As(err, &inUse) || try == 3 {
			t.Fatalf("demo returned at its start (try %d): %v\n%s", try, err, d.out.String())
		}
		t.Logf("try %d: %v; again on other ports", try, err)
	}
}

// `make demo` is how most people meet Snip: run it with the real redirect
// and counter binaries and follow one click from the demo's link to the
// counter's stats; kill the counter and see the demo restart it, as a
// supervisor would, and count the next click.
func TestDemoRunsAndCountsAClick(t *testing.T) {
	t.Parallel()
	bin := demoBinaries(t)
	var dir string
	var base, chPort, sitePort, profPort int
	d := startDemo(t, []string{"SNIP_PARTITIONS=2"}, func() []string {
		dir = t.TempDir()
		var args []string
		args, base, chPort, sitePort = demoArgs(t, bin, dir)
		var err error
		if profPort, err = testenv.FreePort(); err != nil {
			t.Fatal(err)
		}
		return append(args, "--nats-prof-port", strconv.Itoa(profPort))
	})
	out := d.out
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		d.cancel()
		select {
		case err := <-d.done:
			if err != nil {
				t.Errorf("demo returned %v\n%s", err, out.String())
			}
		case <-time.After(2 * time.Minute):
			t.Errorf("demo did not stop\n%s", out.String())
		}
	}
	t.Cleanup(stop)

	redirect := "http://127.0.0.1:" + strconv.Itoa(base)
	counter := "http://127.0.0.1:" + strconv.Itoa(base+1)
	client := &http.Client{Timeout: 5 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	testenv.WaitFor(t, 2*time.Minute, "the demo link to redirect", func() bool {
		resp, err := client.Get(redirect + "/nats-jetstream")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusFound
	})
	total := func() int { return counted(client, counter, "nats-jetstream") }
	testenv.WaitFor(t, time.Minute, "the click in the counter's stats", func() bool { return total() >= 1 })
	if n := total(); n != 1 {
		t.Errorf("counter shows %d clicks, want the 1 sent\n%s", n, out.String())
	}

	// What the banner promises a newcomer.
	testenv.WaitFor(t, time.Minute, "the banner", func() bool { return strings.Contains(out.String(), "Snip is running") })
	banner := out.String()
	for _, want := range []string{
		"Snip is running: redirect, clickcounter (all ready)",
		fmt.Sprintf("demo site:  http://127.0.0.1:%d", sitePort),
		fmt.Sprintf(`{"target":"http://127.0.0.1:%d/articles/hello"}`, sitePort),
		fmt.Sprintf("clickhouse-client --port %d --database snip -q", chPort),
		"curl's own clicks count as bots",
		"HEAD, which answers 302 but is not counted",
	} {
		if !strings.Contains(banner, want) {
			t.Errorf("the banner lacks %q:\n%s", want, banner)
		}
	}
	if strings.Contains(banner, "example.com") {
		t.Errorf("the banner points at example.com:\n%s", banner)
	}
	// --nats-prof-port: the demo process's heap (its embedded NATS server)
	// for measuring the server's memory under load.
	prof := fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/", profPort)
	if !strings.Contains(banner, "profiles     "+prof) {
		t.Errorf("the banner does not name the profiles at %s:\n%s", prof, banner)
	}
	if resp, err := client.Get(prof + "heap?debug=1"); err != nil {
		t.Errorf("heap profile: %v", err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "# HeapAlloc = ") {
			t.Errorf("heap profile: %s, %.200q", resp.Status, b)
		}
	}

	// The counter dies; the demo restarts it and says so, on the terminal
	// and in the counter's log; the next click is counted.
	m := regexp.MustCompile(`clickcounter +http://\S+ \(pid (\d+),`).FindStringSubmatch(banner)
	if m == nil {
		t.Fatalf("no pid for the counter in:\n%s", banner)
	}
	pid, _ := strconv.Atoi(m[1])
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill the counter (pid %d): %v", pid, err)
	}
	testenv.WaitFor(t, time.Minute, "the demo to restart the counter", func() bool {
		return regexp.MustCompile(`clickcounter +EXITED \(signal: killed\) after \S+; restarting it in 1s \(restart 1;`).MatchString(out.String()) &&
			strings.Contains(out.String(), "clickcounter restarted (pid ")
	})
	if log, _ := os.ReadFile(filepath.Join(dir, "logs", "clickcounter.log")); !strings.Contains(string(log), `"source":"snipctl demo"`) ||
		!strings.Contains(string(log), "restarting it in 1s") {
		t.Errorf("the counter's log does not say it was restarted:\n%s", log)
	}
	resp, err := client.Get(redirect + "/nats-jetstream")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	testenv.WaitFor(t, time.Minute, "the second click counted by the restarted counter", func() bool { return total() == 2 })
	stop()
	if !strings.HasSuffix(strings.TrimSpace(out.String()), "snip demo stopped") {
		t.Errorf("the demo's last line is not \"snip demo stopped\":\n%s", out.String())
	}
	// The services stopped while NATS still ran: the counter acked what it
	// held and left its group, and nothing timed out waiting for NATS.
	log, err := os.ReadFile(filepath.Join(dir, "logs", "clickcounter.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "left consumer group") || strings.Contains(string(log), "deadline exceeded") {
		t.Errorf("the counter did not leave its group cleanly at the demo's stop:\n%s", log)
	}
}

// A second demo on the ports of one still running (or still stopping) must
// refuse to start and say which port, instead of starting services that
// cannot bind while the old ones answer its health checks.
func TestDemoRefusesAPortInUse(t *testing.T) {
	t.Parallel()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	port := strconv.Itoa(taken.Addr().(*net.TCPAddr).Port)
	base := freeRange(t, 8) // http-base .. +7 (webhooks)
	free := func() string {
		p, err := testenv.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		return strconv.Itoa(p)
	}
	dir := t.TempDir()
	args := []string{"demo", "--dir", dir, "--bin", t.TempDir(), "--rate", "0",
		"--nats-port", free(), "--nats-monitor-port", free(), "--redis-port", port,
		"--clickhouse-port", free(), "--site-port", free(), "--http-base", strconv.Itoa(base)}
	var out syncBuffer
	err = run(context.Background(), args, nil, &out, &out, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "port "+port+" (redis) is in use") {
		t.Fatalf("demo with its Redis port taken: err %v, want one naming port %s (redis)\n%s", err, port, out.String())
	}
	if entries, _ := os.ReadDir(filepath.Join(dir, "logs")); len(entries) != 0 {
		t.Errorf("the refused demo started something: logs %v", entries)
	}
}

// `snipctl demo -h` prints the demo's usage once, flags and environment
// variables included, and is not an error.
func TestDemoHelpPrintsUsageOnce(t *testing.T) {
	t.Parallel()
	out, err := snipctl(t, nil, "demo", "--help")
	if err != nil {
		t.Fatalf("demo --help: %v\n%s", err, out)
	}
	if n := strings.Count(out, "usage:"); n != 1 {
		t.Errorf("demo --help printed usage %d times:\n%s", n, out)
	}
	for _, want := range []string{"usage: snipctl demo", "-http-base", "-rate", "SNIP_PARTITIONS", "SNIPCTL_TIMEOUT"} {
		if !strings.Contains(out, want) {
			t.Errorf("demo --help lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "README") {
		t.Errorf("demo --help sends the reader to a README instead of listing the variables:\n%s", out)
	}
}

// A demo started the way `nohup make demo &` starts it (SIGINT ignored,
// make as its parent) stops when its parent is killed, the normal way, and
// says so.
func TestDemoStopsWhenItsParentIsKilled(t *testing.T) {
	t.Parallel()
	bin := demoBinaries(t)
	var (
		args    []string
		base    int
		parent  *exec.Cmd
		outPath string
	)
	read := func() string { b, _ := os.ReadFile(outPath); return string(b) }
	// As startDemo: a free port taken by another test before the demo's
	// check makes it refuse at once; it is started again on other ports.
	for try := 1; ; try++ {
		args, base, _, _ = demoArgs(t, bin, t.TempDir())
		outPath = filepath.Join(t.TempDir(), "nohup.out")
		// bash stands in for make: it ignores SIGINT (as a background job
		// does), runs the demo as its child, and dies on SIGTERM.
		script := `trap "" INT HUP; "$@" > "` + outPath + `" 2>&1; true`
		parent = exec.Command("bash", append([]string{"-c", script, "bash", filepath.Join(bin, "snipctl")}, args...)...)
		parent.Env = append(os.Environ(), "SNIP_PARTITIONS=2")
		if err := parent.Start(); err != nil {
			t.Fatal(err)
		}
		w := make(chan error, 1)
		go func() { w <- parent.Wait() }()
		p, b := parent, base
		t.Cleanup(func() {
			_ = p.Process.Kill()
			<-w
			// If the demo outlived the test, it must not hold its ports.
			testenv.WaitFor(t, time.Minute, "the demo to let go of its ports", func() bool {
				return portsFree([]demoPort{{"redirect", b}}) == nil
			})
		})
		testenv.WaitFor(t, 2*time.Minute, "the demo's banner", func() bool {
			return strings.Contains(read(), "Snip is running") || strings.Contains(read(), ") is in use:")
		})
		if !strings.Contains(read(), ") is in use:") {
			break
		}
		if try == 3 {
			t.Fatalf("the demo refused its ports three times:\n%s", read())
		}
		t.Logf("try %d: %s; again on other ports", try, strings.TrimSpace(read()))
	}
	if err := parent.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 2*time.Minute, `the demo's "stopped" line after its parent died`, func() bool {
		return strings.Contains(read(), "snip demo stopped")
	})
	// "stopped" comes once everything has stopped: NATS and the services
	// have let go of their ports.
	natsPort, _ := strconv.Atoi(args[slices.Index(args, "--nats-port")+1])
	if err := portsFree([]demoPort{{"redirect", base}, {"nats", natsPort}}); err != nil {
		t.Errorf("the demo said it stopped while still running: %v\n%s", err, read())
	}
	if strings.Contains(read(), "did not stop in 30s") {
		t.Errorf("a service had to be killed:\n%s", read())
	}
}

// While a service is not ready (the warehouse waits for ClickHouse) the
// demo does not say "running": it names what is ready and what waits, with
// the service's own reason, and says when it turns ready.
func TestDemoSaysWhatIsReadyAndWhatWaits(t *testing.T) {
	t.Parallel()
	base := freeRange(t, 6)
	var ready sync.Map // service name -> true once ready
	for _, s := range demoServices {
		if s.name != "redirect" && s.name != "warehouse" {
			continue
		}
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(base+s.port))
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/readyz" {
				http.NotFound(w, r)
				return
			}
			if s.name == "warehouse" {
				if _, ok := ready.Load(s.name); !ok {
					http.Error(w, "clickhouse: dial tcp 127.0.0.1:19000: connect: connection refused", http.StatusServiceUnavailable)
					return
				}
			}
			_, _ = io.WriteString(w, "ok")
		})}
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(func() { _ = srv.Close() })
	}
	var out syncBuffer
	d := &demo{env: &Env{Stdout: &out}, httpBase: base, readyWait: time.Second, bin: "bin", dir: "dir",
		natsURL: "nats://127.0.0.1:1", siteURL: "http://127.0.0.1:2", clickhouseAddr: "127.0.0.1:19000"}
	started := []string{"redirect", "warehouse"}
	waiting := d.readiness(t.Context(), started)
	d.banner(started, waiting, []demoLink{{Code: "nats-jetstream"}})
	got := out.String()
	for _, want := range []string{
		"Snip is starting. Ready: redirect.",
		"Still waiting: warehouse: 503 Service Unavailable clickhouse: dial tcp 127.0.0.1:19000: connect: connection refused",
		"nothing is lost meanwhile",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the banner lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "Snip is running") {
		t.Errorf("the banner says running while the warehouse waits:\n%s", got)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go d.watchReadiness(ctx, waiting)
	ready.Store("warehouse", true)
	testenv.WaitFor(t, 30*time.Second, "the warehouse said ready", func() bool {
		return regexp.MustCompile(`warehouse +ready now`).MatchString(out.String()) && strings.Contains(out.String(), "every service is ready")
	})
}

// A --rate the trickle cannot keep (a negative one, one whose interval
// rounds to nothing, which made time.NewTicker panic once everything had
// started, NaN, infinity) is a usage error before anything starts. The
// Redis port is taken, so a demo that took the rate would stop at its
// port check instead, having started nothing either.
func TestDemoRefusesABadRate(t *testing.T) {
	t.Parallel()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	port := strconv.Itoa(taken.Addr().(*net.TCPAddr).Port)
	for _, rate := range []string{"-1", "2e9", "NaN", "+Inf"} {
		dir := t.TempDir()
		out, err := snipctl(t, nil, "demo", "--dir", dir, "--bin", t.TempDir(), "--rate", rate, "--redis-port", port)
		if !errors.Is(err, errUsage) || !strings.Contains(fmt.Sprint(err), "--rate") {
			t.Errorf("demo --rate %s: err = %v, want a usage error naming --rate\n%s", rate, err, out)
		}
		if entries, _ := os.ReadDir(dir); len(entries) != 0 {
			t.Errorf("demo --rate %s started something: %s holds %v", rate, dir, entries)
		}
	}
}

// The demo keeps its streams in --dir from run to run. One started with a
// shorter SNIP_CLICKS_MAX_AGE than an earlier run's is refused by the
// topology (it would discard what falls outside), and the error says what
// works for the demo: not `topology apply`'s flag (the demo's NATS runs
// only while it does), but the earlier setting, the demo's own
// --shrink-retention (through make, DEMO_FLAGS), or an empty --dir/nats.
// With --shrink-retention the demo starts, and the next run with the
// shorter age starts without it.
func TestDemoAfterARunWithALongerRetentionSaysWhatWorks(t *testing.T) {
	t.Parallel()
	dir, bin := t.TempDir(), t.TempDir() // no service binaries: the test ends past the topology
	// prepared starts the demo and returns once it is past its topology and
	// owner (it says which services it skips), or what it returned before.
	prepared := func(env []string, flags ...string) (string, error) {
		t.Helper()
		d := startDemo(t, env, func() []string {
			args, _, _, _ := demoArgs(t, bin, dir)
			return append(args, flags...)
		})
		var err error
		returned := false
		testenv.WaitFor(t, 2*time.Minute, "the demo past its topology, or returned", func() bool {
			select {
			case err = <-d.done:
				returned = true
				return true
			default:
				return strings.Contains(d.out.String(), "not built")
			}
		})
		d.cancel()
		if !returned {
			<-d.done // stopped: its NATS has written the streams
			return d.out.String(), nil
		}
		return d.out.String(), err
	}
	if out, err := prepared([]string{"SNIP_CLICKS_MAX_AGE=720h"}); err != nil {
		t.Fatalf("first demo, SNIP_CLICKS_MAX_AGE=720h: %v\n%s", err, out)
	}
	out, err := prepared(nil)
	if !errors.Is(err, topology.ErrRetentionShrinks) {
		t.Fatalf("demo with the default age after one with 720h: err = %v, want ErrRetentionShrinks\n%s", err, out)
	}
	msg := err.Error()
	for _, want := range []string{"max age 720h0m0s, want 168h0m0s", "SNIP_CLICKS_MAX_AGE", "--shrink-retention", "make demo DEMO_FLAGS=--shrink-retention", filepath.Join(dir, "nats")} {
		if !strings.Contains(msg, want) {
			t.Errorf("the refusal %q does not say %q", msg, want)
		}
	}
	if strings.Contains(msg, "(snipctl)") {
		t.Errorf("the refusal %q sends the user to snipctl topology apply, which cannot reach the demo's NATS", msg)
	}
	if out, err := prepared(nil, "--shrink-retention"); err != nil {
		t.Fatalf("demo --shrink-retention, as the refusal says: %v\n%s", err, out)
	}
	if out, err := prepared(nil); err != nil {
		t.Fatalf("demo with the default age after --shrink-retention applied it: %v\n%s", err, out)
	}
	// Another partition count: the earlier count, or empty streams.
	out, err = prepared([]string{"SNIP_PARTITIONS=4"})
	if !errors.Is(err, topology.ErrPartitionsChanged) {
		t.Fatalf("demo with 4 partitions after one with 8: err = %v, want ErrPartitionsChanged\n%s", err, out)
	}
	for _, want := range []string{"SNIP_PARTITIONS", "rm -rf " + filepath.Join(dir, "nats")} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal %q does not say %q", err, want)
		}
	}
	if err := os.RemoveAll(filepath.Join(dir, "nats")); err != nil {
		t.Fatal(err)
	}
	if out, err := prepared([]string{"SNIP_PARTITIONS=4"}); err != nil {
		t.Fatalf("demo with 4 partitions on an empty %s: %v\n%s", filepath.Join(dir, "nats"), err, out)
	}
}

// A demo stopped (Ctrl-C) while it starts, here while it waits for a
// redirect service to create its links, stops what it started and ends
// without an error, as a demo stopped once it runs does: not with "create
// link ...: context canceled (is the redirect service running?)", exit 1.
func TestDemoStoppedWhileItStartsEndsWithoutAnError(t *testing.T) {
	t.Parallel()
	dir, bin := t.TempDir(), t.TempDir() // no redirect: the links wait for one
	d := startDemo(t, nil, func() []string {
		args, _, _, _ := demoArgs(t, bin, dir)
		return args
	})
	testenv.WaitFor(t, 2*time.Minute, "the demo waiting for its links", func() bool {
		return strings.Contains(d.out.String(), "not built")
	})
	d.cancel()
	var err error
	testenv.WaitFor(t, time.Minute, "the demo to stop", func() bool {
		select {
		case err = <-d.done:
			return true
		default:
			return false
		}
	})
	if err != nil {
		t.Errorf("demo stopped while it starts: err = %v, want nil\n%s", err, d.out.String())
	}
	if out := strings.TrimSpace(d.out.String()); !strings.HasSuffix(out, "snip demo stopped") {
		t.Errorf("the demo's last line is not %q:\n%s", "snip demo stopped", out)
	}
}

// SNIP_REPLICAS above 1 without --cluster is a usage error naming
// --cluster, before anything starts: one embedded server keeps one copy,
// and the topology would fail only once NATS, Redis and ClickHouse ran.
func TestDemoRefusesReplicasWithoutACluster(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	out, err := snipctl(t, []string{"SNIP_REPLICAS=3"}, "demo", "--dir", dir, "--bin", t.TempDir(), "--rate", "0",
		"--nats-port", "1", "--redis-port", "1") // one port twice: a demo past the check would stop at the port check
	if !errors.Is(err, errUsage) || !strings.Contains(fmt.Sprint(err), "--cluster") {
		t.Errorf("demo with SNIP_REPLICAS=3: err = %v, want a usage error naming --cluster\n%s", err, out)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("demo with SNIP_REPLICAS=3 started something: %s holds %v", dir, entries)
	}
}

// The demo's start-up waits end with the demo: stopped (Ctrl-C) while it
// waits for the redirect to create its links, it does not go on trying for
// the wait's 30 s before it stops what it started.
func TestDemoStartupWaitEndsWithTheStop(t *testing.T) {
	t.Parallel()
	port, err := testenv.FreePort() // no redirect listens there
	if err != nil {
		t.Fatal(err)
	}
	d := &demo{env: &Env{Stdout: io.Discard}, httpBase: port, dir: t.TempDir(), siteURL: "http://127.0.0.1:2"}
	ctx, stop := context.WithCancel(t.Context())
	stop()
	done := make(chan error, 1)
	go func() {
		_, err := d.createLinks(ctx)
		done <- err
	}()
	testenv.WaitFor(t, 5*time.Second, "the link wait to end with the stopped demo", func() bool {
		select {
		case err = <-done:
			return true
		default:
			return false
		}
	})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("createLinks of a stopped demo: err = %v, want context.Canceled", err)
	}
}

// A redirect that answers 503 while it starts (its listener answers before
// it has reached Redis) is asked again: the demo creates its links once the
// API is served, instead of stopping on the first 503.
func TestDemoCreatesLinksOnceTheRedirectHasStarted(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	redirect := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) <= 3 {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"error":{"code":"starting","message":"the service is starting (wait for redis); try again shortly"}}`))
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer redirect.Close()
	port := redirect.Listener.Addr().(*net.TCPAddr).Port
	d := &demo{env: &Env{Stdout: io.Discard, Cfg: Config{Timeout: 5 * time.Second}}, httpBase: port, dir: t.TempDir(), siteURL: "http://127.0.0.1:2"}
	links, err := d.createLinks(t.Context())
	if err != nil || len(links) != 5 {
		t.Fatalf("createLinks = %d links, %v; want 5 once the redirect has started", len(links), err)
	}
}

// The demo's calls to the services' HTTP APIs end after SNIPCTL_TIMEOUT: a
// service that accepts a request and never answers fails the call (health
// check, link creation, webhook endpoint listing) instead of hanging the
// demo.
func TestDemoHTTPCallsEndAfterTheTimeout(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(hung.Close)
	t.Cleanup(func() { close(release) }) // runs first: Close waits for the handlers
	d := &demo{env: &Env{Stdout: io.Discard, Cfg: Config{Timeout: 200 * time.Millisecond}}}
	errHung := errors.New("the call returned, saying nothing")
	tests := []struct {
		name string
		call func() error
	}{
		{"health_check", func() error { return httpOK(t.Context(), d.httpClient(), hung.URL+"/healthz") }},
		{"link_creation", func() error {
			_, _, err := httpPost(t.Context(), d.httpClient(), hung.URL+"/api/links", demoAPIKey, []byte(`{}`))
			return err
		}},
		{"old_webhook_endpoints", func() error {
			// It reports nothing: returning is what is checked.
			d.removeOldDemoEndpoints(t.Context(), hung.URL+"/api/webhooks/endpoints")
			return errHung
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			done := make(chan error, 1)
			go func() { done <- tc.call() }()
			var err error
			testenv.WaitFor(t, 10*time.Second, tc.name+" against a hung service to end", func() bool {
				select {
				case err = <-done:
					return true
				default:
					return false
				}
			})
			if err == nil {
				t.Errorf("%s against a hung service: no error", tc.name)
			}
		})
	}
}

// Stopping the demo (Ctrl-C cancels its context) ends a health or
// readiness check in flight at once. The checks were sent without the
// context: a stop while a service had taken a check and not answered
// waited for the check's own timeout (SNIPCTL_TIMEOUT, 30 s by default,
// for the health check; 2 s for /readyz). Here the service never answers,
// SNIPCTL_TIMEOUT is a minute and the demo waits a minute for readiness;
// each wait is stopped once its check has reached the service, and must
// return well within a second.
func TestDemoChecksEndWhenTheDemoStops(t *testing.T) {
	t.Parallel()
	const timeout = time.Minute
	const prompt = time.Second // below both checks' own timeouts
	s := demoServices[0]
	tests := []struct {
		name string
		wait func(ctx context.Context, d *demo) error
	}{
		{"health_check", func(ctx context.Context, d *demo) error {
			// As startServices waits for each service.
			return waitUntil(ctx, timeout, func() error { return httpOK(ctx, d.httpClient(), "http://"+d.addr(s.port)+"/healthz") })
		}},
		{"readiness", func(ctx context.Context, d *demo) error {
			if waiting := d.readiness(ctx, []string{s.name}); waiting[s.name] == "" {
				return fmt.Errorf("readiness of a service that never answered: %v, want it waiting", waiting)
			}
			return ctx.Err()
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			arrived := make(chan struct{}, 1)
			release := make(chan struct{})
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			hung := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				select {
				case arrived <- struct{}{}:
				default:
				}
				select {
				case <-release:
				case <-r.Context().Done():
				}
			})}
			go func() { _ = hung.Serve(ln) }()
			t.Cleanup(func() { _ = hung.Close() })
			t.Cleanup(func() { close(release) }) // runs first: the handlers return
			d := &demo{env: &Env{Stdout: io.Discard, Cfg: Config{Timeout: timeout}}, readyWait: timeout,
				httpBase: ln.Addr().(*net.TCPAddr).Port - s.port}

			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- tc.wait(ctx, d) }()
			select {
			case <-arrived:
			case err := <-done:
				t.Fatalf("the wait ended before its check reached the service: %v", err)
			case <-time.After(30 * time.Second):
				t.Fatal("the check never reached the service")
			}
			cancel()
			stopped := time.Now()
			select {
			case err := <-done:
				if !errors.Is(err, context.Canceled) {
					t.Errorf("the stopped wait: err = %v, want context.Canceled", err)
				}
			case <-time.After(prompt):
				t.Fatalf("the wait had not ended %s after the demo stopped with its check in flight", prompt)
			}
			if took := time.Since(stopped); took > prompt {
				t.Errorf("the wait ended %s after the demo stopped; want within %s", took.Round(time.Millisecond), prompt)
			}
		})
	}
}

// A port of the NATS server taken after the demo's port check (another
// program drew it before the server listened) is reported as the check
// reports one: a *portInUseError naming it, not "not ready".
func TestDemoNATSOnAPortTakenSinceTheCheckSaysWhichPort(t *testing.T) {
	t.Parallel()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	d := &demo{env: &Env{Stdout: io.Discard, Stderr: io.Discard}, dir: t.TempDir(), natsHTTP: taken.Addr().(*net.TCPAddr).Port}
	ns, err := d.startNATS(port)
	if err == nil {
		ns.Shutdown()
		t.Fatal("the NATS server started with its monitoring port taken")
	}
	var inUse *portInUseError
	if !errors.As(err, &inUse) || inUse.port.what != "nats monitoring" {
		t.Fatalf("start with the monitoring port taken: %v, want a *portInUseError for nats monitoring", err)
	}
}

// The webhooks service answers on its port from its start, and 503 to its
// API until it is ready: the demo registers its receiver once /readyz says
// so, instead of giving up on the first 503.
func TestDemoRegistersItsReceiverOnceWebhooksIsReady(t *testing.T) {
	t.Parallel()
	var first atomic.Int64 // unix ns of the first request: "starting" for a second after it
	var posts, refused atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		first.CompareAndSwap(0, time.Now().UnixNano())
		if time.Since(time.Unix(0, first.Load())) < time.Second {
			if r.Method == http.MethodPost {
				refused.Add(1)
			}
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"error":{"code":"starting","message":"the service is starting"}}`))
			return
		}
		switch {
		case r.URL.Path == "/readyz":
			w.WriteHeader(http.StatusOK)
		case r.Method == http.MethodGet:
			_, _ = w.Write([]byte(`[]`))
		case r.Method == http.MethodPost:
			posts.Add(1)
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"id":"ep_1","secret":"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}`))
		}
	}))
	defer srv.Close()
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	var out syncBuffer
	d := &demo{env: &Env{Stdout: &out, Stderr: &out, Cfg: Config{Timeout: 5 * time.Second}}, httpBase: port - 7, dir: t.TempDir()}
	stop := d.joinWebhooks(t.Context(), []string{"webhooks"})
	defer stop()
	if posts.Load() != 1 || refused.Load() != 0 || !strings.Contains(out.String(), "endpoint ep_1 ->") {
		t.Fatalf("registrations accepted %d, refused as starting %d; want 1 and 0; the demo said:\n%s", posts.Load(), refused.Load(), out.String())
	}
}

// The banner's clickhouse-client command is followed by how to get the
// client when it is not on the PATH: on Debian and Ubuntu it is a package
// of its own that clickhouse-server does not bring, and a newcomer who
// installed only the server met "command not found" with no hint.
func TestDemoBannerSaysHowToGetTheClickHouseClient(t *testing.T) {
	banner := func() string {
		var out bytes.Buffer
		d := &demo{env: &Env{Stdout: &out}, dir: ".demo", bin: ".demo/bin", httpBase: 8080,
			natsURL: "nats://127.0.0.1:4222", siteURL: "http://127.0.0.1:8089", clickhouseAddr: "127.0.0.1:19000"}
		d.banner([]string{"redirect", "clickcounter"}, nil, []demoLink{{Code: "nats-jetstream"}})
		return out.String()
	}
	const hint = "apt-get install clickhouse-client"

	t.Setenv("PATH", t.TempDir())
	b := banner()
	if !strings.Contains(b, "clickhouse-client --port 19000 --database snip -q") {
		t.Fatalf("the banner lacks the clickhouse-client command:\n%s", b)
	}
	if !strings.Contains(b, "clickhouse-client is not on the PATH") || !strings.Contains(b, hint) {
		t.Errorf("without clickhouse-client on the PATH the banner does not say how to get it:\n%s", b)
	}

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "clickhouse-client"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	if b := banner(); strings.Contains(b, hint) {
		t.Errorf("with clickhouse-client on the PATH the banner still says to install it:\n%s", b)
	}
}

// The webhooks service delivers at least once: a batch comes again with the
// same webhook-id. The demo's receiver says, at the repeat, that it is a
// redelivery a receiver deduplicates by webhook-id, instead of printing
// the same ID twice as if it were news. It remembers a bounded number of
// IDs.
func TestDemoReceiverSaysARepeatedWebhookIDIsARedelivery(t *testing.T) {
	t.Parallel()
	var out syncBuffer
	rcv := &demoReceiver{d: &demo{env: &Env{Stdout: &out, Stderr: &out}}}
	wh, err := standardwebhooks.NewWebhook("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if err != nil {
		t.Fatal(err)
	}
	rcv.wh.Store(wh)
	srv := httptest.NewServer(rcv)
	defer srv.Close()
	post := func(id string) {
		t.Helper()
		body := []byte(`{"events":[{"id":"ev1","type":"click","data":{"code":"nats-jetstream"}}]}`)
		now := time.Now()
		sig, err := wh.Sign(id, now, body)
		if err != nil {
			t.Fatal(err)
		}
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+demoWebhooksPath, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("webhook-id", id)
		req.Header.Set("webhook-timestamp", strconv.FormatInt(now.Unix(), 10))
		req.Header.Set("webhook-signature", sig)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			t.Fatalf("delivery %s answered %d, want 204 (a redelivery is acknowledged too)", id, resp.StatusCode)
		}
	}
	post("msg_a")
	post("msg_b")
	post("msg_a")
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("the receiver printed %d lines for 3 deliveries, want 3:\n%s", len(lines), out.String())
	}
	for i, l := range lines[:2] {
		if strings.Contains(l, "REDELIVERY") {
			t.Errorf("delivery %d, a first one, is called a redelivery: %s", i+1, l)
		}
	}
	if l := lines[2]; !strings.Contains(l, "msg_a") || !strings.Contains(l, "REDELIVERY") || !strings.Contains(l, "deduplicates by webhook-id") {
		t.Errorf("the repeat of msg_a does not say it is a redelivery to deduplicate by webhook-id: %s", l)
	}

	// Bounded: once demoSeenIDs other IDs came, the oldest is forgotten.
	for i := range demoSeenIDs {
		rcv.again(fmt.Sprintf("msg_%d", i))
	}
	if len(rcv.seen) > demoSeenIDs || len(rcv.ring) > demoSeenIDs {
		t.Errorf("the receiver remembers %d IDs (ring %d), want at most %d", len(rcv.seen), len(rcv.ring), demoSeenIDs)
	}
	if rcv.again("msg_a") {
		t.Errorf("msg_a still remembered after %d other IDs", demoSeenIDs)
	}
	if !rcv.again(fmt.Sprintf("msg_%d", demoSeenIDs-1)) {
		t.Errorf("the latest ID is forgotten")
	}
}
