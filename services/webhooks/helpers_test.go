package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/service"
	"github.com/snipdev/snip/pkg/service/servicetest"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/webhooks/internal/delivery"
)

var servers *testenv.Servers

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &servers, testenv.WithRedis())) }

const (
	testPartitions = 4
	acmeKey        = "snip_acmetestkey0123456789abcdef"
	otherKey       = "snip_othertestkey0123456789abcde"
)

// system is one test's NATS and Redis database.
type system struct {
	nats     *testenv.NATS
	js       jetstream.JetStream
	rdb      *redis.Client
	redisURL string
}

func newSystem(tb testing.TB) *system {
	tb.Helper()
	n := testenv.StartNATS(tb)
	rdb, db := servers.Redis.NewDB(tb)
	return &system{nats: n, js: n.JetStream(tb), rdb: rdb, redisURL: servers.Redis.URL(db)}
}

// instance is one webhooks instance running in-process.
type instance struct {
	*servicetest.Running
	addr string
}

// testConfig delivers to local receivers (127.0.0.1 allow-listed, plain
// http allowed to it) and retries fast.
func (s *system) testConfig(member string) Config {
	return Config{
		Base: service.Base{HTTPAddr: "127.0.0.1:0", ShutdownTimeout: 5 * time.Second},
		NATS: service.NATS{URL: s.nats.URL}, Redis: service.Redis{URL: s.redisURL},
		Topology: service.Topology{ApplyTopology: true, Partitions: testPartitions, Replicas: 1,
			ClicksMaxAge: 168 * time.Hour, ClicksMaxBytes: -1, Storage: jetstream.MemoryStorage},
		Owners: service.Owners{BootstrapOwners: "acme:" + acmeKey + ",other:" + otherKey},
		Member: member, LeaseTTL: time.Second,
		RetrySchedule: []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond}, RetryJitter: 0.2,
		DisableAfter: time.Hour, MaxBacklog: 100_000, BatchMax: 10, BatchWait: 50 * time.Millisecond,
		MaxBatchBytes: 256 << 10, Timeout: 500 * time.Millisecond, ConnectTimeout: 500 * time.Millisecond,
		MaxResponseBytes: 64 << 10, RotationOverlap: time.Hour, MaxEndpointsPerOwner: 10, Poll: 100 * time.Millisecond,
		AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}, HTTPHosts: []string{"127.0.0.1"},
		UserAgent: "Snip-Webhooks/test",
	}
}

// start runs a webhooks instance until the test ends (or stop).
func (s *system) start(tb testing.TB, cfg Config) *instance {
	tb.Helper()
	log := slog.New(slog.NewJSONHandler(testWriter{tb}, &slog.HandlerOptions{Level: slog.LevelInfo})).With("member", cfg.Member)
	r := servicetest.Start(tb, func(ctx context.Context, ready func(string)) error {
		cfg.Ready = ready
		return run(ctx, log, cfg)
	})
	// The group's consumers exist once the member joined: clicks published
	// from now on reach it (the group starts at new events).
	testenv.WaitFor(tb, 30*time.Second, "the webhooks group's consumers", func() bool {
		for p := range testPartitions {
			if _, err := s.js.Consumer(tb.Context(), events.ClicksStream, topology.GroupConsumerName(topology.GroupWebhooks, p)); err != nil {
				return false
			}
		}
		return true
	})
	return &instance{Running: r, addr: r.Addr}
}

// stop stops the instance as SIGTERM would and waits for its shutdown,
// which must end without an error.
func (in *instance) stop(tb testing.TB) {
	tb.Helper()
	if err := in.Stop(); err != nil {
		tb.Errorf("service stopped with: %v", err)
	}
}

// testWriter sends logs to t.Log, so they show only on failure.
type testWriter struct{ tb testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.tb.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// publishClicks publishes n clicks for owner acme over the codes, in turn.
func (s *system) publishClicks(tb testing.TB, codes []string, n int) []events.Click {
	tb.Helper()
	return s.publishOwnerClicks(tb, "acme", codes, n)
}

// publishOwnerClicks publishes n clicks for owner over the codes, in turn.
func (s *system) publishOwnerClicks(tb testing.TB, owner string, codes []string, n int) []events.Click {
	tb.Helper()
	out := make([]events.Click, 0, n)
	for i := range n {
		c := events.Click{V: events.ClickVersion, ID: events.NewID(), Time: time.Now().UTC(), Code: codes[i%len(codes)],
			Owner: owner, Target: "https://example.com/", Visitor: fmt.Sprintf("visitor-%d", i%7), Country: "NL"}
		b, err := json.Marshal(c)
		if err != nil {
			tb.Fatal(err)
		}
		if _, err := s.js.Publish(tb.Context(), events.ClickSubject(c.Owner, c.Code), b, jetstream.WithMsgID(c.ID)); err != nil {
			tb.Fatalf("publish click: %v", err)
		}
		out = append(out, c)
	}
	return out
}

// api calls the owner API with key and decodes the answer into out (if
// not nil); it returns the status.
func api(tb testing.TB, addr, key, method, path string, body any, out any) int {
	tb.Helper()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			tb.Fatal(err)
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(tb.Context(), method, "http://"+addr+path, r)
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			tb.Fatalf("%s %s: %d %s: %v", method, path, resp.StatusCode, b, err)
		}
	}
	return resp.StatusCode
}

