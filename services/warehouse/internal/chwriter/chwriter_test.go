package chwriter_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/warehouse/internal/chwriter"
	"github.com/snipdev/snip/services/warehouse/internal/loader"
	"github.com/snipdev/snip/services/warehouse/internal/warehousetest"
)

var servers *testenv.Servers

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &servers, testenv.WithClickHouse())) }

func newWriter(tb testing.TB, addr, db string) *chwriter.Writer {
	tb.Helper()
	w, err := chwriter.Open(chwriter.Config{Addrs: []string{addr}, Database: db, DialTimeout: 2 * time.Second},
		slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		tb.Fatalf("open writer: %v", err)
	}
	tb.Cleanup(func() { _ = w.Close() })
	return w
}

func rows(tb testing.TB, n int) []loader.Row {
	tb.Helper()
	now := time.Now().UTC()
	evs := warehousetest.Events(warehousetest.Clicks(n, now.Add(-time.Hour), time.Second), now)
	out := make([]loader.Row, n)
	for i, e := range evs {
		r, err := loader.RowFromEvent(e)
		if err != nil {
			tb.Fatal(err)
		}
		out[i] = r
	}
	return out
}

func TestInsertWritesEveryColumn(t *testing.T) {
	t.Parallel()
	_, db := servers.ClickHouse.NewDB(t)
	w := newWriter(t, servers.ClickHouse.Addr, db)
	want := rows(t, 50)
	if err := w.Insert(t.Context(), want); err != nil {
		t.Fatalf("insert: %v", err)
	}
	q, err := w.Conn().Query(t.Context(), `SELECT toString(event_id), ts, owner, code, target, ip_prefix, visitor, user_agent,
		referrer, toString(country), request_id, bot, stream_partition, stream_seq, ingested_at FROM clicks ORDER BY stream_seq`)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	var got []loader.Row
	for q.Next() {
		var r loader.Row
		var bot uint8
		if err := q.Scan(&r.EventID, &r.Time, &r.Owner, &r.Code, &r.Target, &r.IPPrefix, &r.Visitor, &r.UserAgent,
			&r.Referrer, &r.Country, &r.RequestID, &bot, &r.Partition, &r.Seq, &r.IngestedAt); err != nil {
			t.Fatal(err)
		}
		r.Bot = bot == 1
		r.Country = trimZero(r.Country)
		r.Time, r.IngestedAt = r.Time.UTC(), r.IngestedAt.UTC()
		got = append(got, r)
	}
	for i := range want { // DateTime keeps seconds
		want[i].Time = want[i].Time.Truncate(time.Second)
		want[i].IngestedAt = want[i].IngestedAt.Truncate(time.Second)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rows read back (-inserted +read):\n%s", diff)
	}
}

// trimZero drops the zero padding of an empty FixedString(2).
func trimZero(s string) string {
	for len(s) > 0 && s[len(s)-1] == 0 {
		s = s[:len(s)-1]
	}
	return s
}

func TestInsertCreatesDatabaseAndSchema(t *testing.T) {
	t.Parallel()
	admin, _ := servers.ClickHouse.NewDB(t)
	var b [6]byte
	_, _ = rand.Read(b[:])
	db := "fresh_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+db)
	})
	w := newWriter(t, servers.ClickHouse.Addr, db)
	if err := w.Insert(t.Context(), rows(t, 3)); err != nil {
		t.Fatalf("insert into a database that did not exist: %v", err)
	}
	if err := w.Ready(t.Context()); err != nil {
		t.Fatalf("Ready after an insert: %v", err)
	}
	var n uint64
	if err := w.Conn().QueryRow(t.Context(), "SELECT count() FROM clicks").Scan(&n); err != nil || n != 3 {
		t.Fatalf("count = %d, %v; want 3", n, err)
	}
}

// probeReady is a readiness probe: Ready within the 2 s pkg/webserver
// gives each check.
func probeReady(t *testing.T, w *chwriter.Writer) func() bool {
	return func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		return w.Ready(ctx) == nil
	}
}

