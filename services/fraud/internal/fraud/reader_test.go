package fraud_test

import (
	"log/slog"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/fraud/internal/clicklog"
	"github.com/snipdev/snip/services/fraud/internal/fraud"
	"github.com/snipdev/snip/services/fraud/internal/fraudpub"
	"github.com/snipdev/snip/services/fraud/internal/kvorigin"
	"github.com/snipdev/snip/services/fraud/internal/redisstore"
	"github.com/snipdev/snip/services/fraud/internal/traffic"
)

var servers *testenv.Servers

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &servers, testenv.WithRedis())) }

// world is real NATS and Redis with the topology applied.
type world struct {
	n *testenv.NATS
	// url is the server members connect to, with memberOpts.
	url        string
	memberOpts []nats.Option
	nc         *nats.Conn
	js         jetstream.JetStream
	rdb        *redis.Client
	store      *redisstore.Store
}

const parts = 4

func newWorld(t *testing.T) *world {
	t.Helper()
	n := testenv.StartNATS(t)
	nc := n.Connect(t)
	js, _ := jetstream.New(nc)
	o := topology.Defaults()
	o.Partitions = parts
	if err := topology.Apply(t.Context(), js, o); err != nil {
		t.Fatal(err)
	}
	rdb, _ := servers.Redis.NewDB(t)
	return &world{n: n, url: n.URL, nc: nc, js: js, rdb: rdb, store: redisstore.New(rdb, parts, 100)}
}

