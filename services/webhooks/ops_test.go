package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/pkg/webserver"
	"github.com/snipdev/snip/services/webhooks/internal/delivery"
	"github.com/snipdev/snip/services/webhooks/internal/redisstore"
)

type endpointStatus struct {
	ID           string    `json:"id"`
	Status       string    `json:"status"`
	Backlog      int64     `json:"backlog"`
	FailingSince time.Time `json:"failing_since"`
	LastError    string    `json:"last_error"`
}

func getEndpoint(tb testing.TB, addr, id string) endpointStatus {
	tb.Helper()
	var st endpointStatus
	if code := api(tb, addr, acmeKey, http.MethodGet, "/api/webhooks/endpoints/"+id, nil, &st); code != http.StatusOK {
		tb.Fatalf("get endpoint %s: status %d", id, code)
	}
	return st
}

func deliveries(tb testing.TB, addr, id string) []redisstore.Delivery {
	tb.Helper()
	var ds struct {
		Deliveries []redisstore.Delivery `json:"deliveries"`
	}
	api(tb, addr, acmeKey, http.MethodGet, "/api/webhooks/endpoints/"+id+"/deliveries", nil, &ds)
	return ds.Deliveries
}

// TestKillMidBatchLosesNothingAndRepeatsWithTheSameWebhookID: the service is
// stopped while a batch is on the wire (the receiver has it, the sender
// never hears back); a new instance sends that batch again with the same
// webhook-id and body, and every click arrives.
func TestKillMidBatchLosesNothingAndRepeatsWithTheSameWebhookID(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	first := s.start(t, s.testConfig("m1"))
	var requests atomic.Int64
	var killed sync.Once
	rc := newReceiver(t, nil)
	rc.answer = func(w http.ResponseWriter, r *http.Request) bool {
		if requests.Add(1) == 3 {
			killed.Do(first.Cancel)
			<-r.Context().Done() // the sender went away with the batch in flight
		}
		return true // record it: the receiver did get it
	}
	ep := createEndpoint(t, first.addr, rc.url(), map[string]any{"batch_max": 5, "batch_wait_ms": 20})
	rc.addSecret(ep.Secret)

	clicks := s.publishClicks(t, []string{"a1", "b2", "c3"}, 60)
	testenv.WaitFor(t, 30*time.Second, "the first instance to stop mid-batch", func() bool { return requests.Load() >= 3 })
	first.stop(t)
	clicks = append(clicks, s.publishClicks(t, []string{"a1", "b2", "c3"}, 40)...)
	s.start(t, s.testConfig("m2"))
	rc.waitAll(t, "every click after the restart", clicks, 60*time.Second)

	if _, bad := rc.counts(); bad != 0 {
		t.Errorf("%d requests did not verify", bad)
	}
	checkUnaltered(t, rc, clicks)
	bodies := map[string][]byte{}    // webhook-id -> body
	webhookOf := map[string]string{} // event id -> webhook-id
	dups := 0
	for _, r := range rc.got() {
		if b, ok := bodies[r.webhookID]; ok {
			dups++
			if !bytes.Equal(b, r.body) {
				t.Errorf("webhook-id %s sent with two different bodies", r.webhookID)
			}
		}
		bodies[r.webhookID] = r.body
		for _, e := range r.events {
			if w, ok := webhookOf[e.ID]; ok && w != r.webhookID {
				t.Errorf("event %s sent again under webhook-id %s, first under %s", e.ID, r.webhookID, w)
			}
			webhookOf[e.ID] = r.webhookID
		}
	}
	if dups == 0 {
		t.Errorf("the batch in flight at the stop was not sent again")
	}
	t.Logf("%d clicks, %d requests, %d repeated (same webhook-id and body)", len(clicks), len(rc.got()), dups)
}

// TestAPOSTInFlightAtTheStopIsFinishedNotSentAgain: the service is told to
// stop (SIGTERM) while a POST is on the wire, and the receiver answers it
// 204 half a second later, well within the service's shutdown timeout.
// The stop lets that POST finish and records the delivery, so the next
// instance does not send the batch again: every webhook-id arrives once.
func TestAPOSTInFlightAtTheStopIsFinishedNotSentAgain(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	cfg := s.testConfig("m1")
	cfg.Timeout = 5 * time.Second
	first := s.start(t, cfg)
	var requests atomic.Int64
	var stopped sync.Once
	rc := newReceiver(t, nil)
	rc.answer = func(w http.ResponseWriter, r *http.Request) bool {
		if requests.Add(1) == 3 {
			stopped.Do(first.Cancel)
			// A slow receiver: it takes half a second more, then answers.
			select {
			case <-r.Context().Done():
			case <-time.After(500 * time.Millisecond):
			}
		}
		return true // record it: the receiver did process it
	}
	ep := createEndpoint(t, first.addr, rc.url(), map[string]any{"batch_max": 5, "batch_wait_ms": 20})
	rc.addSecret(ep.Secret)

	clicks := s.publishClicks(t, []string{"a1", "b2", "c3"}, 60)
	testenv.WaitFor(t, 30*time.Second, "the first instance to be stopped mid-POST", func() bool { return requests.Load() >= 3 })
	first.stop(t)
	clicks = append(clicks, s.publishClicks(t, []string{"a1", "b2", "c3"}, 40)...)
	s.start(t, s.testConfig("m2"))
	rc.waitAll(t, "every click after the restart", clicks, 60*time.Second)

	seen := map[string]int{}
	for _, r := range rc.got() {
		seen[r.webhookID]++
	}
	for id, n := range seen {
		if n > 1 {
			t.Errorf("webhook-id %s received %d times: the POST in flight at the stop was cut and sent again", id, n)
		}
	}
	if ids := rc.eventIDs(); len(ids) != len(clicks) {
		t.Errorf("%d distinct events received, want %d", len(ids), len(clicks))
	}
}

// TestReplayFromATimeDeliversExactlyTheEventsSinceThen.
func TestReplayFromATimeDeliversExactlyTheEventsSinceThen(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	svc := s.start(t, s.testConfig("m1"))
	rc := newReceiver(t, nil)
	ep := createEndpoint(t, svc.addr, rc.url(), nil)
	rc.addSecret(ep.Secret)

	before := s.publishClicks(t, []string{"a1", "b2"}, 30)
	rc.waitAll(t, "the clicks before the replay point", before, 30*time.Second)
	from := time.Now().UTC()
	since := s.publishClicks(t, []string{"a1", "b2"}, 30)
	rc.waitAll(t, "the clicks after the replay point", since, 30*time.Second)
	testenv.WaitFor(t, 10*time.Second, "an empty backlog", func() bool { return getEndpoint(t, svc.addr, ep.ID).Backlog == 0 })
	n0 := len(rc.got())

	if code := api(t, svc.addr, acmeKey, http.MethodPost, "/api/webhooks/endpoints/"+ep.ID+"/replay",
		map[string]string{"from": from.Format(time.RFC3339Nano)}, nil); code != http.StatusAccepted {
		t.Fatalf("replay: status %d", code)
	}
	replayed := func() map[string]int {
		out := map[string]int{}
		for _, r := range rc.got()[n0:] {
			for _, e := range r.events {
				out[e.ID]++
			}
		}
		return out
	}
	testenv.WaitFor(t, 30*time.Second, "the replayed clicks", func() bool {
		got := replayed()
		for _, c := range since {
			if got[c.ID] == 0 {
				return false
			}
		}
		return getEndpoint(t, svc.addr, ep.ID).Backlog == 0
	})
	got := replayed()
	if len(got) != len(since) {
		t.Errorf("replay delivered %d distinct events, want exactly the %d since the replay point", len(got), len(since))
	}
	for _, c := range before {
		if got[c.ID] > 0 {
			t.Errorf("click %s from before the replay point was replayed", c.ID)
		}
	}
	for id, n := range got {
		if n != 1 {
			t.Errorf("event %s replayed %d times, want once", id, n)
		}
	}
	// Live delivery goes on after the replay.
	after := s.publishClicks(t, []string{"a1"}, 5)
	rc.waitAll(t, "clicks after the replay", after, 30*time.Second)
}

