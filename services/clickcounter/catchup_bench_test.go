package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
	"github.com/snipdev/snip/services/clickcounter/internal/redisstore"
)

// BenchmarkCatchUp measures replay speed: CLICKS holds a backlog of N
// clicks (CLICKCOUNTER_BENCH_EVENTS, default 200,000) of the benchmix mix
// (10,000 links, Zipf), and three readers drain it one after the other on the same
// server, each with batches of 2,000 (CLICKCOUNTER_BENCH_BATCH) over the 8 partitions in parallel:
//
//   - bare: one pull consumer per partition that fetches and acks (AckAll,
//     the last message of each batch), nothing else;
//   - noop: the reader runtime with a handler that does nothing;
//   - counter: the reader runtime with the click counter writing to Redis.
//
// Run it once: go test -run '^$' -bench CatchUp -benchtime 1x ./services/clickcounter
func BenchmarkCatchUp(b *testing.B) {
	n := 200_000
	if v := os.Getenv("CLICKCOUNTER_BENCH_EVENTS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			b.Fatalf("CLICKCOUNTER_BENCH_EVENTS=%q: %v", v, err)
		}
	}
	batch := 2000 // the service default, CLICKCOUNTER_BATCH_SIZE
	if v := os.Getenv("CLICKCOUNTER_BENCH_BATCH"); v != "" {
		batch, _ = strconv.Atoi(v)
	}
	ns := testenv.StartNATS(b)
	js := ns.JetStream(b)
	ctx := context.Background()
	o := topology.Defaults()
	if err := topology.Apply(ctx, js, o); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	publishBacklog(b, js, n)
	b.Logf("published %d clicks in %s", n, time.Since(start).Round(time.Millisecond))

	for b.Loop() {
		bare := drainBare(b, js, o.Partitions, batch, n)
		noop := drainGroup(b, js, "bench-noop", batch, n, func(_ context.Context, _ int, evs []reader.Event) error { return nil }, nil)
		rdb, _ := servers.Redis.NewDB(b)
		c, err := counter.New(counter.Options{Store: redisstore.New(rdb), Clicks: noClicksLog{}, Partitions: o.Partitions,
			DedupWindow: 10 * time.Minute, ClicksMaxAge: o.ClicksMaxAge, Metrics: prometheus.NewRegistry()})
		if err != nil {
			b.Fatal(err)
		}
		_ = rdb.ConfigResetStat(ctx).Err()
		cnt := drainGroup(b, js, topology.GroupClickCounter, batch, n, c.HandleBatch, c)
		if info, err := rdb.Info(ctx, "commandstats").Result(); err == nil {
			for _, line := range strings.Split(info, "\n") {
				if strings.HasPrefix(line, "cmdstat_evalsha") || strings.HasPrefix(line, "cmdstat_eval:") {
					b.Logf("redis %s", strings.TrimSpace(line))
				}
			}
		}
		var counted int64
		for p := range o.Partitions {
			v, _ := rdb.HGet(ctx, fmt.Sprintf("cc:{p%d}:g1:pos", p), "events").Int64()
			counted += v
		}
		if counted != int64(n) {
			b.Fatalf("counter counted %d events, want %d", counted, n)
		}
		rate := func(d time.Duration) float64 { return float64(n) / d.Seconds() }
		b.ReportMetric(rate(bare), "bare_events/s")
		b.ReportMetric(rate(noop), "runtime_noop_events/s")
		b.ReportMetric(rate(cnt), "counter_events/s")
		b.ReportMetric(bare.Seconds()/cnt.Seconds(), "counter/bare")
		b.Logf("%d events: bare %s (%.0f/s), runtime no-op %s (%.0f/s), counter %s (%.0f/s); counter/bare = %.2f",
			n, bare.Round(time.Millisecond), rate(bare), noop.Round(time.Millisecond), rate(noop),
			cnt.Round(time.Millisecond), rate(cnt), bare.Seconds()/cnt.Seconds())
	}
}

type noClicksLog struct{}

