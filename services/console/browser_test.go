package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/deadletter"
	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/console/internal/consoletest"
	"github.com/snipdev/snip/services/console/internal/dlq"
	"github.com/snipdev/snip/services/console/internal/webhookstate"
)

// screenshotEnv names the file the browser test writes the console's
// screenshot to (a PNG), when set: SNIP_CONSOLE_SCREENSHOT=../../docs/console.png
// from services/console refreshes the one the README shows.
const screenshotEnv = "SNIP_CONSOLE_SCREENSHOT"

// chromium finds Debian's chromium (or a Chrome) to drive. A missing browser
// fails the test: the page is only tested in one.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no chromium on PATH: the console's browser test needs headless Chromium " +
		"(Debian/Ubuntu: apt-get install chromium; bash .ci/install-servers installs it)")
	return ""
}

// fraudDetection runs the fraud service's binary against the console's
// NATS: a reader of the system that writes real alerts, verdicts and dead
// letters for the console to show.
func fraudDetection(t *testing.T, natsURL string) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "fraud")
	if out, err := exec.Command("go", "build", "-o", bin, "../fraud").CombinedOutput(); err != nil {
		t.Fatalf("build the fraud service: %v\n%s", err, out)
	}
	_, db := servers.Redis.NewDB(t)
	logPath := filepath.Join(t.TempDir(), "fraud.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "NATS_URL="+natsURL, "REDIS_URL="+servers.Redis.URL(db), "HTTP_ADDR=127.0.0.1:0",
		"SNIP_PARTITIONS="+strconv.Itoa(consoletest.Partitions), "SNIP_APPLY_TOPOLOGY=false", "LOG_LEVEL=warn", "SHUTDOWN_TIMEOUT=5s")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the fraud service: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); logf.Close() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("fraud service log:\n%s", b)
		}
	})
}

// The console as an operator sees it: a real headless Chromium logs in and
// reads every panel of a console running against real NATS, Redis and
// ClickHouse, next to the fraud service's binary, with clicks flowing (a
// burst among them, which fraud detection alerts on), a malformed event
// (which it parks as a dead letter), more dead letters, warehouse rows and
// an outbox backlog. It asserts what each panel says, that the page's first
// paint already has the figures, that the live table's number columns line
// up with their headers, and that the page logs no JavaScript error or
// exception (a Content-Security-Policy violation included).
func TestConsoleInABrowser(t *testing.T) {
	t.Parallel()
	browser := chromium(t)
	s := start(t, withToken)
	seed(t, s)
	// The click counter's group, down: its replay dialog is pressed below.
	consoletest.DownGroup(t, s.js, topology.GroupClickCounter)
	fraudDetection(t, s.js.Conn().ConnectedUrl())
	// One visitor clicks acme/abc 25 times at once: fraud detection allows
	// 20 a minute. And an event that is not a click.
	burst := make([]events.Click, 25)
	for i := range burst {
		burst[i] = consoletest.Click("acme", "abc", 0)
		burst[i].Visitor, burst[i].Bot = "burst-visitor", false
	}
	consoletest.Publish(t, s.js, burst...)
	if _, err := s.js.Publish(t.Context(), events.ClickSubject("acme", "abc"), []byte(`{"v":1,"id":"not-a-click"}`)); err != nil {
		t.Fatal(err)
	}
	// An alert as fraud detection writes it: a window of a few milliseconds
	// and a Go duration in its detail.
	now := time.Now().UTC()
	window := 28363413 * time.Nanosecond
	consoletest.PublishAlert(t, s.js, events.FraudAlert{
		V: events.FraudVersion, ID: fmt.Sprintf("visitor_burst:abc:v1:%d", now.UnixNano()), Rule: "visitor_burst",
		Code: "abc", Owner: "acme", Key: "v1", WindowStart: now.Add(-window), WindowEnd: now, Count: 21, Threshold: 20,
		Time: now, Detail: "21 clicks by one visitor within 28.363413ms (at most 20 allowed)",
	})
	// Clicks keep arriving while the page is open.
	trafficCtx, stopTraffic := context.WithCancel(context.Background())
	traffic := make(chan struct{})
	go func() {
		defer close(traffic)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-trafficCtx.Done():
				return
			case <-tick.C:
				c := consoletest.Click("acme", "abc", i)
				b, _ := json.Marshal(c)
				pctx, cancel := context.WithTimeout(trafficCtx, 5*time.Second)
				_, _ = s.js.Publish(pctx, events.ClickSubject(c.Owner, c.Code), b, jetstream.WithMsgID(c.ID))
				cancel()
			}
		}
	}()
	defer func() { stopTraffic(); <-traffic }()

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser), chromedp.NoSandbox,
		chromedp.DisableGPU, chromedp.WindowSize(1400, 1000), chromedp.UserDataDir(t.TempDir()))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	ctx, cancelTab := chromedp.NewContext(actx)
	defer cancelTab()

	// Every console error and uncaught exception the page produces.
	var mu sync.Mutex
	var problems []string
	messages := chromedp.Console(ctx)
	consoleDone := make(chan struct{})
	go func() {
		defer close(consoleDone)
		for m, err := range messages {
			if err != nil {
				return
			}
			// The browser logs the refused replay pressed below (a 409 the
			// page shows) as a resource that failed to load.
			refusedReplay := strings.Contains(m.String(), "status of 409") &&
				strings.HasSuffix(m.URL, "/api/readers/"+topology.GroupClickCounter+"/replay")
			if (m.Type == chromedp.ConsoleError || m.IsException()) && !refusedReplay {
				mu.Lock()
				problems = append(problems, m.String()+" ("+m.URL+")")
				mu.Unlock()
			}
		}
	}()
	defer func() { cancelTab(); <-consoleDone }()

	step := func(what string, a chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if _, err := chromedp.Run(sctx, a); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	eval := func(expr string) string {
		t.Helper()
		ectx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		v, err := chromedp.Run(ectx, chromedp.Evaluate[string](expr))
		if err != nil {
			t.Fatalf("evaluate %s: %v", expr, err)
		}
		return v
	}
	waitFor := func(what, expr string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for eval(expr) != "true" {
			if time.Now().After(deadline) {
				t.Fatalf("the page did not show %s within 30 s; it reads:\n%s", what, eval("document.body.innerText"))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	// click clicks the first element matching sel from inside the page.
	// chromedp.Click dispatches a mouse event at the element's coordinates,
	// and the panels refresh (and change height) while the test runs: on a
	// loaded machine the page can move between the two, and the click lands
	// on whatever is there by then.
	click := func(what, sel string) {
		t.Helper()
		if got := eval(fmt.Sprintf(`(() => { const b = document.querySelector(%q); if (!b) return "missing"; b.click(); return ""; })()`, sel)); got != "" {
			t.Fatalf("%s: %s is %s; the page reads:\n%s", what, sel, got, eval("document.body.innerText"))
		}
	}
	text := func(id string) string { return eval(fmt.Sprintf("document.getElementById(%q).innerText", id)) }

	// Log in through the form, as an operator does.
	if _, err := chromedp.Run(ctx, chromedp.Navigate(s.url+"/login")); err != nil { // the first Run starts the browser: no timeout
		t.Fatalf("open the login page: %v", err)
	}
	step("type the token", chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), testToken))
	step("log in", chromedp.Click(chromedp.CSS(`button[type="submit"]`)))
	waitFor("the console after logging in", `String(location.pathname === "/" && !!document.getElementById("panel-readers"))`)

	// The first paint has the figures: the page arrives with those computed
	// within initialWait. On a loaded machine a computation can take longer
	// (it goes on, and the page after it has it), so the page is loaded
	// again until one first paint has every panel's figures; a page that
	// never carried them fails here.
	placeholders := func() []string {
		var bad []string
		for _, id := range []string{"readers", "consumers", "outbox", "webhooks", "alerts", "dlq"} {
			if got := text(id); strings.Contains(got, "Reading") || strings.Contains(got, "loading") {
				bad = append(bad, fmt.Sprintf("panel #%s shows %q", id, got))
			}
		}
		return bad
	}
	for paintDeadline := time.Now().Add(30 * time.Second); ; {
		step("load the console", chromedp.Navigate(s.url+"/"))
		bad := placeholders()
		if len(bad) == 0 {
			break
		}
		if time.Now().After(paintDeadline) {
			t.Errorf("no first paint had every panel's figures within 30 s; the last:\n%s", strings.Join(bad, "\n"))
			break
		}
		t.Logf("first paint without every figure (a computation outlasted the page's wait), loading again: %s", strings.Join(bad, "; "))
	}

	waitFor("live clicks", `String(document.querySelectorAll("#live tr").length >= 3)`)
	waitFor("both alerts", `String(document.getElementById("alerts").innerText.includes("visitor_burst"))`)
	waitFor("the warehouse", `String(document.getElementById("warehouse").innerText.includes("globex"))`)

	// What the fraud service wrote: its alert on the burst, the event it parked.
	waitFor("fraud detection's alert", `String(document.getElementById("alerts").innerText.includes("by one visitor within"))`)
	waitFor("fraud detection's dead letter", `String(document.getElementById("dlq").innerText.includes("fraud-detection"))`)

	panels := map[string][]string{
		"readers":   {"down-reader", "fraud-detection", "Replay…", "with events and no member", "ack floor", "pinned"},
		"consumers": {topology.PreviewConsumer, "PREVIEW_JOBS"},
		"outbox":    {"clicks", "1 shard,"},
		"alerts":    {"alerts read", "link_flood", "visitor_burst", "acme/abc", "21 > 20", "within 28 ms (at most 20 allowed)"},
		"dlq":       {"5 dead letters", "down-reader", "fraud-detection", "malformed", "preview", "timeout"},
		"warehouse": {"Top links", "abc", "globex", "Clicks per hour"},
		"live":      {"abc", "acme", "human"},
	}
	for id, wants := range panels {
		got := text(id)
		for _, want := range wants {
			if !strings.Contains(got, want) {
				t.Errorf("panel #%s lacks %q; it reads:\n%s", id, want, got)
			}
		}
	}
	alerts := text("alerts")
	if !regexp.MustCompile(`(?m)^\d+ alerts read`).MatchString(alerts) {
		t.Errorf("the alerts panel does not count the alerts read:\n%s", alerts)
	}
	// The window, to the millisecond the browser's clock has.
	if !regexp.MustCompile(`\(within 2[89] ms\)`).MatchString(alerts) {
		t.Errorf("the alerts panel does not give the window as \"(within 28 ms)\":\n%s", alerts)
	}
	if regexp.MustCompile(`\d\.\d{3,}(ms|µs|s)`).MatchString(alerts) {
		t.Errorf("the alerts panel prints a raw duration:\n%s", alerts)
	}
	if today := eval("new Date().toLocaleDateString()"); strings.Contains(alerts, today) {
		t.Errorf("the alerts panel prints today's date (%s) on today's alerts:\n%s", today, alerts)
	}
	body := text("panel-live") + eval("document.body.innerText")
	for _, bad := range []string{"(s)", "loading", "undefined", "NaN", "[object Object]", "1 dead letters", "1 alerts", "1 bots"} {
		if strings.Contains(body, bad) {
			t.Errorf("the page says %q:\n%s", bad, body)
		}
	}

	// The live table's seq and p headers stand over their numbers.
	if got := eval(`(() => {
		const out = [];
		for (const i of [2, 3]) {
			const th = document.querySelector("table.clicks thead th:nth-child(" + i + ")");
			const td = document.querySelector("#live tr td:nth-child(" + i + ")");
			const a = th.getBoundingClientRect(), b = td.getBoundingClientRect();
			if (getComputedStyle(th).textAlign !== "right" || Math.abs(a.right - b.right) > 1 || Math.abs(a.left - b.left) > 1)
				out.push(th.innerText + ": header " + a.left + "-" + a.right + " " + getComputedStyle(th).textAlign + ", cell " + b.left + "-" + b.right);
		}
		return out.join("; ");
	})()`); got != "" {
		t.Errorf("live clicks: headers not over their numbers: %s", got)
	}

	// The dead letters open, and one shows its headers and payload.
	click("list the letters", `#dlq button`)
	waitFor("the letters", `String(document.querySelectorAll("#letters tbody tr").length > 0)`)
	click("show a letter", `#letters tbody button`)
	waitFor("the letter", `String(!document.getElementById("letter").hidden && document.getElementById("letter").innerText.includes("`+events.HeaderDeadReason+`"))`)
	if got := text("letter"); !strings.Contains(got, `"owner": "acme"`) || !strings.Contains(got, "redrive to clicks.acme.abc") {
		t.Errorf("the letter shows:\n%s", got)
	}

	// Replay asks first, and says what a replay means for the group.
	click("open the replay dialog", `#readers button`)
	waitFor("the replay dialog", `String(document.getElementById("replay-dialog").open)`)
	if got := text("replay-note"); len(got) < 20 {
		t.Errorf("the replay dialog explains nothing: %q", got)
	}
	step("close the replay dialog", chromedp.Click(chromedp.CSS(`#replay-close`)))

	// A replay of the click counter from after CLICKS' oldest event would
	// recount nothing: the dialog says it is refused, and why; forced, it
	// is requested, and the warning stays while the progress shows.
	if got := eval(`(() => {
		for (const h of document.querySelectorAll("#readers h3"))
			if (h.firstChild.textContent === "` + topology.GroupClickCounter + `") { h.querySelector("button").click(); return ""; }
		return "missing";
	})()`); got != "" {
		t.Fatalf("the click counter's Replay button is %s; the page reads:\n%s", got, eval("document.body.innerText"))
	}
	waitFor("the click counter's replay dialog", `String(document.getElementById("replay-dialog").open && document.getElementById("replay-group").innerText === "`+topology.GroupClickCounter+`")`)
	replayFrom := func(force bool) {
		t.Helper()
		eval(fmt.Sprintf(`(() => {
			const f = document.getElementById("replay-form");
			f.elements.kind.value = "from_seq";
			f.elements.from_seq.value = "3";
			f.elements.confirm.value = %q;
			f.elements.force.checked = %t;
			document.getElementById("replay-go").click();
			return "";
		})()`, topology.GroupClickCounter, force))
	}
	replayFrom(false)
	waitFor("the refusal", `String(document.getElementById("replay-result").innerText.startsWith("Refused: "))`)
	if got := text("replay-result"); !strings.Contains(got, "from sequence 3 starts after the oldest event CLICKS retains") || !strings.Contains(got, "force") {
		t.Errorf("the refused click-counter replay reads %q; want why, and that force replays anyway", got)
	}
	replayFrom(true)
	waitFor("the forced replay", `String(document.getElementById("replay-result").innerText.includes("requested (from sequence 3)"))`)
	if got := text("replay-warning"); !strings.Contains(got, "starts after the oldest event CLICKS retains") {
		t.Errorf("the forced click-counter replay warns %q; want why it recounts nothing", got)
	}
	step("close the replay dialog", chromedp.Click(chromedp.CSS(`#replay-close`)))

	if path := os.Getenv(screenshotEnv); path != "" {
		step("scroll to the top", chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
			_, err := chromedp.Run(ctx, chromedp.Evaluate[bool]("window.scrollTo(0, 0) === undefined"))
			return err
		}))
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		png, err := chromedp.Run(sctx, chromedp.FullScreenshot(100))
		cancel()
		if err != nil {
			t.Fatalf("screenshot: %v", err)
		}
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatalf("write the screenshot: %v", err)
		}
		t.Logf("screenshot written to %s", path)
	}

	mu.Lock()
	defer mu.Unlock()
	if len(problems) > 0 {
		t.Errorf("the page logged %d JavaScript errors:\n%s", len(problems), strings.Join(problems, "\n"))
	}
}

// The page polls one request at a time: with a server slower than the
// refresh interval, each poll starts only after the previous one answered,
// instead of piling overlapping requests on it. A real Chromium reads the
// console through a proxy that holds every /api/readers request for three
// refresh intervals and counts how many it holds at once.
func TestPagePollsDoNotOverlapWhenTheServerIsSlow(t *testing.T) {
	t.Parallel()
	browser := chromium(t)
	const refresh, slow = 500 * time.Millisecond, 1500 * time.Millisecond
	s := start(t, func(c *Config) { withToken(c); c.Refresh = refresh })
	rp := tokenProxy(t, s.url)
	var held, most, answered atomic.Int64
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/readers" {
			rp.ServeHTTP(w, r)
			return
		}
		n := held.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		defer answered.Add(1)
		defer held.Add(-1)
		// The headers (no-store) go out at once and the body comes late:
		// Chromium would otherwise hold a second request for the same URL
		// until the first one's headers arrive (its cache's lock), and the
		// overlap would not reach the server.
		rec := httptest.NewRecorder()
		rp.ServeHTTP(rec, r)
		maps.Copy(w.Header(), rec.Header())
		w.WriteHeader(rec.Code)
		_ = http.NewResponseController(w).Flush()
		select {
		case <-time.After(slow):
		case <-r.Context().Done():
		}
		_, _ = w.Write(rec.Body.Bytes())
	}))
	t.Cleanup(proxy.Close) // after the browser, which holds a stream open

	ctx := openPage(t, browser, proxy.URL+"/")
	// Four polls answered take at least 4 × (1.5 s + 0.5 s) one at a time;
	// polls every 0.5 s regardless would hold three at once by then.
	testenv.WaitFor(t, 60*time.Second, "four polls of the readers answered", func() bool { return answered.Load() >= 4 })
	if m := most.Load(); m != 1 {
		t.Errorf("the page had %d /api/readers requests in flight at once (refresh %s, each answered after %s), want 1", m, refresh, slow)
	}
	// The page still shows what the polls read.
	ectx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	got, err := chromedp.Run(ectx, chromedp.Evaluate[string](`document.getElementById("updated").innerText`))
	if err != nil || !strings.HasPrefix(got, "Updated") {
		t.Errorf("the page's update time reads %q (%v), want Updated …", got, err)
	}
}

// The live panel comes back by itself after its stream was refused. A
// browser's EventSource reconnects after a dropped connection, but gives up
// for good on an answer that is not a stream: a proxy's 502 while the
// console restarts, the console's 503 when too many pages watch. A real
// Chromium reads the console through a proxy that answers /api/live with
// 502 for a while; once it lets the stream through, the page shows clicks
// published after that, and while it is refused the page does not say it
// is reconnecting.
func TestLivePanelComesBackAfterItsStreamWasRefused(t *testing.T) {
	t.Parallel()
	browser := chromium(t)
	s := start(t, withToken)
	rp := tokenProxy(t, s.url)
	var refusing atomic.Bool
	var refused atomic.Int64
	refusing.Store(true)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/api/live" && refusing.Load() {
			refused.Add(1)
			http.Error(w, "upstream restarting", http.StatusBadGateway)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close) // after the browser, which holds a stream open

	ctx := openPage(t, browser, proxy.URL+"/")
	eval := func(expr string) string { t.Helper(); return evalString(t, ctx, expr) }
	const status = `document.getElementById("live-status").innerText`
	testenv.WaitFor(t, 30*time.Second, "the page's live stream refused", func() bool { return refused.Load() >= 1 })
	var said string
	testenv.WaitFor(t, 10*time.Second, "the live panel saying its stream was refused", func() bool {
		said = eval(status)
		return said != "connecting…"
	})
	if strings.Contains(said, "reconnecting") {
		t.Errorf("with its stream refused the live panel says %q; the browser does not reconnect by itself", said)
	}

	refusing.Store(false)
	// Clicks keep arriving; one published after the proxy let the stream
	// through reaches the table.
	var rows string
	if !testenv.Poll(45*time.Second, func() bool {
		consoletest.Publish(t, s.js, consoletest.Click("acme", "back", 0))
		rows = eval(`String(document.getElementById("live").children.length)`)
		return rows != "0"
	}) {
		t.Errorf("no click reached the live table within 45 s of the stream being let through (status %q, %d refusals)", eval(status), refused.Load())
	}
	if got := eval(status); !strings.Contains(got, "watching") {
		t.Errorf("the live panel's status reads %q after it came back, want the stream's figures", got)
	}
}

// The live panel shows the clicks of a CLICKS deleted and created again
// while it watches, whose sequences start at 1 again: below those the page
// showed, which it would take for repeats and leave out. A real Chromium
// watches the live panel through a proxy that adds the token.
func TestLivePanelShowsACLICKSCreatedAgain(t *testing.T) {
	t.Parallel()
	browser := chromium(t)
	s := start(t, withToken)
	proxy := httptest.NewServer(tokenProxy(t, s.url))
	t.Cleanup(proxy.Close) // after the browser, which holds a stream open

	ctx := openPage(t, browser, proxy.URL+"/")
	eval := func(expr string) string { t.Helper(); return evalString(t, ctx, expr) }
	// The newest row's link, and the links of every row.
	const newest = `(document.querySelector("#live tr td:nth-child(4)") || {}).innerText || ""`
	const links = `Array.from(document.querySelectorAll("#live tr td:nth-child(4)")).map((td) => td.innerText).join(" ")`

	var oldSeqs []uint64
	testenv.WaitFor(t, 60*time.Second, "the old CLICKS' clicks on the page", func() bool {
		oldSeqs = append(oldSeqs, consoletest.Publish(t, s.js, consoletest.Clicks("acme", "old", 10)...)...)
		return eval(newest) == "old"
	})
	if err := s.js.DeleteStream(t.Context(), events.ClicksStream); err != nil {
		t.Fatal(err)
	}
	o := topology.Defaults()
	o.Partitions = consoletest.Partitions
	o.Storage = jetstream.MemoryStorage
	if err := topology.Apply(t.Context(), s.js, o); err != nil {
		t.Fatal(err)
	}
	seqs := consoletest.Publish(t, s.js, consoletest.Clicks("acme", "new", 5)...)
	if !testenv.Poll(45*time.Second, func() bool { return eval(newest) == "new" }) {
		t.Errorf("45 s after CLICKS was created again (its clicks at sequences %v, the old ones up to %d) the live table holds %q, want the new clicks on top",
			seqs, oldSeqs[len(oldSeqs)-1], eval(links))
	}
}

// The webhooks panel lists the most troubled endpoints only (at most
// webhookstate.MaxShown): with more endpoints than that it says how many it
// shows of how many, and its counts read as people write them. A real
// Chromium reads the panel of 51 endpoints.
func TestWebhooksPanelSaysHowManyItShows(t *testing.T) {
	t.Parallel()
	browser := chromium(t)
	s := start(t, withToken)
	total := webhookstate.MaxShown + 1
	for i := range total {
		id := fmt.Sprintf("ep_%03d", i)
		s.rdb.SAdd(t.Context(), "snip:wh:endpoints", id)
		s.rdb.HSet(t.Context(), "snip:wh:{"+id+"}:ep", "cfg", fmt.Sprintf(`{"id":%q,"owner":"acme","url":"https://hooks.acme.example/%d"}`, id, i))
	}
	s.rdb.XAdd(t.Context(), &redis.XAddArgs{Stream: "snip:wh:{ep_000}:q", Values: []any{"id", "e", "t", "click", "ts", time.Now().UnixNano(), "d", "{}"}})
	proxy := httptest.NewServer(tokenProxy(t, s.url))
	t.Cleanup(proxy.Close) // after the browser, which holds a stream open

	ctx := openPage(t, browser, proxy.URL+"/")
	text, rows := panelRows(t, ctx, "webhooks")
	want := fmt.Sprintf("%d endpoints, 1 event waiting (the %d most troubled shown)", total, webhookstate.MaxShown)
	if text != want || rows != strconv.Itoa(webhookstate.MaxShown) {
		t.Errorf("the webhooks panel says %q over %s rows, want %q over %d", text, rows, want, webhookstate.MaxShown)
	}
}

// The dead-letters panel lists the groups with the most letters only (at
// most dlq.GroupsShown): with more groups than that, as a credential that
// parks letters under made-up reasons makes, it says how many there are
// and how many it shows. A real Chromium reads the panel of 51 groups.
func TestDeadLettersPanelSaysHowManyGroupsItShows(t *testing.T) {
	t.Parallel()
	browser := chromium(t)
	s := start(t, withToken)
	total := dlq.GroupsShown + 1
	for i := range total {
		if _, err := deadletter.Publish(t.Context(), s.js, deadletter.Parcel{Source: "webhooks", Reason: fmt.Sprintf("made-up-%03d", i),
			Attempts: 1, Stream: events.ClicksStream, Subject: "clicks.acme.abc", Seq: uint64(i + 1), Data: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	proxy := httptest.NewServer(tokenProxy(t, s.url))
	t.Cleanup(proxy.Close) // after the browser, which holds a stream open

	ctx := openPage(t, browser, proxy.URL+"/")
	text, rows := panelRows(t, ctx, "dlq")
	want := fmt.Sprintf("%d dead letters in %d groups (the %d with the most letters shown)", total, total, dlq.GroupsShown)
	if text != want || rows != strconv.Itoa(dlq.GroupsShown) {
		t.Errorf("the dead-letters panel says %q over %s rows, want %q over %d", text, rows, want, dlq.GroupsShown)
	}
}

// The live panel says when the console cannot follow CLICKS (it is not
// there, say) rather than showing the figures of a quiet stream ("0.0
// clicks/s on CLICKS"), which an operator reads as traffic having stopped.
// A real Chromium reads the panel of a console whose NATS has no CLICKS.
func TestLivePanelSaysWhenItCannotFollowCLICKS(t *testing.T) {
	t.Parallel()
	browser := chromium(t)
	js := testenv.StartNATS(t).JetStream(t) // no topology: CLICKS is not there
	s := startOn(t, js, log(t), withToken)
	proxy := httptest.NewServer(tokenProxy(t, s.url))
	t.Cleanup(proxy.Close) // after the browser, which holds a stream open

	ctx := openPage(t, browser, proxy.URL+"/")
	var said string
	if !testenv.Poll(30*time.Second, func() bool {
		ectx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		said, _ = chromedp.Run(ectx, chromedp.Evaluate[string](`document.getElementById("live-status").innerText`))
		return strings.Contains(said, "not following CLICKS") && strings.Contains(said, "stream not found")
	}) {
		t.Errorf("with no CLICKS to follow the live panel says %q, want that it is not following CLICKS and why", said)
	}
}

// tokenProxy is a reverse proxy to the console at consoleURL that adds the
// token to every request, as an operator's proxy may (a page opened through
// it needs no login), and passes streams on at once.
func tokenProxy(t *testing.T, consoleURL string) *httputil.ReverseProxy {
	t.Helper()
	target, err := url.Parse(consoleURL)
	if err != nil {
		t.Fatal(err)
	}
	return &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		r.SetURL(target)
		r.Out.Header.Set("Authorization", "Bearer "+testToken)
	}, FlushInterval: -1}
}

// openPage starts a Chromium (browser: its path), opens pageURL in it and
// returns the tab. The browser ends when the test does, before whatever the
// test closes with t.Cleanup earlier (a proxy waits for the streams the
// page holds open).
func openPage(t *testing.T, browser, pageURL string) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser), chromedp.NoSandbox,
		chromedp.DisableGPU, chromedp.UserDataDir(t.TempDir()))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	tab, cancelTab := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelTab(); cancelAlloc() })
	if _, err := chromedp.Run(tab, chromedp.Navigate(pageURL)); err != nil { // the first Run starts the browser: no timeout
		t.Fatalf("open the console: %v", err)
	}
	return tab
}

// evalString is the string a JavaScript expression gives in tab; an
// evaluation that fails or takes over 30 s fails the test.
func evalString(t *testing.T, tab context.Context, expr string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[string](expr))
	if err != nil {
		t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// The replay dialog shows what the API answers beyond "requested": a replay
// from before CLICKS' oldest event warns where it really starts, one asked
// while the group's replay is under way warns that it replaces it, and one
// from after CLICKS' last event is refused saying there is nothing to
// replay. Before, the dialog showed only a forced replay's warning: the
// others read as replays requested as asked. A real Chromium presses
// Replay on a group with no member (its replays stay under way) of a
// CLICKS whose first five clicks are gone.
func TestReplayDialogShowsWhatAReplayReallyDoes(t *testing.T) {
	t.Parallel()
	browser := chromium(t)
	s := start(t, withToken)
	const group = "loader"
	consoletest.DownGroup(t, s.js, group)
	seqs := consoletest.Publish(t, s.js, consoletest.Clicks("acme", "abc", 10)...)
	clicks, err := s.js.Stream(t.Context(), events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := clicks.Purge(t.Context(), jetstream.WithPurgeSequence(seqs[5])); err != nil {
		t.Fatal(err)
	}
	proxy := httptest.NewServer(tokenProxy(t, s.url))
	t.Cleanup(proxy.Close) // after the browser, which holds a stream open

	ctx := openPage(t, browser, proxy.URL+"/")
	eval := func(expr string) string { t.Helper(); return evalString(t, ctx, expr) }
	waitFor := func(what, expr string) {
		t.Helper()
		if !testenv.Poll(30*time.Second, func() bool { return eval(expr) == "true" }) {
			t.Fatalf("the page did not show %s within 30 s; it reads:\n%s", what, eval("document.body.innerText"))
		}
	}
	text := func(id string) string { return eval(fmt.Sprintf("document.getElementById(%q).innerText", id)) }

	waitFor("the group's Replay button", `String([...document.querySelectorAll("#readers h3")].some((h) => h.firstChild.textContent === "`+group+`"))`)
	eval(`(() => {
		for (const h of document.querySelectorAll("#readers h3"))
			if (h.firstChild.textContent === "` + group + `") h.querySelector("button").click();
		return "";
	})()`)
	waitFor("the replay dialog", `String(document.getElementById("replay-dialog").open)`)
	// replayFrom asks a replay from sequence seq and waits for the answer
	// (the result's text changes).
	replayFrom := func(seq uint64) string {
		t.Helper()
		eval(fmt.Sprintf(`(() => {
			const f = document.getElementById("replay-form");
			f.elements.kind.value = "from_seq";
			f.elements.from_seq.value = "%d";
			f.elements.confirm.value = %q;
			document.getElementById("replay-result").textContent = "";
			document.getElementById("replay-go").click();
			return "";
		})()`, seq, group))
		waitFor(fmt.Sprintf("the answer to the replay from sequence %d", seq), `String(document.getElementById("replay-result").innerText !== "")`)
		return text("replay-result")
	}

	last := seqs[len(seqs)-1]
	if got := replayFrom(last + 1); !strings.HasPrefix(got, "Refused: ") ||
		!strings.Contains(got, fmt.Sprintf("is after CLICKS' last event (sequence %d): nothing to replay", last)) {
		t.Errorf("the replay from after CLICKS' last event reads %q; want it refused, nothing to replay", got)
	}
	if got := replayFrom(seqs[2]); !strings.Contains(got, fmt.Sprintf("requested (from sequence %d)", seqs[2])) {
		t.Fatalf("the replay from sequence %d reads %q; want it requested", seqs[2], got)
	}
	first := regexp.MustCompile(`Replay (\S+) requested`).FindStringSubmatch(text("replay-result"))
	if got := text("replay-warning"); !strings.Contains(got, fmt.Sprintf("Warning: CLICKS' oldest event now is sequence %d", seqs[5])) ||
		!strings.Contains(got, fmt.Sprintf("not at from sequence %d", seqs[2])) || strings.Contains(got, "replaces") {
		t.Errorf("the replay from sequence %d, which CLICKS no longer holds, warns %q; want only where it really starts", seqs[2], got)
	}
	if got := replayFrom(seqs[7]); !strings.Contains(got, fmt.Sprintf("requested (from sequence %d)", seqs[7])) {
		t.Fatalf("the replay from sequence %d reads %q; want it requested", seqs[7], got)
	}
	if got := text("replay-warning"); first == nil || !strings.Contains(got, "Warning: replay "+first[1]+" of group "+group) ||
		!strings.Contains(got, "this replay replaces it") || strings.Contains(got, "oldest event") {
		t.Errorf("the replay asked while replay %v is under way warns %q; want only that it replaces it", first, got)
	}
}

// A replay's progress that the page cannot read (a poll refused or given
// up after its timeout: a proxy's 502, a console that does not answer)
// says that the replay stays requested and that asking again would
// replace it, and the page goes on polling. Before, it said "Cannot read
// the progress: 502 Bad Gateway" alone, which reads as a replay that
// failed: the operator who asked again replaced it, and moved back again
// the partitions that had carried it out. A real Chromium asks a replay
// of a group with no member through a proxy that refuses the progress
// polls for a while.
func TestReplayProgressThatCannotBeReadSaysTheReplayStaysRequested(t *testing.T) {
	t.Parallel()
	browser := chromium(t)
	s := start(t, withToken)
	const group = "idle"
	consoletest.DownGroup(t, s.js, group)
	consoletest.Publish(t, s.js, consoletest.Clicks("acme", "abc", 10)...)
	rp := tokenProxy(t, s.url)
	var refusing atomic.Bool
	refusing.Store(true)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Path == "/api/readers/"+group+"/replay" && refusing.Load() {
			http.Error(w, "upstream restarting", http.StatusBadGateway)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close) // after the browser, which holds a stream open

	ctx := openPage(t, browser, proxy.URL+"/")
	eval := func(expr string) string { t.Helper(); return evalString(t, ctx, expr) }
	result := func() string { return eval(`document.getElementById("replay-result").innerText`) }
	waitFor := func(what string, ok func(string) bool) string {
		t.Helper()
		var got string
		if !testenv.Poll(30*time.Second, func() bool { got = result(); return ok(got) }) {
			t.Fatalf("the replay dialog did not show %s within 30 s; it reads %q", what, got)
		}
		return got
	}

	if !testenv.Poll(30*time.Second, func() bool {
		return eval(`String([...document.querySelectorAll("#readers h3")].some((h) => h.firstChild.textContent === "`+group+`"))`) == "true"
	}) {
		t.Fatalf("the readers panel never listed %s; the page reads:\n%s", group, eval("document.body.innerText"))
	}
	eval(fmt.Sprintf(`(() => {
		for (const h of document.querySelectorAll("#readers h3"))
			if (h.firstChild.textContent === %q) h.querySelector("button").click();
		const f = document.getElementById("replay-form");
		f.elements.kind.value = "from_seq";
		f.elements.from_seq.value = "1";
		f.elements.confirm.value = %q;
		document.getElementById("replay-go").click();
		return "";
	})()`, group, group))
	got := waitFor("that it cannot read the progress", func(r string) bool { return strings.HasPrefix(r, "Cannot read the progress") })
	st, err := reader.LatestRewind(t.Context(), s.js, group)
	if err != nil || st.ID == "" {
		t.Fatalf("latest replay of %s: %+v, %v; want the one requested", group, st, err)
	}
	for _, want := range []string{"replay " + st.ID, "502", "stays requested", "a new replay replaces this one"} {
		if !strings.Contains(got, want) {
			t.Errorf("the progress that cannot be read reads %q; want it to say %q", got, want)
		}
	}
	refusing.Store(false)
	want := fmt.Sprintf("Replay %s: 0 of %d partitions moved back", st.ID, consoletest.Partitions)
	waitFor("the progress once it can be read", func(r string) bool { return strings.HasPrefix(r, want) })
}

// panelRows waits up to 30 s for the page's panel #id to list rows, and
// returns its summary (its first paragraph) and how many rows it lists.
func panelRows(t *testing.T, tab context.Context, id string) (text, rows string) {
	t.Helper()
	if !testenv.Poll(30*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(tab, 10*time.Second)
		defer cancel()
		text, _ = chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector("#`+id+` p").innerText`))
		rows, _ = chromedp.Run(ctx, chromedp.Evaluate[string](`String(document.querySelectorAll("#`+id+` tbody tr").length)`))
		return rows != "" && rows != "0"
	}) {
		t.Fatalf("the #%s panel never listed a row: %q", id, text)
	}
	return text, rows
}

// In a real browser: an operator logs in through the form, and the page has
// a Log out button; pressing it lands on the login form saying the session
// is ended, the page asks for the login again, and the session cookie the
// browser held (taken from it before the logout, as a thief would) is
// refused by the console from then on.
func TestLogOutInABrowserEndsTheSession(t *testing.T) {
	t.Parallel()
	browser := chromium(t)
	s := start(t, withToken)
	tab := openPage(t, browser, s.url+"/login")
	run := func(what string, a chromedp.Action[chromedp.Void]) {
		t.Helper()
		ctx, cancel := context.WithTimeout(tab, 30*time.Second)
		defer cancel()
		if _, err := chromedp.Run(ctx, a); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	waitFor := func(what, expr string) {
		t.Helper()
		// An evaluation the page's navigation cuts off (the form's POST,
		// its redirect) is read again, not a failure.
		var last error
		if !testenv.Poll(30*time.Second, func() bool {
			ctx, cancel := context.WithTimeout(tab, 5*time.Second)
			defer cancel()
			v, err := chromedp.Run(ctx, chromedp.Evaluate[string](expr))
			last = err
			return err == nil && v == "true"
		}) {
			t.Fatalf("timed out after 30s waiting for %s (the last evaluation's error: %v); the page at %s reads:\n%s", what, last,
				evalString(t, tab, "location.href"), evalString(t, tab, "document.body.innerText"))
		}
	}
	run("type the token", chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), testToken))
	run("log in", chromedp.Click(chromedp.CSS(`button[type="submit"]`)))
	waitFor("the console after logging in", `String(location.pathname === "/" && !!document.getElementById("panel-readers"))`)

	ctx, cancel := context.WithTimeout(tab, 30*time.Second)
	defer cancel()
	jar, err := chromedp.Call(ctx, network.GetCookies, network.GetCookiesParams{URLs: []string{s.url + "/"}})
	if err != nil {
		t.Fatal(err)
	}
	var copied string
	for _, c := range jar.Cookies {
		if c.Name == "snip_console_session" {
			copied = c.Value
		}
	}
	if ok, code, body := sessionOpens(t, s.url, copied); !ok {
		t.Fatalf("the browser's session cookie %q: %d %s", copied, code, body)
	}

	if got := evalString(t, tab, `(() => { const b = document.querySelector('form[action="/logout"] button'); if (!b) return "missing"; b.click(); return ""; })()`); got != "" {
		t.Fatalf("the Log out button is %s; the page reads:\n%s", got, evalString(t, tab, "document.body.innerText"))
	}
	waitFor("the login form saying the session is ended", `String(location.pathname === "/login" && (document.getElementById("notice")?.innerText ?? "").includes("Logged out"))`)
	run("open the console again", chromedp.Navigate(s.url+"/"))
	waitFor("the login form again", `String(location.pathname === "/login" && !!document.querySelector('input[name="token"]'))`)
	if ok, code, body := sessionOpens(t, s.url, copied); ok || code != http.StatusUnauthorized {
		t.Errorf("the cookie copied before the logout: %d %s, want 401", code, body)
	}
}
