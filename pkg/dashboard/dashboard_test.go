package dashboard_test

import (
	"os"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/snipdev/snip/pkg/dashboard"
	"github.com/snipdev/snip/pkg/dashboard/dashboardtest"
	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
)

// The queries against the loader's own rows, through redeliveries and
// merges, are tested where the rows are written: services/warehouse
// (internal/chwriter/dashboard_test.go). Here: what the console adds, and
// the time arithmetic.

var servers *testenv.Servers

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &servers, testenv.WithClickHouse())) }

func TestHourlyTotalsCountEachClickOnceOverEveryLink(t *testing.T) {
	t.Parallel()
	conn, _ := servers.ClickHouse.NewDB(t)
	dashboardtest.ApplySchema(t, conn)
	h0 := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	var clicks []events.Click
	for i := range 7 {
		clicks = append(clicks, dashboardtest.Click("acme", "a1", h0.Add(time.Duration(i)*time.Minute), i == 0))
	}
	for i := range 3 {
		clicks = append(clicks, dashboardtest.Click("globex", "g1", h0.Add(time.Duration(i)*time.Minute), false))
	}
	for i := range 4 {
		clicks = append(clicks, dashboardtest.Click("acme", "a2", h0.Add(2*time.Hour+time.Duration(i)*time.Minute), i < 2))
	}
	dashboardtest.Insert(t, conn, clicks)
	dashboardtest.Insert(t, conn, clicks[3:9]) // a redelivered, overlapping batch
	outside := dashboardtest.Click("acme", "a1", h0.Add(-time.Hour), false)
	dashboardtest.Insert(t, conn, []events.Click{outside})

	got, err := dashboard.New(conn).HourlyTotals(t.Context(), h0.Add(30*time.Minute), h0.Add(3*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	want := []dashboard.HourTotals{
		{Hour: h0, Clicks: 10, BotClicks: 1},
		{Hour: h0.Add(2 * time.Hour), Clicks: 4, BotClicks: 2},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("hourly totals (-want +got):\n%s", d)
	}

	top, err := dashboard.New(conn).TopLinks(t.Context(), "", h0, 2)
	if err != nil {
		t.Fatal(err)
	}
	wantTop := []dashboard.LinkClicks{{Owner: "acme", Code: "a1", Clicks: 7, BotClicks: 1}, {Owner: "acme", Code: "a2", Clicks: 4, BotClicks: 2}}
	if d := cmp.Diff(wantTop, top); d != "" {
		t.Errorf("top links (-want +got):\n%s", d)
	}
}

func TestLast24hIsTheCurrentHourAndThe23Before(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		now  time.Time
		want time.Time
	}{
		{"mid_hour", time.Date(2026, 3, 2, 15, 42, 7, 0, time.UTC), time.Date(2026, 3, 1, 16, 0, 0, 0, time.UTC)},
		{"on_the_hour", time.Date(2026, 3, 2, 15, 0, 0, 0, time.UTC), time.Date(2026, 3, 1, 16, 0, 0, 0, time.UTC)},
		{"other_zone", time.Date(2026, 3, 2, 16, 42, 0, 0, time.FixedZone("CET", 3600)), time.Date(2026, 3, 1, 16, 0, 0, 0, time.UTC)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := dashboard.Last24h(tc.now); !got.Equal(tc.want) {
				t.Errorf("Last24h(%s) = %s, want %s", tc.now, got, tc.want)
			}
		})
	}
}
