package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/warehouse/internal/warehousetest"
)

// catchUpEvents is the backlog each BenchmarkCatchUp measurement loads.
const catchUpEvents = 200_000

// BenchmarkCatchUp measures the whole loader, as deployed: a backlog of
// catchUpEvents clicks (1000 links) waits in CLICKS (embedded NATS, 8
// partitions), the service starts with WAREHOUSE_BATCH_ROWS=rows, and the
// clock runs until ClickHouse accepted every row. The reader runtime fetches,
// decodes and acks; the loader batches; the full schema (table and view)
// receives the rows. Compare with BenchmarkInsert in internal/loader (the
// bare batch insert of the same kind of rows), run alongside:
//
//	go test -run '^$' -bench . -benchtime 1x -count 3 . ./internal/loader
func BenchmarkCatchUp(b *testing.B) {
	for _, rows := range []int{1_000, 10_000, 50_000} {
		b.Run(fmt.Sprintf("rows=%d", rows), func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				n := testenv.StartNATS(b)
				js := n.JetStream(b)
				o := topology.Defaults()
				o.Partitions = warehousetest.Partitions
				if err := topology.Apply(b.Context(), js, o); err != nil {
					b.Fatal(err)
				}
				publishBacklog(b, js, catchUpEvents)
				_, db := servers.ClickHouse.NewDB(b)
				cfg := testConfig(n.URL, servers.ClickHouse.Addr, db)
				cfg.BatchRows, cfg.Linger, cfg.InsertTimeout = rows, time.Second, 30*time.Second

				ctx, cancel := context.WithCancel(context.Background())
				addr := make(chan string, 1)
				cfg.Ready = func(a string) { addr <- a }
				done := make(chan error, 1)
				b.StartTimer()
				start := time.Now()
				go func() { done <- run(ctx, benchLog(), cfg) }()
				a := <-addr
				for inserted(a) < catchUpEvents {
					time.Sleep(50 * time.Millisecond)
				}
				secs := time.Since(start).Seconds()
				b.StopTimer()
				b.ReportMetric(float64(catchUpEvents)/secs, "rows/s")
				scrape := func(name string) float64 { return metricValue(a, name) }
				b.ReportMetric(scrape("warehouse_rows_inserted_total")/scrape("warehouse_insert_rows_count"), "rows/insert")
				cancel()
				if err := <-done; err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// publishBacklog publishes n clicks over 1000 links, as the outbox would.
func publishBacklog(b *testing.B, js jetstream.JetStream, n int) {
	b.Helper()
	now := time.Now().UTC()
	for i := range n {
		c := warehousetest.Click(i, fmt.Sprintf("owner%d", i%50), fmt.Sprintf("link%d", i%1000), now.Add(-time.Duration(n-i)*100*time.Millisecond))
		data, err := json.Marshal(c)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := js.PublishAsync(events.ClickSubject(c.Owner, c.Code), data, jetstream.WithMsgID(c.ID)); err != nil {
			b.Fatal(err)
		}
		if i%2_000 == 1_999 {
			<-js.PublishAsyncComplete()
		}
	}
	<-js.PublishAsyncComplete()
}

func inserted(addr string) float64 { return metricValue(addr, "warehouse_rows_inserted_total") }

// metricValue is metric without a testing.T, for the benchmark's loop.
func metricValue(addr, name string) float64 {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	return sumMetric(resp.Body, name)
}

func benchLog() *slog.Logger {
	if os.Getenv("WAREHOUSE_BENCH_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
