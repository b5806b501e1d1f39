package httpapi_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/labstack/echo/v4"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/owners"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/fraud/internal/fraud"
	"github.com/snipdev/snip/services/fraud/internal/httpapi"
	"github.com/snipdev/snip/services/fraud/internal/redisstore"
)

var servers *testenv.Servers

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &servers, testenv.WithRedis())) }

const (
	acmeKey   = "snip_acmeacmeacmeacmeacme"
	globexKey = "snip_globexglobexglobexgl"
)

func TestAPI(t *testing.T) {
	t.Parallel()
	rdb, _ := servers.Redis.NewDB(t)
	ctx := t.Context()
	ownerStore := owners.NewStore(rdb)
	if err := ownerStore.EnsureFromSpec(ctx, "acme:"+acmeKey+",globex:"+globexKey); err != nil {
		t.Fatal(err)
	}
	store := redisstore.New(rdb, 4, 100)
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	alert := events.FraudAlert{V: 1, ID: "visitor_burst:abc:x:1", Rule: fraud.RuleVisitorBurst, Code: "abc", Owner: "acme", Count: 21, Threshold: 20, Time: at}
	js := []fraud.Judgement{
		{Seq: 1, Code: "abc", Owner: "acme"},
		{Seq: 2, Code: "abc", Owner: "acme", SourceBot: true},
		{Seq: 3, Code: "abc", Owner: "acme", Labels: []fraud.Label{{Seq: 3, Rule: fraud.RuleVisitorBurst}}, Alerts: []events.FraudAlert{alert}},
		{Seq: 4, Code: "abc", Owner: "acme"},
	}
	if err := store.Apply(ctx, events.Partition("abc", 4), fraud.Batch{Judgements: js}); err != nil {
		t.Fatal(err)
	}
	if err := store.Apply(ctx, events.Partition("xyz", 4), fraud.Batch{Judgements: []fraud.Judgement{{Seq: 5, Code: "xyz", Owner: "globex"}}}); err != nil {
		t.Fatal(err)
	}
	e := echo.New()
	httpapi.New(ownerStore, store, slog.New(slog.DiscardHandler), 100).Mount(e)
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)

	tests := []struct {
		name, key, path string
		status          int
		body            string
	}{
		{name: "no_key_is_401", path: "/api/alerts", status: 401, body: `{"error":{"code":"unauthorized","message":"missing or unknown API key (Authorization: Bearer \u003ckey\u003e)"}}`},
		{name: "unknown_key_is_401", key: "snip_nopenopenopenopenope", path: "/api/alerts", status: 401},
		{name: "owner_sees_own_alerts", key: acmeKey, path: "/api/alerts", status: 200, body: mustJSON(t, map[string]any{"alerts": []events.FraudAlert{alert}})},
		{name: "other_owner_sees_none", key: globexKey, path: "/api/alerts", status: 200, body: `{"alerts":[]}`},
		{name: "bad_limit_is_400", key: acmeKey, path: "/api/alerts?limit=0", status: 400, body: `{"error":{"code":"bad_request","message":"limit must be an integer from 1 to 100"}}`},
		{name: "limit_over_cap_is_400", key: acmeKey, path: "/api/alerts?limit=101", status: 400},
		{name: "flagged_share_of_own_link", key: acmeKey, path: "/api/links/abc/fraud", status: 200,
			body: `{"code":"abc","total":4,"flagged":2,"flagged_share":0.5,"flagged_by_rule":{"source_bot":1,"visitor_burst":1}}`},
		{name: "other_owners_link_is_404", key: globexKey, path: "/api/links/abc/fraud", status: 404},
		{name: "unknown_link_is_404", key: acmeKey, path: "/api/links/nope/fraud", status: 404},
		{name: "bad_code_is_400", key: acmeKey, path: "/api/links/a.b/fraud", status: 400},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL+tc.path, nil)
			if tc.key != "" {
				req.Header.Set("Authorization", "Bearer "+tc.key)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status {
				t.Fatalf("status = %d, want %d: %s", resp.StatusCode, tc.status, b)
			}
			if resp.StatusCode == 401 && resp.Header.Get("WWW-Authenticate") == "" {
				t.Error("401 without WWW-Authenticate")
			}
			// One owner's alerts and links, or whether a link is theirs:
			// no cache may keep an answer, errors included.
			if got := resp.Header.Get("Cache-Control"); got != "private, no-store" {
				t.Errorf("Cache-Control = %q, want private, no-store on every answer", got)
			}
			if tc.body != "" {
				if d := cmp.Diff(tc.body+"\n", string(b)); d != "" {
					t.Fatalf("body (-want +got):\n%s", d)
				}
			}
		})
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestAnAlertListWithoutALimitReturnsAtMostTheCap: FRAUD_ALERTS_PER_OWNER
// is the most alerts one request returns; a request that names no limit
// gets the default (50) only where the cap allows it.
func TestAnAlertListWithoutALimitReturnsAtMostTheCap(t *testing.T) {
	t.Parallel()
	rdb, _ := servers.Redis.NewDB(t)
	ctx := t.Context()
	ownerStore := owners.NewStore(rdb)
	if err := ownerStore.EnsureFromSpec(ctx, "acme:"+acmeKey); err != nil {
		t.Fatal(err)
	}
	const maxLimit = 2
	store := redisstore.New(rdb, 4, maxLimit)
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	// Six links of acme over the four partitions, an alert each: each
	// partition keeps up to the cap (it is per owner and partition), so
	// more than the cap in all.
	var seq uint64
	for _, code := range []string{"a1", "b2", "c3", "d4", "e5", "f6"} {
		seq++
		alert := events.FraudAlert{V: 1, ID: "visitor_burst:" + code + ":x:1", Rule: fraud.RuleVisitorBurst, Code: code, Owner: "acme", Count: 21, Threshold: 20, Time: at.Add(time.Duration(seq) * time.Second)}
		js := []fraud.Judgement{{Seq: seq, Code: code, Owner: "acme", Alerts: []events.FraudAlert{alert}}}
		if err := store.Apply(ctx, events.Partition(code, 4), fraud.Batch{Judgements: js}); err != nil {
			t.Fatal(err)
		}
	}
	if all, err := store.RecentAlerts(ctx, "acme", 10); err != nil || len(all) <= maxLimit {
		t.Fatalf("stored alerts = %d, %v; the test needs more than %d", len(all), err, maxLimit)
	}
	e := echo.New()
	httpapi.New(ownerStore, store, slog.New(slog.DiscardHandler), maxLimit).Mount(e)
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/api/alerts", nil)
	req.Header.Set("Authorization", "Bearer "+acmeKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got struct {
		Alerts []events.FraudAlert `json:"alerts"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || resp.StatusCode != 200 {
		t.Fatalf("status %d, %v", resp.StatusCode, err)
	}
	if len(got.Alerts) != maxLimit {
		t.Fatalf("GET /api/alerts without a limit returned %d alerts, want at most the cap, %d", len(got.Alerts), maxLimit)
	}
}
