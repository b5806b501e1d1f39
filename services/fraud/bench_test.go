package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/fraud/internal/traffic"
)

// BenchmarkCatchUp measures how fast the fraud service catches up a backlog
// of realistic clicks, against a bare consumer on the same server in the
// same run. Each iteration publishes the backlog (BENCH_EVENTS, default 1M,
// into an embedded file-storage NATS with the default 8 partitions), then
// times, each from start to "every partition acked":
//
//   - bare: one pull consumer per partition that fetches batches of 500 and
//     acks each batch (AckAll, double ack of the last message), as the
//     runtime does, and nothing else;
//   - runtime: reader.Run with a handler that does nothing;
//   - fraud: the whole service (run): judging, verdicts and alerts
//     published to FRAUD, statistics written to Redis.
//
// Each iteration has a server, a backlog and a Redis database of its own
// (publishing is not timed): the consumers and the fraud-detection group of
// an earlier one have read the whole backlog, so -benchtime 2x or more
// measures it again.
//
// Run: go test -run '^$' -bench CatchUp -benchtime 1x -timeout 30m .
func BenchmarkCatchUp(b *testing.B) {
	total := envInt("BENCH_EVENTS", 1_000_000)
	ctx := context.Background()
	o := topology.Defaults()

	for range b.N {
		b.StopTimer()
		n := testenv.StartNATS(b)
		js := n.JetStream(b)
		if err := topology.Apply(ctx, js, o); err != nil {
			b.Fatal(err)
		}
		published := publishBacklog(b, js, total)
		b.Logf("backlog: %d events", published)
		_, db := servers.Redis.NewDB(b)
		b.StartTimer()

		bare := timeIt(b, func() { bareConsume(b, js, o.Partitions, published) })
		runtime := timeIt(b, func() { runtimeConsume(b, js, published) })
		fraud := timeIt(b, func() { fraudConsume(b, n, db, js) })
		rate := func(d time.Duration) float64 { return float64(published) / d.Seconds() }
		b.ReportMetric(rate(bare), "bare-events/s")
		b.ReportMetric(rate(runtime), "runtime-events/s")
		b.ReportMetric(rate(fraud), "fraud-events/s")
		b.ReportMetric(rate(fraud)/rate(bare), "fraud/bare")
		b.Logf("bare %s (%.0f/s), runtime no-op %s (%.0f/s), fraud %s (%.0f/s): fraud/bare = %.2f",
			bare.Round(time.Millisecond), rate(bare), runtime.Round(time.Millisecond), rate(runtime),
			fraud.Round(time.Millisecond), rate(fraud), rate(fraud)/rate(bare))
	}
}

func timeIt(b *testing.B, f func()) time.Duration {
	b.Helper()
	start := time.Now()
	f()
	return time.Since(start)
}

// publishBacklog publishes about total generated clicks (people on 5,000
// links, with every injected bot pattern) spread over the last hour.
func publishBacklog(b *testing.B, js jetstream.JetStream, total int) int {
	b.Helper()
	const chunks = 12
	start := time.Now().Add(-time.Hour)
	// People click 1.3 times on average (re-opens), so ask for fewer.
	rate := float64(total) / 1.3 / time.Hour.Seconds()
	n := 0
	for i := range chunks {
		clicks := traffic.Generate(traffic.Spec{Seed: uint64(i + 1), Start: start.Add(time.Duration(i) * 5 * time.Minute),
			Duration: 5 * time.Minute, HumanRate: rate, Links: 5000, Owners: 50, Inject: i == chunks/2})
		if err := traffic.Publish(context.Background(), js, clicks, 2048); err != nil {
			b.Fatal(err)
		}
		n += len(clicks)
	}
	return n
}

// bareConsume reads the backlog with one plain consumer a partition and
// fails the benchmark unless it read every one of the want events: a fetch
// that found nothing for a second ends a partition, whether it was
// drained or only slow.
func bareConsume(b *testing.B, js jetstream.JetStream, partitions, want int) {
	b.Helper()
	ctx := context.Background()
	var read atomic.Int64
	var wg sync.WaitGroup
	for p := range partitions {
		cons, err := js.CreateConsumer(ctx, events.ClicksStream, jetstream.ConsumerConfig{
			Durable: fmt.Sprintf("bench-bare-p%d", p), FilterSubject: events.PartitionFilter(p),
			AckPolicy: jetstream.AckAllPolicy, MaxAckPending: 1000, DeliverPolicy: jetstream.DeliverAllPolicy,
		})
		if err != nil {
			b.Fatal(err)
		}
		wg.Go(func() {
			for {
				batch, err := cons.Fetch(500, jetstream.FetchMaxWait(time.Second))
				if err != nil {
					b.Error(err)
					return
				}
				var last jetstream.Msg
				k := 0
				for m := range batch.Messages() {
					last = m
					k++
				}
				if last == nil {
					return // drained
				}
				read.Add(int64(k))
				if err := last.DoubleAck(ctx); err != nil {
					b.Error(err)
					return
				}
				if meta, err := last.Metadata(); err == nil && meta.NumPending == 0 {
					return // caught up: no wait for an empty fetch
				}
			}
		})
	}
	wg.Wait()
	if n := read.Load(); n != int64(want) {
		b.Fatalf("the bare consumers read %d of %d events", n, want)
	}
}

// runtimeConsume drains the backlog through the runtime with a no-op
// handler, and fails the benchmark unless it handled every one of the want
// events.
func runtimeConsume(b *testing.B, js jetstream.JetStream, want int) {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var handled atomic.Int64
	done := make(chan error, 1)
	go func() {
		done <- reader.Run(ctx, js, reader.Config{Group: "bench-runtime", Member: "b1"},
			func(_ context.Context, _ int, evs []reader.Event) error { handled.Add(int64(len(evs))); return nil })
	}()
	waitCaughtUp(b, js, "bench-runtime")
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	if n := handled.Load(); n < int64(want) {
		b.Fatalf("the runtime handled %d of %d events", n, want)
	}
}

func fraudConsume(b *testing.B, n *testenv.NATS, db int, js jetstream.JetStream) {
	b.Helper()
	cfg, err := loadConfig([]string{"NATS_URL=" + n.URL, "REDIS_URL=" + servers.Redis.URL(db), "HTTP_ADDR=127.0.0.1:0", "FRAUD_MEMBER=b1"}, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- run(ctx, slog.New(slog.DiscardHandler), cfg) }()
	waitCaughtUp(b, js, topology.GroupFraudDetection)
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}

// waitCaughtUp waits until the group has a consumer on every partition
// and none has anything pending: Lag leaves out the partitions whose
// consumer does not exist yet, which have processed nothing.
func waitCaughtUp(b *testing.B, js jetstream.JetStream, group string) {
	b.Helper()
	partitions, err := topology.Partitions(context.Background(), js)
	if err != nil {
		b.Fatal(err)
	}
	testenv.WaitFor(b, 30*time.Minute, "group "+group+" to catch up", func() bool {
		lag, err := reader.Lag(context.Background(), js, group)
		if err != nil || len(lag) != partitions {
			return false
		}
		for _, l := range lag {
			if l.Pending != 0 || l.AckPending != 0 {
				return false
			}
		}
		return true
	})
}
