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
	api := e.Group("/api", requireOwner(auth))
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
		c.Response().Header().Set(echo.HeaderCacheControl, "private, no-store")
		return c.JSON(http.StatusOK, s)
	})
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

// errorBody is every error response.
type errorBody struct {
	Error string `json:"error"`
}

// ErrorHandler maps errors to statuses, in one place: unauthorized 401,
// not found 404, bad query 400, echo's own errors as they are, and anything
// else 500, logged (the only errors logged: the rest are the client's).
func ErrorHandler(log *slog.Logger) echo.HTTPErrorHandler {
	return func(err error, c echo.Context) {
		if c.Response().Committed {
			return
		}
		code, msg := http.StatusInternalServerError, "internal error"
		var he *echo.HTTPError
		switch {
		case errors.Is(err, owners.ErrUnauthorized):
			code, msg = http.StatusUnauthorized, "missing or invalid API key (Authorization: Bearer <key>)"
			c.Response().Header().Set(echo.HeaderWWWAuthenticate, `Bearer realm="snip"`)
		case errors.Is(err, counter.ErrLinkNotFound):
			code, msg = http.StatusNotFound, "link not found"
		case errors.Is(err, counter.ErrInvalidRange), errors.Is(err, errBadQuery):
			code, msg = http.StatusBadRequest, err.Error()
		case errors.As(err, &he):
			code, msg = he.Code, fmt.Sprint(he.Message)
		default:
			log.Error("request failed", "method", c.Request().Method, "path", c.Path(),
				"request_id", c.Response().Header().Get(echo.HeaderXRequestID), "err", err)
		}
		var werr error
		if c.Request().Method == http.MethodHead {
			werr = c.NoContent(code)
		} else {
			werr = c.JSON(code, errorBody{Error: msg})
		}
		if werr != nil {
			log.Warn("write error response", "err", werr)
		}
	}
}
