package main

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"

	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/fraud/internal/traffic"
)

// BenchmarkViralFlood measures the fraud reader on a viral link flooded so
// that every click is labelled: one visitor's burst of BENCH_VIRAL_CLICKS
// (default 20,000) clicks, 1ms apart, on one link (so one partition), in an
// embedded file-storage NATS. It times the whole service (run) from start to
// "the group has acked everything", and reports, from the stream that holds
// fraud.verdicts.> (whichever it is), how many verdict messages were stored
// per 10,000 labelled clicks: each is a Nats-Msg-Id the server holds for the
// stream's duplicate window. The file compiles against the code before and
// after verdicts came in bulk, so both run it side by side
// (docs/benchmarks.md). It runs with batches of 500 and of 2,000
// (FRAUD_BATCH_SIZE; the partition's batches are judged one after another,
// so on one hot partition the batch's fixed round trips bound the rate).
// Run:
//
//	go test -run '^$' -bench ViralFlood -benchtime 1x .
func BenchmarkViralFlood(b *testing.B) {
	for _, batch := range []int{500, 2000} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) { benchViralFlood(b, batch) })
	}
}

func benchViralFlood(b *testing.B, batch int) {
	total := envInt("BENCH_VIRAL_CLICKS", 20_000)
	ctx := context.Background()
	for range b.N {
		n := testenv.StartNATS(b)
		js := n.JetStream(b)
		if err := topology.Apply(ctx, js, topology.Defaults()); err != nil {
			b.Fatal(err)
		}
		clicks := traffic.Burst(time.Now().Add(-time.Minute), total, time.Millisecond, "viral", "acme", "bot")
		if err := traffic.Publish(ctx, js, clicks, 2048); err != nil {
			b.Fatal(err)
		}
		_, db := servers.Redis.NewDB(b)
		took := timeIt(b, func() { viralConsume(b, n, db, js, uint64(total), batch) })

		// A subject both layouts store: fraud.verdicts.<owner>.<code> was
		// the per-click subject, and FRAUD_VERDICTS takes fraud.verdicts.>.
		name, err := js.StreamNameBySubject(ctx, "fraud.verdicts.acme.viral")
		if err != nil {
			b.Fatal(err)
		}
		s, err := js.Stream(ctx, name)
		if err != nil {
			b.Fatal(err)
		}
		info, err := s.Info(ctx, jetstream.WithSubjectFilter("fraud.verdicts.>"))
		if err != nil {
			b.Fatal(err)
		}
		var msgs uint64
		for _, c := range info.State.Subjects {
			msgs += c
		}
		dups := info.Config.Duplicates
		rate := float64(total) / took.Seconds()
		per10k := float64(msgs) * 10_000 / float64(total)
		b.ReportMetric(rate, "clicks/s")
		b.ReportMetric(per10k, "verdict-msgs/10k-labelled")
		b.Logf("%d clicks, all labelled: caught up in %s (%.0f clicks/s); %s holds %d verdict messages (%.0f per 10,000 labelled clicks, %d bytes), duplicate window %s",
			total, took.Round(time.Millisecond), rate, name, msgs, per10k, info.State.Bytes, dups)
		n.Stop()
	}
}

// viralConsume runs the service until the viral link's partition has acked
// the last click (CLICKS holds only the flood: sequences 1 to last). Waiting
// for "no partition pending" is not enough here: the other partitions'
// consumers may exist, caught up, before the busy one does.
func viralConsume(b *testing.B, n *testenv.NATS, db int, js jetstream.JetStream, last uint64, batch int) {
	b.Helper()
	cfg, err := loadConfig([]string{"NATS_URL=" + n.URL, "REDIS_URL=" + servers.Redis.URL(db), "HTTP_ADDR=127.0.0.1:0", "FRAUD_MEMBER=b1",
		"FRAUD_BATCH_SIZE=" + strconv.Itoa(batch)}, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- run(ctx, slog.New(slog.DiscardHandler), cfg) }()
	testenv.WaitFor(b, 10*time.Minute, "the fraud group to catch up", func() bool {
		lag, err := reader.Lag(context.Background(), js, topology.GroupFraudDetection)
		if err != nil {
			return false
		}
		for _, l := range lag {
			if l.Partition == events.Partition("viral", topology.DefaultPartitions) {
				return l.AckFloor >= last
			}
		}
		return false
	})
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}