func countTables(t *testing.T, conn driver.Conn, db string) uint64 {
	t.Helper()
	var n uint64
	if err := conn.QueryRow(t.Context(), "SELECT count() FROM system.tables WHERE database = ?", db).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestReadyAfterAMissingTableNeedsNoInsert: an insert that finds a table
// missing makes the writer forget the schema. With no traffic there is no
// next insert to apply it again, and the start-up's wait for the schema has
// ended; Ready applies it, so the loader turns ready again by itself.
func TestReadyAfterAMissingTableNeedsNoInsert(t *testing.T) {
	t.Parallel()
	conn, db := servers.ClickHouse.NewDB(t)
	w := newWriter(t, servers.ClickHouse.Addr, db)
	if err := w.Insert(t.Context(), rows(t, 3)); err != nil {
		t.Fatal(err)
	}
	if err := conn.Exec(t.Context(), "DROP TABLE clicks"); err != nil {
		t.Fatal(err)
	}
	if err := w.Insert(t.Context(), rows(t, 3)); chwriter.Classify(err) != chwriter.ClassMissing {
		t.Fatalf("insert into a dropped table = %v, want class %q", err, chwriter.ClassMissing)
	}
	// The DDL may take longer than one probe on a loaded machine; the next
	// probe goes on from there.
	testenv.WaitFor(t, 30*time.Second, "ready again after the drop, without an insert", probeReady(t, w))
	if n := countTables(t, conn, db); n != 3 {
		t.Fatalf("%s holds %d tables once ready, want 3 (clicks, clicks_hourly, clicks_hourly_mv)", db, n)
	}
}

// TestReadyNoticesADroppedTableWithoutAnInsert: a table, the view or the
// database dropped while no traffic flows fails nothing (the pool's pings
// still succeed); ready means an insert would land, so a probe looks the
// tables up, finds one missing and applies the schema again.
func TestReadyNoticesADroppedTableWithoutAnInsert(t *testing.T) {
	t.Parallel()
	for _, drop := range []string{"TABLE clicks", "TABLE clicks_hourly_mv", "DATABASE"} {
		t.Run(strings.ReplaceAll(drop, " ", "_"), func(t *testing.T) {
			t.Parallel()
			conn, db := servers.ClickHouse.NewDB(t)
			w := newWriter(t, servers.ClickHouse.Addr, db)
			if err := w.Insert(t.Context(), rows(t, 3)); err != nil {
				t.Fatal(err)
			}
			if err := w.Ready(t.Context()); err != nil {
				t.Fatalf("Ready after an insert: %v", err)
			}
			stmt := "DROP " + drop
			if drop == "DATABASE" {
				stmt += " " + db
			}
			if err := conn.Exec(t.Context(), stmt); err != nil {
				t.Fatal(err)
			}
			testenv.WaitFor(t, 20*time.Second, "a probe applies the schema again after DROP "+drop+", without an insert", func() bool {
				if !probeReady(t, w)() {
					return false
				}
				// Not countTables: conn fails every query while its
				// database is missing.
				var n uint64
				err := conn.QueryRow(t.Context(), "SELECT count() FROM system.tables WHERE database = ?", db).Scan(&n)
				return err == nil && n == 3
			})
			if err := w.Insert(t.Context(), rows(t, 3)); err != nil {
				t.Fatalf("insert once ready again: %v", err)
			}
		})
	}
}

// TestReadyAppliesTheSchema: before anything applied the schema (a loader
// whose start-up wait has not got to it), a probe applies it, creating the
// database too.
func TestReadyAppliesTheSchema(t *testing.T) {
	t.Parallel()
	admin, _ := servers.ClickHouse.NewDB(t)
	var b [6]byte
	_, _ = rand.Read(b[:])
	db := "fresh_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+db)
	})
	w := newWriter(t, servers.ClickHouse.Addr, db)
	testenv.WaitFor(t, 30*time.Second, "ready on a server without the database", probeReady(t, w))
	if n := countTables(t, admin, db); n != 3 {
		t.Fatalf("%s holds %d tables once ready, want 3", db, n)
	}
}

