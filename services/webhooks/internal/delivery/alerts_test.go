package delivery_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/webhooks/internal/delivery"
	"github.com/snipdev/snip/services/webhooks/internal/endpoint"
	"github.com/snipdev/snip/services/webhooks/internal/redisstore"
)

var servers *testenv.Servers

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &servers, testenv.WithRedis())) }

// TestStoppingFinishesTheAlertsAlreadyDelivered: at shutdown the alerts
// consumer stops pulling and drains, and the alerts already delivered to it
// are queued and acked, not turned back (nak'd, logged, for another
// instance to take once their delay passed) because the context that told
// it to stop also failed every Redis call the drain made.
func TestStoppingFinishesTheAlertsAlreadyDelivered(t *testing.T) {
	t.Parallel()
	js := testenv.StartNATS(t).JetStream(t)
	rdb := servers.RedisClient(t)
	ctx := t.Context()
	if err := topology.Apply(ctx, js, topology.Defaults()); err != nil {
		t.Fatal(err)
	}
	store := redisstore.New(rdb, 100_000)
	ep := endpoint.Endpoint{ID: "ep_alerts", Owner: "acme", URL: "https://example.com/hook", Types: []string{endpoint.TypeFraudAlert}}
	if err := store.Put(ctx, ep); err != nil {
		t.Fatal(err)
	}
	m, err := delivery.NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	intake := delivery.NewIntake(store, m)

	// More alerts than the consumer pulls at once, so that it holds a
	// buffer of delivered alerts when it is told to stop.
	const n = 3000
	now := time.Now().UTC()
	for i := range n {
		a := events.FraudAlert{V: events.FraudVersion, ID: fmt.Sprintf("alert-%d", i), Rule: "visitor_burst", Code: "a1",
			Owner: "acme", WindowStart: now, WindowEnd: now, Count: 10, Threshold: 5, Time: now}
		b, _ := json.Marshal(a)
		if _, err := js.PublishAsync(events.FraudAlertSubject("a1"), b); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		t.Fatal("publishing the alerts timed out")
	}

	log := &logRecords{}
	cctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- delivery.ConsumeAlerts(cctx, js, topology.WebhooksAlertsConsumer, intake, slog.New(log), 20*time.Second)
	}()
	testenv.WaitFor(t, 30*time.Second, "the first alert to be queued", func() bool {
		n, _, err := store.Backlog(ctx, ep.ID)
		return err == nil && n > 0
	})
	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("ConsumeAlerts did not return after its context ended")
	}

	if turned := log.count("webhooks: route fraud alert"); turned > 0 {
		t.Errorf("%d alerts delivered before the stop were turned back (nak) instead of queued and acked; the first: %s", turned, log.first("webhooks: route fraud alert"))
	}
	// Every alert acked is queued. (An alert the server had sent just as
	// the consumer unsubscribed may reach nobody; it is sent again after
	// the consumer's AckWait, so the count of acks is not checked.)
	c, err := js.Consumer(ctx, events.FraudStream, topology.WebhooksAlertsConsumer)
	if err != nil {
		t.Fatal(err)
	}
	var acked uint64
	var backlog int64
	ok := testenv.Poll(10*time.Second, func() bool {
		info, err := c.Info(ctx)
		if err != nil {
			return false
		}
		acked = info.AckFloor.Consumer
		backlog, _, err = store.Backlog(ctx, ep.ID)
		return err == nil && backlog == int64(acked)
	})
	if !ok || acked == 0 {
		t.Errorf("%d alerts queued, %d acked: want every acked alert queued", backlog, acked)
	}
}

// logRecords keeps a logger's messages (and their err) for a test to read.
type logRecords struct {
	mu   sync.Mutex
	msgs []string
	errs []string
}

func (l *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecords) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logRecords) WithGroup(string) slog.Handler            { return l }
func (l *logRecords) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := ""
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "err" {
			e = a.Value.String()
		}
		return true
	})
	l.msgs, l.errs = append(l.msgs, r.Message), append(l.errs, e)
	return nil
}

func (l *logRecords) count(msg string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.msgs {
		if m == msg {
			n++
		}
	}
	return n
}

func (l *logRecords) first(msg string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, m := range l.msgs {
		if m == msg {
			return l.errs[i]
		}
	}
	return ""
}
