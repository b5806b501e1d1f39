package loader_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/services/warehouse/internal/chwriter"
	"github.com/snipdev/snip/services/warehouse/internal/loader"
	"github.com/snipdev/snip/services/warehouse/internal/schema"
	"github.com/snipdev/snip/services/warehouse/internal/warehousetest"
)

// benchRows is how many rows each measurement inserts, over benchLinks links
// (spread evenly over the partitions, like real traffic).
const (
	benchRows  = 300_000
	benchLinks = 1000
)

// BenchmarkInsert measures rows/s into the full schema (the clicks table and
// its view) for each batch size, two ways over the same pre-built events,
// back to back in every iteration so that their ratio is measured under the
// same conditions:
//
//   - bare: the plainest batch insert from Go, PrepareBatch, Append, Send,
//     one batch after the other, on a connection without compression;
//   - loader: the loader and its ClickHouse writer as the service runs them
//     under live traffic faster than ClickHouse: eight partitions each
//     handing batches of up to rows events (the runtime's BatchSize is the
//     loader's MaxRows) and waiting for Handle.
//
// Run it (docs/benchmarks.md, "Warehouse loader"):
//
//	go test -run '^$' -bench Insert -benchtime 1x -count 3 ./internal/loader
func BenchmarkInsert(b *testing.B) {
	now := time.Now().UTC()
	clicks := make([]events.Click, benchRows)
	for i := range clicks {
		owner := fmt.Sprintf("owner%d", i%50)
		clicks[i] = warehousetest.Click(i, owner, fmt.Sprintf("link%d", i%benchLinks), now.Add(-24*time.Hour+time.Duration(i)*100*time.Millisecond))
	}
	evs := warehousetest.Events(clicks, now)
	byPart := warehousetest.ByPartition(evs)
	for _, size := range []int{1_000, 10_000, 50_000} {
		b.Run(fmt.Sprintf("rows=%d", size), func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				bare := measureBare(b, evs, size)
				loaded, perInsert := measureLoader(b, byPart, len(evs), size)
				b.ReportMetric(bare, "bare_rows/s")
				b.ReportMetric(loaded, "loader_rows/s")
				b.ReportMetric(loaded/bare, "loader/bare")
				b.ReportMetric(perInsert, "rows/insert")
				b.ReportMetric(0, "ns/op")
			}
		})
	}
}

func measureBare(b *testing.B, evs []reader.Event, size int) float64 {
	conn, _ := servers.ClickHouse.NewDB(b)
	if err := schema.Apply(b.Context(), conn); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	for i := 0; i < len(evs); i += size {
		bareInsert(b, conn, evs[i:min(i+size, len(evs))])
	}
	rate := float64(len(evs)) / time.Since(start).Seconds()
	wantRows(b, conn, len(evs))
	return rate
}

// wantRows fails the benchmark unless the clicks table holds n distinct
// events: a rate is one of rows stored only if they were.
func wantRows(b *testing.B, conn clickhouse.Conn, n int) {
	b.Helper()
	var distinct uint64
	if err := conn.QueryRow(b.Context(), "SELECT uniqExact(event_id) FROM clicks").Scan(&distinct); err != nil {
		b.Fatal(err)
	}
	if distinct != uint64(n) {
		b.Fatalf("the clicks table holds %d of the %d events inserted", distinct, n)
	}
}

func measureLoader(b *testing.B, byPart map[int][]reader.Event, total, size int) (rowsPerSec, rowsPerInsert float64) {
	conn, db := servers.ClickHouse.NewDB(b)
	reg := prometheus.NewRegistry()
	w, err := chwriter.Open(chwriter.Config{Addrs: []string{servers.ClickHouse.Addr}, Database: db}, slog.New(slog.DiscardHandler), reg)
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	if err := w.EnsureSchema(b.Context()); err != nil {
		b.Fatal(err)
	}
	l, err := loader.New(w, loader.Config{MaxRows: size, Linger: time.Second, Metrics: reg})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	start := time.Now()
	feedPartitions(b, l, byPart, size)
	rowsPerSec = float64(total) / time.Since(start).Seconds()
	wantRows(b, conn, total)
	return rowsPerSec, float64(total) / warehousetest.Metric(b, reg, "snip_warehouse_insert_rows")
}

// bareInsert is the reference: no loader, no retries, no metrics.
func bareInsert(b *testing.B, conn clickhouse.Conn, evs []reader.Event) {
	batch, err := conn.PrepareBatch(context.Background(), `INSERT INTO clicks (event_id, ts, owner, code, target, ip_prefix, visitor, user_agent, referrer, country, request_id, bot, stream_partition, stream_seq, ingested_at)`)
	if err != nil {
		b.Fatal(err)
	}
	for _, e := range evs {
		c := e.Click
		var bot uint8
		if c.Bot {
			bot = 1
		}
		if err := batch.Append(c.ID, c.Time, c.Owner, c.Code, c.Target, c.IPPrefix, c.Visitor, c.UserAgent, c.Referrer,
			c.Country, c.RequestID, bot, uint16(e.Partition), e.Seq, e.Stored); err != nil {
			b.Fatal(err)
		}
	}
	if err := batch.Send(); err != nil {
		b.Fatal(err)
	}
}

// feedPartitions drives the loader as the runtime does: one goroutine per
// partition, handing one batch at a time and waiting for the handler.
func feedPartitions(b *testing.B, l *loader.Loader, byPart map[int][]reader.Event, batch int) {
	var wg sync.WaitGroup
	for p, part := range byPart {
		wg.Go(func() {
			for i := 0; i < len(part); i += batch {
				evs := part[i:min(i+batch, len(part))]
				// Live traffic: stored just now, so the size and the linger
				// start inserts (a backlog would not linger; BenchmarkCatchUp
				// in the service measures that).
				now := time.Now()
				for k := range evs {
					evs[k].Stored = now
				}
				if err := l.Handle(b.Context(), p, evs); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}