func TestBadRowIsReportedWithItsIndex(t *testing.T) {
	t.Parallel()
	_, db := servers.ClickHouse.NewDB(t)
	w := newWriter(t, servers.ClickHouse.Addr, db)
	tests := []struct {
		name  string
		index int
		spoil func(*loader.Row)
	}{
		{"three_letter_country", 2, func(r *loader.Row) { r.Country = "DEU" }},
		{"event_id_not_a_uuid", 0, func(r *loader.Row) { r.EventID = "not-a-uuid" }},
		{"last_row", 4, func(r *loader.Row) { r.EventID = "" }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rs := rows(t, 5)
			tc.spoil(&rs[tc.index])
			err := w.Insert(t.Context(), rs)
			var re *loader.RowError
			if !errors.As(err, &re) || re.Index != tc.index {
				t.Fatalf("insert = %v, want a RowError at %d", err, tc.index)
			}
		})
	}
	var n uint64
	if err := w.Conn().QueryRow(t.Context(), "SELECT count() FROM clicks").Scan(&n); err != nil || n != 0 {
		t.Fatalf("count = %d, %v; a batch with a bad row must insert nothing", n, err)
	}
	if err := w.Insert(t.Context(), rows(t, 5)); err != nil {
		t.Fatalf("insert after bad rows: %v", err)
	}
}

// spanningDays returns perDay rows on each of the days days before now,
// interleaved (day 0, 1, 2, …, then again), each stored when it happened:
// a replay or catch-up of a long-retained CLICKS.
func spanningDays(tb testing.TB, days, perDay int) []loader.Row {
	tb.Helper()
	now := time.Now().UTC()
	var out []loader.Row
	for k := range perDay {
		for d := range days {
			i := len(out)
			t := now.Add(-time.Duration(d)*24*time.Hour - time.Duration(k)*time.Minute)
			c := warehousetest.Click(i, "acme", fmt.Sprintf("a-l%d", i%10), t)
			r, err := loader.RowFromEvent(reader.Event{Click: c, Partition: 1, Seq: uint64(i + 1), Stored: t})
			if err != nil {
				tb.Fatal(err)
			}
			out = append(out, r)
		}
	}
	return out
}

// TestInsertSpanningManyDaysIsSplit: current servers refuse an insert block
// touching more than max_partitions_per_insert_block (100) partitions, and
// clicks has one per day, so rows spanning 200 days (a replay of a CLICKS
// that retains more than 100 days) go as statements of at most 90 whole
// days each, and every row lands once. 18.16 has no such limit, so the test
// counts the statements.
func TestInsertSpanningManyDaysIsSplit(t *testing.T) {
	t.Parallel()
	_, db := servers.ClickHouse.NewDB(t)
	w := newWriter(t, servers.ClickHouse.Addr, db)
	var statements [][]loader.Row
	chwriter.OnStatement(w, func(rs []loader.Row) { statements = append(statements, rs) })
	want := spanningDays(t, 200, 3)
	if err := w.Insert(t.Context(), want); err != nil {
		t.Fatalf("insert: %v", err)
	}
	dayOf := func(r loader.Row) string { return r.Time.UTC().Format(time.DateOnly) }
	seen := map[string]int{} // day: the statement that held it
	sent := 0
	for n, st := range statements {
		days := map[string]bool{}
		for _, r := range st {
			d := dayOf(r)
			days[d] = true
			if at, ok := seen[d]; ok && at != n {
				t.Errorf("day %s is in statements %d and %d; a day goes whole in one", d, at, n)
			}
			seen[d] = n
		}
		if len(days) > chwriter.DefaultMaxDaysPerInsert {
			t.Errorf("statement %d touches %d days, want at most %d", n, len(days), chwriter.DefaultMaxDaysPerInsert)
		}
		sent += len(st)
	}
	if len(statements) != 3 || sent != len(want) {
		t.Errorf("%d rows went in %d statements, want %d rows in 3 (200 days, 90 a statement)", sent, len(statements), len(want))
	}
	perEvent := warehousetest.RowsPerEvent(t, w.Conn())
	for _, r := range want {
		if perEvent[r.EventID] != 1 {
			t.Errorf("event %s (%s) has %d rows, want 1", r.EventID, dayOf(r), perEvent[r.EventID])
		}
	}
	if len(perEvent) != len(want) {
		t.Errorf("clicks holds %d events, want %d", len(perEvent), len(want))
	}

	// A row refused in a later statement is blamed by its index in the
	// rows given to Insert.
	statements = nil
	rs := spanningDays(t, 200, 1)
	const bad = 50 // 50 days ago: in the second statement (oldest first)
	rs[bad].EventID = "not-a-uuid"
	err := w.Insert(t.Context(), rs)
	if re, ok := errors.AsType[*loader.RowError](err); !ok || re.Index != bad {
		t.Fatalf("insert with row %d bad = %v, want a RowError at %d", bad, err, bad)
	}
}

