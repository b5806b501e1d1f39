package chquery_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/google/uuid"

	"github.com/snipdev/snip/loadtest/internal/chquery"
	"github.com/snipdev/snip/loadtest/internal/oracle"
	"github.com/snipdev/snip/pkg/testenv"
)

var servers *testenv.Servers

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &servers, testenv.WithClickHouse())) }

// var _ checks the client is what the oracle reads the warehouse through.
var _ oracle.WarehouseReader = (*chquery.Client)(nil)

// warehouseDDL is the warehouse's own `clicks` table: chquery relies on
// its contract, so it is tested against the real schema, not a copy.
var warehouseDDL = filepath.Join("..", "..", "..", "services", "warehouse", "internal", "schema", "sql", "001_clicks.sql")

// row is one row of `clicks`, as the loader inserts it.
type row struct {
	owner, code string
	id          uuid.UUID
	bot         bool
}

// newWarehouse creates the warehouse's `clicks` table in a database of
// its own, with its merges stopped (ReplacingMergeTree would otherwise
// merge copies away while the test counts rows), inserts rows, each
// insert one part, and opens a client on it with a DSN.
func newWarehouse(t *testing.T, inserts ...[]row) *chquery.Client {
	t.Helper()
	conn, db := servers.ClickHouse.NewDB(t)
	ddl, err := os.ReadFile(warehouseDDL)
	if err != nil {
		t.Fatalf("the warehouse's schema: %v", err)
	}
	if err := conn.Exec(t.Context(), string(ddl)); err != nil {
		t.Fatalf("create clicks: %v", err)
	}
	if err := conn.Exec(t.Context(), "SYSTEM STOP MERGES clicks"); err != nil {
		t.Fatalf("stop merges: %v", err)
	}
	for _, rows := range inserts {
		insert(t, conn, rows)
	}
	c, err := chquery.Open("clickhouse://" + servers.ClickHouse.Addr + "/" + db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func insert(t *testing.T, conn driver.Conn, rows []row) {
	t.Helper()
	b, err := conn.PrepareBatch(t.Context(), "INSERT INTO clicks (event_id, ts, owner, code, bot)")
	if err != nil {
		t.Fatal(err)
	}
	ts := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, r := range rows {
		var bot uint8
		if r.bot {
			bot = 1
		}
		if err := b.Append(r.id, ts, r.owner, r.code, bot); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Send(); err != nil {
		t.Fatalf("insert: %v", err)
	}
}

// ids are fixed event IDs, so a failure names the same ones every run.
var ids = func() (out [8]uuid.UUID) {
	for i := range out {
		out[i] = uuid.MustParse("0190a000-0000-7000-8000-00000000000" + string(rune('0'+i)))
	}
	return out
}()

// run is an owner's run on links lt-abc-0 and lt-abc-1, with a copy of
// two events (a redelivery), and its neighbours: the same codes of
// another owner, and a code of the owner that shares a longer prefix.
var run = []row{
	{"acme", "lt-abc-0", ids[0], false},
	{"acme", "lt-abc-0", ids[1], true},
	{"acme", "lt-abc-0", ids[2], false},
	{"acme", "lt-abc-1", ids[3], false},
	{"other", "lt-abc-0", ids[4], false},
	{"acme", "lt-abcd-0", ids[5], false},
	{"acme", "xlt-abc-0", ids[6], false},
}

var redelivered = []row{
	{"acme", "lt-abc-0", ids[1], true},
	{"acme", "lt-abc-1", ids[3], false},
}

func TestLinkCountsCountDistinctEventsOfTheOwnersPrefix(t *testing.T) {
	t.Parallel()
	c := newWarehouse(t, run, redelivered)
	tests := []struct {
		name   string
		owner  string
		prefix string
		want   map[string]oracle.WarehouseCount
	}{
		{
			name: "the_runs_links_with_copies_counted_once", owner: "acme", prefix: "lt-abc-",
			want: map[string]oracle.WarehouseCount{
				"lt-abc-0": {Distinct: 3, DistinctBots: 1, Rows: 4},
				"lt-abc-1": {Distinct: 1, DistinctBots: 0, Rows: 2},
			},
		},
		{
			name: "another_owners_clicks_only", owner: "other", prefix: "lt-abc-",
			want: map[string]oracle.WarehouseCount{"lt-abc-0": {Distinct: 1, Rows: 1}},
		},
		// The prefix is a prefix, not a pattern: "_" and "%" in it are
		// themselves ("lt_abc-" would match "lt-abc-0" as a pattern).
		{name: "underscore_is_not_a_wildcard", owner: "acme", prefix: "lt_abc-", want: map[string]oracle.WarehouseCount{}},
		{name: "percent_is_not_a_wildcard", owner: "acme", prefix: "%abc-", want: map[string]oracle.WarehouseCount{}},
		{name: "no_clicks", owner: "nobody", prefix: "lt-abc-", want: map[string]oracle.WarehouseCount{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := c.LinkCounts(t.Context(), tc.owner, tc.prefix)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("link counts (-want +got):\n%s", diff)
			}
		})
	}
}

func TestEventIDsGivesEachEventOnce(t *testing.T) {
	t.Parallel()
	c := newWarehouse(t, run, redelivered)
	tests := []struct {
		name, owner, prefix string
		want                []row
	}{
		{
			name: "the_runs_events", owner: "acme", prefix: "lt-abc-",
			want: []row{run[0], run[1], run[2], run[3]},
		},
		{name: "another_owners", owner: "other", prefix: "lt-abc-", want: []row{run[4]}},
		{name: "underscore_is_not_a_wildcard", owner: "acme", prefix: "lt_abc-"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var got []row
			err := c.EventIDs(t.Context(), tc.owner, tc.prefix, func(code string, id uuid.UUID, bot bool) {
				got = append(got, row{tc.owner, code, id, bot})
			})
			if err != nil {
				t.Fatal(err)
			}
			byID := func(a, b row) bool { return a.id.String() < b.id.String() }
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(row{}), cmpopts.SortSlices(byID)); diff != "" {
				t.Errorf("event IDs (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCountIsTheLinksDistinctEvents(t *testing.T) {
	t.Parallel()
	c := newWarehouse(t, run, redelivered)
	tests := []struct {
		name, owner, code string
		want              int
	}{
		{name: "copies_counted_once", owner: "acme", code: "lt-abc-1", want: 1},
		{name: "bots_included", owner: "acme", code: "lt-abc-0", want: 3},
		{name: "the_owners_own", owner: "other", code: "lt-abc-0", want: 1},
		{name: "the_code_exactly_not_a_prefix", owner: "acme", code: "lt-abc", want: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := c.Count(t.Context(), tc.owner, tc.code)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("count of %s/%s = %d, want %d", tc.owner, tc.code, got, tc.want)
			}
		})
	}
}

func TestPingNeedsTheTable(t *testing.T) {
	t.Parallel()
	if err := newWarehouse(t).Ping(t.Context()); err != nil {
		t.Errorf("ping with the table: %v", err)
	}
	_, db := servers.ClickHouse.NewDB(t) // no table
	c, err := chquery.Open("clickhouse://" + servers.ClickHouse.Addr + "/" + db)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Ping(t.Context()); err == nil || !strings.Contains(err.Error(), `no table "clicks"`) {
		t.Errorf("ping without the table: %v, want no table \"clicks\"", err)
	}
	if _, err := chquery.Open("http://%zz"); err == nil {
		t.Error("Open accepted a DSN that is not a URL")
	}
}
