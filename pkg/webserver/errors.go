package webserver

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"
)

// ErrorBody is the one error envelope of every Snip HTTP API:
//
//	{"error": {"code": "not_found", "message": "no such link"}}
//
// Code is a stable snake_case token a program can branch on; Message is for
// people and may change.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the inside of ErrorBody.
type ErrorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Problem is how one error is answered: its status, its code and the
// message shown to the caller ("" shows the error's own text, for errors
// whose text is written for the caller, such as a validation failure).
type Problem struct {
	Status  int
	Code    string
	Message string
}

// ErrorTable is a service's one table from its sentinel errors to answers.
// It reports false for an error it does not know; it may set response
// headers through h (a Retry-After, say). ErrorHandler handles the rest.
type ErrorTable func(err error, h http.Header) (Problem, bool)

// Codes the error handler itself answers with.
const (
	// CodeInternal is any error the table does not know: a 500 whose
	// details stay in the log.
	CodeInternal = "internal"
	// CodeUnauthorized is the code tables give a missing or unknown key.
	CodeUnauthorized = "unauthorized"
)

// ErrorHandler is the echo error handler every Snip API uses. It asks table
// first; then echo's own errors (unknown route, wrong method, body too
// large) keep their status, with the status text in snake case as code;
// anything else is a 500 "internal", logged with the request ID (the only
// errors logged as errors: the others are the caller's, and a mapped 5xx,
// a dependency being down, is logged as a warning). A 401 gets
// WWW-Authenticate: Bearer realm="snip". HEAD requests get the status
// without a body.
func ErrorHandler(log *slog.Logger, table ErrorTable) echo.HTTPErrorHandler {
	return func(err error, c echo.Context) {
		if c.Response().Committed {
			return
		}
		h := c.Response().Header()
		p, ok := Problem{}, false
		if table != nil {
			p, ok = table(err, h)
		}
		var he *echo.HTTPError
		switch {
		case ok:
			if p.Message == "" {
				p.Message = err.Error()
			}
			if p.Status >= 500 {
				log.Warn("request refused", "method", c.Request().Method, "path", c.Request().URL.Path, "status", p.Status,
					"request_id", h.Get(echo.HeaderXRequestID), "err", err)
			}
		case errors.As(err, &he):
			p = Problem{Status: he.Code, Code: StatusCode(he.Code), Message: http.StatusText(he.Code)}
			if m, isString := he.Message.(string); isString && m != "" {
				p.Message = m
			} else if he.Message != nil && !isString {
				p.Message = fmt.Sprint(he.Message)
			}
		default:
			p = Problem{Status: http.StatusInternalServerError, Code: CodeInternal, Message: "internal error"}
			log.Error("request failed", "method", c.Request().Method, "path", c.Request().URL.Path,
				"request_id", h.Get(echo.HeaderXRequestID), "err", err)
		}
		if p.Status == http.StatusUnauthorized && h.Get(echo.HeaderWWWAuthenticate) == "" {
			h.Set(echo.HeaderWWWAuthenticate, `Bearer realm="snip"`)
		}
		var werr error
		if c.Request().Method == http.MethodHead {
			werr = c.NoContent(p.Status)
		} else {
			werr = c.JSON(p.Status, ErrorBody{Error: ErrorDetail{Code: p.Code, Message: p.Message}})
		}
		if werr != nil {
			log.Warn("write error response", "err", werr)
		}
	}
}

// StatusCode is the envelope code of a bare HTTP status: its text in snake
// case ("Not Found" is "not_found").
func StatusCode(status int) string {
	t := http.StatusText(status)
	if t == "" {
		return "http_" + fmt.Sprint(status)
	}
	return strings.ReplaceAll(strings.ToLower(strings.ReplaceAll(t, "-", " ")), " ", "_")
}
