package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/owners"
	"github.com/snipdev/snip/pkg/webserver"
	"github.com/snipdev/snip/services/redirect/internal/directpub"
	"github.com/snipdev/snip/services/redirect/internal/link"
	"github.com/snipdev/snip/services/redirect/internal/linkstore"
	"github.com/snipdev/snip/services/redirect/internal/outbox"
	"github.com/snipdev/snip/services/redirect/internal/redirect"
)

// TestErrorHandlerMapsEverySentinel: the one error handler turns each
// sentinel, however wrapped, into its status, machine code and headers.
func TestErrorHandlerMapsEverySentinel(t *testing.T) {
	t.Parallel()
	tests := []struct {
		err        error
		wantStatus int
		wantCode   string
		wantHeader string
	}{
		{owners.ErrUnauthorized, 401, "unauthorized", "WWW-Authenticate"},
		{fmt.Errorf("x: %w", link.ErrInvalidTarget), 400, "invalid_target", ""},
		{fmt.Errorf("x: %w", link.ErrInvalidCode), 400, "invalid_code", ""},
		{fmt.Errorf("x: %w", link.ErrReservedCode), 400, "reserved_code", ""},
		{fmt.Errorf("x: %w", linkstore.ErrNotFound), 404, "not_found", ""},
		{fmt.Errorf("x: %w", redirect.ErrNotFound), 404, "not_found", ""},
		{fmt.Errorf("x: %w", linkstore.ErrCodeTaken), 409, "code_taken", ""},
		{fmt.Errorf("x: %w: %w", redirect.ErrClickNotRecorded, outbox.ErrFull), 503, "click_not_recorded", "Retry-After"},
		{fmt.Errorf("x: %w: %w", redirect.ErrClickUnconfirmed, directpub.ErrUnconfirmed), 503, "click_unconfirmed", ClickHeader},
		{fmt.Errorf("x: %w", outbox.ErrFull), 503, "outbox_full", "Retry-After"},
		{fmt.Errorf("x: %w", outbox.ErrUnavailable), 503, "unavailable", "Retry-After"},
		{fmt.Errorf("x: %w", linkstore.ErrUnavailable), 503, "unavailable", "Retry-After"},
		{echo.ErrStatusRequestEntityTooLarge, 413, "body_too_large", ""},
		{echo.ErrMethodNotAllowed, 405, "method_not_allowed", ""},
		{errors.New("something else"), 500, "internal", ""},
	}
	a := &API{Log: slog.New(slog.DiscardHandler)}
	a.Register(echo.New(), prometheus.NewRegistry())
	for _, tc := range tests {
		t.Run(tc.wantCode+"_"+tc.err.Error(), func(t *testing.T) {
			t.Parallel()
			e := echo.New()
			w := httptest.NewRecorder()
			c := e.NewContext(httptest.NewRequest(http.MethodPost, "/api/links", nil), w)
			a.handleError(tc.err, c)
			var body webserver.ErrorBody
			if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
				t.Fatalf("body %q: %v", w.Body, err)
			}
			if w.Code != tc.wantStatus || body.Error.Code != tc.wantCode || body.Error.Message == "" {
				t.Fatalf("%v -> %d %s, want %d %s with a message", tc.err, w.Code, w.Body, tc.wantStatus, tc.wantCode)
			}
			if tc.wantHeader != "" && w.Header().Get(tc.wantHeader) == "" {
				t.Fatalf("%v: no %s header", tc.err, tc.wantHeader)
			}
		})
	}
}
