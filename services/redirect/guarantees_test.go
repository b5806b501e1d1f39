package main

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
)

// drive sends clicks to every code, one sequential client per code (so the
// order of its 302s is well defined), until stop is closed and each client
// has sent at least min clicks. base() is read per request, so a test can
// move the traffic to another instance.
func drive(l *ledger, base func() string, codes []string, minPerCode int, stop <-chan struct{}) (wait func()) {
	var wg sync.WaitGroup
	for _, code := range codes {
		wg.Go(func() {
			for seq := 0; ; seq++ {
				select {
				case <-stop:
					if seq >= minPerCode {
						return
					}
				default:
				}
				if _, err := l.click(base(), code); err != nil {
					time.Sleep(20 * time.Millisecond) // the server is away; do not spin
				}
			}
		})
	}
	return wg.Wait
}

// TestGuarantee_NATSDownRedirectsGoOnAndEveryClickArrivesOnceInOrder: the
// service starts while NATS is down, and NATS goes away again later under
// traffic. Every redirect still answers 302 (the outbox holds the clicks),
// and once NATS is back every click is in CLICKS exactly once (by event ID
// and by request ID), per link in the order the 302s were served.
func TestGuarantee_NATSDownRedirectsGoOnAndEveryClickArrivesOnceInOrder(t *testing.T) {
	t.Parallel()
	_, db := servers.Redis.NewDB(t)
	n := testenv.StartNATS(t)
	n.Stop() // down before the service starts
	cfg := testConfig(servers.Redis.URL(db), n.URL)
	// Order per link is promised while Redis answers within the outbox
	// wait: a click that takes the direct path can overtake its link's
	// backlog in the outbox (decisions/0014). A loaded test machine can
	// stall Redis past 100 ms, so this test waits longer.
	cfg.OutboxWait, cfg.OutboxValidity, cfg.CommitTimeout = 3*time.Second, 4*time.Second, 8*time.Second
	in := startInstance(t, cfg)
	var codes []string
	for i := range 6 {
		codes = append(codes, createLink(t, in.URL, fmt.Sprintf("https://example.com/%d", i), ""))
	}
	l := newLedger()
	base := func() string { return in.URL }

	phase := func(name string, perCode int) {
		stop := make(chan struct{})
		close(stop)
		drive(l, base, codes, perCode, stop)()
		if l.refused != 0 {
			t.Fatalf("%s: %d redirects were not 302", name, l.refused)
		}
	}
	phase("nats down from the start", 30)
	n.Start()
	phase("nats up", 30)
	n.Stop()
	phase("nats down again", 30)
	if got := metric(t, in.URL, "snip_redirect_outbox_depth_total_entries", `lane="clicks"`); got == 0 {
		t.Log("outbox depth not sampled yet while NATS was down") // informational: the sampler runs every 100ms
	}
	n.Start()

	js := n.JetStream(t)
	l.expectInCLICKS(t, js)
	testenv.WaitFor(t, 30*time.Second, "the outbox to empty", func() bool {
		return metricIs(t, in.URL, "snip_redirect_outbox_depth_total_entries", 0)
	})
}

// buildBinary builds the service into a temporary folder.
func buildBinary(tb testing.TB) string {
	tb.Helper()
	bin := filepath.Join(tb.TempDir(), "redirect")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Env = os.Environ()
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// proc is the service running as a child process.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func startProc(tb testing.TB, bin string, env []string, url string) *proc {
	tb.Helper()
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), env...)
	logf, err := os.Create(filepath.Join(tb.TempDir(), "redirect.log"))
	if err != nil {
		tb.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start %s: %v", bin, err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); logf.Close(); close(p.done) }()
	tb.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
		}
	})
	testenv.WaitFor(tb, 60*time.Second, "the service process to answer /readyz", func() bool {
		select {
		case <-p.done:
			log, _ := os.ReadFile(logf.Name())
			tb.Fatalf("service exited early:\n%s", log)
		default:
		}
		r, err := doErr("GET", url+"/readyz", "")
		return err == nil && r.Status == http.StatusOK
	})
	return p
}

