package httpapi

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
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
