package httpapi_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/owners"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/webserver"
	"github.com/snipdev/snip/services/clickcounter/internal/counter"
	"github.com/snipdev/snip/services/clickcounter/internal/httpapi"
	"github.com/snipdev/snip/services/clickcounter/internal/redisstore"
)

var servers *testenv.Servers

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &servers, testenv.WithRedis())) }

type noClicks struct{}

func (noClicks) FirstSeq(context.Context, int) (uint64, error) { return 0, nil }

func (noClicks) NextSeq(context.Context, int, uint64) (uint64, error) { return 0, nil }

func newCounter(tb testing.TB, rdb redis.UniversalClient) *counter.Counter {
	tb.Helper()
	c, err := counter.New(counter.Options{Store: redisstore.New(rdb), Clicks: noClicks{}, Partitions: 4,
		DedupWindow: time.Minute, ClicksMaxAge: 7 * 24 * time.Hour})
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

func TestStatsAPI(t *testing.T) {
	t.Parallel()
	rdb, _ := servers.Redis.NewDB(t)
	ctx := t.Context()
	own := owners.NewStore(rdb)
	acmeKey, err := own.Create(ctx, "acme", "Acme")
	if err != nil {
		t.Fatal(err)
	}
	globexKey, err := own.Create(ctx, "globex", "Globex")
	if err != nil {
		t.Fatal(err)
	}
	c := newCounter(t, rdb)
	for i, le := range []events.LinkEvent{
		{Kind: events.LinkCreated, Owner: "acme", Code: "hot"},
		{Kind: events.LinkCreated, Owner: "acme", Code: "quiet"},
		{Kind: events.LinkCreated, Owner: "globex", Code: "theirs"},
	} {
		le.V, le.ID, le.Time = events.LinkVersion, events.NewID(), time.Now()
		if err := c.ApplyLinkEvent(ctx, &le, uint64(i+1)); err != nil {
			t.Fatal(err)
		}
	}
	cl := events.Click{V: events.ClickVersion, ID: events.NewID(), Time: time.Now(), Code: "hot", Owner: "acme", Visitor: "v1", Country: "FR"}
	p := events.Partition("hot", 4)
	if err := c.HandleBatch(ctx, p, []reader.Event{{Click: cl, Partition: p, Seq: 7, Stored: cl.Time}}); err != nil {
		t.Fatal(err)
	}

	e := echo.New()
	httpapi.Register(e, own, c, slog.New(slog.DiscardHandler))
	// A second API on a dead Redis, for the 500 case.
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { _ = dead.Close() })
	broken := echo.New()
	httpapi.Register(broken, own, newCounter(t, dead), slog.New(slog.DiscardHandler))

	tests := []struct {
		name, path, auth string
		api              *echo.Echo
		wantCode         int
		wantHuman        int64
		hours, days      int // series lengths of a 200; 0: the defaults
	}{
		{name: "owner_gets_stats", path: "/api/links/hot/stats", auth: "Bearer " + acmeKey, wantCode: 200, wantHuman: 1},
		{name: "link_without_clicks_is_zeros", path: "/api/links/quiet/stats", auth: "Bearer " + acmeKey, wantCode: 200},
		{name: "ranges_within_bounds", path: "/api/links/hot/stats?hours=3&days=2&top=1", auth: "Bearer " + acmeKey, wantCode: 200, wantHuman: 1, hours: 3, days: 2},
		{name: "bearer_scheme_is_case_insensitive", path: "/api/links/hot/stats", auth: "bearer " + acmeKey, wantCode: 200, wantHuman: 1},
		{name: "no_key_is_401", path: "/api/links/hot/stats", wantCode: 401},
		{name: "basic_auth_is_401", path: "/api/links/hot/stats", auth: "Basic YWNtZTpwdw==", wantCode: 401},
		{name: "unknown_key_is_401", path: "/api/links/hot/stats", auth: "Bearer " + owners.NewAPIKey(), wantCode: 401},
		{name: "key_without_prefix_is_401", path: "/api/links/hot/stats", auth: "Bearer nope", wantCode: 401},
		{name: "another_owners_link_is_404", path: "/api/links/hot/stats", auth: "Bearer " + globexKey, wantCode: 404},
		{name: "and_the_other_way_round", path: "/api/links/theirs/stats", auth: "Bearer " + acmeKey, wantCode: 404},
		{name: "unknown_link_is_404", path: "/api/links/nope/stats", auth: "Bearer " + acmeKey, wantCode: 404},
		{name: "hours_out_of_range_is_400", path: "/api/links/hot/stats?hours=49", auth: "Bearer " + acmeKey, wantCode: 400},
		{name: "days_zero_is_400", path: "/api/links/hot/stats?days=0", auth: "Bearer " + acmeKey, wantCode: 400},
		{name: "top_not_a_number_is_400", path: "/api/links/hot/stats?top=ten", auth: "Bearer " + acmeKey, wantCode: 400},
		{name: "repeated_parameter_is_400", path: "/api/links/hot/stats?days=1&days=2", auth: "Bearer " + acmeKey, wantCode: 400},
		{name: "unknown_parameter_is_400", path: "/api/links/hot/stats?since=1h", auth: "Bearer " + acmeKey, wantCode: 400},
		{name: "unknown_route_is_404", path: "/api/links/hot", auth: "Bearer " + acmeKey, wantCode: 404},
		{name: "redis_down_is_500", path: "/api/links/hot/stats", auth: "Bearer " + acmeKey, api: broken, wantCode: 500},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			api := e
			if tc.api != nil {
				api = tc.api
			}
			req := httptest.NewRequest(http.MethodGet, tc.path, nil)
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			rec := httptest.NewRecorder()
			api.ServeHTTP(rec, req)
			if rec.Code != tc.wantCode {
				t.Fatalf("status = %d, want %d; body %s", rec.Code, tc.wantCode, rec.Body)
			}
			if rec.Header().Get("Cache-Control") != "private, no-store" {
				t.Errorf("Cache-Control = %q, want private, no-store on every answer", rec.Header().Get("Cache-Control"))
			}
			if tc.wantCode == 401 && rec.Header().Get("WWW-Authenticate") == "" {
				t.Errorf("401 without WWW-Authenticate")
			}
			if tc.wantCode != 200 {
				var body webserver.ErrorBody
				if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body.Error.Code == "" || body.Error.Message == "" {
					t.Errorf("error body %q: want {\"error\": {\"code\": ..., \"message\": ...}}", rec.Body)
				}
				return
			}
			var s counter.Stats
			if err := json.Unmarshal(rec.Body.Bytes(), &s); err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(counter.Pair{Human: tc.wantHuman}, s.Totals); d != "" {
				t.Errorf("totals (-want +got):\n%s", d)
			}
			hours, days := counter.DefaultRange().Hours, counter.DefaultRange().Days
			if tc.hours != 0 {
				hours, days = tc.hours, tc.days
			}
			if len(s.Hourly) != hours || len(s.Daily) != days {
				t.Errorf("%d hours and %d days, want %d and %d", len(s.Hourly), len(s.Daily), hours, days)
			}
		})
	}
}

