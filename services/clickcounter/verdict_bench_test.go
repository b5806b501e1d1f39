package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/clickcounter/internal/benchmix"
	"github.com/snipdev/snip/services/clickcounter/internal/counter"
	"github.com/snipdev/snip/services/clickcounter/internal/jsfeed"
	"github.com/snipdev/snip/services/clickcounter/internal/redisstore"
)

// BenchmarkVerdictFeed measures the correction path: FRAUD_VERDICTS holds
// labels about N clicks (CLICKCOUNTER_BENCH_VERDICTS, default 100,000) the
// counter has already counted, each relabelling its click (so every one
// moves counts, the expensive case), and the counter's verdict feed, wired
// as run wires it, drains them. The time runs from the feed's start to the
// consumer's ack floor reaching the last message; afterwards every label
// must have been applied. Two mixes:
//
//   - flood: every click is on one link (fraud detection's link_flood rule
//     labels every click of a flooded link: the load test's case), with the
//     benchmix spread of countries and referrers;
//
//   - spread: the benchmix clicks as they are (10,000 links, Zipf), so a
//     batch touches hundreds of links: the worst case for aggregation.
//
// and two forms of the same labels:
//
//   - bulk: what fraud detection publishes, one FraudVerdictBatch per
//     detector batch of 500 events of a partition (SplitVerdicts);
//
//   - single: one FraudVerdict a message, as detectors before bulk
//     verdicts published them (the counter still reads them).
//
//     go test -run '^$' -bench VerdictFeed -benchtime 1x ./services/clickcounter
func BenchmarkVerdictFeed(b *testing.B) {
	n := 100_000
	if v := os.Getenv("CLICKCOUNTER_BENCH_VERDICTS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			b.Fatalf("CLICKCOUNTER_BENCH_VERDICTS=%q: %v", v, err)
		}
	}
	for _, mix := range []string{"flood", "spread"} {
		for _, form := range []string{"bulk", "single"} {
			b.Run(mix+"/"+form, func(b *testing.B) { benchVerdictFeed(b, n, mix == "flood", form == "bulk") })
		}
	}
}

func benchVerdictFeed(b *testing.B, n int, flood, bulk bool) {
	ns := testenv.StartNATS(b)
	js := ns.JetStream(b)
	ctx := context.Background()
	o := topology.Defaults()
	if err := topology.Apply(ctx, js, o); err != nil {
		b.Fatal(err)
	}
	clicks := benchClicks(o.Partitions, n, flood)
	start := time.Now()
	lastSeq, msgs := publishVerdicts(b, js, clicks, bulk)
	b.Logf("published %d labels in %d messages in %s", n, msgs, time.Since(start).Round(time.Millisecond))

	for b.Loop() {
		rdb, _ := servers.Redis.NewDB(b)
		reg := prometheus.NewRegistry()
		c, err := counter.New(counter.Options{Store: redisstore.New(rdb), Clicks: jsfeed.Clicks{JS: js}, Partitions: o.Partitions,
			DedupWindow: 10 * time.Minute, ClicksMaxAge: o.ClicksMaxAge, Metrics: reg})
		if err != nil {
			b.Fatal(err)
		}
		for p, evs := range clicks {
			for start := 0; start < len(evs); start += 500 {
				if err := c.HandleBatch(ctx, p, evs[start:min(start+500, len(evs))]); err != nil {
					b.Fatalf("count clicks: %v", err)
				}
			}
		}
		// A fresh consumer, so every iteration reads FRAUD from the start.
		if err := js.DeleteConsumer(ctx, events.FraudVerdictsStream, topology.ClickCounterVerdictsConsumer); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			b.Fatal(err)
		}
		if err := topology.ApplyClickCounter(ctx, js); err != nil {
			b.Fatal(err)
		}
		_ = rdb.ConfigResetStat(ctx).Err()
		d := drainVerdicts(b, js, c, reg, lastSeq)
		if info, err := rdb.Info(ctx, "commandstats").Result(); err == nil {
			for _, line := range strings.Split(info, "\n") {
				if strings.HasPrefix(line, "cmdstat_evalsha") {
					b.Logf("redis %s", strings.TrimSpace(line))
				}
			}
		}
		if got := gatherCounter(b, reg, "snip_clickcounter_corrections_total", "relabelled"); got != float64(n) {
			b.Fatalf("relabelled %v verdicts, want %d", got, n)
		}
		rate := float64(n) / d.Seconds()
		b.ReportMetric(rate, "verdicts/s")
		b.Logf("%d verdicts drained in %s: %.0f/s", n, d.Round(time.Millisecond), rate)
	}
}

