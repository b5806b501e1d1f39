package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/deadletter"
	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/service/servicetest"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/preview/internal/preview"
	"github.com/snipdev/snip/services/preview/internal/redisstore"
)

var servers *testenv.Servers

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &servers, testenv.WithRedis())) }

// world is one test's NATS, Redis database and page server.
type world struct {
	js       jetstream.JetStream
	natsURL  string
	rdb      *redis.Client
	redisURL string
	pages    *pageServer
}

// newWorld creates the queue's streams and consumers. backOff nil keeps the
// production consumer (BackOff 1s,2s,4s,8s); tests that wait for five
// failed tries pass shorter steps.
func newWorld(t testing.TB, backOff []time.Duration) *world {
	t.Helper()
	n := testenv.StartNATS(t)
	js := n.JetStream(t)
	o := topology.Defaults()
	o.Storage = jetstream.MemoryStorage
	for _, sc := range topology.Streams(o) {
		switch sc.Name {
		case events.PreviewJobsStream, events.DeadLetterStream, events.PreviewAdvisoriesStream:
			if _, err := js.CreateStream(t.Context(), sc); err != nil {
				t.Fatal(err)
			}
		}
	}
	cc := topology.PreviewConsumerConfig()
	if backOff != nil {
		cc.BackOff, cc.AckWait = backOff, backOff[0]
	}
	if _, err := js.CreateConsumer(t.Context(), events.PreviewJobsStream, cc); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateConsumer(t.Context(), events.PreviewAdvisoriesStream, topology.PreviewRescueConsumerConfig()); err != nil {
		t.Fatal(err)
	}
	rdb, db := servers.Redis.NewDB(t)
	return &world{js: js, natsURL: n.URL, rdb: rdb, redisURL: servers.Redis.URL(db), pages: newPageServer(t, "127.0.0.1:0")}
}

// config is the service's configuration for tests: its own streams are
// created by newWorld, the page server's 127.0.0.1 is allow-listed, and
// retries start at 100ms.
func (w *world) config(t testing.TB, extra ...string) Config {
	t.Helper()
	environ := append([]string{
		"NATS_URL=" + w.natsURL, "REDIS_URL=" + w.redisURL, "HTTP_ADDR=127.0.0.1:0",
		"SNIP_APPLY_TOPOLOGY=false", "PREVIEW_ALLOW_CIDRS=127.0.0.1/32", "SHUTDOWN_TIMEOUT=10s",
		"PREVIEW_RETRY_BASE=100ms", "PREVIEW_RETRY_MAX=200ms", "PREVIEW_RETRY_JITTER=0",
		"PREVIEW_FETCH_TIMEOUT=5s", "PREVIEW_CONCURRENCY=4", "PREVIEW_BACKLOG_INTERVAL=200ms", "PREVIEW_PULL_WAIT=200ms",
	}, extra...)
	cfg, err := loadConfig(environ, nil)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// instance is one running preview service.
type instance struct {
	*servicetest.Running
	addr string
}

// start runs the service until the test ends, and returns once it is ready.
func start(t testing.TB, cfg Config) *instance {
	t.Helper()
	log := slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: cfg.LogLevel}))
	r := servicetest.Start(t, func(ctx context.Context, ready func(string)) error {
		cfg.Ready = ready
		return run(ctx, log, cfg)
	})
	inst := &instance{Running: r, addr: r.Addr}
	testenv.WaitFor(t, 20*time.Second, "service ready", func() bool { return inst.get(t, "/readyz") == http.StatusOK })
	return inst
}

// stop stops the service as SIGTERM would and returns how run ended.
func (i *instance) stop() error { return i.Stop() }

func (i *instance) get(t testing.TB, path string) int {
	resp, err := http.Get("http://" + i.addr + path)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// metric returns the value of one sample of /metrics, e.g.
// `snip_preview_jobs_total{result="stored"}`, 0 if absent.
func (i *instance) metric(t testing.TB, sample string) float64 {
	t.Helper()
	v, _ := i.sample(t, sample)
	return v
}

// sample is metric that also says whether /metrics has the sample at all.
func (i *instance) sample(t testing.TB, sample string) (float64, bool) {
	t.Helper()
	resp, err := http.Get("http://" + i.addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(sample) + ` (\S+)$`).FindSubmatch(b)
	if m == nil {
		return 0, false
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatalf("%s: %v", sample, err)
	}
	return v, true
}

type testLog struct{ t testing.TB }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// pageServer serves pages by path and records when each path was hit.
type pageServer struct {
	*httptest.Server
	mu     sync.Mutex
	pages  map[string]http.HandlerFunc
	hits   map[string][]time.Time
	always http.HandlerFunc
}

func newPageServer(t testing.TB, addr string) *pageServer {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	p := &pageServer{pages: map[string]http.HandlerFunc{}, hits: map[string][]time.Time{}}
	p.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.hits[r.URL.Path] = append(p.hits[r.URL.Path], time.Now())
		h := p.pages[r.URL.Path]
		p.mu.Unlock()
		if h == nil {
			http.NotFound(w, r)
			return
		}
		h(w, r)
	}))
	p.Listener.Close()
	p.Listener = ln
	p.Start()
	t.Cleanup(p.Close)
	return p
}

