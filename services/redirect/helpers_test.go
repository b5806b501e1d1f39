package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/service"
	"github.com/snipdev/snip/pkg/service/servicetest"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/redirect/internal/httpapi"
)

var servers *testenv.Servers

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &servers, testenv.WithRedis())) }

// Owners every test instance bootstraps.
const (
	acmeKey  = "snip_acme0123456789abcdefgh"
	otherKey = "snip_other0123456789abcdefg"
)

// testConfig is a Config for one in-process instance on 127.0.0.1:0.
func testConfig(redisURL, natsURL string) Config {
	return Config{
		Base: service.Base{HTTPAddr: "127.0.0.1:0", LogLevel: slog.LevelWarn, ShutdownTimeout: 10 * time.Second},
		NATS: service.NATS{URL: natsURL}, Redis: service.Redis{URL: redisURL},
		Topology:     service.Topology{ApplyTopology: true, Partitions: 3, Replicas: 1, ClicksMaxAge: 168 * time.Hour, ClicksMaxBytes: -1},
		Owners:       service.Owners{BootstrapOwners: "acme:" + acmeKey + ",other:" + otherKey},
		OutboxShards: 4, OutboxMaxEntries: 1_000_000, UnrecordedPolicy: "reject",
		// The production outbox wait; a generous ack bound, because a loaded
		// test machine can take longer than 500 ms to answer a publish.
		OutboxWait: 100 * time.Millisecond, OutboxValidity: time.Second, DirectTimeout: 2 * time.Second, LookupTimeout: 250 * time.Millisecond,
		CommitMaxBatch: 64, CommitWorkers: 2, CommitLinger: 500 * time.Microsecond, CommitTimeout: 2 * time.Second, // the production linger and timeout
		RelayWindow: 128, RelayLeaseTTL: time.Second, RelayLinger: 20 * time.Millisecond, PublishTimeout: 2 * time.Second,
		MonitorInterval: 100 * time.Millisecond, CacheSize: 1000, CacheTTL: time.Minute,
	}
}

// instance is the service running in-process.
type instance struct {
	*servicetest.Running
	URL string
}

// startInstance runs the service until the test ends (or Stop).
func startInstance(tb testing.TB, cfg Config) *instance {
	tb.Helper()
	log := slog.New(slog.DiscardHandler)
	if os.Getenv("SNIP_TEST_LOG") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return startInstanceLog(tb, cfg, log)
}

// startInstanceLog is startInstance with the service logging to log.
func startInstanceLog(tb testing.TB, cfg Config, log *slog.Logger) *instance {
	tb.Helper()
	r := servicetest.Start(tb, func(ctx context.Context, ready func(string)) error {
		cfg.Ready = ready
		return run(ctx, log, cfg)
	})
	return &instance{Running: r, URL: r.URL()}
}

// logBuffer holds what a service logs as JSON, one record a line, for the
// test to read while the service writes.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// newLogBuffer returns an empty buffer and a logger, at Info and above,
// that writes to it.
func newLogBuffer() (*logBuffer, *slog.Logger) {
	l := &logBuffer{}
	return l, slog.New(slog.NewJSONHandler(l, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// records returns the records logged so far. slog's handler writes each
// record in one Write, so every line is whole.
func (l *logBuffer) records(tb testing.TB) []map[string]any {
	tb.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range bytes.Split(bytes.TrimSpace(l.b.Bytes()), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal(line, &rec); err != nil {
			tb.Fatalf("log line %s: %v", line, err)
		}
		out = append(out, rec)
	}
	return out
}

// client never follows redirects, so tests see the 302 itself.
var client = &http.Client{
	Timeout:       10 * time.Second,
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	Transport:     &http.Transport{MaxIdleConnsPerHost: 64},
}

type response struct {
	Status int
	Header http.Header
	Body   []byte
}

func (r response) json(tb testing.TB, v any) {
	tb.Helper()
	if err := json.Unmarshal(r.Body, v); err != nil {
		tb.Fatalf("decode %s: %v", r.Body, err)
	}
}

// do sends one request; header pairs are name, value.
func do(tb testing.TB, method, url, body string, header ...string) response {
	tb.Helper()
	r, err := doErr(method, url, body, header...)
	if err != nil {
		tb.Fatalf("%s %s: %v", method, url, err)
	}
	return r
}

func doErr(method, url, body string, header ...string) (response, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return response{}, err
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return response{Status: resp.StatusCode, Header: resp.Header, Body: b}, err
}

// createLink creates a link as acme and returns its code. Custom codes
// are sent with "url" (the alias), random ones with "target".
func createLink(tb testing.TB, base, target, code string) string {
	tb.Helper()
	body, _ := json.Marshal(map[string]string{"url": target, "code": code})
	if code == "" {
		body, _ = json.Marshal(map[string]string{"target": target})
	}
	r := do(tb, "POST", base+"/api/links", string(body), "Authorization", "Bearer "+acmeKey, "Content-Type", "application/json")
	if r.Status != http.StatusCreated {
		tb.Fatalf("create link: %d %s", r.Status, r.Body)
	}
	var l struct{ Code string }
	r.json(tb, &l)
	return l.Code
}

// clickMsg is one message read back from CLICKS.
type clickMsg struct {
	MsgID string
	Click events.Click
}

// readStream reads every message stored in stream, in stream order.
func readStream(tb testing.TB, js jetstream.JetStream, stream string) []jetstream.Msg {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		tb.Fatalf("stream %s: %v", stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		tb.Fatalf("stream %s info: %v", stream, err)
	}
	want := int(info.State.Msgs)
	if want == 0 {
		return nil
	}
	if info.Config.Retention == jetstream.WorkQueuePolicy {
		// A work queue takes no second consumer; read it message by message.
		var out []jetstream.Msg
		for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
			raw, err := s.GetMsg(ctx, seq)
			if err != nil {
				continue // acked and removed meanwhile
			}
			out = append(out, rawMsg{raw})
		}
		return out
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		tb.Fatalf("ordered consumer: %v", err)
	}
	var out []jetstream.Msg
	for len(out) < want {
		batch, err := cons.Fetch(min(want-len(out), 1000), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			tb.Fatalf("fetch %s: %v", stream, err)
		}
		for m := range batch.Messages() {
			out = append(out, m)
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			tb.Fatalf("fetch %s: %v", stream, err)
		}
	}
	return out
}

func readClicks(tb testing.TB, js jetstream.JetStream) []clickMsg {
	tb.Helper()
	var out []clickMsg
	for _, m := range readStream(tb, js, events.ClicksStream) {
		c, err := events.DecodeClick(m.Data())
		if err != nil {
			tb.Fatalf("CLICKS holds an undecodable click: %v\n%s", err, m.Data())
		}
		out = append(out, clickMsg{MsgID: m.Headers().Get(events.HeaderMsgID), Click: c})
	}
	return out
}

// streamCount is the number of messages in a stream, 0 if it is missing.
func streamCount(js jetstream.JetStream, stream string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return 0
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0
	}
	return int(info.State.Msgs)
}

// ledger records, per code, the request IDs of the clicks that got a 302,
// in the order the 302s were received.
type ledger struct {
	mu      sync.Mutex
	served  map[string][]string // code -> request IDs answered 302
	failed  map[string]bool     // request IDs without a 302 (may or may not be recorded)
	errored map[string]bool     // request IDs answered with an error status: never recorded
	// unconfirmed are request IDs answered 503 click_unconfirmed: sent to
	// JetStream without an ack, so recorded at most once (in failed too).
	unconfirmed map[string]bool
	refused     int // non-302 answers
	seq         int
	lat         []time.Duration // time to the 302, per served click
	why         []string        // the first few non-302 answers, for failure messages
}

func newLedger() *ledger {
	return &ledger{served: map[string][]string{}, failed: map[string]bool{}, errored: map[string]bool{}, unconfirmed: map[string]bool{}}
}

func (l *ledger) total() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.totalLocked()
}

func (l *ledger) totalLocked() int {
	n := 0
	for _, ids := range l.served {
		n += len(ids)
	}
	return n
}

// click sends one GET /code with a fresh request ID and records the outcome.
func (l *ledger) click(base, code string) (int, error) {
	l.mu.Lock()
	l.seq++
	rid := fmt.Sprintf("%s-%07d", code, l.seq)
	l.mu.Unlock()
	start := time.Now()
	r, err := doErr("GET", base+"/"+code, "", "X-Request-Id", rid, "User-Agent", "Mozilla/5.0 test", "CF-IPCountry", "DE")
	took := time.Since(start)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil || r.Status != http.StatusFound {
		l.failed[rid] = true
		switch {
		case err == nil && r.Header.Get(httpapi.ClickHeader) == "unconfirmed":
			l.unconfirmed[rid] = true
		case err == nil:
			l.errored[rid] = true
		}
		if len(l.why) < 5 {
			l.why = append(l.why, fmt.Sprintf("%s: %d %s %v", rid, r.Status, r.Body, err))
		}
		l.refused++
		return r.Status, err
	}
	l.served[code] = append(l.served[code], rid)
	l.lat = append(l.lat, took)
	return r.Status, nil
}

