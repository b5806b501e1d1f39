package delivery

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/netguard"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/webhooks/internal/endpoint"
	"github.com/snipdev/snip/services/webhooks/internal/redisstore"
)

// TestAnEndpointDeletedBetweenTwoScansLeavesNoSeries: an endpoint created
// and deleted between two scans of an instance's manager (which therefore
// never listed it) still had events queued through that instance; its
// series go at the next scan all the same. And a series made again by a
// batch queued just before the delete, after that scan, goes at the scan
// after it.
func TestAnEndpointDeletedBetweenTwoScansLeavesNoSeries(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := t.Context()
	store := redisstore.New(rdb, 1000)
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	intake := NewIntake(store, m)
	mgr := NewManager(store, NewSender(store, NewClient(ClientConfig{}), SenderConfig{}, m, log), "m2", time.Hour, log)
	series := func() (names []string) {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			for _, s := range mf.GetMetric() {
				for _, l := range s.GetLabel() {
					if l.GetName() == "endpoint" && l.GetValue() == "ep_brief" {
						names = append(names, mf.GetName())
					}
				}
			}
		}
		return names
	}

	mgr.scan(ctx) // before the endpoint exists
	ep := endpoint.Endpoint{ID: "ep_brief", Owner: "acme", URL: "https://example.com/hook", Types: []string{endpoint.TypeClick}, BatchMax: 1}
	if err := store.Put(ctx, ep); err != nil {
		t.Fatal(err)
	}
	queue := func() {
		t.Helper()
		if _, err := intake.enqueue(ctx, redisstore.DedupNone, 0, map[string][]redisstore.Event{ep.ID: {{ID: "e1", Type: endpoint.TypeClick, Data: []byte(`{}`)}}}); err != nil {
			t.Fatal(err)
		}
	}
	queue()
	if got := series(); len(got) == 0 || !strings.Contains(strings.Join(got, " "), "queued_events_total") {
		t.Fatalf("series of the endpoint after queueing: %v; want queued_events_total", got)
	}
	if err := store.Delete(ctx, ep); err != nil {
		t.Fatal(err)
	}
	mgr.scan(ctx)
	if got := series(); len(got) != 0 {
		t.Fatalf("series of an endpoint deleted before this instance's manager ever listed it, after its next scan: %v; want none", got)
	}

	// The series of a batch queued before the delete, counted after the
	// scan that dropped the series.
	m.note(ep.ID)
	m.queued.WithLabelValues(ep.ID).Add(1)
	mgr.scan(ctx)
	if got := series(); len(got) != 0 {
		t.Fatalf("series made again after the scan that dropped them, after the next scan: %v; want none", got)
	}
}

// TestAnEventIsCountedOnceDeliveredOrDropped: the backlog bound drops the
// oldest events of a batch in flight (counted as dropped) and the batch is
// then delivered. The sender counted the whole batch as delivered, so
// those events were counted twice, dropped and delivered: delivered plus
// dropped came to more than was queued. Each is counted once now, as it
// left the queue.
func TestAnEventIsCountedOnceDeliveredOrDropped(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := t.Context()
	store := redisstore.New(rdb, 3)
	var (
		mu       sync.Mutex
		received []string
	)
	posted, answer := make(chan struct{}), make(chan struct{})
	var once sync.Once
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b Body
		if err := json.NewDecoder(r.Body).Decode(&b); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		once.Do(func() { close(posted); <-answer })
		mu.Lock()
		for _, e := range b.Events {
			received = append(received, e.ID)
		}
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(recv.Close)
	var closeAnswer sync.Once
	release := func() { closeAnswer.Do(func() { close(answer) }) }
	t.Cleanup(release)
	e := endpoint.Endpoint{ID: "ep_bound", Owner: "acme", URL: recv.URL + "/hook", Types: []string{endpoint.TypeClick}, Secret: endpoint.NewSecret(), BatchMax: 3}
	if err := store.Put(ctx, e); err != nil {
		t.Fatal(err)
	}
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	intake := NewIntake(store, m)
	queue := func(ids ...string) {
		t.Helper()
		var evs []redisstore.Event
		for _, id := range ids {
			evs = append(evs, redisstore.Event{ID: id, Type: endpoint.TypeClick, Time: time.Now().UTC(), Data: []byte(`{}`)})
		}
		if _, err := intake.enqueue(ctx, redisstore.DedupNone, 0, map[string][]redisstore.Event{e.ID: evs}); err != nil {
			t.Fatal(err)
		}
	}
	queue("a", "b", "c")

	dialer := netguard.NewDialer(netguard.NewPolicy([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}), nil, time.Second)
	client := NewClient(ClientConfig{Timeout: 10 * time.Second, ConnectTimeout: time.Second, MaxResponseBytes: 1 << 10, UserAgent: "a", Dialer: dialer})
	cfg := SenderConfig{Schedule: []time.Duration{20 * time.Millisecond}, DisableAfter: time.Hour, MaxBatchBytes: 1 << 20, Poll: 10 * time.Millisecond}
	mgr := NewManager(store, NewSender(store, client, cfg, m, log), "a", 6*time.Second, log)
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Run(mctx) }()
	t.Cleanup(func() { cancel(); <-done })

	select {
	case <-posted: // {a, b, c} is in flight, held by the receiver
	case <-time.After(10 * time.Second):
		t.Fatal("no POST")
	}
	queue("d", "e") // the bound (3) drops a and b
	release()
	testenv.WaitFor(t, 10*time.Second, "every event to reach the receiver and leave the queue", func() bool {
		mu.Lock()
		n := len(received)
		mu.Unlock()
		backlog, _, err := store.Backlog(ctx, e.ID)
		return n == 5 && err == nil && backlog == 0
	})

	queued := testutil.ToFloat64(m.queued.WithLabelValues(e.ID))
	dropped := testutil.ToFloat64(m.dropped.WithLabelValues(e.ID))
	delivered := testutil.ToFloat64(m.delivered.WithLabelValues(e.ID))
	if queued != 5 || dropped != 2 || delivered != 3 {
		t.Errorf("queued %v, dropped %v, delivered %v; want 5, 2 (a, b) and 3 (c, d, e): each event counted once", queued, dropped, delivered)
	}
}
