package httpapi

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// A route added after Register has no OPTIONS route of its own, and echo's
// router, finding none on its path, backtracks to /:code, which matches any
// path and now has one: the OPTIONS is answered with /:code's Allow and
// counted under /:code, as Register's doc comment says.
func TestOptionsOfARouteAddedAfterRegisterIsTheRedirectRoutes(t *testing.T) {
	t.Parallel()
	a := &API{Log: slog.New(slog.DiscardHandler)}
	e := echo.New()
	a.Register(e, prometheus.NewRegistry())
	e.GET("/late", func(c echo.Context) error { return c.NoContent(http.StatusOK) })
	e.GET("/late/deeper", func(c echo.Context) error { return c.NoContent(http.StatusOK) })
	for _, path := range []string{"/late", "/late/deeper"} {
		w := httptest.NewRecorder()
		e.ServeHTTP(w, httptest.NewRequest(http.MethodOptions, path, nil))
		if w.Code != http.StatusNoContent || w.Header().Get("Allow") != "OPTIONS, GET, HEAD" {
			t.Errorf("OPTIONS %s: %d, Allow %q; want 204 and /:code's %q", path, w.Code, w.Header().Get("Allow"), "OPTIONS, GET, HEAD")
		}
	}
	if n := testutil.ToFloat64(a.requests.WithLabelValues("/:code", http.MethodOptions, "204")); n != 2 {
		t.Errorf(`requests{route="/:code",method="OPTIONS",status="204"} = %v, want 2`, n)
	}
}

// Echo's router falls back to /:code (whose last segment matches any rest
// of a path) for a method the matched route lacks but /:code has, GET and
// HEAD: those are 405 with the route's Allow, counted under the route, as
// echo answers the route's other missing methods; a path no route has is
// still 404.
func TestAMethodAnAPIRouteLacksIs405NotTheRedirects404(t *testing.T) {
	t.Parallel()
	a := &API{Log: slog.New(slog.DiscardHandler)}
	e := echo.New()
	a.Register(e, prometheus.NewRegistry())
	for _, tc := range []struct {
		method, path, route string
		status              int
		allow               string
	}{
		{http.MethodHead, "/api/links/abc", "/api/links/:code", http.StatusMethodNotAllowed, "OPTIONS, DELETE, GET"},
		{http.MethodGet, "/api/links", "/api/links", http.StatusMethodNotAllowed, "OPTIONS, POST"},
		{http.MethodHead, "/api/links", "/api/links", http.StatusMethodNotAllowed, "OPTIONS, POST"},
		{http.MethodGet, "/api/key/rotate", "/api/key/rotate", http.StatusMethodNotAllowed, "OPTIONS, POST"},
		// echo's own 405, for comparison: the same Allow
		{http.MethodPut, "/api/links/abc", "/api/links/:code", http.StatusMethodNotAllowed, "OPTIONS, DELETE, GET"},
		{http.MethodGet, "/api/nothing", "/:code", http.StatusNotFound, ""},
		{http.MethodHead, "/api/nothing/more", "/:code", http.StatusNotFound, ""},
	} {
		w := httptest.NewRecorder()
		e.ServeHTTP(w, httptest.NewRequest(tc.method, tc.path, nil))
		if w.Code != tc.status || w.Header().Get("Allow") != tc.allow {
			t.Errorf("%s %s: %d, Allow %q; want %d, Allow %q", tc.method, tc.path, w.Code, w.Header().Get("Allow"), tc.status, tc.allow)
		}
		if tc.status == http.StatusMethodNotAllowed && !strings.Contains(w.Body.String(), "method_not_allowed") && tc.method != http.MethodHead {
			t.Errorf("%s %s: body %s, want code method_not_allowed", tc.method, tc.path, w.Body.String())
		}
		if n := testutil.ToFloat64(a.requests.WithLabelValues(tc.route, tc.method, strconv.Itoa(tc.status))); n != 1 {
			t.Errorf(`%s %s: requests{route=%q,method=%q,status="%d"} = %v, want 1`, tc.method, tc.path, tc.route, tc.method, tc.status, n)
		}
	}
}
