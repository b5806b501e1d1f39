package webserver_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/labstack/echo/v4"

	"github.com/snipdev/snip/pkg/webserver"
)

var (
	errGone  = errors.New("no such thing")
	errFull  = errors.New("backed up")
	errNoKey = errors.New("no key")
)

func table(err error, h http.Header) (webserver.Problem, bool) {
	switch {
	case errors.Is(err, errGone):
		return webserver.Problem{Status: http.StatusNotFound, Code: "not_found", Message: "no such link"}, true
	case errors.Is(err, errFull):
		h.Set("Retry-After", "10")
		return webserver.Problem{Status: http.StatusServiceUnavailable, Code: "outbox_full"}, true
	case errors.Is(err, errNoKey):
		return webserver.Problem{Status: http.StatusUnauthorized, Code: webserver.CodeUnauthorized, Message: "send a key"}, true
	}
	return webserver.Problem{}, false
}

func TestErrorHandlerWritesOneEnvelope(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		method     string
		err        error
		wantStatus int
		wantBody   *webserver.ErrorBody
		wantHeader map[string]string
	}{
		{"table_sentinel", http.MethodGet, fmt.Errorf("get link: %w", errGone), 404,
			&webserver.ErrorBody{Error: webserver.ErrorDetail{Code: "not_found", Message: "no such link"}}, nil},
		{"table_message_defaults_to_the_error", http.MethodGet, errFull, 503,
			&webserver.ErrorBody{Error: webserver.ErrorDetail{Code: "outbox_full", Message: "backed up"}}, map[string]string{"Retry-After": "10"}},
		{"unauthorized_gets_www_authenticate", http.MethodGet, errNoKey, 401,
			&webserver.ErrorBody{Error: webserver.ErrorDetail{Code: "unauthorized", Message: "send a key"}}, map[string]string{"WWW-Authenticate": `Bearer realm="snip"`}},
		{"echo_error_keeps_its_status", http.MethodGet, echo.NewHTTPError(http.StatusMethodNotAllowed), 405,
			&webserver.ErrorBody{Error: webserver.ErrorDetail{Code: "method_not_allowed", Message: "Method Not Allowed"}}, nil},
		{"echo_error_with_a_message", http.MethodGet, echo.NewHTTPError(http.StatusRequestEntityTooLarge, "too big"), 413,
			&webserver.ErrorBody{Error: webserver.ErrorDetail{Code: "request_entity_too_large", Message: "too big"}}, nil},
		{"unknown_error_is_internal_and_hidden", http.MethodGet, errors.New("redis: secret detail"), 500,
			&webserver.ErrorBody{Error: webserver.ErrorDetail{Code: webserver.CodeInternal, Message: "internal error"}}, nil},
		{"head_gets_no_body", http.MethodHead, errGone, 404, nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := echo.New()
			e.HTTPErrorHandler = webserver.ErrorHandler(slog.New(slog.DiscardHandler), table)
			e.Any("/x", func(echo.Context) error { return tc.err })
			rec := httptest.NewRecorder()
			e.ServeHTTP(rec, httptest.NewRequest(tc.method, "/x", nil))
			if rec.Code != tc.wantStatus {
				t.Fatalf("status = %d, want %d", rec.Code, tc.wantStatus)
			}
			for k, v := range tc.wantHeader {
				if got := rec.Header().Get(k); got != v {
					t.Errorf("%s = %q, want %q", k, got, v)
				}
			}
			if tc.wantBody == nil {
				if rec.Body.Len() != 0 {
					t.Errorf("body %q, want none", rec.Body)
				}
				return
			}
			var got webserver.ErrorBody
			if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
				t.Fatalf("body %q: %v", rec.Body, err)
			}
			if d := cmp.Diff(*tc.wantBody, got); d != "" {
				t.Errorf("body (-want +got):\n%s", d)
			}
		})
	}
}

func TestStatusCode(t *testing.T) {
	t.Parallel()
	tests := []struct {
		status int
		want   string
	}{{404, "not_found"}, {405, "method_not_allowed"}, {429, "too_many_requests"}, {503, "service_unavailable"}, {207, "multi_status"}, {799, "http_799"}}
	for _, tc := range tests {
		if got := webserver.StatusCode(tc.status); got != tc.want {
			t.Errorf("StatusCode(%d) = %q, want %q", tc.status, got, tc.want)
		}
	}
}
