package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/pkg/webserver"
)

// groupFilters returns the filter subjects of each of the webhooks group's
// partition consumers.
func (s *system) groupFilters(tb testing.TB) [][]string {
	tb.Helper()
	out := make([][]string, testPartitions)
	for p := range testPartitions {
		c, err := s.js.Consumer(tb.Context(), events.ClicksStream, topology.GroupConsumerName(topology.GroupWebhooks, p))
		if err != nil {
			tb.Fatal(err)
		}
		cfg := c.CachedInfo().Config
		out[p] = cfg.FilterSubjects
		if cfg.FilterSubject != "" {
			out[p] = []string{cfg.FilterSubject}
		}
	}
	return out
}

// waitFilters waits until every partition's consumer reads exactly what
// want(p) says.
func (s *system) waitFilters(tb testing.TB, what string, want func(p int) []string) {
	tb.Helper()
	testenv.WaitFor(tb, 30*time.Second, what, func() bool {
		for p, f := range s.groupFilters(tb) {
			if !slices.Equal(f, want(p)) {
				return false
			}
		}
		return true
	})
}

// groupPending is how many clicks the server would send the webhooks group
// now (each consumer's NumPending, counted with its filters) and how many
// it sent that are not acked yet.
func (s *system) groupPending(tb testing.TB) (pending, unacked uint64) {
	pending, unacked, _ = s.groupCounts(tb)
	return pending, unacked
}

// groupCounts is groupPending and the deliveries the group's consumers made.
func (s *system) groupCounts(tb testing.TB) (pending, unacked, delivered uint64) {
	tb.Helper()
	for p := range testPartitions {
		c, err := s.js.Consumer(tb.Context(), events.ClicksStream, topology.GroupConsumerName(topology.GroupWebhooks, p))
		if err != nil {
			tb.Fatal(err)
		}
		info := c.CachedInfo()
		pending += info.NumPending
		unacked += uint64(info.NumAckPending)
		delivered += info.Delivered.Consumer
	}
	return pending, unacked, delivered
}

// clickProbe creates a consumer that reads every click stored from now on,
// and returns a function that waits until the server has counted n of them
// for it. The server counts a stored click for each consumer whose filter
// matches it a moment after it acks the publish, click after click, for all
// those consumers at once: once the probe has counted the n clicks published
// since, every other consumer that any of them matched counts it too: as
// pending, or as delivered once sent.
func (s *system) clickProbe(tb testing.TB) (counted func(n uint64)) {
	tb.Helper()
	c, err := s.js.CreateConsumer(tb.Context(), events.ClicksStream, jetstream.ConsumerConfig{
		DeliverPolicy: jetstream.DeliverNewPolicy, AckPolicy: jetstream.AckNonePolicy, InactiveThreshold: time.Minute,
	})
	if err != nil {
		tb.Fatal(err)
	}
	return func(n uint64) {
		tb.Helper()
		testenv.WaitFor(tb, 30*time.Second, fmt.Sprintf("the server counting the %d clicks published for its consumers", n), func() bool {
			info, err := c.Info(tb.Context())
			if err != nil {
				tb.Fatal(err)
			}
			return info.NumPending == n
		})
		if err := s.js.DeleteConsumer(tb.Context(), events.ClicksStream, c.CachedInfo().Name); err != nil {
			tb.Fatal(err)
		}
	}
}