func (p *pageServer) handle(path string, h http.HandlerFunc) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pages[path] = h
}

func (p *pageServer) hitTimes(path string) []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Time(nil), p.hits[path]...)
}

func (p *pageServer) hitCount(path string) int { return len(p.hitTimes(path)) }

func html(title string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, `<html><head><title>%s</title><meta property="og:image" content="/img/%s.png"></head><body>…</body></html>`, title, title)
	}
}

func publishJob(t testing.TB, js jetstream.JetStream, code, target string) string {
	t.Helper()
	job := events.PreviewJob{V: events.PreviewJobVersion, ID: events.NewID(), Time: time.Now().UTC(), Code: code, Owner: "acme", Target: target}
	data, _ := json.Marshal(job)
	if _, err := js.Publish(context.Background(), events.PreviewJobSubject, data, jetstream.WithMsgID(job.ID)); err != nil {
		t.Fatal(err)
	}
	return job.ID
}

func previewHash(t testing.TB, rdb *redis.Client, code string) map[string]string {
	t.Helper()
	h, err := rdb.HGetAll(context.Background(), redisstore.Key(code)).Result()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func streamMsgs(t testing.TB, js jetstream.JetStream, name string) uint64 {
	t.Helper()
	s, err := js.Stream(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

func letters(t *testing.T, js jetstream.JetStream) []deadletter.Letter {
	t.Helper()
	var got []deadletter.Letter
	if err := deadletter.Each(t.Context(), js, events.DeadLetterSubjects, func(l deadletter.Letter) error {
		got = append(got, l)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return got
}

func TestThreeWorkersShareTheQueueAndASlowPageHoldsUpNothing(t *testing.T) {
	t.Parallel()
	w := newWorld(t, nil)
	const jobs = 300
	for i := range jobs {
		w.pages.handle("/p/"+strconv.Itoa(i), html("page"+strconv.Itoa(i)))
	}
	release := make(chan struct{})
	w.pages.handle("/slow", func(rw http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		html("slow")(rw, r)
	})
	// The slow page takes longer than the fetch timeout would allow by
	// default, and far longer than the first ack deadline (1s).
	var workers []*instance
	for range 3 {
		workers = append(workers, start(t, w.config(t, "PREVIEW_FETCH_TIMEOUT=60s")))
	}
	publishJob(t, w.js, "slow", w.pages.URL+"/slow")
	testenv.WaitFor(t, 10*time.Second, "slow page requested", func() bool { return w.pages.hitCount("/slow") == 1 })
	for i := range jobs {
		publishJob(t, w.js, "c"+strconv.Itoa(i), w.pages.URL+"/p/"+strconv.Itoa(i))
	}
	testenv.WaitFor(t, 60*time.Second, "every fast job stored", func() bool {
		n, err := w.rdb.Keys(context.Background(), redisstore.KeyPrefix+"c*").Result()
		return err == nil && len(n) == jobs
	})
	if h := previewHash(t, w.rdb, "slow"); len(h) != 0 {
		t.Fatalf("slow preview stored before its page answered: %v", h)
	}
	close(release)
	testenv.WaitFor(t, 20*time.Second, "slow job stored", func() bool { return previewHash(t, w.rdb, "slow")["title"] == "slow" })
	for i := range jobs {
		code, path := "c"+strconv.Itoa(i), "/p/"+strconv.Itoa(i)
		if h := previewHash(t, w.rdb, code); h["title"] != "page"+strconv.Itoa(i) || h["image"] != w.pages.URL+"/img/page"+strconv.Itoa(i)+".png" {
			t.Fatalf("preview of %s = %v", code, h)
		}
		if n := w.pages.hitCount(path); n != 1 {
			t.Errorf("%s fetched %d times, want exactly once", path, n)
		}
	}
	if n := w.pages.hitCount("/slow"); n != 1 {
		t.Errorf("slow page fetched %d times, want once (keep-alive failed?)", n)
	}
	stored := make([]float64, len(workers))
	testenv.WaitFor(t, 10*time.Second, "every store counted", func() bool {
		total := 0.0
		for i, inst := range workers {
			stored[i] = inst.metric(t, `snip_preview_jobs_total{result="stored"}`)
			total += stored[i]
		}
		return total == jobs+1
	})
	for i, n := range stored {
		t.Logf("worker %d stored %v previews", i, n)
		if n == 0 {
			t.Errorf("worker %d did no job: the queue did not share the work", i)
		}
	}
	testenv.WaitFor(t, 10*time.Second, "queue empty", func() bool { return streamMsgs(t, w.js, events.PreviewJobsStream) == 0 })
}

func TestTransientFailuresAreRetriedWithBackoff(t *testing.T) {
	t.Parallel()
	w := newWorld(t, nil) // production BackOff: the delays are the real ones
	var mu sync.Mutex
	calls := map[string]int{}
	failFirst := func(n int, fail http.HandlerFunc) http.HandlerFunc {
		return func(rw http.ResponseWriter, r *http.Request) {
			mu.Lock()
			calls[r.URL.Path]++
			c := calls[r.URL.Path]
			mu.Unlock()
			if c <= n {
				fail(rw, r)
				return
			}
			html("finally")(rw, r)
		}
	}
	w.pages.handle("/flaky", failFirst(2, func(rw http.ResponseWriter, _ *http.Request) { rw.WriteHeader(http.StatusServiceUnavailable) }))
	w.pages.handle("/limited", failFirst(1, func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Retry-After", "2")
		rw.WriteHeader(http.StatusTooManyRequests)
	}))
	start(t, w.config(t, "PREVIEW_RETRY_BASE=400ms", "PREVIEW_RETRY_MAX=10s"))
	publishJob(t, w.js, "flaky", w.pages.URL+"/flaky")
	publishJob(t, w.js, "limited", w.pages.URL+"/limited")
	for _, code := range []string{"flaky", "limited"} {
		testenv.WaitFor(t, 30*time.Second, code+" stored", func() bool { return previewHash(t, w.rdb, code)["title"] == "finally" })
	}
	tests := []struct {
		path    string
		minGaps []time.Duration
	}{
		{"/flaky", []time.Duration{400 * time.Millisecond, 800 * time.Millisecond}}, // base, 2x base
		{"/limited", []time.Duration{2 * time.Second}},                              // Retry-After
	}
	for _, tc := range tests {
		hits := w.pages.hitTimes(tc.path)
		if len(hits) != len(tc.minGaps)+1 {
			t.Fatalf("%s hit %d times, want %d", tc.path, len(hits), len(tc.minGaps)+1)
		}
		for i, min := range tc.minGaps {
			if gap := hits[i+1].Sub(hits[i]); gap < min {
				t.Errorf("%s: retry %d came after %s, want at least %s", tc.path, i+1, gap, min)
			} else {
				t.Logf("%s: retry %d after %s (minimum %s)", tc.path, i+1, gap, min)
			}
		}
	}
	if n := len(letters(t, w.js)); n != 0 {
		t.Fatalf("%d dead letters, want none", n)
	}
}

func TestFailingPageIsDeadLetteredAndRedrivenOnceFixed(t *testing.T) {
	t.Parallel()
	w := newWorld(t, []time.Duration{300 * time.Millisecond, 400 * time.Millisecond, 500 * time.Millisecond, 600 * time.Millisecond})
	var fixed sync.Mutex
	broken := true
	w.pages.handle("/broken", func(rw http.ResponseWriter, r *http.Request) {
		fixed.Lock()
		b := broken
		fixed.Unlock()
		if b {
			http.Error(rw, "database on fire", http.StatusInternalServerError)
			return
		}
		html("fixed")(rw, r)
	})
	inst := start(t, w.config(t))
	id := publishJob(t, w.js, "broken", w.pages.URL+"/broken")
	testenv.WaitFor(t, 30*time.Second, "job dead-lettered", func() bool { return len(letters(t, w.js)) == 1 })
	l := letters(t, w.js)[0]
	if l.Subject != "dead.preview.http_5xx" || l.Attempts != topology.PreviewMaxDeliver || l.ID != id ||
		!strings.Contains(l.Error, "500 Internal Server Error") || l.Stream != events.PreviewJobsStream {
		t.Fatalf("dead letter = %+v", l)
	}
	if n := w.pages.hitCount("/broken"); n != topology.PreviewMaxDeliver {
		t.Fatalf("page hit %d times, want %d", n, topology.PreviewMaxDeliver)
	}
	// The worker publishes the dead letter, then records the failure on the
	// link's preview (workqueue's park, then its dead hook): a reader can
	// see the letter a moment before the marker.
	var h map[string]string
	testenv.WaitFor(t, 10*time.Second, "the failed marker on the preview", func() bool {
		h = previewHash(t, w.rdb, "broken")
		return h["status"] == "failed"
	})
	if h["reason"] != "http_5xx" || h["job_id"] != id {
		t.Fatalf("preview hash = %v, want the failed marker", h)
	}
	testenv.WaitFor(t, 10*time.Second, "dead-letter metric", func() bool {
		return inst.metric(t, `snip_preview_dead_letters_total{reason="http_5xx",via="worker"}`) == 1 &&
			inst.metric(t, `snip_preview_dead_letter_backlog{reason="http_5xx"}`) == 1
	})
	// The worker terminates the job after the park and its dead hook; the
	// work queue removes it once the server recorded the TERM.
	testenv.WaitFor(t, 10*time.Second, "the dead-lettered job gone from "+events.PreviewJobsStream, func() bool {
		return streamMsgs(t, w.js, events.PreviewJobsStream) == 0
	})

	fixed.Lock()
	broken = false
	fixed.Unlock()
	if _, err := deadletter.Redrive(t.Context(), w.js, l.Seq); err != nil { // what `snipctl dlq redrive SEQ` calls
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "redriven job stored", func() bool { return previewHash(t, w.rdb, "broken")["status"] == "ok" })
	if h := previewHash(t, w.rdb, "broken"); h["title"] != "fixed" || h["job_id"] != id || h["reason"] != "" {
		t.Fatalf("preview after redrive = %v", h)
	}
	if n := len(letters(t, w.js)); n != 0 {
		t.Fatalf("%d dead letters after redrive, want 0", n)
	}
}

func TestOutcomes(t *testing.T) {
	t.Parallel()
	w := newWorld(t, nil)
	// A server on a loopback address that is not allow-listed: fetches to it
	// must be refused before a request is made.
	inside := newPageServer(t, "127.0.0.2:0")
	inside.handle("/", html("secret"))
	insidePort := strconv.Itoa(inside.Listener.Addr().(*net.TCPAddr).Port)
	const ru = "Привет, мир"
	cp1251 := func(s string) string {
		var b strings.Builder
		for _, r := range s {
			switch {
			case r < 0x80:
				b.WriteRune(r)
			case r >= 'А' && r <= 'я':
				b.WriteByte(byte(r - 'А' + 0xC0))
			}
		}
		return b.String()
	}
	raw := func(ct, body string) http.HandlerFunc {
		return func(rw http.ResponseWriter, _ *http.Request) {
			rw.Header().Set("Content-Type", ct)
			_, _ = io.WriteString(rw, body)
		}
	}
	w.pages.handle("/cp1251-header", raw("text/html; charset=windows-1251", cp1251("<head><title>"+ru+"</title></head>")))
	w.pages.handle("/cp1251-meta", raw("text/html", cp1251(`<head><meta charset="windows-1251"><title>`+ru+`</title></head>`)))
	w.pages.handle("/malformed", raw("text/html", `<html><head><title>Half<meta name=description content="open`))
	w.pages.handle("/no-tags", raw("text/html", `just text`))
	w.pages.handle("/huge", func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "text/html")
		_, _ = io.WriteString(rw, `<html><head><meta property="og:title" content="Huge"></head><body>`)
		chunk := strings.Repeat("<p>filler</p>", 10000)
		for range 1000 { // ~130 MB if anyone read it all
			if _, err := io.WriteString(rw, chunk); err != nil {
				return
			}
		}
	})
	w.pages.handle("/image", raw("image/png", "\x89PNG\r\n\x1a\n"))
	w.pages.handle("/pdf", raw("application/pdf", "%PDF-1.4"))
	w.pages.handle("/loop", func(rw http.ResponseWriter, r *http.Request) { http.Redirect(rw, r, "/loop", http.StatusFound) })
	w.pages.handle("/to-inside", func(rw http.ResponseWriter, r *http.Request) {
		http.Redirect(rw, r, inside.URL+"/", http.StatusFound)
	})
	w.pages.handle("/gone", func(rw http.ResponseWriter, _ *http.Request) { rw.WriteHeader(http.StatusGone) })
	w.pages.handle("/forbidden", func(rw http.ResponseWriter, _ *http.Request) { rw.WriteHeader(http.StatusForbidden) })

	cfg := w.config(t)
	cfg.Resolver = hosts{
		"public-looking.example.com": {netip.MustParseAddr("127.0.0.2")},
		"rebinding.example.net":      {netip.MustParseAddr("169.254.169.254")},
	}
	start(t, cfg)

	tests := []struct {
		name   string
		target string
		raw    string // a payload instead of a job
		title  string // stored with this title, or
		reason string // dead-lettered with this reason after one try
	}{
		{name: "charset_in_header", target: w.pages.URL + "/cp1251-header", title: ru},
		{name: "charset_in_meta", target: w.pages.URL + "/cp1251-meta", title: ru},
		{name: "malformed_html", target: w.pages.URL + "/malformed", title: `Half<meta name=description content="open`},
		{name: "no_tags_at_all", target: w.pages.URL + "/no-tags", title: ""},
		{name: "huge_page_read_only_at_its_head", target: w.pages.URL + "/huge", title: "Huge"},
		{name: "image", target: w.pages.URL + "/image", reason: "not_html"},
		{name: "pdf", target: w.pages.URL + "/pdf", reason: "not_html"},
		{name: "redirect_loop", target: w.pages.URL + "/loop", reason: "too_many_redirects"},
		{name: "not_found", target: w.pages.URL + "/nothing-here", reason: "not_found"},
		{name: "gone", target: w.pages.URL + "/gone", reason: "gone"},
		{name: "forbidden", target: w.pages.URL + "/forbidden", reason: "http_4xx"},
		{name: "ftp_target", target: "ftp://example.com/file", reason: "bad_target"},
		{name: "ssrf_loopback", target: "http://127.0.0.2:" + insidePort + "/", reason: "refused_address"},
		{name: "ssrf_redirect_to_loopback", target: w.pages.URL + "/to-inside", reason: "refused_address"},
		{name: "ssrf_private_10", target: "http://10.0.0.1/", reason: "refused_address"},
		{name: "ssrf_metadata", target: "http://169.254.169.254/latest/meta-data/", reason: "refused_address"},
		{name: "ssrf_ipv6_loopback", target: "http://[::1]:" + insidePort + "/", reason: "refused_address"},
		{name: "ssrf_name_resolving_to_loopback", target: "http://public-looking.example.com:" + insidePort + "/", reason: "refused_address"},
		{name: "ssrf_name_resolving_to_metadata", target: "http://rebinding.example.net/", reason: "refused_address"},
		{name: "unknown_host", target: "http://no-such-host.example.org/", reason: "no_such_host"},
		{name: "malformed_job", raw: `{"v":1,"id":"not-a-uuid"}`, reason: "malformed"},
		{name: "future_job_version", raw: `{"v":99,"id":"x"}`, reason: "unknown_version"},
	}
	codes := map[string]string{}
	for i, tc := range tests {
		code := "o" + strconv.Itoa(i)
		codes[tc.name] = code
		if tc.raw != "" {
			if _, err := w.js.Publish(t.Context(), events.PreviewJobSubject, []byte(tc.raw)); err != nil {
				t.Fatal(err)
			}
			continue
		}
		publishJob(t, w.js, code, tc.target)
	}
	testenv.WaitFor(t, 60*time.Second, "every job settled", func() bool { return streamMsgs(t, w.js, events.PreviewJobsStream) == 0 })
	byReason := map[string]int{}
	byCode := map[string]deadletter.Letter{}
	for _, l := range letters(t, w.js) {
		byReason[l.Reason]++
		var j struct{ Code string }
		_ = json.Unmarshal(l.Data, &j)
		byCode[j.Code] = l
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code := codes[tc.name]
			h := previewHash(t, w.rdb, code)
			switch {
			case tc.reason == "":
				if h["status"] != "ok" || h["title"] != tc.title {
					t.Fatalf("preview = %v, want stored with title %q", h, tc.title)
				}
			case tc.raw != "":
				if byReason[tc.reason] != 1 {
					t.Fatalf("dead letters by reason %v, want one %s", byReason, tc.reason)
				}
			default:
				l, ok := byCode[code]
				if !ok || l.Reason != tc.reason || l.Attempts != 1 {
					t.Fatalf("dead letter %+v (found %v), want reason %s after 1 attempt", l, ok, tc.reason)
				}
				if h["status"] != "failed" || h["reason"] != tc.reason {
					t.Fatalf("preview = %v, want the failed marker", h)
				}
			}
		})
	}
	if n := inside.hitCount("/"); n != 0 {
		t.Errorf("the refused server got %d requests, want 0", n)
	}
}

