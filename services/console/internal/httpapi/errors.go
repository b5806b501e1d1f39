package httpapi

import (
	"errors"
	"log/slog"
	"math"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/snipdev/snip/pkg/deadletter"
	"github.com/snipdev/snip/pkg/owners"
	"github.com/snipdev/snip/services/console/internal/dlq"
	"github.com/snipdev/snip/services/console/internal/livefeed"
	"github.com/snipdev/snip/services/console/internal/ownerstream"
	"github.com/snipdev/snip/services/console/internal/readers"
)

// The console's own refusals.
var (
	errNoToken       = errors.New("the console needs its token: Authorization: Bearer <CONSOLE_TOKEN>, or log in at /login")
	errCrossOrigin   = errors.New("cross-origin request refused")
	errForbiddenHost = errors.New("this console serves loopback only (no CONSOLE_TOKEN); the request's Host is not a loopback name")
	errBadRequest    = errors.New("bad request")
	errUnavailable   = errors.New("unavailable")
)

// apiError is the body of every error: {"error": {"code", "message"}}.
type apiError struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// statusOf maps an error to its status and code; unknown errors are 500.
func statusOf(err error) (int, string) {
	var he *echo.HTTPError
	switch {
	case errors.As(err, &he):
		return he.Code, http.StatusText(he.Code)
	case errors.As(err, new(errLimited)):
		return http.StatusTooManyRequests, "too_many_attempts"
	case errors.Is(err, errNoToken), errors.Is(err, owners.ErrUnauthorized):
		return http.StatusUnauthorized, "unauthorized"
	case errors.Is(err, errCrossOrigin), errors.Is(err, errForbiddenHost):
		return http.StatusForbidden, "forbidden"
	case errors.Is(err, readers.ErrNotConfirmed):
		return http.StatusBadRequest, "not_confirmed"
	case errors.Is(err, readers.ErrBadReplay), errors.Is(err, ownerstream.ErrBadStart),
		errors.Is(err, dlq.ErrBadFilter), errors.Is(err, errBadRequest):
		return http.StatusBadRequest, "bad_request"
	case errors.Is(err, readers.ErrUnknownGroup), errors.Is(err, deadletter.ErrNotFound):
		return http.StatusNotFound, "not_found"
	case errors.Is(err, deadletter.ErrNotRedrivable):
		return http.StatusConflict, "not_redrivable"
	case errors.Is(err, ownerstream.ErrOwnerLimit):
		return http.StatusTooManyRequests, "too_many_streams"
	case errors.Is(err, ownerstream.ErrTooManyStreams), errors.Is(err, livefeed.ErrTooManyBrowsers):
		return http.StatusServiceUnavailable, "too_many_streams"
	case errors.Is(err, ownerstream.ErrUnavailable), errors.Is(err, errUnavailable):
		return http.StatusServiceUnavailable, "unavailable"
	}
	return http.StatusInternalServerError, "internal"
}

// setRetryAfter tells a refused client when to come back: the wait of an
// errLimited, 5 seconds otherwise.
func setRetryAfter(c echo.Context, err error) {
	secs := 5
	var lim errLimited
	if errors.As(err, &lim) {
		secs = max(1, int(math.Ceil(lim.wait.Seconds())))
	}
	c.Response().Header().Set("Retry-After", strconv.Itoa(secs))
}

// ErrorHandler is the service's one echo error handler: sentinel errors
// become their status, everything else a logged 500.
func ErrorHandler(log *slog.Logger) echo.HTTPErrorHandler {
	return func(err error, c echo.Context) {
		if c.Response().Committed {
			return
		}
		status, code := statusOf(err)
		var body apiError
		body.Error.Code = code
		body.Error.Message = err.Error()
		var he *echo.HTTPError
		if errors.As(err, &he) {
			if m, ok := he.Message.(string); ok {
				body.Error.Message = m
			}
		}
		switch {
		case status >= 500 && code == "internal":
			log.Error("request failed", "method", c.Request().Method, "path", c.Request().URL.Path, "err", err,
				"request_id", c.Response().Header().Get(echo.HeaderXRequestID))
			body.Error.Message = "internal error"
		case status == http.StatusUnauthorized:
			c.Response().Header().Set("WWW-Authenticate", `Bearer realm="snip"`)
		case status == http.StatusTooManyRequests:
			setRetryAfter(c, err)
		}
		if c.Request().Method == http.MethodHead {
			_ = c.NoContent(status)
			return
		}
		_ = c.JSON(status, body)
	}
}
