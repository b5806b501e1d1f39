package chwriter_test

import (
	"log/slog"
	"sort"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/google/go-cmp/cmp"

	"github.com/snipdev/snip/pkg/dashboard"
	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/services/warehouse/internal/chwriter"
	"github.com/snipdev/snip/services/warehouse/internal/loader"
	"github.com/snipdev/snip/services/warehouse/internal/warehousetest"
)

// start is a fixed time, so expectations do not depend on the clock.
var start = time.Date(2026, 3, 1, 10, 17, 0, 0, time.UTC)

// stored is when the test's events were "stored in JetStream".
var stored = start.Add(12 * time.Hour)

type dashEnv struct {
	q    *dashboard.Queries
	w    *chwriter.Writer
	conn driver.Conn
}

func newDashEnv(tb testing.TB) *dashEnv {
	tb.Helper()
	conn, db := servers.ClickHouse.NewDB(tb)
	w, err := chwriter.Open(chwriter.Config{Addrs: []string{servers.ClickHouse.Addr}, Database: db}, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = w.Close() })
	return &dashEnv{q: dashboard.New(conn), w: w, conn: conn}
}

func (e *dashEnv) insert(tb testing.TB, evs []reader.Event) {
	tb.Helper()
	rows := make([]loader.Row, len(evs))
	for i, ev := range evs {
		r, err := loader.RowFromEvent(ev)
		if err != nil {
			tb.Fatal(err)
		}
		rows[i] = r
	}
	if err := e.w.Insert(tb.Context(), rows); err != nil {
		tb.Fatalf("insert %d rows: %v", len(rows), err)
	}
}

// snapshot is every dashboard number for the test data.
type snapshot struct {
	Hours    map[string][]dashboard.HourClicks // by owner/code
	Top      []dashboard.LinkClicks
	TopAcme  []dashboard.LinkClicks
	Visitors map[string]uint64 // by owner and by owner/code
	Totals   dashboard.Totals
}

var links = func() []events.Click {
	// Which links exist: one click of each of Clicks' links.
	return warehousetest.Clicks(20, start, time.Second)
}()

func (e *dashEnv) snapshot(tb testing.TB) snapshot {
	tb.Helper()
	ctx := tb.Context()
	from, to := start.Add(-time.Hour), start.Add(48*time.Hour)
	s := snapshot{Hours: map[string][]dashboard.HourClicks{}, Visitors: map[string]uint64{}}
	var err error
	for _, l := range links {
		key := l.Owner + "/" + l.Code
		if s.Hours[key], err = e.q.ClicksPerHour(ctx, l.Owner, l.Code, from, to); err != nil {
			tb.Fatal(err)
		}
		if s.Visitors[key], err = e.q.UniqueVisitors(ctx, l.Owner, l.Code, from, to); err != nil {
			tb.Fatal(err)
		}
		if s.Visitors[l.Owner], err = e.q.UniqueVisitors(ctx, l.Owner, "", from, to); err != nil {
			tb.Fatal(err)
		}
	}
	if s.Top, err = e.q.TopLinks(ctx, "", from, 5); err != nil {
		tb.Fatal(err)
	}
	if s.TopAcme, err = e.q.TopLinks(ctx, "acme", from, 3); err != nil {
		tb.Fatal(err)
	}
	if s.Totals, err = e.q.Totals(ctx, from, to); err != nil {
		tb.Fatal(err)
	}
	s.Totals.Rows = 0 // rows differ with copies by design; compared apart
	return s
}

// expect computes the snapshot in Go from what was sent.
func expect(clicks []events.Click) snapshot {
	s := snapshot{Hours: map[string][]dashboard.HourClicks{}, Visitors: map[string]uint64{}}
	top := map[[2]string]*dashboard.LinkClicks{}
	for _, h := range warehousetest.Hours(clicks) {
		key := h.Owner + "/" + h.Code
		s.Hours[key] = append(s.Hours[key], dashboard.HourClicks{Hour: h.Hour, Clicks: h.Clicks, BotClicks: h.BotClicks, Visitors: h.Visitors})
		lk := [2]string{h.Owner, h.Code}
		if top[lk] == nil {
			top[lk] = &dashboard.LinkClicks{Owner: h.Owner, Code: h.Code}
		}
		top[lk].Clicks += h.Clicks
		top[lk].BotClicks += h.BotClicks
	}
	visitors := map[string]map[string]bool{}
	for _, c := range clicks {
		for _, key := range []string{c.Owner, c.Owner + "/" + c.Code} {
			if visitors[key] == nil {
				visitors[key] = map[string]bool{}
			}
			visitors[key][c.Visitor] = true
		}
	}
	for k, v := range visitors {
		s.Visitors[k] = uint64(len(v))
	}
	var all []dashboard.LinkClicks
	for _, l := range top {
		all = append(all, *l)
	}
	sort.Slice(all, func(i, j int) bool {
		a, b := all[i], all[j]
		if a.Clicks != b.Clicks {
			return a.Clicks > b.Clicks
		}
		if a.Owner != b.Owner {
			return a.Owner < b.Owner
		}
		return a.Code < b.Code
	})
	s.Top = all[:5]
	for _, l := range all {
		if l.Owner == "acme" && len(s.TopAcme) < 3 {
			s.TopAcme = append(s.TopAcme, l)
		}
	}
	s.Totals.Events = uint64(warehousetest.Distinct(clicks))
	return s
}

// testClicks spans 30 hours with an uneven mix of links, so the top-links
// ranking is not a tie.
func testClicks() []events.Click {
	clicks := warehousetest.Clicks(3000, start, 36*time.Second)
	for i := range 400 { // a hot link
		clicks = append(clicks, warehousetest.Click(i, "acme", "a-l3", start.Add(time.Duration(i)*time.Minute)))
	}
	for i := range 150 {
		clicks = append(clicks, warehousetest.Click(i, "globex", "g-l7", start.Add(time.Duration(i)*7*time.Minute)))
	}
	return clicks
}

func TestQueriesAnswerWhatWasSent(t *testing.T) {
	t.Parallel()
	e := newDashEnv(t)
	clicks := testClicks()
	e.insert(t, warehousetest.Events(clicks, stored))
	if diff := cmp.Diff(expect(clicks), e.snapshot(t)); diff != "" {
		t.Errorf("dashboard (-sent +warehouse):\n%s", diff)
	}
}

// TestQueriesUnchangedByCopies loads every event again in the ways the
// pipeline can: a redelivered batch (identical rows), a batch split
// differently, a replay through a republish (other sequences and stored
// time). Before and after ClickHouse merges the copies, every query answers
// as if each event had arrived once.
func TestQueriesUnchangedByCopies(t *testing.T) {
	t.Parallel()
	e := newDashEnv(t)
	clicks := testClicks()
	evs := warehousetest.Events(clicks, stored)
	e.insert(t, evs)
	want := e.snapshot(t)

	e.insert(t, evs)            // redelivery of everything
	e.insert(t, evs[1000:2500]) // an overlapping retry
	e.insert(t, evs[:10])       // a tiny one
	republished := warehousetest.Events(clicks, stored.Add(time.Hour))
	for i := range republished {
		republished[i].Seq += 1_000_000
	}
	e.insert(t, republished)
	if diff := cmp.Diff(want, e.snapshot(t)); diff != "" {
		t.Errorf("dashboard after copies (-once +copies):\n%s", diff)
	}
	var rows, rolled uint64
	if err := e.conn.QueryRow(t.Context(), "SELECT count() FROM clicks").Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if err := e.conn.QueryRow(t.Context(), "SELECT countMerge(inserted_rows) FROM clicks_hourly").Scan(&rolled); err != nil {
		t.Fatal(err)
	}
	if n := uint64(len(clicks)); rows <= n || rolled != 3*n+1500+10 {
		t.Errorf("rows = %d, rollup inserted_rows = %d; the copies did not all arrive (want rows > %d, inserted_rows %d)", rows, rolled, n, 3*n+1510)
	}

	for _, table := range []string{"clicks", "clicks_hourly"} {
		if err := e.conn.Exec(t.Context(), "OPTIMIZE TABLE "+table+" FINAL"); err != nil {
			t.Fatal(err)
		}
	}
	if diff := cmp.Diff(want, e.snapshot(t)); diff != "" {
		t.Errorf("dashboard after merges (-once +merged):\n%s", diff)
	}
	if err := e.conn.QueryRow(t.Context(), "SELECT count() FROM clicks").Scan(&rows); err != nil || rows != uint64(len(clicks)) {
		t.Errorf("rows after OPTIMIZE FINAL = %d, %v; want %d (one per event)", rows, err, len(clicks))
	}
}

// TestRollupMatchesRawTable checks the view against the raw table read with
// FINAL, per link and hour, after copies.
func TestRollupMatchesRawTable(t *testing.T) {
	t.Parallel()
	e := newDashEnv(t)
	evs := warehousetest.Events(testClicks(), stored)
	e.insert(t, evs)
	e.insert(t, evs[500:1500])
	var mismatches uint64
	err := e.conn.QueryRow(t.Context(), `
SELECT count() FROM (
    SELECT owner, code, hour, uniqExactMerge(clicks) AS n FROM clicks_hourly GROUP BY owner, code, hour
) ANY FULL OUTER JOIN (
    SELECT owner, code, toStartOfHour(ts) AS hour, count() AS m FROM clicks FINAL GROUP BY owner, code, hour
) USING (owner, code, hour)
WHERE n != m`).Scan(&mismatches)
	if err != nil {
		t.Fatal(err)
	}
	if mismatches != 0 {
		t.Errorf("%d (link, hour) rows where the rollup and the raw table disagree", mismatches)
	}
}
