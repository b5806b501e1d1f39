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