// TestInsertRowsMetricIsPerStatement: snip_warehouse_insert_rows says how
// many rows each INSERT statement the server accepted held, so a batch split
// into three statements is three observations, and rows a statement landed
// are counted even when a later one of the same batch fails. So is
// snip_warehouse_insert_duration_seconds: it times each statement the
// server accepted, not the Insert call around them (with its schema and
// view checks).
func TestInsertRowsMetricIsPerStatement(t *testing.T) {
	t.Parallel()
	_, db := servers.ClickHouse.NewDB(t)
	reg := prometheus.NewRegistry()
	w, err := chwriter.Open(chwriter.Config{Addrs: []string{servers.ClickHouse.Addr}, Database: db, DialTimeout: 2 * time.Second},
		slog.New(slog.DiscardHandler), reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	var sizes []int
	chwriter.OnStatement(w, func(rs []loader.Row) { sizes = append(sizes, len(rs)) })
	rs := spanningDays(t, 200, 3)
	if err := w.Insert(t.Context(), rs); err != nil {
		t.Fatalf("insert: %v", err)
	}
	if len(sizes) != 3 {
		t.Fatalf("%d statements, want 3 (200 days, 90 a statement)", len(sizes))
	}
	durations := func() uint64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "snip_warehouse_insert_duration_seconds" {
				return mf.GetMetric()[0].GetHistogram().GetSampleCount()
			}
		}
		t.Fatal("no snip_warehouse_insert_duration_seconds")
		return 0
	}
	histogram := func() (count uint64, sum float64) {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "snip_warehouse_insert_rows" {
				h := mf.GetMetric()[0].GetHistogram()
				return h.GetSampleCount(), h.GetSampleSum()
			}
		}
		t.Fatal("no snip_warehouse_insert_rows")
		return 0, 0
	}
	if count, sum := histogram(); count != 3 || sum != float64(len(rs)) {
		t.Errorf("snip_warehouse_insert_rows: %d observations summing to %v, want 3 (%v) summing to %d", count, sum, sizes, len(rs))
	}
	if count := durations(); count != 3 {
		t.Errorf("snip_warehouse_insert_duration_seconds: %d observations, want 3: one a statement, as snip_warehouse_insert_rows", count)
	}
	if got := warehousetest.Metric(t, reg, "snip_warehouse_rows_inserted_total"); got != float64(len(rs)) {
		t.Errorf("snip_warehouse_rows_inserted_total = %v, want %d", got, len(rs))
	}

	// The second statement refuses a row: the first landed, and counts.
	sizes = nil
	rs = spanningDays(t, 200, 1)
	rs[50].EventID = "not-a-uuid" // 50 days ago: in the second statement (oldest first)
	if err := w.Insert(t.Context(), rs); err == nil {
		t.Fatal("insert with a bad row succeeded")
	}
	if len(sizes) != 1 {
		t.Fatalf("%d statements accepted before the bad row, want 1", len(sizes))
	}
	if count, sum := histogram(); count != 4 || sum != float64(600+sizes[0]) {
		t.Errorf("snip_warehouse_insert_rows after a batch whose first statement landed: %d observations summing to %v, want 4 summing to %d",
			count, sum, 600+sizes[0])
	}
	if count := durations(); count != 4 {
		t.Errorf("snip_warehouse_insert_duration_seconds after a batch whose first statement landed: %d observations, want 4", count)
	}
	if got := warehousetest.Metric(t, reg, "snip_warehouse_rows_inserted_total"); got != float64(600+sizes[0]) {
		t.Errorf("snip_warehouse_rows_inserted_total = %v, want %d (the first statement's rows landed)", got, 600+sizes[0])
	}
}