// TestGuarantee_Kill9LosesNoClickThatGot302 builds and runs the real binary,
// drives it with concurrent clients, SIGKILLs it mid-traffic (with a backlog
// in the outbox: NATS is stopped just before), and starts a new process on
// the same port, which takes the dead one's relay leases over once they
// expire and publishes the backlog. Every click
// that got a 302 reaches CLICKS exactly once, in order per link; clicks of
// requests that died with the process are there at most once.
func TestGuarantee_Kill9LosesNoClickThatGot302(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds the binary; run without -short")
	}
	bin := buildBinary(t)
	_, db := servers.Redis.NewDB(t)
	n := testenv.StartNATS(t)
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	url := "http://127.0.0.1:" + strconv.Itoa(port)
	env := []string{
		"HTTP_ADDR=127.0.0.1:" + strconv.Itoa(port), "REDIS_URL=" + servers.Redis.URL(db), "NATS_URL=" + n.URL,
		"SNIP_BOOTSTRAP_OWNERS=acme:" + acmeKey, "SNIP_PARTITIONS=3", "SNIP_OUTBOX_SHARDS=4",
		"SNIP_RELAY_LEASE_TTL=1s", "SNIP_RELAY_WINDOW=64", "LOG_LEVEL=warn",
		// Order is checked: see the NATS-down test on why the wait is long.
		"SNIP_OUTBOX_WAIT=3s", "SNIP_OUTBOX_VALIDITY=4s", "SNIP_COMMIT_TIMEOUT=8s",
	}
	first := startProc(t, bin, append(env, "SNIP_INSTANCE=first"), url)
	var codes []string
	for i := range 8 {
		codes = append(codes, createLink(t, url, fmt.Sprintf("https://example.com/k%d", i), ""))
	}
	l := newLedger()
	stop := make(chan struct{})
	wait := drive(l, func() string { return url }, codes, 0, stop)
	testenv.WaitFor(t, 60*time.Second, "traffic before the kill", func() bool { return l.total() >= 400 })
	// Take NATS away for a moment so the dead process leaves a backlog in
	// the outbox under its relay leases, which the new one must take over.
	n.Stop()
	stoppedAt := l.total()
	testenv.WaitFor(t, 60*time.Second, "a backlog in the outbox", func() bool { return l.total() >= stoppedAt+200 })
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-first.done
	servedAtKill := l.total()
	n.Start()
	startProc(t, bin, append(env, "SNIP_INSTANCE=second"), url)
	testenv.WaitFor(t, 60*time.Second, "traffic after the restart", func() bool { return l.total() >= servedAtKill+200 })
	close(stop)
	wait()

	js := n.JetStream(t)
	want := l.expectInCLICKS(t, js)
	t.Logf("%d clicks served (%d before the kill), %d requests failed around it", want, servedAtKill, l.refused)
}

// TestGuarantee_RedisRestartUnderTraffic: Redis stopped (gracefully) and
// restarted under traffic on cached links. Every request still gets its
// 302, the clicks of the outage recorded straight in JetStream; once Redis
// is back clicks go through the outbox again, and every click that got a
// 302 is in CLICKS exactly once.
func TestGuarantee_RedisRestartUnderTraffic(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	n := testenv.StartNATS(t)
	in := startInstance(t, testConfig(r.URL(0), n.URL))
	var codes []string
	for i := range 4 {
		codes = append(codes, createLink(t, in.URL, fmt.Sprintf("https://example.com/r%d", i), ""))
	}
	l := newLedger()
	stop := make(chan struct{})
	wait := drive(l, func() string { return in.URL }, codes, 0, stop)
	testenv.WaitFor(t, 60*time.Second, "traffic before the restart", func() bool { return l.total() >= 100 })
	r.Stop()
	testenv.WaitFor(t, 60*time.Second, "clicks recorded straight in JetStream while redis is down", func() bool {
		return metric(t, in.URL, "snip_redirect_clicks_recorded_total", `path="jetstream"`) >= 50
	})
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	viaOutbox := metric(t, in.URL, "snip_redirect_clicks_recorded_total", `path="outbox"`)
	testenv.WaitFor(t, 60*time.Second, "clicks in the outbox again", func() bool {
		return metric(t, in.URL, "snip_redirect_clicks_recorded_total", `path="outbox"`) >= viaOutbox+100
	})
	close(stop)
	wait()

	if l.refused != 0 {
		t.Fatalf("%d requests were not answered 302 while redis restarted: %q", l.refused, l.why)
	}
	l.expectInCLICKSAnyOrder(t, n.JetStream(t))
}