// TestAWebhookIDNamesOneBody: a webhook-id names one body, so a receiver
// may deduplicate by it (Standard Webhooks). Live intake queues each
// partition's clicks as that partition's member hands them, so a queue
// need not be in CLICKS' order: here clicks a and c (link on partition P)
// are queued, and sent as one batch, before click b (partition Q) that came
// between them; a replay then queues a, b and c in CLICKS' order and sends
// them as one batch. The webhook-id was made of a batch's first and last
// event IDs, so the replay's batch {a, b, c} went out under the ID of the
// live batch {a, c}, and a receiver that deduplicates by webhook-id dropped
// it, b with it. Each body has its own ID; a retry of a batch (its first
// attempt answered 500) keeps the batch's ID.
func TestAWebhookIDNamesOneBody(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	svc := s.start(t, s.testConfig("m1"))
	var failed atomic.Pointer[receipt]
	rc := newReceiver(t, nil)
	rc.answer = func(w http.ResponseWriter, r *http.Request) bool {
		if failed.Load() != nil {
			return true
		}
		failed.Store(&receipt{webhookID: r.Header.Get("webhook-id")})
		w.WriteHeader(http.StatusInternalServerError)
		return false
	}
	codeP, codeQ := "a1", ""
	for _, c := range []string{"b2", "c3", "d4", "e5", "f6", "g7", "h8"} {
		if events.Partition(c, testPartitions) != events.Partition(codeP, testPartitions) {
			codeQ = c
			break
		}
	}
	if codeQ == "" {
		t.Fatal("no link on another partition than a1's")
	}

	// Published before the endpoint exists, so live intake skips them (the
	// endpoint starts after CLICKS' last sequence): the test queues them as
	// intake would have, a and c from P's batch, then b from Q's.
	from := time.Now().UTC()
	var a, b, c redisstore.Event
	for _, x := range []struct {
		ev   *redisstore.Event
		code string
	}{{&a, codeP}, {&b, codeQ}, {&c, codeP}} {
		cl := events.Click{V: events.ClickVersion, ID: events.NewID(), Time: time.Now().UTC(), Code: x.code,
			Owner: "acme", Target: "https://example.com/", Visitor: "visitor", Country: "NL"}
		data, _ := json.Marshal(cl)
		ack, err := s.js.Publish(t.Context(), events.ClickSubject(cl.Owner, cl.Code), data, jetstream.WithMsgID(cl.ID))
		if err != nil {
			t.Fatal(err)
		}
		*x.ev = redisstore.Event{Seq: ack.Sequence, ID: cl.ID, Type: "click", Time: cl.Time, Data: data}
	}
	ep := createEndpoint(t, svc.addr, rc.url(), map[string]any{"batch_max": 3, "batch_wait_ms": 200})
	rc.addSecret(ep.Secret)
	store := redisstore.New(s.rdb, 100_000)
	queue := func(p string, evs ...redisstore.Event) {
		t.Helper()
		if _, _, err := store.Enqueue(t.Context(), redisstore.DedupNone, events.Partition(p, testPartitions),
			map[string][]redisstore.Event{ep.ID: evs}); err != nil {
			t.Fatal(err)
		}
	}
	ids := func(r receipt) []string {
		var out []string
		for _, e := range r.events {
			out = append(out, e.ID)
		}
		return out
	}
	bodyOf := func(evs ...redisstore.Event) func() (receipt, bool) {
		var want []string
		for _, e := range evs {
			want = append(want, e.ID)
		}
		return func() (receipt, bool) {
			for _, r := range rc.got() {
				if slices.Equal(ids(r), want) {
					return r, true
				}
			}
			return receipt{}, false
		}
	}
	waitBody := func(what string, evs ...redisstore.Event) receipt {
		t.Helper()
		var r receipt
		testenv.WaitFor(t, 30*time.Second, what, func() bool {
			var ok bool
			r, ok = bodyOf(evs...)()
			return ok
		})
		return r
	}

	queue(codeP, a, c)
	live := waitBody("the live batch {a, c}, retried", a, c)
	if f := failed.Load(); f.webhookID != live.webhookID {
		t.Errorf("the retry of {a, c} has webhook-id %q, its first attempt %q: want the same", live.webhookID, f.webhookID)
	}
	queue(codeQ, b)
	waitBody("the live batch {b}", b)
	testenv.WaitFor(t, 10*time.Second, "an empty backlog", func() bool { return getEndpoint(t, svc.addr, ep.ID).Backlog == 0 })

	if code := api(t, svc.addr, acmeKey, http.MethodPost, "/api/webhooks/endpoints/"+ep.ID+"/replay",
		map[string]string{"from": from.Format(time.RFC3339Nano)}, nil); code != http.StatusAccepted {
		t.Fatalf("replay: status %d", code)
	}
	replayed := waitBody("the replay's batch {a, b, c}", a, b, c)
	t.Logf("live {a, c}: %s; replayed {a, b, c}: %s", live.webhookID, replayed.webhookID)

	bodies := map[string][]byte{}
	for _, r := range rc.got() {
		if prev, ok := bodies[r.webhookID]; ok && !bytes.Equal(prev, r.body) {
			t.Errorf("webhook-id %s sent with two bodies:\n%s\n%s", r.webhookID, prev, r.body)
		}
		bodies[r.webhookID] = r.body
	}
}