func (noClicksLog) FirstSeq(context.Context, int) (uint64, error) { return 1, nil }

// publishBacklog stores n clicks, async, with their IDs as Nats-Msg-Id.
func publishBacklog(b *testing.B, js jetstream.JetStream, n int) {
	b.Helper()
	mix := benchmix.New()
	now := time.Now().UTC()
	for range n {
		c := mix.Click("acme", now)
		data, _ := json.Marshal(c)
		if _, err := js.PublishAsync(events.ClickSubject(c.Owner, c.Code), data, jetstream.WithMsgID(c.ID), jetstream.WithStallWait(time.Minute)); err != nil {
			b.Fatalf("publish: %v", err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(5 * time.Minute):
		b.Fatal("publishes not acknowledged after 5 minutes")
	}
}

// drainBare reads CLICKS with one plain pull consumer per partition
// (AckAll, the group consumers' settings) and acks each batch's last
// message; it returns the time from the first message to the last ack.
func drainBare(b *testing.B, js jetstream.JetStream, partitions, batch, n int) time.Duration {
	b.Helper()
	ctx := context.Background()
	var done atomic.Int64
	var first sync.Once
	var t0 time.Time
	var wg sync.WaitGroup
	for p := range partitions {
		cfg := jetstream.ConsumerConfig{
			Durable: "bench-bare-p" + strconv.Itoa(p), FilterSubject: events.PartitionFilter(p),
			AckPolicy: jetstream.AckAllPolicy, AckWait: time.Minute, MaxAckPending: 2 * batch, MaxDeliver: -1,
		}
		cons, err := js.CreateOrUpdateConsumer(ctx, events.ClicksStream, cfg)
		if err != nil {
			b.Fatal(err)
		}
		wg.Go(func() {
			for done.Load() < int64(n) {
				mb, err := cons.Fetch(batch, jetstream.FetchMaxWait(100*time.Millisecond))
				if err != nil {
					continue
				}
				var last jetstream.Msg
				k := 0
				for m := range mb.Messages() {
					first.Do(func() { t0 = time.Now() })
					last = m
					k++
				}
				if last != nil {
					if err := last.DoubleAck(ctx); err != nil {
						b.Errorf("ack: %v", err)
						return
					}
					done.Add(int64(k))
				}
			}
		})
	}
	wg.Wait()
	return time.Since(t0)
}

// drainGroup runs the reader runtime with h until it has handled n events,
// and returns the time from the first batch to the last.
func drainGroup(b *testing.B, js jetstream.JetStream, group string, batch, n int, h reader.Handler, c *counter.Counter) time.Duration {
	b.Helper()
	var handled atomic.Int64
	var first sync.Once
	var t0 time.Time
	var t1 atomic.Int64
	finished := make(chan struct{})
	var fin sync.Once
	wrapped := func(ctx context.Context, p int, evs []reader.Event) error {
		first.Do(func() { t0 = time.Now() })
		if err := h(ctx, p, evs); err != nil {
			return err
		}
		if handled.Add(int64(len(evs))) >= int64(n) {
			t1.Store(time.Now().UnixNano())
			fin.Do(func() { close(finished) })
		}
		return nil
	}
	cfg := reader.Config{Group: group, BatchSize: batch, Start: reader.StartAtOldest()}
	if c != nil {
		cfg.OnAssign, cfg.OnRevoke, cfg.OnRewind = c.OnAssign, c.OnRevoke, c.OnRewind
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- reader.Run(ctx, js, cfg, wrapped) }()
	select {
	case <-finished:
	case err := <-errc:
		cancel()
		b.Fatalf("reader %s stopped: %v", group, err)
	case <-time.After(30 * time.Minute):
		cancel()
		b.Fatalf("reader %s handled %d of %d events in 30 minutes", group, handled.Load(), n)
	}
	cancel()
	if err := <-errc; err != nil {
		b.Fatalf("reader %s: %v", group, err)
	}
	return time.Unix(0, t1.Load()).Sub(t0)
}