// TestRedisDownCachedLinksRedirectUncachedAnswer503: with Redis down, a
// cached link still redirects and its click is recorded straight in
// JetStream; a link that is not cached cannot be looked up, so it answers
// 503 within the lookup bound; /readyz stays ready (clicks can be
// recorded) until NATS goes too, and then says why NATS is down. With NATS down as well, the policy decides: reject answers 503 (counted unrecorded),
// redirect answers 302 without the click.
func TestRedisDownCachedLinksRedirectUncachedAnswer503(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	n := testenv.StartNATS(t)
	cfg := testConfig(r.URL(0), n.URL)
	in := startInstance(t, cfg)
	cfg.UnrecordedPolicy = "redirect"
	lenient := startInstance(t, cfg)
	code := createLink(t, in.URL, "https://example.com/up", "")
	uncached := createLink(t, in.URL, "https://example.com/cold", "")
	for _, base := range []string{in.URL, lenient.URL} {
		if got := do(t, "GET", base+"/"+code, "").Status; got != http.StatusFound {
			t.Fatalf("GET = %d", got)
		}
	}
	r.Stop()
	for range 5 {
		if got := do(t, "GET", in.URL+"/"+code, "").Status; got != http.StatusFound {
			t.Fatalf("GET of a cached link with redis down = %d, want 302", got)
		}
	}
	if got := metric(t, in.URL, "snip_redirect_clicks_recorded_total", `path="jetstream"`); got != 5 {
		t.Fatalf(`clicks_recorded_total{path="jetstream"} = %v, want 5`, got)
	}
	start := time.Now()
	if got := do(t, "GET", in.URL+"/"+uncached, "").Status; got != http.StatusServiceUnavailable {
		t.Fatalf("GET of an uncached link with redis down = %d, want 503", got)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("the 503 took %s", took)
	}
	if got := do(t, "GET", in.URL+"/readyz", "").Status; got != http.StatusOK {
		t.Fatalf("/readyz with redis down and nats up = %d, want 200 (clicks are recorded through JetStream)", got)
	}

	n.Stop()
	var readyz response
	if !testenv.Poll(10*time.Second, func() bool {
		readyz = do(t, "GET", in.URL+"/readyz", "")
		return readyz.Status == http.StatusServiceUnavailable && strings.Contains(string(readyz.Body), "direct path: nats RECONNECTING: dial tcp ") &&
			strings.Contains(string(readyz.Body), "connection refused")
	}) {
		t.Fatalf("/readyz with both stores down = %d %s, want 503 saying why NATS is down (the refused dial)", readyz.Status, readyz.Body)
	}
	if got := do(t, "GET", in.URL+"/"+code, "").Status; got != http.StatusServiceUnavailable {
		t.Fatalf("GET with redis and nats down, policy reject = %d, want 503", got)
	}
	if got := do(t, "GET", lenient.URL+"/"+code, "").Status; got != http.StatusFound {
		t.Fatalf("GET with redis and nats down, policy redirect = %d, want 302", got)
	}
	for _, base := range []string{in.URL, lenient.URL} {
		if got := metric(t, base, "snip_redirect_clicks_unrecorded_total"); got != 1 {
			t.Fatalf("%s: clicks_unrecorded_total = %v, want 1", base, got)
		}
	}
	n.Start()
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "a click recorded in the outbox after redis returns", func() bool {
		do(t, "GET", in.URL+"/"+code, "")
		return metric(t, in.URL, "snip_redirect_clicks_recorded_total", `path="outbox"`) >= 2
	})
}

// TestRedisDownAnExpiredCachedLinkRedirectsADeletedOneDoesNot: with Redis
// stopped, a link whose cache entry has passed SNIP_CACHE_TTL still
// redirects (stale-if-error, counted), while a link deleted before the
// outage, dropped from this instance's cache by LINKS, answers 503.
func TestRedisDownAnExpiredCachedLinkRedirectsADeletedOneDoesNot(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	n := testenv.StartNATS(t)
	js := n.JetStream(t)
	cfg := testConfig(r.URL(0), n.URL)
	cfg.CacheTTL, cfg.CacheStaleIfError = 300*time.Millisecond, time.Hour
	a := startInstance(t, cfg)
	b := startInstance(t, cfg)
	steady := createLink(t, a.URL, "https://example.com/steady", "")
	gone := createLink(t, a.URL, "https://example.com/gone", "")
	testenv.WaitFor(t, 30*time.Second, "link.created in LINKS", func() bool { return streamCount(js, events.LinksStream) == 2 })
	for _, code := range []string{steady, gone} {
		if got := do(t, "GET", b.URL+"/"+code, "").Status; got != http.StatusFound { // b caches it
			t.Fatalf("GET %s via b = %d", code, got)
		}
	}
	testenv.WaitFor(t, 30*time.Second, "b following LINKS", func() bool {
		return metric(t, b.URL, "snip_redirect_links_following") == 1
	})
	if r := do(t, "DELETE", a.URL+"/api/links/"+gone, "", "Authorization", "Bearer "+acmeKey); r.Status != http.StatusNoContent {
		t.Fatalf("DELETE = %d %s", r.Status, r.Body)
	}
	testenv.WaitFor(t, 30*time.Second, "b to drop the deleted link (LINKS)", func() bool {
		return metric(t, b.URL, "snip_redirect_cache_invalidations_total") == 1
	})

	r.Stop()
	testenv.WaitFor(t, 30*time.Second, "the expired entry served stale", func() bool {
		if got := do(t, "GET", b.URL+"/"+steady, "").Status; got != http.StatusFound {
			t.Fatalf("GET of a cached link with redis down = %d, want 302", got)
		}
		return metric(t, b.URL, "snip_redirect_cache_stale_served_total") >= 1
	})
	if got := do(t, "GET", b.URL+"/"+gone, "").Status; got != http.StatusServiceUnavailable {
		t.Fatalf("GET of the deleted link with redis down = %d, want 503", got)
	}
	if got := metric(t, b.URL, "snip_redirect_cache_stale_served_total"); got < 1 {
		t.Fatalf("cache_stale_served_total = %v", got)
	}
}