func TestDroppedTableIsCreatedAgain(t *testing.T) {
	t.Parallel()
	conn, db := servers.ClickHouse.NewDB(t)
	w := newWriter(t, servers.ClickHouse.Addr, db)
	if err := w.Insert(t.Context(), rows(t, 5)); err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{"clicks_hourly_mv", "clicks"} {
		if err := conn.Exec(t.Context(), "DROP TABLE "+table); err != nil {
			t.Fatal(err)
		}
	}
	err := w.Insert(t.Context(), rows(t, 5))
	if got := chwriter.Classify(err); got != chwriter.ClassMissing || errors.Is(err, loader.ErrPermanent) {
		t.Fatalf("insert into a dropped table = %v (class %q), want class %q, not permanent", err, got, chwriter.ClassMissing)
	}
	if err := w.Insert(t.Context(), rows(t, 5)); err != nil {
		t.Fatalf("second insert after the drop (schema applied again): %v", err)
	}
}

// TestDroppedViewIsCreatedAgain: the materialized view alone dropped makes
// no insert fail on the server (clicks takes the rows, and clicks_hourly,
// which every dashboard reads, never sees them). The writer inserts nothing
// while it is gone (class missing, retried), applies the schema again, and
// the rollup holds every click the table does.
func TestDroppedViewIsCreatedAgain(t *testing.T) {
	t.Parallel()
	conn, db := servers.ClickHouse.NewDB(t)
	w := newWriter(t, servers.ClickHouse.Addr, db)
	if err := w.Insert(t.Context(), rows(t, 5)); err != nil {
		t.Fatal(err)
	}
	if err := conn.Exec(t.Context(), "DROP TABLE clicks_hourly_mv"); err != nil {
		t.Fatal(err)
	}
	err := w.Insert(t.Context(), rows(t, 5))
	if got := chwriter.Classify(err); got != chwriter.ClassMissing || errors.Is(err, loader.ErrPermanent) {
		t.Errorf("insert with the view dropped = %v (class %q), want class %q, not permanent", err, got, chwriter.ClassMissing)
	}
	if err := w.Insert(t.Context(), rows(t, 5)); err != nil {
		t.Fatalf("second insert after the drop (schema applied again): %v", err)
	}
	var raw, rollup uint64
	if err := conn.QueryRow(t.Context(), "SELECT uniqExact(event_id) FROM clicks").Scan(&raw); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(t.Context(), "SELECT uniqExactMerge(clicks) FROM clicks_hourly").Scan(&rollup); err != nil {
		t.Fatal(err)
	}
	if raw != 10 || rollup != raw {
		t.Errorf("clicks holds %d events and clicks_hourly %d; want 10 in both (the first insert and the one after the view was back)", raw, rollup)
	}
}

func TestSchemaMismatchIsPermanent(t *testing.T) {
	t.Parallel()
	conn, db := servers.ClickHouse.NewDB(t)
	w := newWriter(t, servers.ClickHouse.Addr, db)
	if err := w.Insert(t.Context(), rows(t, 5)); err != nil {
		t.Fatal(err)
	}
	if err := conn.Exec(t.Context(), "ALTER TABLE clicks DROP COLUMN request_id"); err != nil {
		t.Fatal(err)
	}
	err := w.Insert(t.Context(), rows(t, 5))
	if got := chwriter.Classify(err); got != chwriter.ClassSchema || !errors.Is(err, loader.ErrPermanent) {
		t.Fatalf("insert with a dropped column = %v (class %q), want class %q and ErrPermanent", err, got, chwriter.ClassSchema)
	}
}

