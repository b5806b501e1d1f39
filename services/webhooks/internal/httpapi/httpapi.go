// Package httpapi is the webhooks owner API and the service's one echo
// error handler. Every route needs a Bearer API key (pkg/owners, the same
// keys as the links API); an endpoint of another owner answers 404, like
// one that does not exist. Errors are {"error": {"code": "...", "message": "..."}}.
//
//	POST   /api/webhooks/endpoints                      create (answers the secret)
//	GET    /api/webhooks/endpoints                      list
//	GET    /api/webhooks/endpoints/:id                  one, with status, backlog and its latest replay's state
//	DELETE /api/webhooks/endpoints/:id                  delete (and its queue)
//	POST   /api/webhooks/endpoints/:id/pause            stop sending (events keep queueing)
//	POST   /api/webhooks/endpoints/:id/resume           send again (also re-enables a disabled one)
//	POST   /api/webhooks/endpoints/:id/rotate-secret    new secret; the old one signs too for the overlap
//	POST   /api/webhooks/endpoints/:id/test             queue a test event
//	GET    /api/webhooks/endpoints/:id/deliveries       recent attempts, newest first
//	POST   /api/webhooks/endpoints/:id/deliveries/:d/redeliver   send one again, now
//	POST   /api/webhooks/endpoints/:id/replay           {"from": "<RFC 3339>"}: queue the events since then again (in the background; GET shows how it went)
package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/snipdev/snip/pkg/owners"
	"github.com/snipdev/snip/pkg/webserver"
	"github.com/snipdev/snip/services/webhooks/internal/delivery"
	"github.com/snipdev/snip/services/webhooks/internal/endpoint"
)

// Authenticator resolves an API key to its owner.
type Authenticator interface {
	Authenticate(ctx context.Context, key string) (owners.Owner, error)
}

// errBadRequest marks a body the API does not accept.
var errBadRequest = errors.New("bad request")

const ownerKey = "owner"

// maxBody bounds request bodies.
const maxBody = 64 << 10

// Register mounts the API on e and installs the error handler.
func Register(e *echo.Echo, auth Authenticator, a *delivery.Admin, log *slog.Logger) {
	e.HTTPErrorHandler = ErrorHandler(log)
	g := e.Group("/api/webhooks/endpoints", requireOwner(auth))
	owner := func(c echo.Context) string { return c.Get(ownerKey).(owners.Owner).ID }
	ctx := func(c echo.Context) context.Context { return c.Request().Context() }
	g.POST("", func(c echo.Context) error {
		var r endpoint.Request
		if err := decode(c, &r); err != nil {
			return err
		}
		s, err := a.Create(ctx(c), owner(c), r)
		if err != nil {
			return err
		}
		return c.JSON(http.StatusCreated, s)
	})
	g.GET("", func(c echo.Context) error {
		l, err := a.List(ctx(c), owner(c))
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, map[string]any{"endpoints": l})
	})
	g.GET("/:id", func(c echo.Context) error {
		s, err := a.Get(ctx(c), owner(c), c.Param("id"))
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, s)
	})
	g.DELETE("/:id", func(c echo.Context) error {
		if err := a.Delete(ctx(c), owner(c), c.Param("id")); err != nil {
			return err
		}
		return c.NoContent(http.StatusNoContent)
	})
	for path, paused := range map[string]bool{"/:id/pause": true, "/:id/resume": false} {
		g.POST(path, func(c echo.Context) error {
			s, err := a.SetPaused(ctx(c), owner(c), c.Param("id"), paused)
			if err != nil {
				return err
			}
			return c.JSON(http.StatusOK, s)
		})
	}
	g.POST("/:id/rotate-secret", func(c echo.Context) error {
		s, err := a.Rotate(ctx(c), owner(c), c.Param("id"))
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, s)
	})
	g.POST("/:id/test", func(c echo.Context) error {
		id, err := a.SendTest(ctx(c), owner(c), c.Param("id"))
		if err != nil {
			return err
		}
		return c.JSON(http.StatusAccepted, map[string]string{"event_id": id})
	})
	g.GET("/:id/deliveries", func(c echo.Context) error {
		ds, err := a.Deliveries(ctx(c), owner(c), c.Param("id"))
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, map[string]any{"deliveries": ds})
	})
	g.POST("/:id/deliveries/:d/redeliver", func(c echo.Context) error {
		d, err := a.Redeliver(ctx(c), owner(c), c.Param("id"), c.Param("d"))
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, d)
	})
	g.POST("/:id/replay", func(c echo.Context) error {
		var r struct {
			From string `json:"from"`
		}
		if err := decode(c, &r); err != nil {
			return err
		}
		from, err := time.Parse(time.RFC3339Nano, r.From)
		if err != nil {
			return fmt.Errorf("from: %q is not an RFC 3339 time: %w", r.From, errBadRequest)
		}
		if err := a.Replay(ctx(c), owner(c), c.Param("id"), from); err != nil {
			return err
		}
		return c.JSON(http.StatusAccepted, map[string]string{"replaying_from": from.UTC().Format(time.RFC3339Nano)})
	})
}

func decode(c echo.Context, into any) error {
	d := json.NewDecoder(io.LimitReader(c.Request().Body, maxBody))
	d.DisallowUnknownFields()
	if err := d.Decode(into); err != nil {
		return fmt.Errorf("body: %v: %w", err, errBadRequest)
	}
	return nil
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

// ErrorHandler is pkg/webserver's error handler (the envelope every Snip API
// shares) with this service's table.
func ErrorHandler(log *slog.Logger) echo.HTTPErrorHandler {
	return webserver.ErrorHandler(log, errorTable)
}

// errorTable maps the service's errors to statuses, in one place:
// unauthorized 401, not found 404, invalid 400, busy 429, not reading 503; echo's own errors
// keep theirs, and anything else is a logged 500.
func errorTable(err error, h http.Header) (webserver.Problem, bool) {
	switch {
	case errors.Is(err, owners.ErrUnauthorized):
		return webserver.Problem{Status: http.StatusUnauthorized, Code: webserver.CodeUnauthorized, Message: "missing or invalid API key (Authorization: Bearer <key>)"}, true
	case errors.Is(err, endpoint.ErrNotFound):
		return webserver.Problem{Status: http.StatusNotFound, Code: "not_found", Message: "not found"}, true
	case errors.Is(err, endpoint.ErrInvalid), errors.Is(err, errBadRequest):
		return webserver.Problem{Status: http.StatusBadRequest, Code: "bad_request"}, true
	case errors.Is(err, delivery.ErrBusy), errors.Is(err, delivery.ErrCreating):
		return webserver.Problem{Status: http.StatusTooManyRequests, Code: "busy"}, true
	case errors.Is(err, delivery.ErrNotReading):
		h.Set("Retry-After", "5")
		return webserver.Problem{Status: http.StatusServiceUnavailable, Code: "unavailable", Message: "the endpoint's clicks cannot be read now (NATS unavailable); try again (a create stored nothing)"}, true
	}
	return webserver.Problem{}, false
}