func (w *world) reader(t *testing.T, r fraud.Rules, m *fraud.Metrics) *fraud.Reader {
	t.Helper()
	d, err := fraud.NewDetector(r)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := fraudpub.New(w.nc, 256, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return fraud.NewReader(d, clicklog.New(w.js, parts), pub, w.store, kvorigin.New(w.js, topology.GroupFraudDetection), slog.New(slog.DiscardHandler), m)
}

// events returns partition p's events with sequence >= from, as the runtime
// would hand them.
// hotBurst publishes 30 clicks of one visitor on the link "hot", half a
// second apart (visitor_burst fires at the 21st and labels every click
// after), and returns the link's partition and its events.
func (w *world) hotBurst(t *testing.T) (int, []reader.Event) {
	t.Helper()
	p := events.Partition("hot", parts)
	clicks := traffic.Burst(time.Now().Add(-time.Minute), 30, 500*time.Millisecond, "hot", "acme", "bot")
	if err := traffic.Publish(t.Context(), w.js, clicks, 64); err != nil {
		t.Fatal(err)
	}
	return p, w.events(t, p, 1)
}

func (w *world) events(t *testing.T, p int, from uint64) []reader.Event {
	t.Helper()
	var out []reader.Event
	if _, err := clicklog.New(w.js, parts).Scan(t.Context(), p, time.Time{}, 1<<62, func(ev reader.Event) {
		if ev.Seq >= from {
			out = append(out, ev)
		}
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// fraudMsgs returns the FRAUD messages on subject filter by Nats-Msg-Id.
// verdictLabels returns how many labels of FRAUD_VERDICTS name each click,
// and how many verdict messages there are.
func (w *world) verdictLabels(t *testing.T) (map[string]int, int) {
	t.Helper()
	labels, msgs, err := traffic.VerdictLabels(t.Context(), w.js)
	if err != nil {
		t.Fatal(err)
	}
	return labels, msgs
}

func (w *world) fraudMsgs(t *testing.T, filter string) map[string]int {
	t.Helper()
	ids, err := traffic.MsgIDs(t.Context(), w.js, events.FraudStream, filter)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// TestTakeoverRebuildsWindowsFromTheLog: the previous owner judged 15
// clicks of a burst (under the threshold of 20) and acked them; the new
// owner rebuilds its windows from the log in OnAssign, so the next 10
// clicks make it fire, and it labels all 25, the first 15 read back from
// CLICKS by sequence.
func TestTakeoverRebuildsWindowsFromTheLog(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := t.Context()
	p := events.Partition("hot", parts)
	start := time.Now().Add(-time.Minute)
	clicks := traffic.Burst(start, 25, 500*time.Millisecond, "hot", "acme", "bot")
	if err := traffic.Publish(ctx, w.js, clicks[:15], 64); err != nil {
		t.Fatal(err)
	}
	old := w.reader(t, fraud.Defaults(), nil)
	if err := old.OnAssign(ctx, p, 1); err != nil {
		t.Fatal(err)
	}
	if err := old.Handle(ctx, p, w.events(t, p, 1)); err != nil {
		t.Fatal(err)
	}
	old.OnRevoke(p)

	if err := traffic.Publish(ctx, w.js, clicks[15:], 64); err != nil {
		t.Fatal(err)
	}
	m := fraud.NewMetrics(nil)
	next := w.reader(t, fraud.Defaults(), m)
	if err := next.OnAssign(ctx, p, 16); err != nil {
		t.Fatal(err)
	}
	if err := next.Handle(ctx, p, w.events(t, p, 16)); err != nil {
		t.Fatal(err)
	}
	alerts := w.fraudMsgs(t, "fraud.alerts.>")
	want := fraud.AlertID(fraud.RuleVisitorBurst, "hot", "bot", clicks[20].Time.Truncate(time.Hour))
	if len(alerts) != 1 || alerts[want] != 1 {
		t.Fatalf("alerts = %v, want one %s", alerts, want)
	}
	verdicts, _ := w.verdictLabels(t)
	for _, c := range clicks {
		if verdicts[c.ID] != 1 {
			t.Fatalf("click %s: %d verdicts, want 1 (%d verdicts in all)", c.ID, verdicts[c.ID], len(verdicts))
		}
	}
	st, err := w.store.LinkStats(ctx, "hot")
	if err != nil || st.Total != 25 || st.Flagged != 25 || st.ByRule[fraud.RuleVisitorBurst] != 25 {
		t.Fatalf("stats = %+v, %v; want 25 of 25 flagged", st, err)
	}
}

// TestFailedPublishIsRetriedWithoutDoubleCounting: NATS goes away while a
// batch is handled, the handler returns an error (so the runtime would not
// ack), and the retry of the same batch after NATS is back publishes and
// stores everything once.
func TestFailedPublishIsRetriedWithoutDoubleCounting(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := t.Context()
	p, batch := w.hotBurst(t)
	r := w.reader(t, fraud.Defaults(), nil)
	if err := r.OnAssign(ctx, p, 1); err != nil {
		t.Fatal(err)
	}
	w.n.Stop()
	if err := r.Handle(ctx, p, batch); err == nil {
		t.Fatal("Handle succeeded with NATS down")
	}
	w.n.Start()
	testenv.WaitFor(t, 20*time.Second, "reconnect", func() bool { return w.nc.IsConnected() })
	for range 2 { // the retry, then a redelivery of the same batch
		if err := r.Handle(ctx, p, batch); err != nil {
			t.Fatal(err)
		}
	}
	v, msgs := w.verdictLabels(t)
	if len(v) != 30 {
		t.Fatalf("%d verdicts, want 30", len(v))
	}
	for _, e := range batch {
		if v[e.Click.ID] != 1 {
			t.Fatalf("click %s: %d labels, want 1", e.Click.ID, v[e.Click.ID])
		}
	}
	// The batch's labels went out in one message, and its re-sends (same
	// ID) were dropped as duplicates.
	if msgs != 1 {
		t.Fatalf("%d verdict messages, want 1", msgs)
	}
	st, err := w.store.LinkStats(ctx, "hot")
	if err != nil || st.Total != 30 || st.Flagged != 30 {
		t.Fatalf("stats = %+v, %v; want 30 of 30", st, err)
	}
	if a := w.fraudMsgs(t, "fraud.alerts.>"); len(a) != 1 {
		t.Fatalf("alerts = %v, want one", a)
	}
}

// counter returns the value of the counter called name in reg.
func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// TestLabelOfAClickGoneFromTheLogDoesNotStopThePartition: a reader judged
// the first 15 clicks of a burst, then retention (here CLICKS cut to its
// newest 10 events) discarded them before the next batch made the burst
// fire. Their labels cannot be built (the state keeps only sequences), so
// they are skipped and counted, and the batch still succeeds: the partition
// goes on, and the clicks still in the log get their verdicts.
func TestLabelOfAClickGoneFromTheLogDoesNotStopThePartition(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := t.Context()
	p := events.Partition("hot", parts)
	clicks := traffic.Burst(time.Now().Add(-time.Minute), 30, 500*time.Millisecond, "hot", "acme", "bot")
	if err := traffic.Publish(ctx, w.js, clicks[:15], 64); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	r := w.reader(t, fraud.Defaults(), fraud.NewMetrics(reg))
	if err := r.OnAssign(ctx, p, 1); err != nil {
		t.Fatal(err)
	}
	if err := r.Handle(ctx, p, w.events(t, p, 1)); err != nil {
		t.Fatal(err)
	}

	s, err := w.js.Stream(ctx, events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.MaxMsgs = 10
	if _, err := w.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if err := traffic.Publish(ctx, w.js, clicks[15:25], 64); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "clicks 1-15 discarded", func() bool {
		info, err := s.Info(ctx)
		return err == nil && info.State.FirstSeq == 16
	})
	if err := r.Handle(ctx, p, w.events(t, p, 16)); err != nil {
		t.Fatalf("batch labelling clicks gone from the log: %v", err)
	}
	if got := counter(t, reg, "snip_fraud_labels_not_in_log_total"); got != 15 {
		t.Fatalf("snip_fraud_labels_not_in_log_total = %v, want 15", got)
	}

	// The partition goes on: the next batch is judged and labelled.
	if err := traffic.Publish(ctx, w.js, clicks[25:], 64); err != nil {
		t.Fatal(err)
	}
	if err := r.Handle(ctx, p, w.events(t, p, 26)); err != nil {
		t.Fatal(err)
	}
	v, _ := w.verdictLabels(t)
	for i, c := range clicks {
		if want := min(1, i/15); v[c.ID] != want {
			t.Fatalf("click %d: %d verdicts, want %d", i+1, v[c.ID], want)
		}
	}
	if got := counter(t, reg, "snip_fraud_events_judged_total"); got != 30 {
		t.Fatalf("snip_fraud_events_judged_total = %v, want 30", got)
	}
	// The statistics count what the detector decided, verdict or not.
	st, err := w.store.LinkStats(ctx, "hot")
	if err != nil || st.Total != 30 || st.Flagged != 30 {
		t.Fatalf("stats = %+v, %v; want 30 of 30 flagged", st, err)
	}
}

// TestRetryOfAJudgedBatchIsNotCountedBehind: a batch fails after it was
// judged (NATS stopped), and the runtime retries the same events, still
// first deliveries. They are the member's own pending judgements, not events
// behind its position: snip_fraud_events_behind_total stays 0, as it does for a
// redelivery. A first delivery genuinely behind the position still counts.
func TestRetryOfAJudgedBatchIsNotCountedBehind(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := t.Context()
	p, batch := w.hotBurst(t)
	reg := prometheus.NewRegistry()
	r := w.reader(t, fraud.Defaults(), fraud.NewMetrics(reg))
	if err := r.OnAssign(ctx, p, 1); err != nil {
		t.Fatal(err)
	}
	w.n.Stop()
	if err := r.Handle(ctx, p, batch); err == nil {
		t.Fatal("Handle succeeded with NATS down")
	}
	w.n.Start()
	testenv.WaitFor(t, 20*time.Second, "reconnect", func() bool { return w.nc.IsConnected() })
	if err := r.Handle(ctx, p, batch); err != nil { // the runtime's retry
		t.Fatal(err)
	}
	if got := counter(t, reg, "snip_fraud_events_behind_total"); got != 0 {
		t.Fatalf("after the retry, snip_fraud_events_behind_total = %v, want 0", got)
	}
	if got := counter(t, reg, "snip_fraud_events_judged_total"); got != 30 {
		t.Fatalf("snip_fraud_events_judged_total = %v, want 30", got)
	}

	again := slices.Clone(batch)
	for i := range again {
		again[i].Deliveries = 2
	}
	if err := r.Handle(ctx, p, again); err != nil { // a redelivery
		t.Fatal(err)
	}
	if got := counter(t, reg, "snip_fraud_events_behind_total"); got != 0 {
		t.Fatalf("after a redelivery, snip_fraud_events_behind_total = %v, want 0", got)
	}
	// First deliveries of events this member judged, published and stored
	// before: behind its position, never to be judged.
	if err := r.Handle(ctx, p, batch[:5]); err != nil {
		t.Fatal(err)
	}
	if got := counter(t, reg, "snip_fraud_events_behind_total"); got != 5 {
		t.Fatalf("after 5 first deliveries behind, snip_fraud_events_behind_total = %v, want 5", got)
	}
}