// usersWithoutRights is a users.xml for a server of a test's own: the
// default user as testenv makes it, and one user for each way ClickHouse
// 18.16's users.xml keeps a user from writing, none of which is a wrong
// name or password.
const usersWithoutRights = `<yandex>
  <profiles>
    <default><max_memory_usage>4000000000</max_memory_usage></default>
    <readonly><readonly>1</readonly></readonly>
  </profiles>
  <users>
    <default><password></password><networks><ip>127.0.0.1</ip><ip>::1</ip></networks><profile>default</profile><quota>default</quota></default>
    <readonly_user><password></password><networks><ip>127.0.0.1</ip></networks><profile>readonly</profile><quota>default</quota></readonly_user>
    <other_db_user><password></password><networks><ip>127.0.0.1</ip></networks><profile>default</profile><quota>default</quota><allow_databases><database>elsewhere</database></allow_databases></other_db_user>
    <remote_user><password></password><networks><ip>10.1.2.3</ip></networks><profile>default</profile><quota>default</quota></remote_user>
  </users>
  <quotas><default></default></quotas>
</yandex>
`

// TestNoRightToWriteIsAuth: on 18.16 a user an operator has not allowed to
// write the warehouse is refused with READONLY (164: a readonly profile),
// DATABASE_ACCESS_DENIED (291: allow_databases names others) or
// IP_ADDRESS_NOT_ALLOWED (195: its networks do not include the loader's).
// Each is the auth class: the loader's credentials or grants, which only an
// operator can change (ErrPermanent: an error log, retried slowly), not a
// server error retried as if it would pass.
func TestNoRightToWriteIsAuth(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ch, err := testenv.NewClickHouseServer(dir)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(ch.Close)
	// The schema is there, as an operator would have applied it.
	if err := newWriter(t, ch.Addr, "snip").Insert(t.Context(), rows(t, 5)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "users.xml"), []byte(usersWithoutRights), 0o644); err != nil {
		t.Fatal(err)
	}
	ch.Stop()
	if err := ch.Start(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ user, code string }{
		{"readonly_user", "code: 164"},
		{"other_db_user", "code: 291"},
		{"remote_user", "code: 195"},
	} {
		t.Run(tc.user, func(t *testing.T) {
			t.Parallel()
			w, err := chwriter.Open(chwriter.Config{Addrs: []string{ch.Addr}, Database: "snip", User: tc.user, DialTimeout: 2 * time.Second},
				slog.New(slog.DiscardHandler), prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = w.Close() })
			err = w.Insert(t.Context(), rows(t, 5))
			if !strings.Contains(fmt.Sprint(err), tc.code) {
				t.Fatalf("insert as %s = %v; want the server's %s", tc.user, err, tc.code)
			}
			if got := chwriter.Classify(err); got != chwriter.ClassAuth || !errors.Is(err, loader.ErrPermanent) {
				t.Errorf("insert as %s = %v (class %q), want class %q and ErrPermanent", tc.user, err, got, chwriter.ClassAuth)
			}
		})
	}
}

// TestChangedColumnTypeIsSchemaNotABadRow: after an operator changed a
// column's type to one the client refuses the rows' values for, Insert
// blames the table (schema class, ErrPermanent, naming the column), never a
// row: blaming one would park every click in turn. With the type changed
// back the same rows go in.
func TestChangedColumnTypeIsSchemaNotABadRow(t *testing.T) {
	t.Parallel()
	tests := []struct{ column, to, back string }{
		{"request_id", "UUID", "String"},
		{"target", "UInt64", "String"},
	}
	for _, tc := range tests {
		t.Run(tc.column+"_"+tc.to, func(t *testing.T) {
			t.Parallel()
			conn, db := servers.ClickHouse.NewDB(t)
			w := newWriter(t, servers.ClickHouse.Addr, db)
			if err := w.EnsureSchema(t.Context()); err != nil {
				t.Fatal(err)
			}
			if err := conn.Exec(t.Context(), fmt.Sprintf("ALTER TABLE clicks MODIFY COLUMN %s %s", tc.column, tc.to)); err != nil {
				t.Fatal(err)
			}
			rs := rows(t, 5)
			err := w.Insert(t.Context(), rs)
			var re *loader.RowError
			if errors.As(err, &re) {
				t.Fatalf("insert after %s became %s blames row %d: %v; want the table blamed", tc.column, tc.to, re.Index, err)
			}
			if got := chwriter.Classify(err); got != chwriter.ClassSchema || !errors.Is(err, loader.ErrPermanent) {
				t.Fatalf("insert after %s became %s = %v (class %q), want class %q and ErrPermanent", tc.column, tc.to, err, got, chwriter.ClassSchema)
			}
			// The message names the changed column and only it: the other
			// columns have the types the writer expects.
			if want := fmt.Sprintf("(%s is %s, the loader writes %s)", tc.column, tc.to, tc.back); !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say %q", err, want)
			}
			if err := conn.Exec(t.Context(), fmt.Sprintf("ALTER TABLE clicks MODIFY COLUMN %s %s", tc.column, tc.back)); err != nil {
				t.Fatal(err)
			}
			if err := w.Insert(t.Context(), rs); err != nil {
				t.Fatalf("insert with the type changed back: %v", err)
			}
		})
	}
}

