package fraud_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/fraud/internal/fraud"
)

// runMember runs rd as a member of fraud detection's group on its own
// connection, with h as the handler, until the test ends or crash is called.
func (w *world) runMember(t *testing.T, name string, rd *fraud.Reader, h reader.Handler, onRewind func(context.Context, int, reader.RewindInfo) error) (crash func()) {
	t.Helper()
	nc, err := nats.Connect(w.n.URL, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	cfg := reader.Config{
		Group: topology.GroupFraudDetection, Member: name, BatchSize: 5, LeaseTTL: time.Second, DrainTimeout: time.Second,
		OnAssign: rd.OnAssign, OnRevoke: rd.OnRevoke, OnRewind: onRewind,
	}
	go func() { done <- reader.Run(ctx, js, cfg, h) }()
	var once sync.Once
	crash = func() {
		once.Do(func() {
			nc.Close() // no ack, no unpin, no goodbye: a process that died
			cancel()
			<-done
		})
	}
	t.Cleanup(crash)
	return crash
}

// gathered returns a counter's value summed over its series (0: none yet).
func gathered(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// TestATakeoverDuringAReplayJudgesTheRestOfIt: the group judged a burst
// (30 clicks of one visitor, 1..30 in one partition: visitor_burst alerts at
// the 21st and labels every click), then is replayed from the start. The
// owner judges the replay's first batch (1..5) again and dies holding the
// second. Redis's mark is 30, the first pass's, ahead of the new owner's
// resume point (6): not a batch the dead owner stored and did not ack, but
// the replay's first pass. The new owner goes on with the replay: it judges
// 6..30 again and raises the burst's alert and labels again (FRAUD drops
// them as duplicates). Taken for a stored but unacked batch, 6..30 were fed
// without a decision and the rest of the replay judged nothing.
func TestATakeoverDuringAReplayJudgesTheRestOfIt(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := t.Context()
	p, evs := w.hotBurst(t)
	last := evs[len(evs)-1].Seq
	if len(evs) != 30 || last != 30 {
		t.Fatalf("the burst is %d events up to %d, want 30 up to 30", len(evs), last)
	}

	first := w.reader(t, fraud.Defaults(), nil)
	var rewound atomic.Bool
	var replayBatches atomic.Int32
	holding := make(chan struct{})
	var hold sync.Once
	crash := w.runMember(t, "first", first, func(ctx context.Context, part int, batch []reader.Event) error {
		if part == p && rewound.Load() && replayBatches.Add(1) > 1 {
			// The replay's second batch: the member dies holding it.
			hold.Do(func() { close(holding) })
			<-ctx.Done()
			return ctx.Err()
		}
		return first.Handle(ctx, part, batch)
	}, func(ctx context.Context, part int, ri reader.RewindInfo) error {
		err := first.OnRewind(ctx, part, ri)
		if err == nil && part == p {
			rewound.Store(true)
		}
		return err
	})
	testenv.WaitFor(t, 30*time.Second, "the first pass to be stored", func() bool {
		mark, err := w.store.HighWater(ctx, p)
		return err == nil && mark == last
	})
	alerts := w.fraudMsgs(t, "fraud.alerts.>")
	if len(alerts) != 1 {
		t.Fatalf("the first pass raised %v, want one alert", alerts)
	}

	if _, err := reader.Rewind(ctx, w.js, topology.GroupFraudDetection, reader.FromSeq(1)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-holding:
	case <-time.After(30 * time.Second):
		t.Fatal("the owner never took the replay's second batch")
	}
	crash()

	reg := prometheus.NewRegistry()
	next := w.reader(t, fraud.Defaults(), fraud.NewMetrics(reg))
	w.runMember(t, "next", next, next.Handle, next.OnRewind)
	name := topology.GroupConsumerName(topology.GroupFraudDetection, p)
	testenv.WaitFor(t, 60*time.Second, "the new owner to reach the end of the replay", func() bool {
		c, err := w.js.Consumer(ctx, events.ClicksStream, name)
		return err == nil && c.CachedInfo().AckFloor.Stream == last
	})

	if got := gathered(t, reg, "snip_fraud_events_judged_total"); got != 25 {
		t.Errorf("the new owner judged %v events, want 25 (the replay's 6..30)", got)
	}
	if got := gathered(t, reg, "snip_fraud_alerts_total"); got != 1 {
		t.Errorf("the new owner raised %v alerts, want the burst's one again", got)
	}
	if got := gathered(t, reg, "snip_fraud_verdicts_total"); got != 30 {
		t.Errorf("the new owner published %v labels, want the burst's 30 again", got)
	}
	if got := gathered(t, reg, "snip_fraud_events_behind_total"); got != 0 {
		t.Errorf("snip_fraud_events_behind_total = %v, want 0", got)
	}
	if got := w.fraudMsgs(t, "fraud.alerts.>"); len(got) != 1 || got[firstKey(alerts)] != 1 {
		t.Errorf("alerts on FRAUD after the replay = %v, want %v", got, alerts)
	}
	st, err := w.store.LinkStats(ctx, "hot")
	if err != nil || st.Total != 30 || st.Flagged != 30 {
		t.Errorf("stats = %+v, %v; want 30 of 30 flagged, as before the replay", st, err)
	}
}

func firstKey(m map[string]int) string {
	for k := range m {
		return k
	}
	return ""
}