// hosts is a resolver with a fixed table (no real DNS in tests).
type hosts map[string][]netip.Addr

func (h hosts) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if ips, ok := h[host]; ok {
		return ips, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func TestShutdownMidJobLosesNothing(t *testing.T) {
	t.Parallel()
	t.Run("job_finishes_within_the_timeout", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t, nil)
		release := make(chan struct{})
		w.pages.handle("/slowish", func(rw http.ResponseWriter, r *http.Request) {
			<-release
			html("finished")(rw, r)
		})
		a := start(t, w.config(t))
		publishJob(t, w.js, "s", w.pages.URL+"/slowish")
		testenv.WaitFor(t, 10*time.Second, "page requested", func() bool { return w.pages.hitCount("/slowish") == 1 })
		stopped := make(chan error, 1)
		go func() { stopped <- a.stop() }()
		testenv.WaitFor(t, 10*time.Second, "intake stopped", func() bool { return a.get(t, "/readyz") != http.StatusOK })
		close(release)
		if err := <-stopped; err != nil {
			t.Fatal(err)
		}
		if h := previewHash(t, w.rdb, "s"); h["title"] != "finished" {
			t.Fatalf("preview = %v, want the job in hand finished before exit", h)
		}
		if n := streamMsgs(t, w.js, events.PreviewJobsStream); n != 0 {
			t.Fatalf("queue holds %d, want the job acked", n)
		}
	})
	t.Run("job_that_does_not_finish_is_handed_back", func(t *testing.T) {
		t.Parallel()
		// Ack deadlines of a minute: a job the stopping worker left without
		// handing it back would come again only after one, long past the
		// next worker's wait below.
		w := newWorld(t, []time.Duration{time.Minute, time.Minute, time.Minute, time.Minute})
		var mu sync.Mutex
		hung := false
		w.pages.handle("/hangs-once", func(rw http.ResponseWriter, r *http.Request) {
			mu.Lock()
			first := !hung
			hung = true
			mu.Unlock()
			if first {
				<-r.Context().Done() // until the worker gives up on it
				return
			}
			html("second try")(rw, r)
		})
		a := start(t, w.config(t, "SHUTDOWN_TIMEOUT=300ms", "PREVIEW_FETCH_TIMEOUT=60s"))
		publishJob(t, w.js, "h", w.pages.URL+"/hangs-once")
		testenv.WaitFor(t, 10*time.Second, "page requested", func() bool { return w.pages.hitCount("/hangs-once") == 1 })
		if err := a.stop(); err != nil {
			t.Fatal(err)
		}
		if h := previewHash(t, w.rdb, "h"); len(h) != 0 {
			t.Fatalf("preview = %v before any worker finished", h)
		}
		start(t, w.config(t))
		testenv.WaitFor(t, 10*time.Second, "job done by the next worker", func() bool { return previewHash(t, w.rdb, "h")["title"] == "second try" })
		if n := len(letters(t, w.js)); n != 0 {
			t.Fatalf("%d dead letters, want 0", n)
		}
	})
}