// TestTheGroupIsSentOnlyClicksSomeEndpointWants: with no click endpoint the
// server sends the webhooks group nothing, however many clicks there are;
// an endpoint gets every click stored after its create call answered (the
// call widens the consumers first); clicks of owners without endpoints are
// never sent; a deleted endpoint's owner is dropped again.
func TestTheGroupIsSentOnlyClicksSomeEndpointWants(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	svc := s.start(t, s.testConfig("m1"))
	nothing := func(p int) []string { return []string{topology.NoClicksFilter(p)} }
	s.waitFilters(t, "every consumer narrowed to nothing", nothing)

	counted := s.clickProbe(t)
	before := s.publishClicks(t, []string{"a1", "b2", "c3"}, 30)
	// Read the group's counts once the server has counted these clicks:
	// read right after the publishes, its pending count can still be 0 for
	// a group that would be sent them all. What it was sent already counts
	// too: its members pull all the time.
	counted(uint64(len(before)))
	if n, u, d := s.groupCounts(t); n+d != 0 {
		t.Fatalf("with no endpoint the server would send the group %d clicks and sent it %d (%d not acked), want none", n, d, u)
	}

	rc := newReceiver(t, nil)
	ep := createEndpoint(t, svc.addr, rc.url(), nil)
	rc.addSecret(ep.Secret)
	// No waiting: the answer promised every click stored from now on.
	acme := s.publishClicks(t, []string{"a1", "b2", "c3"}, 40)
	rc.waitAll(t, "every acme click published after the create call answered", acme, 30*time.Second)
	checkUnaltered(t, rc, acme)
	// The consumers had not passed acme's earlier clicks (they were sent
	// none), so the server sends those too; the intake skips them.
	testenv.WaitFor(t, 30*time.Second, "the group done with every click it was sent", func() bool {
		n, u := s.groupPending(t)
		return n == 0 && u == 0
	})
	got := rc.eventIDs()
	for _, c := range before {
		if got[c.ID] > 0 {
			t.Errorf("click %s, stored before the endpoint was created, was delivered", c.ID)
		}
	}
	if len(got) != len(acme) {
		t.Errorf("the endpoint got %d distinct events, want the %d published after it was created", len(got), len(acme))
	}
	for p, f := range s.groupFilters(t) {
		if !slices.Equal(f, []string{fmt.Sprintf("%d.clicks.acme.>", p)}) {
			t.Errorf("partition %d reads %q, want acme's clicks only", p, f)
		}
	}
	// Another owner's clicks are not sent to the group at all: with them
	// and five more of acme's stored, the group is sent five.
	_, _, sent := s.groupCounts(t)
	s.publishOwnerClicks(t, "other", []string{"o1", "o2", "o3"}, 25)
	more := s.publishClicks(t, []string{"a1", "b2"}, 5)
	rc.waitAll(t, "acme's clicks after another owner's", more, 30*time.Second)
	testenv.WaitFor(t, 30*time.Second, "the group done again", func() bool {
		n, u := s.groupPending(t)
		return n == 0 && u == 0
	})
	if _, _, now := s.groupCounts(t); now-sent != uint64(len(more)) {
		t.Errorf("the group was sent %d clicks after another owner's 25 and acme's %d, want %d", now-sent, len(more), len(more))
	}

	if code := api(t, svc.addr, acmeKey, http.MethodDelete, "/api/webhooks/endpoints/"+ep.ID, nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete endpoint: %d", code)
	}
	s.waitFilters(t, "every consumer narrowed to nothing again after the delete", nothing)
}

// TestCreateAnswers503AndStoresNothingWhenTheGroupCannotBeWidened: with NATS
// down the create call cannot make the group read the endpoint's clicks, so
// it stores nothing and says so.
func TestCreateAnswers503AndStoresNothingWhenTheGroupCannotBeWidened(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	svc := s.start(t, s.testConfig("m1"))
	rc := newReceiver(t, nil)
	s.nats.Stop()
	var e webserver.ErrorBody
	req := map[string]any{"url": rc.url(), "event_types": []string{"click"}}
	if code := api(t, svc.addr, acmeKey, http.MethodPost, "/api/webhooks/endpoints", req, &e); code != http.StatusServiceUnavailable || e.Error.Code != "unavailable" {
		t.Fatalf("create with NATS down: %d %+v, want 503 unavailable", code, e.Error)
	}
	var list struct {
		Endpoints []json.RawMessage `json:"endpoints"`
	}
	if code := api(t, svc.addr, acmeKey, http.MethodGet, "/api/webhooks/endpoints", nil, &list); code != http.StatusOK || len(list.Endpoints) != 0 {
		t.Fatalf("after the refused create: %d, %d endpoints, want 200 and none", code, len(list.Endpoints))
	}

}

// TestResumingAPausedEndpointNeedsNoNATS: a paused endpoint's clicks are
// read all along (it keeps queueing), so its resume changes nothing the
// group reads. The resume widened the group all the same, and with NATS
// down answered 503 unavailable ("try again") though the endpoint was
// resumed and sending. It answers 200, the endpoint active, and its test
// event is delivered.
func TestResumingAPausedEndpointNeedsNoNATS(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	svc := s.start(t, s.testConfig("m1"))
	rc := newReceiver(t, nil)
	ep := createEndpoint(t, svc.addr, rc.url(), nil)
	rc.addSecret(ep.Secret)
	path := "/api/webhooks/endpoints/" + ep.ID
	if code := api(t, svc.addr, acmeKey, http.MethodPost, path+"/pause", nil, nil); code != http.StatusOK {
		t.Fatalf("pause: %d", code)
	}
	s.nats.Stop()
	var st endpointStatus
	if code := api(t, svc.addr, acmeKey, http.MethodPost, path+"/resume", nil, &st); code != http.StatusOK || st.Status != "active" {
		t.Fatalf("resume of a paused endpoint with NATS down: %d %+v, want 200 and active", code, st)
	}
	var test struct {
		EventID string `json:"event_id"`
	}
	if code := api(t, svc.addr, acmeKey, http.MethodPost, path+"/test", nil, &test); code != http.StatusAccepted {
		t.Fatalf("test event: %d", code)
	}
	testenv.WaitFor(t, 30*time.Second, "the test event delivered", func() bool { return rc.eventIDs()[test.EventID] == 1 })
}