// verify checks CLICKS against the ledger: every served click exactly once
// (by event ID and by request ID), per code in the order the 302s were
// served, and nothing that was never requested.
func (l *ledger) verify(tb testing.TB, clicks []clickMsg) {
	tb.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	seenEvent := map[string]bool{}
	seenReq := map[string]int{}
	perCode := map[string][]string{}
	for _, c := range clicks {
		if c.MsgID != c.Click.ID {
			tb.Fatalf("Nats-Msg-Id %q != event ID %q", c.MsgID, c.Click.ID)
		}
		if seenEvent[c.Click.ID] {
			tb.Fatalf("event %s is in CLICKS twice", c.Click.ID)
		}
		seenEvent[c.Click.ID] = true
		seenReq[c.Click.RequestID]++
		if seenReq[c.Click.RequestID] > 1 {
			tb.Fatalf("request %s has %d clicks in CLICKS", c.Click.RequestID, seenReq[c.Click.RequestID])
		}
		if !l.failed[c.Click.RequestID] {
			perCode[c.Click.Code] = append(perCode[c.Click.Code], c.Click.RequestID)
		}
	}
	for code, want := range l.served {
		got := perCode[code]
		if len(got) != len(want) {
			missing := 0
			for _, rid := range want {
				if seenReq[rid] == 0 {
					missing++
				}
			}
			tb.Fatalf("code %s: %d clicks served, %d in CLICKS (%d missing)", code, len(want), len(got), missing)
		}
		for i := range want {
			if got[i] != want[i] {
				tb.Fatalf("code %s: click %d in CLICKS is %s, want %s (order per link broken)", code, i, got[i], want[i])
			}
		}
	}
	for code, got := range perCode {
		if _, ok := l.served[code]; !ok {
			tb.Fatalf("CLICKS has %d clicks of code %s that was never served", len(got), code)
		}
	}
}

// verifyOnce checks CLICKS against the ledger without order: every served
// click exactly once, no click of a request answered with an error status,
// nothing that was never requested. It returns the number of errored
// requests checked.
func (l *ledger) verifyOnce(tb testing.TB, clicks []clickMsg) int {
	tb.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	seenEvent := map[string]bool{}
	seenReq := map[string]int{}
	for _, c := range clicks {
		if c.MsgID != c.Click.ID {
			tb.Fatalf("Nats-Msg-Id %q != event ID %q", c.MsgID, c.Click.ID)
		}
		if seenEvent[c.Click.ID] {
			tb.Fatalf("event %s is in CLICKS twice", c.Click.ID)
		}
		seenEvent[c.Click.ID] = true
		seenReq[c.Click.RequestID]++
		if seenReq[c.Click.RequestID] > 1 {
			tb.Fatalf("request %s has %d clicks in CLICKS", c.Click.RequestID, seenReq[c.Click.RequestID])
		}
		if l.errored[c.Click.RequestID] {
			tb.Fatalf("request %s was answered with an error, but its click is in CLICKS", c.Click.RequestID)
		}
	}
	lost := 0
	for _, ids := range l.served {
		for _, rid := range ids {
			if seenReq[rid] == 0 {
				lost++
			}
		}
	}
	known := 0
	for _, ids := range l.served {
		known += len(ids)
	}
	for rid := range l.failed {
		if seenReq[rid] > 0 {
			known++ // an unanswered request's click may be there, once
		}
	}
	if lost > 0 {
		tb.Fatalf("%d clicks that got a 302 are not in CLICKS", lost)
	}
	if len(clicks) != known {
		tb.Fatalf("CLICKS holds %d clicks, want the %d served (plus unanswered ones found): a click nobody requested", len(clicks), known)
	}
	return len(l.errored)
}

// expectInCLICKSAnyOrder waits until CLICKS holds every served click, then
// checks it with verifyOnce. It returns the number served and errored.
//
// The count alone does not say so: a request that got no 302 may be in
// CLICKS too (its answer was lost, or it said it did not know), so the wait
// ends when no served request ID is missing, read from the stream once it
// holds at least as many clicks as were served.
func (l *ledger) expectInCLICKSAnyOrder(tb testing.TB, js jetstream.JetStream) (served, errored int) {
	tb.Helper()
	want := l.total()
	testenv.WaitFor(tb, 90*time.Second, fmt.Sprintf("the %d served clicks in CLICKS", want), func() bool {
		return streamCount(js, events.ClicksStream) >= want && l.missingServed(readClicks(tb, js)) == 0
	})
	return want, l.verifyOnce(tb, readClicks(tb, js))
}

// missingServed is how many request IDs answered 302 have no click in clicks.
func (l *ledger) missingServed(clicks []clickMsg) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	in := make(map[string]bool, len(clicks))
	for _, c := range clicks {
		in[c.Click.RequestID] = true
	}
	n := 0
	for _, ids := range l.served {
		for _, rid := range ids {
			if !in[rid] {
				n++
			}
		}
	}
	return n
}