// TestReplayFromATimeNoStreamPositionHoldsIsRefused: a replay drops the
// queued events up to its cut and refills them from the streams from its
// start time on. A time the streams cannot hold as a position (before
// 1678: nanoseconds since 1970 overflow an int64, and the server reads the
// wrapped value as a time long after the last event) found nothing to
// refill: the answer was 202 and the queued events were gone. Such a time
// is refused, and the queue stays as it was.
func TestReplayFromATimeNoStreamPositionHoldsIsRefused(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	svc := s.start(t, s.testConfig("m1"))
	rc := newReceiver(t, nil)
	ep := createEndpoint(t, svc.addr, rc.url(), nil)
	rc.addSecret(ep.Secret)
	base := "/api/webhooks/endpoints/" + ep.ID
	api(t, svc.addr, acmeKey, http.MethodPost, base+"/pause", nil, nil)
	queued := s.publishClicks(t, []string{"a1", "b2"}, 20)
	testenv.WaitFor(t, 30*time.Second, "the clicks queued for the paused endpoint", func() bool {
		return getEndpoint(t, svc.addr, ep.ID).Backlog == int64(len(queued))
	})
	for _, from := range []string{"1600-01-01T00:00:00Z", "0001-01-01T00:00:00Z"} {
		var e webserver.ErrorBody
		if code := api(t, svc.addr, acmeKey, http.MethodPost, base+"/replay", map[string]string{"from": from}, &e); code != http.StatusBadRequest {
			t.Errorf("replay from %s: status %d (%+v), want 400", from, code, e)
		}
	}
	// (A replay accepted from 1600 ran in the background, dropped the
	// queued clicks and refilled none: they never arrived.)
	if code := api(t, svc.addr, acmeKey, http.MethodPost, base+"/resume", nil, nil); code != http.StatusOK {
		t.Fatalf("resume: status %d", code)
	}
	rc.waitAll(t, "the clicks queued before the refused replays", queued, 30*time.Second)
}

// TestReplaySendsOnlyTheClicksLiveIntakeWouldSend: a replay judges a click
// by the readers' one rule of validity, as live intake does. A click whose
// payload disagrees with the subject it was stored under (another owner's
// click under acme's subject, or another link's) is parked by every reader;
// replayed, it reached acme's endpoint, with the other owner's visitor,
// target and referrer in it, or reached an endpoint that lists only links
// other than the one it was stored under.
func TestReplaySendsOnlyTheClicksLiveIntakeWouldSend(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	svc := s.start(t, s.testConfig("m1"))
	rc := newReceiver(t, nil)
	ep := createEndpoint(t, svc.addr, rc.url(), map[string]any{"links": []string{"a1"}})
	rc.addSecret(ep.Secret)

	from := time.Now().UTC()
	good := s.publishClicks(t, []string{"a1"}, 10)
	var bad []string
	for _, tc := range []struct {
		c       events.Click
		subject string
	}{
		{events.Click{Owner: "other", Code: "a1"}, events.ClickSubject("acme", "a1")}, // another owner's click under acme's subject
		{events.Click{Owner: "acme", Code: "a1"}, events.ClickSubject("acme", "b2")},  // under a link the endpoint leaves out
	} {
		c := tc.c
		c.V, c.ID, c.Time, c.Target, c.Visitor = events.ClickVersion, events.NewID(), time.Now().UTC(), "https://example.com/", "visitor-x"
		b, _ := json.Marshal(c)
		if _, err := s.js.Publish(t.Context(), tc.subject, b, jetstream.WithMsgID(c.ID)); err != nil {
			t.Fatal(err)
		}
		bad = append(bad, c.ID)
	}
	good = append(good, s.publishClicks(t, []string{"a1"}, 10)...)
	rc.waitAll(t, "the valid clicks, live", good, 30*time.Second)
	n0 := len(rc.got())
	if code := api(t, svc.addr, acmeKey, http.MethodPost, "/api/webhooks/endpoints/"+ep.ID+"/replay",
		map[string]string{"from": from.Format(time.RFC3339Nano)}, nil); code != http.StatusAccepted {
		t.Fatalf("replay: status %d", code)
	}
	rc.waitAllFrom(t, "the valid clicks, replayed", n0, good, 30*time.Second)
	testenv.WaitFor(t, 10*time.Second, "an empty backlog", func() bool { return getEndpoint(t, svc.addr, ep.ID).Backlog == 0 })
	got := rc.eventIDs()
	for _, id := range bad {
		if got[id] > 0 {
			t.Errorf("invalid click %s (parked by every reader) was sent %d times", id, got[id])
		}
	}
}

// A replay drops only what it refills: a click live intake queued after the
// replay's cut (here put in the queue directly, with a CLICKS sequence past
// the stream's end, while the endpoint is paused) is still delivered, along
// with the replayed ones.
func TestReplayKeepsWhatIntakeQueuedAfterItsCut(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	svc := s.start(t, s.testConfig("m1"))
	rc := newReceiver(t, nil)
	ep := createEndpoint(t, svc.addr, rc.url(), nil)
	rc.addSecret(ep.Secret)
	base := "/api/webhooks/endpoints/" + ep.ID

	from := time.Now().UTC()
	since := s.publishClicks(t, []string{"a1", "b2"}, 20)
	rc.waitAll(t, "the clicks before the replay", since, 30*time.Second)
	api(t, svc.addr, acmeKey, http.MethodPost, base+"/pause", nil, nil)
	late := events.Click{V: events.ClickVersion, ID: events.NewID(), Time: time.Now().UTC(), Code: "a1",
		Owner: "acme", Target: "https://example.com/", Visitor: "visitor-late", Country: "NL"}
	data, _ := json.Marshal(late)
	store := redisstore.New(s.rdb, 100_000)
	if _, _, err := store.Enqueue(t.Context(), redisstore.DedupNone, 0, map[string][]redisstore.Event{ep.ID: {{
		Seq: 1 << 40, ID: late.ID, Type: "click", Time: late.Time, Data: data,
	}}}); err != nil {
		t.Fatal(err)
	}
	if code := api(t, svc.addr, acmeKey, http.MethodPost, base+"/replay",
		map[string]string{"from": from.Format(time.RFC3339Nano)}, nil); code != http.StatusAccepted {
		t.Fatalf("replay: status %d", code)
	}
	testenv.WaitFor(t, 30*time.Second, "the replay to queue the clicks again", func() bool {
		return getEndpoint(t, svc.addr, ep.ID).Backlog >= int64(len(since))
	})
	// Every click of since reached the receiver before the replay: only
	// what it receives after the resume counts.
	n0 := len(rc.got())
	api(t, svc.addr, acmeKey, http.MethodPost, base+"/resume", nil, nil)
	rc.waitAllFrom(t, "the replayed clicks and the one queued after the cut", n0, append(since, late), 30*time.Second)
}

// hosts resolves names from a table the test changes (DNS that answers
// differently at creation and at delivery).
type hosts struct {
	mu sync.Mutex
	m  map[string]netip.Addr
}

func (h *hosts) set(name, ip string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.m[name] = netip.MustParseAddr(ip)
}