// benchClicks draws n clicks of the mix (all on one link if flood) and
// places them in CLICKS order: per partition, with increasing sequences.
func benchClicks(partitions, n int, flood bool) map[int][]reader.Event {
	mix := benchmix.New()
	now := time.Now().UTC()
	out := map[int][]reader.Event{}
	for i := range n {
		cl := mix.Click("acme", now)
		if flood {
			cl.Code = "flooded"
		}
		p := events.Partition(cl.Code, partitions)
		out[p] = append(out[p], reader.Event{Click: cl, Partition: p, Seq: uint64(i + 1), Stored: now, Deliveries: 1})
	}
	return out
}

// publishVerdicts stores a label about each click, flipping the click's
// label, in bulk messages (one per 500 events of a partition) or one per
// message, and returns the last FRAUD_VERDICTS sequence and the number of
// messages.
func publishVerdicts(b *testing.B, js jetstream.JetStream, clicks map[int][]reader.Event, bulk bool) (uint64, int) {
	b.Helper()
	msgs := 0
	publish := func(subject, id string, v any) {
		data, err := json.Marshal(v)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := js.PublishAsync(subject, data, jetstream.WithMsgID(id), jetstream.WithStallWait(time.Minute)); err != nil {
			b.Fatalf("publish verdict: %v", err)
		}
		msgs++
	}
	for p, evs := range clicks {
		for start := 0; start < len(evs); start += 500 {
			batch := evs[start:min(start+500, len(evs))]
			labels := make([]events.FraudVerdictLabel, 0, len(batch))
			for _, ev := range batch {
				cl := ev.Click
				labels = append(labels, events.FraudVerdictLabel{ClickID: cl.ID, ClickSeq: ev.Seq, Code: cl.Code, Owner: cl.Owner, Rule: "link_flood",
					Bot: !cl.Bot, SourceBot: cl.Bot, ClickTime: cl.Time, Country: cl.Country, Referrer: cl.Referrer, Time: cl.Time.Add(time.Second)})
			}
			if bulk {
				for _, m := range events.SplitVerdicts(p, batch[0].Seq, batch[len(batch)-1].Seq, labels) {
					publish(events.FraudVerdictBatchSubject(p), m.ID, m)
				}
				continue
			}
			for _, l := range labels {
				v := events.FraudVerdict{V: events.FraudVersion, ID: "v:" + l.ClickID, Partition: p, FraudVerdictLabel: l}
				publish(events.FraudVerdictSubject(l.Owner, l.Code), v.ID, v)
			}
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(5 * time.Minute):
		b.Fatal("verdicts not acknowledged after 5 minutes")
	}
	s, err := js.Stream(context.Background(), events.FraudVerdictsStream)
	if err != nil {
		b.Fatal(err)
	}
	return s.CachedInfo().State.LastSeq, msgs
}

// drainVerdicts runs the service's verdict feed until the consumer has
// acked everything up to last, and returns how long that took.
func drainVerdicts(b *testing.B, js jetstream.JetStream, c *counter.Counter, reg *prometheus.Registry, last uint64) time.Duration {
	b.Helper()
	var feed jsfeed.Feed
	for _, f := range feeds(c, slog.New(slog.DiscardHandler), 10*time.Second) {
		if f.Name == "verdicts" {
			feed = f
		}
	}
	fm, err := jsfeed.NewMetrics(reg)
	if err != nil {
		b.Fatal(err)
	}
	cons, err := js.Consumer(context.Background(), events.FraudVerdictsStream, topology.ClickCounterVerdictsConsumer)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	start := time.Now()
	wg.Go(func() {
		if err := feed.Run(ctx, js, fm); err != nil {
			b.Errorf("feed: %v", err)
		}
	})
	defer func() { cancel(); wg.Wait() }()
	testenv.WaitFor(b, 30*time.Minute, fmt.Sprintf("the verdict feed to ack every verdict (to FRAUD sequence %d)", last), func() bool {
		info, err := cons.Info(context.Background())
		return err == nil && info.AckFloor.Stream >= last && info.NumAckPending == 0
	})
	return time.Since(start)
}

// gatherCounter returns a counter's value for the sample whose only label
// value is result.
func gatherCounter(b *testing.B, reg *prometheus.Registry, name, result string) float64 {
	b.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