// latencies returns the p50, p99 and largest time to a 302.
func (l *ledger) latencies() (p50, p99, top time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return percentiles(l.lat)
}

// expectInCLICKS waits until CLICKS holds every served click, then
// verifies it against the ledger. It returns the number served.
//
// As in expectInCLICKSAnyOrder, the count alone does not say so: clicks of
// requests that got no 302 (a process killed under them) may be there too
// while served ones are still being relayed, so the wait ends when no
// served request ID is missing.
func (l *ledger) expectInCLICKS(tb testing.TB, js jetstream.JetStream) int {
	tb.Helper()
	want := l.total()
	testenv.WaitFor(tb, 90*time.Second, fmt.Sprintf("the %d served clicks in CLICKS", want), func() bool {
		return streamCount(js, events.ClicksStream) >= want && l.missingServed(readClicks(tb, js)) == 0
	})
	l.verify(tb, readClicks(tb, js))
	return want
}

// metric returns the sum of a metric's samples whose line contains all of
// match, from /metrics (0 when none does).
func metric(tb testing.TB, base, name string, match ...string) float64 {
	tb.Helper()
	sum, _ := metricSamples(tb, base, name, match...)
	return sum
}

// metricIs reports whether a metric has samples matching match and they sum
// to want: a gauge waited down to 0 must be there, or a renamed or
// unregistered one would pass the wait.
func metricIs(tb testing.TB, base, name string, want float64, match ...string) bool {
	tb.Helper()
	sum, n := metricSamples(tb, base, name, match...)
	return n > 0 && sum == want
}

// metricSamples returns the sum and the number of a metric's samples whose
// line contains all of match, from /metrics.
func metricSamples(tb testing.TB, base, name string, match ...string) (float64, int) {
	tb.Helper()
	// A scrape can time out on a machine loaded enough (the race detector,
	// other test binaries); the service is not at fault, so try again, up
	// to a deadline, before failing the test.
	var r response
	deadline := time.Now().Add(45 * time.Second)
	for {
		var err error
		if r, err = doErr("GET", base+"/metrics", ""); err == nil {
			break
		}
		if time.Now().After(deadline) {
			tb.Fatalf("GET %s/metrics: %v", base, err)
		}
	}
	var sum float64
	var n int
	for _, line := range bytes.Split(r.Body, []byte("\n")) {
		s := string(line)
		if !strings.HasPrefix(s, name) || (len(s) > len(name) && s[len(name)] != ' ' && s[len(name)] != '{') {
			continue
		}
		ok := true
		for _, m := range match {
			ok = ok && strings.Contains(s, m)
		}
		if !ok {
			continue
		}
		var v float64
		if _, err := fmt.Sscanf(s[strings.LastIndexByte(s, ' ')+1:], "%g", &v); err == nil {
			sum += v
			n++
		}
	}
	return sum, n
}

// rawMsg adapts a stored message to the jetstream.Msg the tests read.
type rawMsg struct{ r *jetstream.RawStreamMsg }

func (m rawMsg) Data() []byte                              { return m.r.Data }
func (m rawMsg) Subject() string                           { return m.r.Subject }
func (m rawMsg) Headers() nats.Header                      { return m.r.Header }
func (m rawMsg) Metadata() (*jetstream.MsgMetadata, error) { return nil, errors.New("raw message") }
func (m rawMsg) Reply() string                             { return "" }
func (m rawMsg) Ack() error                                { return nil }
func (m rawMsg) DoubleAck(context.Context) error           { return nil }
func (m rawMsg) Nak() error                                { return nil }
func (m rawMsg) NakWithDelay(time.Duration) error          { return nil }
func (m rawMsg) InProgress() error                         { return nil }
func (m rawMsg) Term() error                               { return nil }
func (m rawMsg) TermWithReason(string) error               { return nil }

// warmLinks creates n links (targets https://example.com/<prefix><i>),
// clicks each once through l, so the instance at base has them cached, and
// waits until those clicks are in CLICKS: a test's faults then strike a
// system whose streams exist and whose relay publishes. (A redirect answers
// 302 once Redis has its click, before the topology may be applied; on a
// slow machine, creating CLICKS has taken seconds, and a fault test that
// froze NATS then found no stream to take the clicks it sent.) It returns
// the codes.
func warmLinks(tb testing.TB, l *ledger, base string, js jetstream.JetStream, prefix string, n int) []string {
	tb.Helper()
	codes := make([]string, 0, n)
	for i := range n {
		code := createLink(tb, base, fmt.Sprintf("https://example.com/%s%d", prefix, i), "")
		codes = append(codes, code)
		if got, err := l.click(base, code); got != http.StatusFound { // warms the link cache
			tb.Fatalf("GET = %d %v", got, err)
		}
	}
	l.expectInCLICKSAnyOrder(tb, js)
	return codes
}