// TestServerDownPausedAndBack walks one server of the test's own through the
// failures the loader must ride out: each is classified as retryable, a
// frozen server fails the insert within its deadline instead of hanging,
// and the pool recovers without a new writer.
func TestServerDownPausedAndBack(t *testing.T) {
	t.Parallel()
	ch := testenv.StartClickHouse(t)
	w := newWriter(t, ch.Addr, "snip")
	insert := func(timeout time.Duration) error {
		ctx, cancel := context.WithTimeout(t.Context(), timeout)
		defer cancel()
		return w.Insert(ctx, rows(t, 100))
	}
	if err := insert(30 * time.Second); err != nil {
		t.Fatalf("insert: %v", err)
	}

	ch.Pause()
	start := time.Now()
	err := insert(2 * time.Second)
	took := time.Since(start)
	ch.Resume()
	if got := chwriter.Classify(err); got != chwriter.ClassTimeout {
		t.Errorf("insert into a frozen server = %v (class %q), want class %q", err, got, chwriter.ClassTimeout)
	}
	// The deadline (2s) or, for a new connection's handshake, DialTimeout
	// (2s) bounds it; 20s means it hung.
	if took > 20*time.Second {
		t.Errorf("insert into a frozen server took %s; it must fail at its deadline", took)
	}
	if err := insert(30 * time.Second); err != nil {
		t.Fatalf("insert after resume: %v", err)
	}

	ch.Stop()
	err = insert(10 * time.Second)
	if got := chwriter.Classify(err); got != chwriter.ClassUnavailable || errors.Is(err, loader.ErrPermanent) {
		t.Errorf("insert with the server stopped = %v (class %q), want class %q", err, got, chwriter.ClassUnavailable)
	}
	if err := ch.Start(); err != nil {
		t.Fatal(err)
	}
	if err := insert(30 * time.Second); err != nil {
		t.Fatalf("insert after restart: %v", err)
	}
	var n uint64
	// Three inserts succeeded. The one that timed out against the frozen
	// server may still have landed: its data was in the socket when the
	// server stopped, and the server finished it after SIGCONT. A client
	// cannot know (the notes' "maybe inserted"), which is why the loader
	// retries whole batches into an idempotent table.
	if err := w.Conn().QueryRow(t.Context(), "SELECT uniqExact(event_id) FROM clicks").Scan(&n); err != nil || (n != 300 && n != 400) {
		t.Fatalf("distinct events = %d, %v; want 300 (three successful inserts), or 400 if the timed-out one landed", n, err)
	}
}