func (h *hosts) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if ip, ok := h.m[host]; ok {
		return []netip.Addr{ip}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// TestSSRFRefusedAtCreationAndAtDelivery: with no allow-list, endpoints at
// internal addresses are refused when created, and a name that resolved
// to a public address at creation and to loopback later is refused when
// delivering, without a request reaching the local receiver.
func TestSSRFRefusedAtCreationAndAtDelivery(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	rc := newReceiver(t, nil)
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(rc.srv.URL, "http://"))
	dns := &hosts{m: map[string]netip.Addr{}}
	dns.set("rebind.example", "93.184.215.14")
	dns.set("internal.example", "10.1.2.3")
	cfg := s.testConfig("m1")
	cfg.AllowCIDRs = nil
	cfg.HTTPHosts = []string{"127.0.0.1", "localhost", "10.0.0.1", "169.254.169.254", "[::1]", "::1", "::127.0.0.1",
		"::ffff:127.0.0.1", "192.168.1.10", "fd00:ec2::254", "rebind.example", "internal.example", "100.100.100.200"}
	cfg.Resolver = dns
	svc := s.start(t, cfg)

	tests := []struct{ name, url string }{
		{"loopback", "http://127.0.0.1:" + port + "/hook"},
		{"loopback_v6", "http://[::1]:" + port + "/hook"},
		{"v4_compatible_loopback", "http://[::127.0.0.1]:" + port + "/hook"},
		{"v4_mapped_loopback", "http://[::ffff:127.0.0.1]:" + port + "/hook"},
		{"private_10", "http://10.0.0.1/hook"},
		{"private_192_168", "http://192.168.1.10/hook"},
		{"link_local_metadata", "http://169.254.169.254/latest/meta-data/"},
		{"aws_metadata_v6", "http://[fd00:ec2::254]/"},
		{"alibaba_metadata", "http://100.100.100.200/"},
		{"name_resolving_to_private", "http://internal.example/hook"},
		{"unknown_name", "http://localhost/hook"},
		{"https_required", "http://example.com/hook"},
		{"credentials", "https://user:pass@example.com/hook"},
		{"not_http", "ftp://example.com/hook"},
	}
	for _, tc := range tests {
		var e webserver.ErrorBody
		code := api(t, svc.addr, acmeKey, http.MethodPost, "/api/webhooks/endpoints",
			map[string]any{"url": tc.url, "event_types": []string{"click"}}, &e)
		if code != http.StatusBadRequest || e.Error.Message == "" || e.Error.Code != "bad_request" {
			t.Errorf("%s: create %s = %d %+v, want 400 bad_request with a message", tc.name, tc.url, code, e.Error)
		}
	}

	// Public at creation, loopback at delivery.
	ep := createEndpoint(t, svc.addr, "http://rebind.example:"+port+"/hook", nil)
	dns.set("rebind.example", "127.0.0.1")
	if code := api(t, svc.addr, acmeKey, http.MethodPost, "/api/webhooks/endpoints/"+ep.ID+"/test", nil, nil); code != http.StatusAccepted {
		t.Fatalf("test event: status %d", code)
	}
	testenv.WaitFor(t, 30*time.Second, "a refused delivery attempt", func() bool {
		for _, d := range deliveries(t, svc.addr, ep.ID) {
			if d.Status == "failed" && strings.Contains(d.Error, "address refused") {
				return true
			}
		}
		return false
	})
	if n, _ := rc.counts(); n != 0 {
		t.Errorf("the local receiver got %d requests, want 0", n)
	}
}

// TestOwnerAPI: authentication, the error envelope, another owner's
// endpoint, pause and resume, a test event, redelivery, delete.
func TestOwnerAPI(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	cfg := s.testConfig("m1")
	cfg.MaxEndpointsPerOwner = 2
	svc := s.start(t, cfg)
	rc := newReceiver(t, nil)
	ep := createEndpoint(t, svc.addr, rc.url(), map[string]any{"links": []string{"a1"}})
	rc.addSecret(ep.Secret)
	base := "/api/webhooks/endpoints/" + ep.ID

	var e webserver.ErrorBody
	for _, tc := range []struct {
		name, key, method, path string
		body                    any
		want                    int
	}{
		{"no_key", "", http.MethodGet, "/api/webhooks/endpoints", nil, http.StatusUnauthorized},
		{"bad_key", "snip_nope", http.MethodGet, "/api/webhooks/endpoints", nil, http.StatusUnauthorized},
		{"other_owners_endpoint", otherKey, http.MethodGet, base, nil, http.StatusNotFound},
		{"other_owner_cannot_delete", otherKey, http.MethodDelete, base, nil, http.StatusNotFound},
		{"unknown_event_type", acmeKey, http.MethodPost, "/api/webhooks/endpoints", map[string]any{"url": rc.url(), "event_types": []string{"purchase"}}, http.StatusBadRequest},
		{"unknown_field", acmeKey, http.MethodPost, "/api/webhooks/endpoints", map[string]any{"url": rc.url(), "event_types": []string{"click"}, "colour": "red"}, http.StatusBadRequest},
		{"batch_too_big", acmeKey, http.MethodPost, "/api/webhooks/endpoints", map[string]any{"url": rc.url(), "event_types": []string{"click"}, "batch_max": 5000}, http.StatusBadRequest},
		{"bad_replay_time", acmeKey, http.MethodPost, base + "/replay", map[string]any{"from": "yesterday"}, http.StatusBadRequest},
		{"unknown_delivery", acmeKey, http.MethodPost, base + "/deliveries/nope/redeliver", nil, http.StatusNotFound},
		{"second_endpoint", acmeKey, http.MethodPost, "/api/webhooks/endpoints", map[string]any{"url": rc.url() + "2", "event_types": []string{"fraud_alert"}}, http.StatusCreated},
		{"too_many_endpoints", acmeKey, http.MethodPost, "/api/webhooks/endpoints", map[string]any{"url": rc.url() + "3", "event_types": []string{"click"}}, http.StatusBadRequest},
	} {
		e = webserver.ErrorBody{}
		if code := api(t, svc.addr, tc.key, tc.method, tc.path, tc.body, &e); code != tc.want || (code >= 400) != (e.Error.Message != "") || (code >= 400) != (e.Error.Code != "") {
			t.Errorf("%s: %s %s = %d %+v, want %d with an error code and message", tc.name, tc.method, tc.path, code, e.Error, tc.want)
		}
	}

	// Paused: events queue (only link a1's), nothing is sent; resumed: all arrive.
	api(t, svc.addr, acmeKey, http.MethodPost, base+"/pause", nil, nil)
	if st := getEndpoint(t, svc.addr, ep.ID); st.Status != "paused" {
		t.Fatalf("status after pause %q", st.Status)
	}
	clicks := s.publishClicks(t, []string{"a1", "zz"}, 20)
	testenv.WaitFor(t, 30*time.Second, "10 clicks of link a1 queued while paused", func() bool { return getEndpoint(t, svc.addr, ep.ID).Backlog == 10 })
	if n, _ := rc.counts(); n != 0 {
		t.Fatalf("paused endpoint got %d requests", n)
	}
	api(t, svc.addr, acmeKey, http.MethodPost, base+"/resume", nil, nil)
	var a1 []events.Click
	for _, c := range clicks {
		if c.Code == "a1" {
			a1 = append(a1, c)
		}
	}
	rc.waitAll(t, "the queued clicks after resume", a1, 30*time.Second)
	if ids := rc.eventIDs(); len(ids) != len(a1) {
		t.Errorf("got %d distinct events, want the %d of link a1 (the link filter)", len(ids), len(a1))
	}

	// A test event, then its redelivery with the same webhook-id.
	var test struct {
		EventID string `json:"event_id"`
	}
	api(t, svc.addr, acmeKey, http.MethodPost, base+"/test", nil, &test)
	testenv.WaitFor(t, 30*time.Second, "the test event", func() bool { return rc.eventIDs()[test.EventID] == 1 })
	// The receiver counts the request when it arrives; the service records
	// the delivery after the response, so the record may come a moment later.
	var testDelivery redisstore.Delivery
	testenv.WaitFor(t, 30*time.Second, "a delivered record of the test event", func() bool {
		for _, d := range deliveries(t, svc.addr, ep.ID) {
			if slices.Equal(d.EventIDs, []string{test.EventID}) && d.Status == "delivered" {
				testDelivery = d
				return true
			}
		}
		return false
	})
	var again redisstore.Delivery
	if code := api(t, svc.addr, acmeKey, http.MethodPost, base+"/deliveries/"+testDelivery.ID+"/redeliver", nil, &again); code != http.StatusOK || again.Status != "delivered" {
		t.Fatalf("redeliver: %d %+v", code, again)
	}
	if n := rc.eventIDs()[test.EventID]; n != 2 {
		t.Errorf("test event received %d times after redelivery, want 2", n)
	}
	for _, r := range rc.got() {
		if slices.ContainsFunc(r.events, func(e delivery.BodyEvent) bool { return e.ID == test.EventID }) && r.webhookID != testDelivery.WebhookID {
			t.Errorf("the test event was sent with webhook-id %q, want %q both times (a redelivery keeps it)", r.webhookID, testDelivery.WebhookID)
		}
	}
	if _, bad := rc.counts(); bad != 0 {
		t.Errorf("%d requests did not verify", bad)
	}

	if code := api(t, svc.addr, acmeKey, http.MethodDelete, base, nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete: status %d", code)
	}
	if code := api(t, svc.addr, acmeKey, http.MethodGet, base, nil, nil); code != http.StatusNotFound {
		t.Errorf("get after delete: status %d, want 404", code)
	}
}

