package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/warehouse/internal/warehousetest"
)

// catchUpEvents is the backlog each BenchmarkCatchUp measurement loads.
const catchUpEvents = 200_000.0

// BenchmarkCatchUp measures the whole loader, as deployed: a backlog of
// catchUpEvents clicks (1000 links) waits in CLICKS (embedded NATS, 8
// partitions), the service starts with WAREHOUSE_BATCH_ROWS=rows, and the
// clock runs until ClickHouse accepted every row: the reader runtime fetches,
// decodes and acks, the loader batches, the full schema (table and view)
// receives the rows. In the same iteration, on the same backlog, the runtime
// alone drains it with a handler that does nothing (another group): the
// ceiling the loader can reach on this machine.
//
//	go test -run '^$' -bench CatchUp -benchtime 1x -count 3 .
func BenchmarkCatchUp(b *testing.B) {
	for _, rows := range []int{1_000, 10_000, 50_000} {
		b.Run(fmt.Sprintf("rows=%d", rows), func(b *testing.B) {
			for i := range b.N {
				b.StopTimer()
				n := testenv.StartNATS(b)
				js := n.JetStream(b)
				o := topology.Defaults()
				o.Partitions = warehousetest.Partitions
				if err := topology.Apply(b.Context(), js, o); err != nil {
					b.Fatal(err)
				}
				publishBacklog(b, js, catchUpEvents)

				noop := drainNoop(b, js, fmt.Sprintf("noop%d", i), rows)
				loaded, perInsert := catchUp(b, n.URL, rows)
				b.ReportMetric(noop, "runtime_noop_events/s")
				b.ReportMetric(loaded, "loader_rows/s")
				b.ReportMetric(loaded/noop, "loader/noop")
				b.ReportMetric(perInsert, "rows/insert")
				b.ReportMetric(0, "ns/op")
			}
		})
	}
}

// catchUp runs the service on the backlog until every row is inserted,
// and fails the benchmark unless the table holds every click of it: the
// service's own count of rows inserted would also count a batch inserted
// twice.
func catchUp(b *testing.B, natsURL string, rows int) (rowsPerSec, rowsPerInsert float64) {
	conn, db := servers.ClickHouse.NewDB(b)
	cfg := testConfig(natsURL, servers.ClickHouse.Addr, db)
	cfg.BatchRows, cfg.Linger, cfg.InsertTimeout = rows, time.Second, 30*time.Second
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr := make(chan string, 1)
	cfg.Ready = func(a string) { addr <- a }
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- run(ctx, benchLog(), cfg) }()
	a := <-addr
	testenv.WaitFor(b, 30*time.Minute, "the loader to insert the backlog", func() bool {
		return metricValue(a, "snip_warehouse_rows_inserted_total") >= catchUpEvents
	})
	rowsPerSec = catchUpEvents / time.Since(start).Seconds()
	rowsPerInsert = metricValue(a, "snip_warehouse_rows_inserted_total") / metricValue(a, "snip_warehouse_insert_rows_count")
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	var distinct uint64
	if err := conn.QueryRow(b.Context(), "SELECT uniqExact(event_id) FROM clicks").Scan(&distinct); err != nil {
		b.Fatal(err)
	}
	if distinct != catchUpEvents {
		b.Fatalf("the clicks table holds %d of the %.0f clicks of the backlog", distinct, catchUpEvents)
	}
	return rowsPerSec, rowsPerInsert
}

// drainNoop drains the backlog with the runtime and a handler that only
// counts, in a group of its own, with the loader's batch size.
func drainNoop(b *testing.B, js jetstream.JetStream, group string, batch int) float64 {
	var handled atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		done <- reader.Run(ctx, js, reader.Config{Group: group, BatchSize: batch, LeaseTTL: time.Second},
			func(_ context.Context, _ int, evs []reader.Event) error { handled.Add(int64(len(evs))); return nil })
	}()
	testenv.WaitFor(b, 30*time.Minute, "the no-op group to drain the backlog", func() bool {
		return handled.Load() >= catchUpEvents
	})
	rate := catchUpEvents / time.Since(start).Seconds()
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	return rate
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
