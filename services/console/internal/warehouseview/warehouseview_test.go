package warehouseview_test

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/snipdev/snip/pkg/dashboard/dashboardtest"
	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/console/internal/warehouseview"
)

var servers *testenv.Servers

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &servers, testenv.WithClickHouse())) }

func open(t *testing.T, cfg warehouseview.Config) *warehouseview.View {
	t.Helper()
	v, err := warehouseview.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = v.Close() })
	return v
}

func TestPanelSaysWhyItHasNoFigures(t *testing.T) {
	t.Parallel()
	_, db := servers.ClickHouse.NewDB(t)
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		cfg        warehouseview.Config
		configured bool
		want       string
	}{
		{"not_configured", warehouseview.Config{}, false, "ClickHouse not configured"},
		{"nothing_listening", warehouseview.Config{Addrs: []string{"127.0.0.1:" + strconv.Itoa(port)}, Database: db}, true, "ClickHouse not reachable"},
		{"no_tables_yet", warehouseview.Config{Addrs: []string{servers.ClickHouse.Addr}, Database: db}, true, "tables are not there yet"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := open(t, tc.cfg).Snapshot(t.Context(), time.Now())
			if s.Available || s.Configured != tc.configured || !strings.Contains(s.Error, tc.want) {
				t.Errorf("snapshot %+v: want configured=%v, unavailable, error containing %q", s, tc.configured, tc.want)
			}
		})
	}
}

func TestPanelShowsTopLinksAndHoursOfTheLast24h(t *testing.T) {
	t.Parallel()
	conn, db := servers.ClickHouse.NewDB(t)
	dashboardtest.ApplySchema(t, conn)
	now := time.Now().UTC()
	hour := now.Truncate(time.Hour)
	var clicks []events.Click
	for i := range 5 {
		clicks = append(clicks, dashboardtest.Click("acme", "hot", hour.Add(time.Duration(i)*time.Second), i == 0))
	}
	clicks = append(clicks, dashboardtest.Click("globex", "warm", hour.Add(-2*time.Hour), false))
	clicks = append(clicks, dashboardtest.Click("acme", "old", hour.Add(-30*time.Hour), false)) // before the window
	dashboardtest.Insert(t, conn, clicks)

	s := open(t, warehouseview.Config{Addrs: []string{servers.ClickHouse.Addr}, Database: db, TopLinks: 5}).Snapshot(t.Context(), now)
	if !s.Available || s.Error != "" {
		t.Fatalf("snapshot unavailable: %s", s.Error)
	}
	wantTop := []warehouseview.Link{{Owner: "acme", Code: "hot", Clicks: 5, BotClicks: 1}, {Owner: "globex", Code: "warm", Clicks: 1}}
	if d := cmp.Diff(wantTop, s.TopLinks); d != "" {
		t.Errorf("top links (-want +got):\n%s", d)
	}
	wantHours := []warehouseview.Hour{{Hour: hour.Add(-2 * time.Hour), Clicks: 1}, {Hour: hour, Clicks: 5, BotClicks: 1}}
	if d := cmp.Diff(wantHours, s.Hours); d != "" {
		t.Errorf("hours (-want +got):\n%s", d)
	}
}