// created is the create answer's part the tests use.
type created struct {
	ID     string `json:"id"`
	Secret string `json:"secret"`
}

func createEndpoint(tb testing.TB, addr, url string, extra map[string]any) created {
	tb.Helper()
	req := map[string]any{"url": url, "event_types": []string{"click"}}
	for k, v := range extra {
		req[k] = v
	}
	var c created
	if code := api(tb, addr, acmeKey, http.MethodPost, "/api/webhooks/endpoints", req, &c); code != http.StatusCreated {
		tb.Fatalf("create endpoint %s: status %d", url, code)
	}
	return c
}

// receipt is one verified delivery.
type receipt struct {
	webhookID string
	header    http.Header
	body      []byte
	events    []delivery.BodyEvent
	at        time.Time
}

// receiver is a local endpoint that verifies every request with the
// Standard Webhooks library, against any of the secrets it was given.
type receiver struct {
	tb  testing.TB
	srv *httptest.Server
	// answer decides the response; nil answers 204.
	answer func(w http.ResponseWriter, r *http.Request) bool

	mu         sync.Mutex
	secrets    []string
	receipts   []receipt
	unverified int
	requests   int
}

func newReceiver(tb testing.TB, answer func(w http.ResponseWriter, r *http.Request) bool) *receiver {
	tb.Helper()
	rc := &receiver{tb: tb, answer: answer}
	rc.srv = httptest.NewServer(http.HandlerFunc(rc.serve))
	tb.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) url() string { return rc.srv.URL + "/hook" }

func (rc *receiver) addSecret(s string) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.secrets = append(rc.secrets, s)
}

func (rc *receiver) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	rc.mu.Lock()
	rc.requests++
	secrets := append([]string(nil), rc.secrets...)
	rc.mu.Unlock()
	if rc.answer != nil && !rc.answer(w, r) {
		return // answered with a failure (or hung)
	}
	verified := false
	for _, s := range secrets {
		wh, err := standardwebhooks.NewWebhook(s)
		if err != nil {
			rc.tb.Errorf("secret %q: %v", s, err)
			continue
		}
		if wh.Verify(body, r.Header) == nil {
			verified = true
			break
		}
	}
	var b delivery.Body
	if err := json.Unmarshal(body, &b); err != nil || !verified {
		rc.mu.Lock()
		rc.unverified++
		rc.mu.Unlock()
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	rc.mu.Lock()
	rc.receipts = append(rc.receipts, receipt{webhookID: r.Header.Get("webhook-id"), header: r.Header.Clone(), body: body, events: b.Events, at: time.Now()})
	rc.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// got returns the verified receipts so far.
func (rc *receiver) got() []receipt {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]receipt(nil), rc.receipts...)
}

// eventIDs counts each event ID received.
func (rc *receiver) eventIDs() map[string]int { return rc.eventIDsFrom(0) }

// eventIDsFrom counts the event IDs of the requests received from the
// from-th on.
func (rc *receiver) eventIDsFrom(from int) map[string]int {
	out := map[string]int{}
	for _, r := range rc.got()[from:] {
		for _, e := range r.events {
			out[e.ID]++
		}
	}
	return out
}

func (rc *receiver) counts() (requests, unverified int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.requests, rc.unverified
}

// waitAll waits until every click's ID was received.
func (rc *receiver) waitAll(tb testing.TB, what string, clicks []events.Click, timeout time.Duration) {
	tb.Helper()
	rc.waitAllFrom(tb, what, 0, clicks, timeout)
}

// waitAllFrom waits until every click's ID was received in the requests
// from the from-th on.
func (rc *receiver) waitAllFrom(tb testing.TB, what string, from int, clicks []events.Click, timeout time.Duration) {
	tb.Helper()
	testenv.WaitFor(tb, timeout, what, func() bool {
		ids := rc.eventIDsFrom(from)
		for _, c := range clicks {
			if ids[c.ID] == 0 {
				return false
			}
		}
		return true
	})
}

// checkUnaltered fails unless every received click event equals the
// published click.
func checkUnaltered(tb testing.TB, rc *receiver, clicks []events.Click) {
	tb.Helper()
	byID := map[string]events.Click{}
	for _, c := range clicks {
		byID[c.ID] = c
	}
	for _, r := range rc.got() {
		for _, e := range r.events {
			want, ok := byID[e.ID]
			if !ok {
				continue
			}
			var got events.Click
			if err := json.Unmarshal(e.Data, &got); err != nil {
				tb.Fatalf("event %s: %v", e.ID, err)
			}
			if d := cmp.Diff(want, got); e.Type != "click" || d != "" {
				tb.Errorf("event %s (type %s) altered (-published +received):\n%s", e.ID, e.Type, d)
			}
		}
	}
}
