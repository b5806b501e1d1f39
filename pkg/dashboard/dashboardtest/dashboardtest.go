// Package dashboardtest gives tests outside the warehouse the warehouse's
// tables and a way to fill them: it applies the schema copy operators use
// (deploy/clickhouse/*.sql, which the warehouse's tests keep identical to the
// schema it applies) and inserts clicks the way the loader does, through the
// clicks table, so the rollup's materialized view sees them. It is test
// support: only _test.go files import it.
package dashboardtest

import (
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/snipdev/snip/pkg/events"
)

// SchemaDir is the folder with the schema copy, found from this file's place
// in the repository so tests in any package find it.
func SchemaDir(tb testing.TB) string {
	tb.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		tb.Fatal("dashboardtest: cannot locate the source file")
	}
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "deploy", "clickhouse")
}

// ApplySchema creates the warehouse's tables and view in conn's database.
func ApplySchema(tb testing.TB, conn driver.Conn) {
	tb.Helper()
	files, err := filepath.Glob(filepath.Join(SchemaDir(tb), "*.sql"))
	if err != nil || len(files) == 0 {
		tb.Fatalf("dashboardtest: no schema files in %s (%v)", SchemaDir(tb), err)
	}
	sort.Strings(files)
	for _, f := range files {
		sql, err := os.ReadFile(f)
		if err != nil {
			tb.Fatal(err)
		}
		if err := conn.Exec(tb.Context(), string(sql)); err != nil {
			tb.Fatalf("dashboardtest: apply %s: %v", filepath.Base(f), err)
		}
	}
}

// Insert writes clicks into the clicks table in one insert, as the loader
// would have read them from partition 0 starting at sequence 1.
func Insert(tb testing.TB, conn driver.Conn, clicks []events.Click) {
	tb.Helper()
	batch, err := conn.PrepareBatch(tb.Context(), `INSERT INTO clicks (event_id, ts, owner, code, target, ip_prefix, visitor, user_agent, referrer, country, request_id, bot, stream_partition, stream_seq, ingested_at)`)
	if err != nil {
		tb.Fatalf("dashboardtest: prepare insert: %v", err)
	}
	for i, c := range clicks {
		var bot uint8
		if c.Bot {
			bot = 1
		}
		err := batch.Append(c.ID, c.Time.UTC(), c.Owner, c.Code, c.Target, c.IPPrefix, c.Visitor, c.UserAgent,
			c.Referrer, c.Country, c.RequestID, bot, uint16(0), uint64(i+1), c.Time.UTC().Truncate(time.Second))
		if err != nil {
			tb.Fatalf("dashboardtest: append click %d: %v", i, err)
		}
	}
	if err := batch.Send(); err != nil {
		tb.Fatalf("dashboardtest: insert %d clicks: %v", len(clicks), err)
	}
}

// Click is a valid click of owner/code at t with a fresh event ID; bot labels
// it a bot at the source.
func Click(owner, code string, t time.Time, bot bool) events.Click {
	return events.Click{
		V: events.ClickVersion, ID: events.NewID(), Time: t.UTC(), Code: code, Owner: owner,
		Target: "https://example.com/" + code, Visitor: "v-" + code, Bot: bot,
	}
}
