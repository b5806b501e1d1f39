// Package httpapi is the fraud service's HTTP API for owners: their recent
// alerts and the flagged share of each of their links, authenticated with
// the owner's API key (Authorization: Bearer <key>).
//
//	GET /api/alerts?limit=N         the caller's newest alerts, newest first
//	GET /api/links/:code/fraud      total and flagged clicks of one of the caller's links
package httpapi

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/owners"
	"github.com/snipdev/snip/pkg/webserver"
	"github.com/snipdev/snip/services/fraud/internal/fraud"
)

// Authenticator resolves an API key to its owner.
type Authenticator interface {
	Authenticate(ctx context.Context, key string) (owners.Owner, error)
}

// Stats is where the API reads from.
type Stats interface {
	RecentAlerts(ctx context.Context, owner string, limit int) ([]events.FraudAlert, error)
	LinkStats(ctx context.Context, code string) (fraud.LinkStats, error)
}

// Errors the handlers return; ErrorHandler maps them to statuses.
var (
	// ErrBadRequest means a parameter is malformed.
	ErrBadRequest = errors.New("bad request")
)

// DefaultLimit is how many alerts a request that names no limit gets, or
// the most one request returns (New's maxLimit) where that is fewer.
const DefaultLimit = 50

// API serves the routes.
type API struct {
	auth     Authenticator
	stats    Stats
	log      *slog.Logger
	maxLimit int
}

// New returns the API; maxLimit is the most alerts a request may ask for.
func New(auth Authenticator, stats Stats, log *slog.Logger, maxLimit int) *API {
	return &API{auth: auth, stats: stats, log: log, maxLimit: maxLimit}
}

// Mount adds the routes and the error handler to e.
func (a *API) Mount(e *echo.Echo) {
	e.HTTPErrorHandler = a.ErrorHandler
	g := e.Group("/api", noStore, a.authenticate)
	g.GET("/alerts", a.alerts)
	g.GET("/links/:code/fraud", a.linkFraud)
}

// noStore marks every answer of the API, errors included, as one owner's
// and not to be stored by any cache: an owner's alerts and links, or
// whether a link is theirs.
func noStore(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		c.Response().Header().Set(echo.HeaderCacheControl, "private, no-store")
		return next(c)
	}
}

func (a *API) authenticate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		o, err := a.auth.Authenticate(c.Request().Context(), owners.BearerKey(c.Request().Header.Get(echo.HeaderAuthorization)))
		if err != nil {
			return err
		}
		c.Set("owner", o)
		return next(c)
	}
}

func owner(c echo.Context) owners.Owner { return c.Get("owner").(owners.Owner) }

type alertsResponse struct {
	Alerts []events.FraudAlert `json:"alerts"`
}

func (a *API) alerts(c echo.Context) error {
	limit := min(DefaultLimit, a.maxLimit)
	if s := c.QueryParam("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > a.maxLimit {
			return wrap(ErrBadRequest, "limit must be an integer from 1 to "+strconv.Itoa(a.maxLimit))
		}
		limit = n
	}
	list, err := a.stats.RecentAlerts(c.Request().Context(), owner(c).ID, limit)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, alertsResponse{Alerts: list})
}

func (a *API) linkFraud(c echo.Context) error {
	code := c.Param("code")
	if !events.ValidToken(code) {
		return wrap(ErrBadRequest, "link code must be 1-64 letters, digits, '-' or '_'")
	}
	st, err := a.stats.LinkStats(c.Request().Context(), code)
	if err != nil {
		return err
	}
	if st.Owner != owner(c).ID {
		return fraud.ErrUnknownLink // someone else's link looks like no link
	}
	return c.JSON(http.StatusOK, st)
}

// userError is an error whose message is safe to show the caller.
type userError struct {
	kind error
	msg  string
}

func (e *userError) Error() string { return e.msg }
func (e *userError) Unwrap() error { return e.kind }

func wrap(kind error, msg string) error { return &userError{kind: kind, msg: msg} }

// ErrorHandler is the service's one echo error handler: pkg/webserver's
// (the envelope every Snip API shares) with this service's table.
func (a *API) ErrorHandler(err error, c echo.Context) {
	webserver.ErrorHandler(a.log, errorTable)(err, c)
}

// errorTable maps the service's errors to statuses: a bad parameter 400,
// unauthorized 401, an unknown link 404; echo's own errors keep theirs, and
// anything else is a logged 500 whose details stay in the log.
func errorTable(err error, _ http.Header) (webserver.Problem, bool) {
	var ue *userError
	switch {
	case errors.As(err, &ue):
		return webserver.Problem{Status: http.StatusBadRequest, Code: "bad_request", Message: ue.msg}, true
	case errors.Is(err, owners.ErrUnauthorized):
		return webserver.Problem{Status: http.StatusUnauthorized, Code: webserver.CodeUnauthorized, Message: "missing or unknown API key (Authorization: Bearer <key>)"}, true
	case errors.Is(err, fraud.ErrUnknownLink):
		return webserver.Problem{Status: http.StatusNotFound, Code: "not_found", Message: "no fraud statistics for this link: no click of it judged yet, or not your link"}, true
	}
	return webserver.Problem{}, false
}
