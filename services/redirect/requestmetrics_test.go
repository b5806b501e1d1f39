package main

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/snipdev/snip/pkg/testenv"
)

// The request counter's labels come from a fixed set whatever a client
// sends: HTTP lets a request name any method token, and a label per token
// would grow /metrics (and the process's memory) with every new one. A
// request no route matched counts under method "other" unless its method is
// a standard one.
func TestRequestMetricsStayBoundedWhateverTheMethod(t *testing.T) {
	t.Parallel()
	_, db := servers.Redis.NewDB(t)
	n := testenv.StartNATS(t)
	in := startInstance(t, testConfig(servers.Redis.URL(db), n.URL))

	const methods = 50
	for i := range methods {
		r := do(t, fmt.Sprintf("PROBE%d", i), in.URL+"/", "")
		if r.Status != http.StatusNotFound {
			t.Fatalf("PROBE%d /: status %d, want 404", i, r.Status)
		}
	}
	if r := do(t, http.MethodGet, in.URL+"/", ""); r.Status != http.StatusNotFound {
		t.Fatalf("GET /: status %d, want 404", r.Status)
	}
	const name = "snip_redirect_http_requests_total"
	if sum, n := metricSamples(t, in.URL, name, `route="unmatched"`, `method="PROBE`); n != 0 {
		t.Fatalf("%d series (%v requests) labelled with a client's own method; want none", n, sum)
	}
	if sum, n := metricSamples(t, in.URL, name, `route="unmatched"`, `method="other"`, `status="404"`); n != 1 || sum != methods {
		t.Fatalf(`%s{route="unmatched",method="other",status="404"}: %d series summing to %v; want 1 summing to %d`, name, n, sum, methods)
	}
	if sum, n := metricSamples(t, in.URL, name, `route="unmatched"`, `method="GET"`, `status="404"`); n != 1 || sum != 1 {
		t.Fatalf(`%s{route="unmatched",method="GET",status="404"}: %d series summing to %v; want 1 summing to 1`, name, n, sum)
	}
}

// A request whose path a route matches but whose method it does not take is
// answered 405 by echo's own handler: no route's handler runs, so the
// routes' counting did not see it, and the unrouted count skipped it as
// routed. It counts under the route it missed, its method through the same
// fixed set as the unrouted ones.
func TestMethodNotAllowedIsCounted(t *testing.T) {
	t.Parallel()
	_, db := servers.Redis.NewDB(t)
	n := testenv.StartNATS(t)
	in := startInstance(t, testConfig(servers.Redis.URL(db), n.URL))

	const probes = 3
	for i := range probes {
		if r := do(t, fmt.Sprintf("PROBE%d", i), in.URL+"/api/links", ""); r.Status != http.StatusMethodNotAllowed {
			t.Fatalf("PROBE%d /api/links: status %d, want 405", i, r.Status)
		}
	}
	if r := do(t, http.MethodPut, in.URL+"/api/links", ""); r.Status != http.StatusMethodNotAllowed {
		t.Fatalf("PUT /api/links: status %d, want 405", r.Status)
	}
	if r := do(t, http.MethodPost, in.URL+"/abc123", ""); r.Status != http.StatusMethodNotAllowed {
		t.Fatalf("POST /abc123: status %d, want 405", r.Status)
	}
	const name = "snip_redirect_http_requests_total"
	tests := []struct {
		name  string
		match []string
		want  float64
	}{
		{"unknown_methods_count_as_other", []string{`route="/api/links"`, `method="other"`, `status="405"`}, probes},
		{"a_standard_method_keeps_its_name", []string{`route="/api/links"`, `method="PUT"`, `status="405"`}, 1},
		{"the_redirect_route", []string{`route="/:code"`, `method="POST"`, `status="405"`}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if sum, n := metricSamples(t, in.URL, name, tc.match...); n != 1 || sum != tc.want {
				t.Errorf("%s%v: %d series summing to %v; want 1 summing to %v", name, tc.match, n, sum, tc.want)
			}
		})
	}
	if sum, n := metricSamples(t, in.URL, name, `method="PROBE`); n != 0 {
		t.Errorf("%d series (%v requests) labelled with a client's own method; want none", n, sum)
	}
}

// The outbox's per-shard bound is exported, so that the filling alert can
// compare each shard with it: a link's clicks all go to one shard, and a hot
// link fills its shard (its clicks refused there) long before the total is
// anywhere near SNIP_OUTBOX_MAX_ENTRIES.
func TestOutboxShardCapacityIsExported(t *testing.T) {
	t.Parallel()
	_, db := servers.Redis.NewDB(t)
	n := testenv.StartNATS(t)
	cfg := testConfig(servers.Redis.URL(db), n.URL)
	cfg.OutboxShards, cfg.OutboxMaxEntries = 4, 1000
	in := startInstance(t, cfg)
	if sum, n := metricSamples(t, in.URL, "snip_redirect_outbox_shard_capacity_entries"); n != 1 || sum != 250 {
		t.Fatalf("snip_redirect_outbox_shard_capacity_entries: %d samples summing to %v; want one, 250 (1000 entries over 4 shards)", n, sum)
	}
}

// An OPTIONS request to a route's path is answered 204 with Allow, naming
// the route's methods. Echo answers it itself when no OPTIONS route exists,
// without any route's handler or the error handler, so it went uncounted;
// it counts under the route, as a 405 does.
func TestOptionsIsCounted(t *testing.T) {
	t.Parallel()
	_, db := servers.Redis.NewDB(t)
	n := testenv.StartNATS(t)
	in := startInstance(t, testConfig(servers.Redis.URL(db), n.URL))

	tests := []struct {
		name      string
		path      string
		route     string
		wantAllow string
	}{
		{"the_link_api", "/api/links", "/api/links", "OPTIONS, POST"},
		{"a_link", "/api/links/abc123", "/api/links/:code", "OPTIONS, DELETE, GET"},
		{"the_redirect_route", "/abc123", "/:code", "OPTIONS, GET, HEAD"},
		{"a_probe", "/healthz", "/healthz", "OPTIONS, GET, HEAD"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := do(t, http.MethodOptions, in.URL+tc.path, "")
			if r.Status != http.StatusNoContent || r.Header.Get("Allow") != tc.wantAllow {
				t.Fatalf("OPTIONS %s: status %d, Allow %q; want 204, %q", tc.path, r.Status, r.Header.Get("Allow"), tc.wantAllow)
			}
			const name = "snip_redirect_http_requests_total"
			match := []string{`route="` + tc.route + `"`, `method="OPTIONS"`, `status="204"`}
			if sum, n := metricSamples(t, in.URL, name, match...); n != 1 || sum != 1 {
				t.Errorf("%s%v: %d series summing to %v; want 1 summing to 1", name, match, n, sum)
			}
		})
	}
}