// TestRetryAfterIsHonouredAndAFailingEndpointIsDisabled: 429 with
// Retry-After: 1 spaces the attempts by a second (the schedule says 100ms),
// and after DisableAfter the endpoint is disabled and the owner is told on
// webhooks.disabled.<owner>.
func TestRetryAfterIsHonouredAndAFailingEndpointIsDisabled(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	cfg := s.testConfig("m1")
	cfg.DisableAfter = 2500 * time.Millisecond
	cfg.RetrySchedule = []time.Duration{100 * time.Millisecond, 5 * time.Second}
	svc := s.start(t, cfg)
	nc := s.nats.Connect(t)
	told := make(chan *nats.Msg, 4)
	sub, err := nc.ChanSubscribe(topology.WebhooksDisabledSubjectPrefix+"acme", told)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	rc := newReceiver(t, func(w http.ResponseWriter, _ *http.Request) bool {
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
		return false
	})
	ep := createEndpoint(t, svc.addr, rc.url(), nil)
	s.publishClicks(t, []string{"a1"}, 1)

	select {
	case m := <-told:
		var ev struct {
			Endpoint string `json:"endpoint"`
			Reason   string `json:"reason"`
		}
		if err := json.Unmarshal(m.Data, &ev); err != nil || ev.Endpoint != ep.ID || ev.Reason == "" {
			t.Errorf("disabled event %s: %v", m.Data, err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no disabled event within 30s")
	}
	st := getEndpoint(t, svc.addr, ep.ID)
	if st.Status != "disabled" || !strings.Contains(st.LastError, "429") {
		t.Errorf("endpoint %+v, want disabled after HTTP 429s", st)
	}
	ds := deliveries(t, svc.addr, ep.ID)
	if len(ds) < 2 {
		t.Fatalf("%d attempts, want at least 2", len(ds))
	}
	for i := 0; i+1 < len(ds); i++ { // newest first
		if gap := ds[i].Time.Sub(ds[i+1].Time); gap < 900*time.Millisecond {
			t.Errorf("attempts %d and %d %s apart, want >= Retry-After (1s)", ds[i+1].Attempt, ds[i].Attempt, gap)
		}
	}
	// Resume re-enables it.
	api(t, svc.addr, acmeKey, http.MethodPost, "/api/webhooks/endpoints/"+ep.ID+"/resume", nil, nil)
	if st := getEndpoint(t, svc.addr, ep.ID); st.Status != "active" {
		t.Errorf("status after resume %q, want active", st.Status)
	}
}

// TestARetryAfterBeyondWhatADurationHoldsWaitsTheLongestWait: a receiver
// answering garbage, a 503 whose Retry-After has more seconds than a
// time.Duration holds (18446744074), was tried again 290 ms later: the
// seconds, multiplied by a second, wrapped around, and a receiver could so
// have its batch sent again in a loop (each attempt a delivery record and
// a failure written to Redis). Such a Retry-After is the longest the
// service allows, the schedule's longest wait (here 3 s, without jitter).
func TestARetryAfterBeyondWhatADurationHoldsWaitsTheLongestWait(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	cfg := s.testConfig("m1")
	cfg.RetrySchedule = []time.Duration{100 * time.Millisecond, 3 * time.Second}
	cfg.RetryJitter = 0
	svc := s.start(t, cfg)
	rc := newReceiver(t, func(w http.ResponseWriter, _ *http.Request) bool {
		w.Header().Set("Retry-After", "18446744074")
		w.WriteHeader(http.StatusServiceUnavailable)
		return false
	})
	ep := createEndpoint(t, svc.addr, rc.url(), nil)
	s.publishClicks(t, []string{"a1"}, 1)
	var ds []redisstore.Delivery
	testenv.WaitFor(t, 20*time.Second, "two attempts", func() bool {
		ds = deliveries(t, svc.addr, ep.ID)
		return len(ds) >= 2
	})
	if gap := ds[len(ds)-2].Time.Sub(ds[len(ds)-1].Time); gap < 2900*time.Millisecond { // newest first
		t.Errorf("the second attempt came %s after the first, want the schedule's longest wait (3s)", gap)
	}
}

// TestResumeSendsAtOnceAfterALongRetryWait: an endpoint disabled while its
// next try is an hour away is tried at once when its owner resumes it.
func TestResumeSendsAtOnceAfterALongRetryWait(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	cfg := s.testConfig("m1")
	cfg.DisableAfter = 50 * time.Millisecond
	cfg.RetrySchedule = []time.Duration{100 * time.Millisecond, time.Hour}
	cfg.RetryJitter = 0
	svc := s.start(t, cfg)
	var up atomic.Bool
	rc := newReceiver(t, func(w http.ResponseWriter, _ *http.Request) bool {
		if up.Load() {
			return true
		}
		w.WriteHeader(http.StatusInternalServerError)
		return false
	})
	ep := createEndpoint(t, svc.addr, rc.url(), nil)
	rc.addSecret(ep.Secret)
	clicks := s.publishClicks(t, []string{"a1"}, 3)
	testenv.WaitFor(t, 30*time.Second, "the endpoint disabled", func() bool { return getEndpoint(t, svc.addr, ep.ID).Status == "disabled" })
	up.Store(true)
	if code := api(t, svc.addr, acmeKey, http.MethodPost, "/api/webhooks/endpoints/"+ep.ID+"/resume", nil, nil); code != http.StatusOK {
		t.Fatalf("resume: status %d", code)
	}
	rc.waitAll(t, "the queued clicks right after resume (the next scheduled try was an hour away)", clicks, 20*time.Second)
	if st := getEndpoint(t, svc.addr, ep.ID); st.Status != "active" || !st.FailingSince.IsZero() {
		t.Errorf("after delivery: %+v, want active and not failing", st)
	}
}

// TestAResumeDuringAFailingAttemptIsNotUndone: the owner resumes a failing
// endpoint (which clears its failing run) while its sender's next attempt is
// on the wire, and that attempt fails too. The failure starts a new run, so
// the endpoint is not disabled, and its next try delivers. The sender wrote
// back the run it had read before the resume, older than DisableAfter, and
// disabled the endpoint its owner had just resumed.
func TestAResumeDuringAFailingAttemptIsNotUndone(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	cfg := s.testConfig("m1")
	cfg.DisableAfter = 50 * time.Millisecond // a run's second failure, 100ms on, disables
	cfg.RetrySchedule = []time.Duration{100 * time.Millisecond}
	cfg.RetryJitter = 0
	cfg.Timeout = 30 * time.Second // the held attempt is not timed out
	svc := s.start(t, cfg)
	var requests atomic.Int32
	onWire, release := make(chan struct{}), make(chan struct{})
	rc := newReceiver(t, func(w http.ResponseWriter, _ *http.Request) bool {
		switch requests.Add(1) {
		case 1:
		case 2: // held until the owner resumed the endpoint
			close(onWire)
			<-release
		default:
			return true
		}
		w.WriteHeader(http.StatusInternalServerError)
		return false
	})
	ep := createEndpoint(t, svc.addr, rc.url(), nil)
	rc.addSecret(ep.Secret)
	clicks := s.publishClicks(t, []string{"a1"}, 1)
	select {
	case <-onWire:
	case <-time.After(30 * time.Second):
		close(release)
		t.Fatal("no second attempt within 30s")
	}
	code := api(t, svc.addr, acmeKey, http.MethodPost, "/api/webhooks/endpoints/"+ep.ID+"/resume", nil, nil)
	close(release)
	if code != http.StatusOK {
		t.Fatalf("resume: status %d", code)
	}
	testenv.WaitFor(t, 30*time.Second, "the click delivered, or the endpoint disabled", func() bool {
		return len(rc.got()) > 0 || getEndpoint(t, svc.addr, ep.ID).Status == "disabled"
	})
	if st := getEndpoint(t, svc.addr, ep.ID); st.Status != "active" {
		t.Errorf("endpoint %+v after a failure that followed its resume, want active", st)
	}
	rc.waitAll(t, "the click", clicks, 20*time.Second)
}

// TestFraudAlertsReachTheirOwnersEndpointsOnce: an alert goes to its owner's
// fraud_alert endpoints only, unaltered, and an alert published again (as
// a redelivery would hand it) is not sent twice.
func TestFraudAlertsReachTheirOwnersEndpointsOnce(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	svc := s.start(t, s.testConfig("m1"))
	alerts := newReceiver(t, nil)
	clicksOnly := newReceiver(t, nil)
	ep := createEndpoint(t, svc.addr, alerts.url(), map[string]any{"event_types": []string{"fraud_alert"}})
	alerts.addSecret(ep.Secret)
	clicksOnly.addSecret(createEndpoint(t, svc.addr, clicksOnly.url(), nil).Secret)

	publish := func(owner, id string) events.FraudAlert {
		now := time.Now().UTC()
		a := events.FraudAlert{V: events.FraudVersion, ID: id, Rule: "visitor_burst", Code: "a1", Owner: owner,
			WindowStart: now.Add(-time.Minute), WindowEnd: now, Count: 50, Threshold: 20, Time: now}
		b, err := json.Marshal(a)
		if err != nil {
			t.Fatal(err)
		}
		// A fresh Nats-Msg-Id each time: the stream stores every copy, as it
		// would a republish after its duplicate window.
		if _, err := s.js.Publish(t.Context(), events.FraudAlertSubject(a.Code), b, jetstream.WithMsgID(events.NewID())); err != nil {
			t.Fatal(err)
		}
		return a
	}
	from := time.Now().UTC()
	mine := publish("acme", "visitor_burst:a1:k1:1")
	publish("other", "visitor_burst:a1:k2:1")
	publish("acme", mine.ID) // the same alert again
	last := publish("acme", "visitor_burst:a1:k3:1")
	testenv.WaitFor(t, 30*time.Second, "acme's alerts", func() bool {
		ids := alerts.eventIDs()
		return ids[mine.ID] > 0 && ids[last.ID] > 0
	})
	ids := alerts.eventIDs()
	if len(ids) != 2 || ids[mine.ID] != 1 {
		t.Errorf("received %v, want acme's two alerts once each", ids)
	}
	sent := map[string]events.FraudAlert{mine.ID: mine, last.ID: last}
	for _, r := range alerts.got() {
		for _, e := range r.events {
			var a events.FraudAlert
			if err := json.Unmarshal(e.Data, &a); err != nil || e.Type != "fraud_alert" {
				t.Errorf("event %s type %s data %s: %v", e.ID, e.Type, e.Data, err)
			}
			if d := cmp.Diff(sent[e.ID], a); d != "" {
				t.Errorf("alert %s as delivered (-published +received):\n%s", e.ID, d)
			}
		}
	}
	if n, _ := clicksOnly.counts(); n != 0 {
		t.Errorf("a click-only endpoint got %d requests", n)
	}

	// A replay sends acme's alerts again, once each (the first is in FRAUD
	// twice).
	testenv.WaitFor(t, 10*time.Second, "an empty backlog", func() bool { return getEndpoint(t, svc.addr, ep.ID).Backlog == 0 })
	n0 := len(alerts.got())
	if code := api(t, svc.addr, acmeKey, http.MethodPost, "/api/webhooks/endpoints/"+ep.ID+"/replay",
		map[string]string{"from": from.Format(time.RFC3339Nano)}, nil); code != http.StatusAccepted {
		t.Fatalf("replay: status %d", code)
	}
	replayed := map[string]int{}
	testenv.WaitFor(t, 30*time.Second, "the replayed alerts", func() bool {
		replayed = map[string]int{}
		for _, r := range alerts.got()[n0:] {
			for _, e := range r.events {
				replayed[e.ID]++
			}
		}
		return replayed[mine.ID] > 0 && replayed[last.ID] > 0 && getEndpoint(t, svc.addr, ep.ID).Backlog == 0
	})
	if diff := cmp.Diff(map[string]int{mine.ID: 1, last.ID: 1}, replayed); diff != "" {
		t.Errorf("replayed alerts (-want +got):\n%s", diff)
	}
}

// TestTwoInstancesShareEndpointsAndTakeOver: two instances share the
// endpoints by lease (whichever takes an endpoint's lease first sends to
// it); when the one holding the most of them stops (so at least one:
// stopping an instance that held none would take nothing over), the other
// takes its leases and delivers to every endpoint.
func TestTwoInstancesShareEndpointsAndTakeOver(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	members := map[string]*instance{"m1": s.start(t, s.testConfig("m1")), "m2": s.start(t, s.testConfig("m2"))}
	var rcs []*receiver
	var ids []string
	for range 4 {
		rc := newReceiver(t, nil)
		ep := createEndpoint(t, members["m1"].addr, rc.url(), nil)
		rc.addSecret(ep.Secret)
		rcs = append(rcs, rc)
		ids = append(ids, ep.ID)
	}
	first := s.publishClicks(t, []string{"a1", "b2", "c3"}, 30)
	for i, rc := range rcs {
		rc.waitAll(t, fmt.Sprintf("endpoint %d, both instances up", i), first, 30*time.Second)
	}
	// Every endpoint was delivered to, so its sender holds its lease.
	holders := s.leaseHolders(t, ids)
	held := map[string]int{}
	for _, m := range holders {
		held[m]++
	}
	t.Logf("leases with both instances up: %v", holders)
	stopped, survivor := "m1", "m2"
	if held["m2"] > held["m1"] {
		stopped, survivor = "m2", "m1"
	}
	if held[stopped] == 0 {
		t.Fatalf("leases %v: neither instance holds one, nothing to take over", holders)
	}
	members[stopped].stop(t)
	second := s.publishClicks(t, []string{"a1", "b2", "c3"}, 30)
	for i, rc := range rcs {
		rc.waitAll(t, fmt.Sprintf("endpoint %d after %s stopped", i, stopped), second, 30*time.Second)
		if _, bad := rc.counts(); bad != 0 {
			t.Errorf("endpoint %d: %d requests did not verify", i, bad)
		}
	}
	for id, m := range s.leaseHolders(t, ids) {
		if m != survivor {
			t.Errorf("endpoint %s: lease held by %q after %s stopped, want %s", id, m, stopped, survivor)
		}
	}
}

// leaseHolders returns the member holding each endpoint's lease ("" for
// none), as redisstore keeps it: the lease holds its sender's token,
// "<member>/<random>".
func (s *system) leaseHolders(tb testing.TB, ids []string) map[string]string {
	tb.Helper()
	out := map[string]string{}
	for _, id := range ids {
		token, err := s.rdb.Get(tb.Context(), "snip:wh:{"+id+"}:lease").Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			tb.Fatal(err)
		}
		if i := strings.LastIndexByte(token, '/'); i >= 0 {
			token = token[:i]
		}
		out[id] = token
	}
	return out
}

// TestRedirectsAreNotFollowedAndResponsesAreCapped: a 3xx is a failed
// attempt (the target it names gets nothing), a large response body is
// kept only in part, and the per-endpoint metrics count both.
func TestRedirectsAreNotFollowedAndResponsesAreCapped(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	svc := s.start(t, s.testConfig("m1"))
	target := newReceiver(t, nil)
	redirecting := newReceiver(t, func(w http.ResponseWriter, r *http.Request) bool {
		http.Redirect(w, r, target.url(), http.StatusTemporaryRedirect)
		return false
	})
	chatty := newReceiver(t, func(w http.ResponseWriter, _ *http.Request) bool {
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(bytes.Repeat([]byte("x"), 1<<20))
		return false
	})
	redirEP := createEndpoint(t, svc.addr, redirecting.url(), nil)
	target.addSecret(redirEP.Secret)
	chattyEP := createEndpoint(t, svc.addr, chatty.url(), nil)
	s.publishClicks(t, []string{"a1"}, 1)

	testenv.WaitFor(t, 30*time.Second, "a failed attempt at the redirecting endpoint", func() bool {
		for _, d := range deliveries(t, svc.addr, redirEP.ID) {
			if d.Status == "failed" && d.Code == http.StatusTemporaryRedirect && strings.Contains(d.Error, "redirect not followed") {
				return true
			}
		}
		return false
	})
	if n, _ := target.counts(); n != 0 {
		t.Errorf("the redirect's target got %d requests, want 0", n)
	}
	var d redisstore.Delivery
	testenv.WaitFor(t, 30*time.Second, "a delivery to the chatty endpoint", func() bool {
		ds := deliveries(t, svc.addr, chattyEP.ID)
		if len(ds) == 0 {
			return false
		}
		d = ds[0]
		return true
	})
	if d.Status != "delivered" || len(d.Response) != 512 {
		t.Errorf("delivery %s with %d response bytes kept, want delivered with 512", d.Status, len(d.Response))
	}
	wants := []string{
		`snip_webhooks_delivered_events_total{endpoint="` + chattyEP.ID + `"} 1`,
		`snip_webhooks_failed_attempts_total{endpoint="` + redirEP.ID + `"}`,
		`snip_webhooks_backlog_events{endpoint="` + redirEP.ID + `"} 1`,
		`snip_webhooks_oldest_undelivered_age_seconds{endpoint="` + redirEP.ID + `"}`,
	}
	testenv.WaitFor(t, 30*time.Second, "the per-endpoint metrics", func() bool {
		_, b := getMetrics(t, svc.addr)
		for _, want := range wants {
			if !strings.Contains(b, want) {
				return false
			}
		}
		return true
	})
}

// TestDeletedEndpointsLeaveNoMetricSeries: the per-endpoint series
// (queued, delivered, the latency histogram, the gauges) go when the
// endpoint is deleted, on every instance, the one sending for it or not:
// an owner who creates, uses and deletes endpoints in a loop (each a new
// ID) would otherwise grow every instance's registry, and its scrape,
// without bound.
func TestDeletedEndpointsLeaveNoMetricSeries(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	members := []*instance{s.start(t, s.testConfig("m1")), s.start(t, s.testConfig("m2"))}
	rc := newReceiver(t, nil)
	ep := createEndpoint(t, members[0].addr, rc.url(), nil)
	rc.addSecret(ep.Secret)
	base := "/api/webhooks/endpoints/" + ep.ID
	series := `{endpoint="` + ep.ID + `"}`
	for i, m := range members {
		var test struct {
			EventID string `json:"event_id"`
		}
		if code := api(t, m.addr, acmeKey, http.MethodPost, base+"/test", nil, &test); code != http.StatusAccepted {
			t.Fatalf("test event through m%d: status %d", i+1, code)
		}
		testenv.WaitFor(t, 30*time.Second, "the test event queued through m"+strconv.Itoa(i+1), func() bool { return rc.eventIDs()[test.EventID] == 1 })
	}
	// Each instance counted the event it queued; the one sending counted
	// the deliveries too.
	testenv.WaitFor(t, 30*time.Second, "every instance's series of the endpoint", func() bool {
		delivered := false
		for _, m := range members {
			_, b := getMetrics(t, m.addr)
			if !strings.Contains(b, "snip_webhooks_queued_events_total"+series) {
				return false
			}
			delivered = delivered || strings.Contains(b, "snip_webhooks_delivered_events_total"+series)
		}
		return delivered
	})
	if code := api(t, members[0].addr, acmeKey, http.MethodDelete, base, nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete: status %d", code)
	}
	var left []string
	if !testenv.Poll(10*time.Second, func() bool {
		left = nil
		for i, m := range members {
			_, b := getMetrics(t, m.addr)
			for _, line := range strings.Split(b, "\n") {
				if strings.Contains(line, `endpoint="`+ep.ID+`"`) {
					left = append(left, fmt.Sprintf("m%d: %s", i+1, line))
				}
			}
		}
		return len(left) == 0
	}) {
		t.Errorf("series of the deleted endpoint still exported 10s after the delete:\n%s", strings.Join(left, "\n"))
	}
}

// TestConcurrentCreatesKeepTheOwnersLimit: an owner's endpoints are
// bounded (each has a queue and a sender) however the creates arrive; many
// at once, through two instances, may not each see room and all be stored.
func TestConcurrentCreatesKeepTheOwnersLimit(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	cfg := s.testConfig("m1")
	members := []*instance{s.start(t, cfg), s.start(t, s.testConfig("m2"))}
	rc := newReceiver(t, nil)
	const tries = 40
	codes := make([]int, tries)
	var wg sync.WaitGroup
	for i := range tries {
		wg.Go(func() {
			body := `{"url":"` + rc.url() + `","event_types":["click"]}`
			req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+members[i%2].addr+"/api/webhooks/endpoints", strings.NewReader(body))
			if err != nil {
				t.Error(err)
				return
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+acmeKey)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			_ = resp.Body.Close()
			codes[i] = resp.StatusCode
		})
	}
	wg.Wait()
	created := 0
	for _, c := range codes {
		switch c {
		case http.StatusCreated:
			created++
		case http.StatusBadRequest:
		default:
			t.Errorf("create: status %d, want 201 or 400 (at the limit)", c)
		}
	}
	var list struct {
		Endpoints []endpointStatus `json:"endpoints"`
	}
	api(t, members[0].addr, acmeKey, http.MethodGet, "/api/webhooks/endpoints", nil, &list)
	if created != cfg.MaxEndpointsPerOwner || len(list.Endpoints) != cfg.MaxEndpointsPerOwner {
		t.Errorf("%d concurrent creates: %d answered 201, %d stored; want %d (WEBHOOKS_MAX_ENDPOINTS_PER_OWNER)",
			tries, created, len(list.Endpoints), cfg.MaxEndpointsPerOwner)
	}
}

