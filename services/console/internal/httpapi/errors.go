package httpapi

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/snipdev/snip/pkg/consolesessions"
	"github.com/snipdev/snip/pkg/deadletter"
	"github.com/snipdev/snip/pkg/owners"
	"github.com/snipdev/snip/pkg/webserver"
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
	errSessionEnded  = consolesessions.ErrEnded
	errOldSession    = errors.New("this session is from an earlier version of the console, which could not end it: log in again")
	errTokenRequired = errors.New("revoking every session takes the console token (Authorization: Bearer <CONSOLE_TOKEN>), not a session")
	errNoSessions    = errors.New("this console has no CONSOLE_TOKEN, so no sessions to revoke")
)

// ownerUnavailable is all the owners' stream says when Redis or NATS is
// away. Its clients are owners' systems, or anyone who sends a key-shaped
// guess, not the console's operators: the cause (a dependency's address and
// error) goes to the log with the request, never into the answer.
const ownerUnavailable = "the click stream is unavailable for a moment: reconnect shortly, with Last-Event-ID"

// ownerBusy is all the owners' stream says when the instance serves the most
// streams it may: how many that is stays in the log and the metrics.
const ownerBusy = "this instance serves the most click streams it may: reconnect shortly, with Last-Event-ID"

// publicError answers with msg in place of err's text, which only the log
// gets (errorTable logs every 5xx with its error).
type publicError struct {
	msg string
	err error
}

func (e *publicError) Error() string { return e.err.Error() }
func (e *publicError) Unwrap() error { return e.err }

// errorTable maps an error to its status and code; the message is the
// error's text (the console's errors are written for the operator), or a
// publicError's own message. What it does not know is a logged 500.
func errorTable(err error, h http.Header) (webserver.Problem, bool) {
	if he := (*echo.HTTPError)(nil); errors.As(err, &he) && he.Code == http.StatusRequestEntityTooLarge {
		return webserver.Problem{Status: he.Code, Code: "body_too_large", Message: fmt.Sprintf("request body over %d bytes", maxBody)}, true
	}
	status, code := statusOf(err)
	if code == "" {
		return webserver.Problem{}, false
	}
	if status == http.StatusTooManyRequests {
		setRetryAfter(h, err)
	}
	p := webserver.Problem{Status: status, Code: code}
	if pe := (*publicError)(nil); errors.As(err, &pe) {
		p.Message = pe.msg
	}
	return p, true
}

// statusOf maps an error to its status and code; "" for an unknown error.
func statusOf(err error) (int, string) {
	switch {
	case errors.As(err, new(errLimited)):
		return http.StatusTooManyRequests, "too_many_attempts"
	case errors.Is(err, errNoToken), errors.Is(err, owners.ErrUnauthorized),
		errors.Is(err, errSessionEnded), errors.Is(err, errOldSession):
		return http.StatusUnauthorized, webserver.CodeUnauthorized
	case errors.Is(err, errCrossOrigin), errors.Is(err, errForbiddenHost), errors.Is(err, errTokenRequired):
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
	case errors.Is(err, errNoSessions):
		return http.StatusConflict, "no_sessions"
	case errors.Is(err, readers.ErrNotARecount):
		return http.StatusConflict, "not_a_recount"
	case errors.Is(err, readers.ErrNotReplayable):
		return http.StatusConflict, "not_replayable"
	case errors.Is(err, readers.ErrNothingToReplay):
		return http.StatusConflict, "nothing_to_replay"
	case errors.Is(err, readers.ErrRequestedMeanwhile):
		return http.StatusConflict, "replay_requested_meanwhile"
	case errors.Is(err, ownerstream.ErrOwnerLimit):
		return http.StatusTooManyRequests, "too_many_streams"
	case errors.Is(err, ownerstream.ErrOpenRate):
		return http.StatusTooManyRequests, "too_many_stream_opens"
	case errors.Is(err, ownerstream.ErrTooManyStreams), errors.Is(err, livefeed.ErrTooManyBrowsers):
		return http.StatusServiceUnavailable, "too_many_streams"
	case errors.Is(err, ownerstream.ErrUnavailable), errors.Is(err, errUnavailable):
		return http.StatusServiceUnavailable, "unavailable"
	}
	return 0, ""
}

// setRetryAfter tells a refused client when to come back: the wait of an
// errLimited or an ownerstream.OpenRateError, 5 seconds otherwise.
func setRetryAfter(h http.Header, err error) {
	secs := 5
	var lim errLimited
	var opens *ownerstream.OpenRateError
	switch {
	case errors.As(err, &lim):
		secs = max(1, int(math.Ceil(lim.wait.Seconds())))
	case errors.As(err, &opens):
		secs = max(1, int(math.Ceil(opens.Wait.Seconds())))
	}
	h.Set("Retry-After", strconv.Itoa(secs))
}

// ErrorHandler is the service's one echo error handler: pkg/webserver's
// (the envelope every Snip API shares, {"error": {"code", "message"}}) with
// the console's table.
func ErrorHandler(log *slog.Logger) echo.HTTPErrorHandler {
	return webserver.ErrorHandler(log, errorTable)
}