// The JSON shape is the API's contract; this pins its field names.
func TestStatsJSONShape(t *testing.T) {
	t.Parallel()
	stored := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	s := counter.Stats{
		Code: "abc", Owner: "acme", Totals: counter.Pair{Human: 3, Bot: 1},
		Hourly:       []counter.HourStat{{Hour: stored, Pair: counter.Pair{Human: 3, Bot: 1}}},
		Daily:        []counter.DayStat{{Day: "2026-11-30", Pair: counter.Pair{Human: 3, Bot: 1}, Uniques: 2}},
		TopCountries: []counter.Dimension{{Name: "DE", Pair: counter.Pair{Human: 3}}},
		TopReferrers: []counter.Dimension{{Name: "(direct)", Pair: counter.Pair{Human: 3, Bot: 1}}},
		AsOf:         counter.AsOf{Partition: 2, Seq: 99, Stored: &stored, Generation: 1},
	}
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"code":"abc","owner":"acme","totals":{"human":3,"bot":1},` +
		`"hourly":[{"hour":"2026-11-30T12:00:00Z","human":3,"bot":1}],` +
		`"daily":[{"day":"2026-11-30","human":3,"bot":1,"uniques":2}],` +
		`"top_countries":[{"name":"DE","human":3,"bot":0}],` +
		`"top_referrers":[{"name":"(direct)","human":3,"bot":1}],` +
		`"as_of":{"partition":2,"seq":99,"stored":"2026-11-30T12:00:00Z","generation":1}}`
	if d := cmp.Diff(want, string(b)); d != "" {
		t.Fatalf("JSON (-want +got):\n%s", d)
	}
}