// TestJobsAlreadyDoneAreNotFetchedAgain: the queue delivers at least once,
// so a job comes again after its preview is stored (here a copy stored
// under another Nats-Msg-Id, as a hand-back or a redrive makes one), and an
// older job of the link can arrive after a newer one was stored. Neither is
// fetched again nor changes the preview: both count as duplicates.
func TestJobsAlreadyDoneAreNotFetchedAgain(t *testing.T) {
	t.Parallel()
	w := newWorld(t, nil)
	w.pages.handle("/old", html("old"))
	w.pages.handle("/new", html("new"))
	inst := start(t, w.config(t))
	job := func(path string) events.PreviewJob {
		return events.PreviewJob{V: events.PreviewJobVersion, ID: events.NewID(), Time: time.Now().UTC(), Code: "d", Owner: "acme", Target: w.pages.URL + path}
	}
	older, newer := job("/old"), job("/new")
	for newer.ID <= older.ID { // job IDs are UUIDv7s: the later, the greater
		newer = job("/new")
	}
	pub := func(j events.PreviewJob, msgID string) {
		t.Helper()
		data, _ := json.Marshal(j)
		if _, err := w.js.Publish(t.Context(), events.PreviewJobSubject, data, jetstream.WithMsgID(msgID)); err != nil {
			t.Fatal(err)
		}
	}
	pub(newer, newer.ID)
	testenv.WaitFor(t, 20*time.Second, "the newer job's preview stored", func() bool { return previewHash(t, w.rdb, "d")["title"] == "new" })
	pub(newer, newer.ID+"-again")
	pub(older, older.ID)
	testenv.WaitFor(t, 20*time.Second, "both late jobs counted as duplicates and the queue empty", func() bool {
		return inst.metric(t, `snip_preview_jobs_total{result="duplicate"}`) == 2 && streamMsgs(t, w.js, events.PreviewJobsStream) == 0
	})
	if n, m := w.pages.hitCount("/new"), w.pages.hitCount("/old"); n != 1 || m != 0 {
		t.Errorf("/new fetched %d times, /old %d; want once and never", n, m)
	}
	if h := previewHash(t, w.rdb, "d"); h["title"] != "new" || h["job_id"] != newer.ID {
		t.Errorf("preview = %v, want the newer job's", h)
	}
}