func TestClassify(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"nil", nil, ""},
		{"refused", &net.OpError{Op: "dial", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}, chwriter.ClassUnavailable},
		{"reset_wrapped", fmt.Errorf("prepare: %w", syscall.ECONNRESET), chwriter.ClassUnavailable},
		{"broken_pipe", fmt.Errorf("send data: %w", syscall.EPIPE), chwriter.ClassUnavailable},
		{"eof", fmt.Errorf("read: %w", io.EOF), chwriter.ClassUnavailable},
		{"deadline", fmt.Errorf("prepare: %w", context.DeadlineExceeded), chwriter.ClassTimeout},
		{"acquire_timeout", clickhouse.ErrAcquireConnTimeout, chwriter.ClassTimeout},
		{"net_timeout", &net.OpError{Op: "read", Err: timeoutErr{}}, chwriter.ClassTimeout},
		{"canceled", context.Canceled, chwriter.ClassCanceled},
		{"too_many_parts", &clickhouse.Exception{Code: 252}, chwriter.ClassOverloaded},
		{"too_many_parts_merges_behind", &clickhouse.Exception{Code: 252, Message: tooManyParts}, chwriter.ClassOverloaded},
		{"too_many_partitions", fmt.Errorf("send insert: %w", &clickhouse.Exception{Code: 252, Message: tooManyPartitions}), chwriter.ClassPartitions},
		{"memory_limit", &clickhouse.Exception{Code: 241}, chwriter.ClassOverloaded},
		{"server_timeout", &clickhouse.Exception{Code: 159}, chwriter.ClassOverloaded},
		{"unknown_table", &clickhouse.Exception{Code: 60}, chwriter.ClassMissing},
		{"unknown_database", &clickhouse.Exception{Code: 81}, chwriter.ClassMissing},
		{"no_such_column", fmt.Errorf("prepare: %w", &clickhouse.Exception{Code: 16}), chwriter.ClassSchema},
		{"type_mismatch", &clickhouse.Exception{Code: 53}, chwriter.ClassSchema},
		{"access_denied", &clickhouse.Exception{Code: 497}, chwriter.ClassAuth},
		{"wrong_password", &clickhouse.Exception{Code: 516}, chwriter.ClassAuth},
		{"other_exception", &clickhouse.Exception{Code: 1}, chwriter.ClassServer},
		{"unknown", errors.New("something"), chwriter.ClassOther},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := chwriter.Classify(tc.err); got != tc.want {
				t.Errorf("Classify(%v) = %q, want %q", tc.err, got, tc.want)
			}
		})
	}
}

// The two messages of code 252 (TOO_MANY_PARTS), as current servers word them.
const (
	tooManyParts      = "Too many parts (300 with average size of 1.02 MiB) in table 'snip.clicks'. Merges are processing significantly slower than inserts"
	tooManyPartitions = "Too many partitions for single INSERT block (more than 100). The limit is controlled by 'max_partitions_per_insert_block' setting. Large number of partitions is a common misconception."
)

// TestTooManyPartitionsIsPermanent: a server whose
// max_partitions_per_insert_block is below the days the writer puts in one
// insert refuses that insert every time, so it is not "overloaded"
// (retried at once, forever, with a warning) but its own class, permanent:
// retried slowly with an error log naming the setting. 18.16 has no such
// limit, so the server's exception is made here.
func TestTooManyPartitionsIsPermanent(t *testing.T) {
	t.Parallel()
	w := newWriter(t, servers.ClickHouse.Addr, "snip")
	err := chwriter.Fail(w, fmt.Errorf("send insert: %w", &clickhouse.Exception{Code: 252, Message: tooManyPartitions}))
	if got := chwriter.Classify(err); got != chwriter.ClassPartitions || !errors.Is(err, loader.ErrPermanent) {
		t.Errorf("too many partitions = %v (class %q), want class %q, permanent", err, got, chwriter.ClassPartitions)
	}
	for _, want := range []string{"max_partitions_per_insert_block", "90 days", "WAREHOUSE_MAX_DAYS_PER_INSERT"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("too many partitions = %q, want it to name %q", err, want)
		}
	}
	err = chwriter.Fail(w, fmt.Errorf("send insert: %w", &clickhouse.Exception{Code: 252, Message: tooManyParts}))
	if got := chwriter.Classify(err); got != chwriter.ClassOverloaded || errors.Is(err, loader.ErrPermanent) {
		t.Errorf("too many parts = %v (class %q), want class %q, not permanent", err, got, chwriter.ClassOverloaded)
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }
