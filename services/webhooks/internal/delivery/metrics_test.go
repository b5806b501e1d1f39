package delivery

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

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