// TestTwoCopiesOfAJobInHandAtOnceCountOneStoredOneDuplicate: two copies of
// one job (published under two Msg-Ids) are both past the done check when
// the first stores; the second is a duplicate, not a job a newer one
// superseded.
func TestTwoCopiesOfAJobInHandAtOnceCountOneStoredOneDuplicate(t *testing.T) {
	t.Parallel()
	w := newWorld(t, nil)
	w.pages.handle("/twice", func(rw http.ResponseWriter, r *http.Request) {
		// Answer once both copies asked: both are then past the done check.
		deadline := time.Now().Add(10 * time.Second)
		for w.pages.hitCount("/twice") < 2 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		html("twice")(rw, r)
	})
	inst := start(t, w.config(t))
	j := events.PreviewJob{V: events.PreviewJobVersion, ID: events.NewID(), Time: time.Now().UTC(), Code: "c", Owner: "acme", Target: w.pages.URL + "/twice"}
	data, _ := json.Marshal(j)
	for _, msgID := range []string{j.ID, j.ID + "-again"} {
		if _, err := w.js.Publish(t.Context(), events.PreviewJobSubject, data, jetstream.WithMsgID(msgID)); err != nil {
			t.Fatal(err)
		}
	}
	testenv.WaitFor(t, 20*time.Second, "both copies settled", func() bool {
		return inst.metric(t, `snip_preview_deliveries_total{outcome="done"}`) == 2
	})
	if n := w.pages.hitCount("/twice"); n != 2 {
		t.Fatalf("page fetched %d times, want both copies in hand at once", n)
	}
	stored, dup, sup := inst.metric(t, `snip_preview_jobs_total{result="stored"}`),
		inst.metric(t, `snip_preview_jobs_total{result="duplicate"}`), inst.metric(t, `snip_preview_jobs_total{result="superseded"}`)
	if stored != 1 || dup != 1 || sup != 0 {
		t.Fatalf("jobs_total stored %v, duplicate %v, superseded %v; want 1, 1, 0", stored, dup, sup)
	}
}

func TestOperationalEndpoints(t *testing.T) {
	t.Parallel()
	w := newWorld(t, nil)
	inst := start(t, w.config(t))
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 200, "/metrics": 200, "/nope": 404} {
		if got := inst.get(t, path); got != want {
			t.Errorf("GET %s = %d, want %d", path, got, want)
		}
	}
	if v, ok := inst.sample(t, "snip_preview_jobs_in_flight"); !ok || v != 0 {
		t.Errorf("jobs in flight gauge = %v (present %v), want present and 0", v, ok)
	}
}

func TestAppliesItsTopology(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t)
	rdb, db := servers.Redis.NewDB(t)
	_ = rdb
	w := &world{js: n.JetStream(t), natsURL: n.URL, redisURL: servers.Redis.URL(db), pages: newPageServer(t, "127.0.0.1:0")}
	start(t, w.config(t, "SNIP_APPLY_TOPOLOGY=true"))
	c, err := w.js.Consumer(t.Context(), events.PreviewJobsStream, topology.PreviewConsumer)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.CachedInfo().Config; got.MaxDeliver != topology.PreviewMaxDeliver || len(got.BackOff) != len(topology.PreviewBackOff) {
		t.Fatalf("consumer config = %+v", got)
	}
	if _, err := w.js.Stream(t.Context(), events.DeadLetterStream); err != nil {
		t.Fatal(err)
	}
	if _, err := w.js.Consumer(t.Context(), events.PreviewAdvisoriesStream, topology.PreviewRescueConsumer); err != nil {
		t.Fatal(err)
	}
	// A second instance configured for another partition count must refuse
	// to start rather than fight over CLICKS.
	cfg := w.config(t, "SNIP_APPLY_TOPOLOGY=true", "SNIP_PARTITIONS=3")
	if err := run(t.Context(), slog.New(slog.DiscardHandler), cfg); !errors.Is(err, topology.ErrPartitionsChanged) {
		t.Fatalf("run with another partition count = %v, want ErrPartitionsChanged", err)
	}
}

func TestLoadConfig(t *testing.T) {
	t.Parallel()
	cfg, err := loadConfig(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Concurrency != 8 || cfg.HTTPAddr != ":8084" || !cfg.ApplyTopology || len(cfg.AllowCIDRs) != 0 || !strings.Contains(cfg.UserAgent, "Snip") {
		t.Fatalf("defaults = %+v", cfg)
	}
	cfg, err = loadConfig([]string{"PREVIEW_ALLOW_CIDRS=10.1.0.0/16,fd00::/8"}, nil)
	if err != nil || len(cfg.AllowCIDRs) != 2 || cfg.AllowCIDRs[1] != netip.MustParsePrefix("fd00::/8") {
		t.Fatalf("allow-list = %v, %v", cfg.AllowCIDRs, err)
	}
	for _, bad := range [][]string{
		{"PREVIEW_ALLOW_CIDRS=10.1.0.0"}, {"PREVIEW_CONCURRENCY=0"}, {"PREVIEW_RETRY_JITTER=2"},
		{"PREVIEW_RETRY_BASE=1m", "PREVIEW_RETRY_MAX=1s"}, {"PREVIEW_MAX_BODY_BYTES=10"}, {"LOG_LEVEL=loud"},
	} {
		if _, err := loadConfig(bad, nil); err == nil {
			t.Errorf("loadConfig(%v) accepted a bad value", bad)
		}
	}
	// A value the queue would take for its default (30s) is refused,
	// naming the variable.
	for _, bad := range []string{"PREVIEW_BACKLOG_INTERVAL=0", "PREVIEW_BACKLOG_INTERVAL=-1s"} {
		if _, err := loadConfig([]string{bad}, nil); err == nil || !strings.Contains(err.Error(), "PREVIEW_BACKLOG_INTERVAL") {
			t.Errorf("loadConfig(%s) = %v, want a refusal naming PREVIEW_BACKLOG_INTERVAL", bad, err)
		}
	}
}

// TestAJobWhoseLastAckWasLostLeavesNoDeadLetter: a job's last try stored
// its preview and its ack was lost, so the server gave up on it and
// announced it. The rescuer parked it as max_deliveries: a dead letter
// for a job that was done (its redrive a no-op). It now asks the preview's
// record first, and removes the job without a letter; the preview stays.
func TestAJobWhoseLastAckWasLostLeavesNoDeadLetter(t *testing.T) {
	t.Parallel()
	backOff := []time.Duration{200 * time.Millisecond, 200 * time.Millisecond, 200 * time.Millisecond, 200 * time.Millisecond}
	w := newWorld(t, backOff)
	job := events.PreviewJob{V: events.PreviewJobVersion, ID: events.NewID(), Time: time.Now().UTC(), Code: "lost", Owner: "acme", Target: w.pages.URL + "/lost"}
	data, _ := json.Marshal(job)
	if _, err := w.js.Publish(t.Context(), events.PreviewJobSubject, data, jetstream.WithMsgID(job.ID)); err != nil {
		t.Fatal(err)
	}
	cons, err := w.js.Consumer(t.Context(), events.PreviewJobsStream, topology.PreviewConsumer)
	if err != nil {
		t.Fatal(err)
	}
	// Deliveries 1 to 4 went to workers that crashed; the 5th stored the
	// preview, and its ack never reached the server.
	for range topology.PreviewMaxDeliver {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := <-batch.Messages(); !ok {
			t.Fatalf("no redelivery: %v", batch.Error())
		}
	}
	rec := preview.Record{JobID: job.ID, URL: job.Target, FetchedAt: time.Now().UTC()}
	rec.Title = "stored by the last try"
	if _, err := redisstore.New(w.rdb).Save(t.Context(), job.Code, rec); err != nil {
		t.Fatal(err)
	}
	// The next instance's pull makes the server notice and announce it.
	inst := start(t, w.config(t))
	testenv.WaitFor(t, 20*time.Second, "the job gone from the queue and its advisory handled", func() bool {
		return streamMsgs(t, w.js, events.PreviewJobsStream) == 0 && streamMsgs(t, w.js, events.PreviewAdvisoriesStream) == 0
	})
	if got := letters(t, w.js); len(got) != 0 {
		t.Errorf("dead letters %+v, want none for a job that was done", got)
	}
	if n := inst.metric(t, `snip_preview_rescued_done_total`); n != 1 {
		t.Errorf("snip_preview_rescued_done_total = %v, want 1", n)
	}
	if h := previewHash(t, w.rdb, job.Code); h["status"] != "ok" || h["job_id"] != job.ID || h["title"] != rec.Title {
		t.Errorf("preview = %v, want the last try's, status ok", h)
	}
	if n := w.pages.hitCount("/lost"); n != 0 {
		t.Errorf("page fetched %d times, want none", n)
	}
}
