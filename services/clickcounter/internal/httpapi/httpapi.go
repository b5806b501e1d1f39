// Package httpapi is the click counter's HTTP API: GET
// /api/links/:code/stats for the link's owner, and the service's one echo
// error handler.
//
// Authentication is a Bearer API key (pkg/owners). A link that exists but
// belongs to another owner answers 404, exactly like a link that does not
// exist: a 403 would tell anyone with a key which codes are taken by
// someone else, and let them enumerate them.
package httpapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/snipdev/snip/pkg/owners"
	"github.com/snipdev/snip/pkg/webserver"
	"github.com/snipdev/snip/services/clickcounter/internal/counter"
)

// Authenticator resolves an API key to its owner.
type Authenticator interface {
	Authenticate(ctx context.Context, key string) (owners.Owner, error)
}

// StatsReader returns a link's stats for an owner.
type StatsReader interface {
	LinkStats(ctx context.Context, owner, code string, r counter.Range) (*counter.Stats, error)
}

// errBadQuery marks a query string the API does not accept.
var errBadQuery = errors.New("bad query")

const ownerKey = "owner"

// Register mounts the API on e and installs the error handler.
func Register(e *echo.Echo, auth Authenticator, stats StatsReader, log *slog.Logger) {
	e.HTTPErrorHandler = ErrorHandler(log)
	api := e.Group("/api", noStore, requireOwner(auth))
	api.GET("/links/:code/stats", func(c echo.Context) error {
		r, err := parseRange(c.QueryParams())
		if err != nil {
			return err
		}
		owner := c.Get(ownerKey).(owners.Owner)
		s, err := stats.LinkStats(c.Request().Context(), owner.ID, c.Param("code"), r)
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, s)
	})
}

// noStore marks every answer of the API, errors included, as one owner's
// and not to be stored: an owner's stats, or whether a link is theirs.
func noStore(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		c.Response().Header().Set(echo.HeaderCacheControl, "private, no-store")
		return next(c)
	}
}

// requireOwner authenticates the request's Bearer key.
func requireOwner(auth Authenticator) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			key := owners.BearerKey(c.Request().Header.Get(echo.HeaderAuthorization))
			if key == "" {
				return owners.ErrUnauthorized
			}
			o, err := auth.Authenticate(c.Request().Context(), key)
			if err != nil {
				return err
			}
			c.Set(ownerKey, o)
			return next(c)
		}
	}
}

// parseRange reads the optional hours, days and top parameters.
func parseRange(q map[string][]string) (counter.Range, error) {
	r := counter.DefaultRange()
	fields := map[string]*int{"hours": &r.Hours, "days": &r.Days, "top": &r.Top}
	for name, vals := range q {
		into, ok := fields[name]
		if !ok {
			return r, fmt.Errorf("unknown parameter %q (want hours, days, top): %w", name, errBadQuery)
		}
		if len(vals) != 1 {
			return r, fmt.Errorf("parameter %q given %d times: %w", name, len(vals), errBadQuery)
		}
		n, err := strconv.Atoi(vals[0])
		if err != nil {
			return r, fmt.Errorf("parameter %q: %q is not an integer: %w", name, vals[0], errBadQuery)
		}
		*into = n
	}
	if err := r.Validate(); err != nil {
		return r, err
	}
	return r, nil
}

// ErrorHandler is pkg/webserver's error handler (the envelope every Snip API
// shares) with this service's table.
func ErrorHandler(log *slog.Logger) echo.HTTPErrorHandler {
	return webserver.ErrorHandler(log, errorTable)
}

// errorTable maps the service's errors to statuses, in one place:
// unauthorized 401, not found 404, bad query 400; echo's own errors keep
// theirs, and anything else is a logged 500.
func errorTable(err error, _ http.Header) (webserver.Problem, bool) {
	switch {
	case errors.Is(err, owners.ErrUnauthorized):
		return webserver.Problem{Status: http.StatusUnauthorized, Code: webserver.CodeUnauthorized, Message: "missing or invalid API key (Authorization: Bearer <key>)"}, true
	case errors.Is(err, counter.ErrLinkNotFound):
		return webserver.Problem{Status: http.StatusNotFound, Code: "not_found", Message: "link not found"}, true
	case errors.Is(err, counter.ErrInvalidRange), errors.Is(err, errBadQuery):
		return webserver.Problem{Status: http.StatusBadRequest, Code: "bad_request"}, true
	}
	return webserver.Problem{}, false
}