func getMetrics(t *testing.T, addr string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The replica wait is off by default; on, its timeout is bounded.
func TestConfigReplicaWait(t *testing.T) {
	t.Parallel()
	cfg, err := loadConfig(nil, nil)
	if err != nil || cfg.WaitReplicas != 0 {
		t.Fatalf("defaults: WaitReplicas %d, %v; want 0 (off)", cfg.WaitReplicas, err)
	}
	cfg, err = loadConfig([]string{"WEBHOOKS_WAIT_REPLICAS=1", "WEBHOOKS_WAIT_REPLICAS_TIMEOUT=250ms"}, nil)
	if err != nil || cfg.WaitReplicas != 1 || cfg.WaitReplicasTimeout != 250*time.Millisecond {
		t.Fatalf("on: %d, %s, %v", cfg.WaitReplicas, cfg.WaitReplicasTimeout, err)
	}
	for _, env := range [][]string{{"WEBHOOKS_WAIT_REPLICAS=-1"}, {"WEBHOOKS_WAIT_REPLICAS=1", "WEBHOOKS_WAIT_REPLICAS_TIMEOUT=0s"}} {
		if _, err := loadConfig(env, nil); err == nil || !strings.Contains(err.Error(), "WEBHOOKS_WAIT_REPLICAS") {
			t.Errorf("loadConfig(%v) = %v, want an error naming WEBHOOKS_WAIT_REPLICAS", env, err)
		}
	}
}

// A negative rotation overlap would act as 0, the old secret never signing
// again: it is refused at load, by name; 0 is allowed.
func TestConfigRotationOverlap(t *testing.T) {
	t.Parallel()
	cfg, err := loadConfig([]string{"WEBHOOKS_ROTATION_OVERLAP=0s"}, nil)
	if err != nil || cfg.RotationOverlap != 0 {
		t.Fatalf("0s: %s, %v; want 0 accepted", cfg.RotationOverlap, err)
	}
	if _, err := loadConfig([]string{"WEBHOOKS_ROTATION_OVERLAP=-1h"}, nil); err == nil || !strings.Contains(err.Error(), "WEBHOOKS_ROTATION_OVERLAP") {
		t.Errorf("-1h: %v, want an error naming WEBHOOKS_ROTATION_OVERLAP", err)
	}
}

// TestTheAPIAnswersAnEndpointInTheUnitsACreateTakes: a create, a GET and
// the list answer the batch wait as batch_wait_ms, as a create takes it;
// the secret only in the create's answer; and none of the service's
// bookkeeping (the replay cuts, the replay generation).
func TestTheAPIAnswersAnEndpointInTheUnitsACreateTakes(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	svc := s.start(t, s.testConfig("m1"))
	rc := newReceiver(t, nil)
	req := map[string]any{"url": rc.url(), "event_types": []string{"click"}, "batch_max": 7, "batch_wait_ms": 250}
	var made map[string]any
	if code := api(t, svc.addr, acmeKey, http.MethodPost, "/api/webhooks/endpoints", req, &made); code != http.StatusCreated {
		t.Fatalf("create: status %d", code)
	}
	id, _ := made["id"].(string)
	// A replay moves the cuts and the generation: they are set, and still
	// not answered.
	if code := api(t, svc.addr, acmeKey, http.MethodPost, "/api/webhooks/endpoints/"+id+"/replay", map[string]any{"from": time.Now().Add(-time.Minute).UTC().Format(time.RFC3339Nano)}, nil); code != http.StatusAccepted {
		t.Fatalf("replay: status %d", code)
	}
	var one map[string]any
	testenv.WaitFor(t, 30*time.Second, "the replay done", func() bool {
		one = nil
		api(t, svc.addr, acmeKey, http.MethodGet, "/api/webhooks/endpoints/"+id, nil, &one)
		r, _ := one["replay"].(map[string]any)
		return r["state"] == "done"
	})
	var list struct {
		Endpoints []map[string]any `json:"endpoints"`
	}
	api(t, svc.addr, acmeKey, http.MethodGet, "/api/webhooks/endpoints", nil, &list)
	if len(list.Endpoints) != 1 {
		t.Fatalf("list: %d endpoints, want 1", len(list.Endpoints))
	}
	for _, tc := range []struct {
		name   string
		got    map[string]any
		secret bool
	}{{"create", made, true}, {"get", one, false}, {"list", list.Endpoints[0], false}} {
		if got := tc.got["batch_wait_ms"]; got != 250.0 {
			t.Errorf("%s: batch_wait_ms %v, want 250 (as created)", tc.name, got)
		}
		if got := tc.got["batch_max"]; got != 7.0 {
			t.Errorf("%s: batch_max %v, want 7", tc.name, got)
		}
		if s, _ := tc.got["secret"].(string); tc.secret != strings.HasPrefix(s, "whsec_") {
			t.Errorf("%s: secret %q, want one: %v", tc.name, s, tc.secret)
		}
		for _, k := range []string{"batch_wait", "replay_clicks_upto", "replay_alerts_upto", "generation"} {
			if v, ok := tc.got[k]; ok {
				t.Errorf("%s: answers %s: %v, want it left out", tc.name, k, v)
			}
		}
		if !tc.secret {
			if _, ok := tc.got["secret"]; ok {
				t.Errorf("%s: answers an empty secret, want it left out", tc.name)
			}
		}
	}
}
