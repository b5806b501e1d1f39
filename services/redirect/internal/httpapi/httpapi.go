// Package httpapi is the redirect service's HTTP surface: the owners' link
// API under /api/links and the redirect itself at /:code, with the table
// that turns every sentinel error into a status code and a machine code
// (pkg/webserver writes the JSON envelope every Snip API shares).
package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/owners"
	"github.com/snipdev/snip/pkg/webserver"
	"github.com/snipdev/snip/services/redirect/internal/link"
	"github.com/snipdev/snip/services/redirect/internal/linkstore"
	"github.com/snipdev/snip/services/redirect/internal/redirect"
	"github.com/snipdev/snip/services/redirect/internal/visitor"
)

// MaxBody is the largest request body the API reads: a target of
// link.MaxTargetLen plus a code and JSON punctuation fit with room to spare.
const MaxBody = 8 << 10

// Authenticator resolves API keys to owners.
type Authenticator interface {
	Authenticate(ctx context.Context, key string) (owners.Owner, error)
}

// Links is what the API needs of the link store.
type Links interface {
	Create(ctx context.Context, owner, target, code string) (link.Link, error)
	GetOwned(ctx context.Context, owner, code string) (link.Link, error)
	Preview(ctx context.Context, code string) (linkstore.Preview, error)
	Delete(ctx context.Context, owner, code string) error
}

// Follower is the redirect hot path.
type Follower interface {
	Follow(ctx context.Context, v redirect.Visit) (link.Link, error)
}

// Invalidator drops a code from this instance's link cache.
type Invalidator interface {
	Invalidate(code string)
}

// API holds the handlers' dependencies.
type API struct {
	Owners    Authenticator
	Links     Links
	Follow    Follower
	Cache     Invalidator
	Log       *slog.Logger
	PublicURL string // base of short_url; empty: derived from the request
	// CreateLimit, if set, limits each owner's link creation (apikeys.go).
	CreateLimit Limiter
	// Keys, if set, serves POST /api/key/rotate.
	Keys KeyRotator
	// resolved caches the self-loop check's DNS answers (selfloop.go).
	resolvedOnce sync.Once
	resolved     *resolveCache
	// RedirectLatency observes the time to answer a redirect.
	RedirectLatency prometheus.Observer
	// Misses counts requests for codes that cannot exist (bad characters).
	Misses   prometheus.Counter
	requests *prometheus.CounterVec
	// onError is pkg/webserver's error handler with this service's table.
	onError echo.HTTPErrorHandler
	// redirected is requests{route="/:code",method="GET",status="302"},
	// resolved once: the hot path's label lookup would allocate.
	redirected prometheus.Counter
	// echo and allow (route template to its Allow header) let /:code
	// answer 405 for a method another route's path lacks (notAllowed).
	echo  *echo.Echo
	allow map[string]string
}

// Register mounts the routes, the error handler and the request metrics on e.
// Every path routed on e by then, the probes' included, answers OPTIONS (204
// with Allow) through a counted route. Add every route before Register: an
// OPTIONS to a path routed later is answered by /:code's OPTIONS route
// (echo falls back to it, and it matches any path), with /:code's Allow.
//
// Echo's router also falls back to /:code for a method that the matched
// route lacks but /:code has (GET, HEAD): HEAD /api/links/<code>, GET
// /api/links. /:code answers those 405 with the route's Allow, as echo
// answers any other method there (notAllowed).
func (a *API) Register(e *echo.Echo, reg prometheus.Registerer) {
	a.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "snip", Subsystem: "redirect", Name: "http_requests_total",
		Help: "HTTP requests by route, method and status.",
	}, []string{"route", "method", "status"})
	reg.MustRegister(a.requests)
	a.redirected = a.requests.WithLabelValues("/:code", http.MethodGet, "302")
	a.onError = webserver.ErrorHandler(a.Log, errorTable)
	e.HTTPErrorHandler = a.handleError

	// Handlers are wrapped here, once: echo v4 composes middleware given to
	// e.Use or to a route anew for every request (an allocation each). The
	// body limit is on the route, not the group: a group middleware would
	// turn every unknown /api method into 404 instead of 405.
	api := e.Group("/api")
	api.POST("/links", a.countRequests(middleware.BodyLimit(strconv.Itoa(MaxBody))(a.create)))
	api.GET("/links/:code", a.countRequests(a.get))
	api.DELETE("/links/:code", a.countRequests(a.delete))
	api.POST("/key/rotate", a.countRequests(a.rotateKey))

	follow := a.countRequests(a.redirect)
	e.GET("/:code", follow)
	e.HEAD("/:code", follow)
	a.echo = e
	a.registerOptions(e)
}

// allowOrder is the order of methods in an Allow header, echo's.
var allowOrder = []string{http.MethodConnect, http.MethodDelete, http.MethodGet, http.MethodHead,
	http.MethodPatch, http.MethodPost, http.MethodPut, http.MethodTrace}

// registerOptions gives every path routed on e so far (the probes
// included) an OPTIONS route that answers as echo would itself, 204 with
// Allow naming the path's methods, and is counted. Echo's own answer runs
// outside every handler and returns no error, so neither countRequests nor
// handleError saw it.
func (a *API) registerOptions(e *echo.Echo) {
	a.allow = map[string]string{}
	methods := map[string]map[string]bool{}
	for _, r := range e.Routes() {
		if r.Method != http.MethodOptions && !slices.Contains(allowOrder, r.Method) {
			continue // not a method (echo's route-not-found entries)
		}
		if methods[r.Path] == nil {
			methods[r.Path] = map[string]bool{}
		}
		methods[r.Path][r.Method] = true
	}
	for path, m := range methods {
		allow := http.MethodOptions
		for _, method := range allowOrder {
			if m[method] {
				allow += ", " + method
			}
		}
		a.allow[path] = allow
		if m[http.MethodOptions] {
			continue // the path answers OPTIONS itself
		}
		e.OPTIONS(path, a.countRequests(func(c echo.Context) error {
			c.Response().Header().Set(echo.HeaderAllow, allow)
			return c.NoContent(http.StatusNoContent)
		}))
	}
}

// IPExtractor returns how the client address is found: the connection's
// peer, or X-Forwarded-For only when the peer is one of the trusted proxies
// (and then the rightmost untrusted address in the header).
func IPExtractor(trusted []netip.Prefix) echo.IPExtractor {
	if len(trusted) == 0 {
		return echo.ExtractIPDirect()
	}
	opts := []echo.TrustOption{echo.TrustLoopback(false), echo.TrustLinkLocal(false), echo.TrustPrivateNet(false)}
	for _, p := range trusted {
		_, n, _ := net.ParseCIDR(p.Masked().String())
		opts = append(opts, echo.TrustIPRange(n))
	}
	return echo.ExtractIPFromXFFHeader(opts...)
}

// apiError is an error with a status, a machine-readable code and a message
// for people.
type apiError struct {
	status  int
	code    string
	message string
}

func (e *apiError) Error() string { return e.message }

func badRequest(code, format string, args ...any) error {
	return &apiError{status: http.StatusBadRequest, code: code, message: fmt.Sprintf(format, args...)}
}

// handleError is the service's one error handler: pkg/webserver's, which
// writes the envelope every Snip API shares ({"error": {"code", "message"}})
// from errorTable, plus the count of the requests that reached no route's
// handler (so no countRequests counted them), by methodLabel: those no
// route matched, under route "unmatched", and those whose path a route
// matched but not their method (echo's own handler answers them 405), under
// that route's template.
func (a *API) handleError(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	route := c.Path()
	if route == "" {
		route = "unmatched"
	} else if c.Get(echo.ContextKeyHeaderAllow) == nil {
		route = "" // a route's handler failed: countRequests counts it
	}
	if route != "" {
		defer func() {
			a.requests.WithLabelValues(route, methodLabel(c.Request().Method), statusText(c.Response().Status)).Inc()
		}()
	}
	a.onError(err, c)
}

// methodLabel is a request's method as a metric label: one of the methods
// HTTP defines, or "other". A client may send any token as its method, and
// a label per token would grow the counter (and /metrics) without bound.
func methodLabel(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace:
		return m
	}
	return "other"
}

// errorTable is the service's table from its errors to statuses, codes and
// messages; anything it does not know is a logged 500.
func errorTable(err error, h http.Header) (webserver.Problem, bool) {
	var ae *apiError
	var he *echo.HTTPError
	switch {
	case errors.As(err, &ae):
		return webserver.Problem{Status: ae.status, Code: ae.code, Message: ae.message}, true
	case errors.As(err, &he):
		msg := fmt.Sprint(he.Message)
		switch he.Code {
		case http.StatusNotFound:
			return webserver.Problem{Status: he.Code, Code: "not_found", Message: "no such link or route"}, true
		case http.StatusMethodNotAllowed:
			return webserver.Problem{Status: he.Code, Code: "method_not_allowed", Message: msg}, true
		case http.StatusRequestEntityTooLarge:
			return webserver.Problem{Status: he.Code, Code: "body_too_large", Message: fmt.Sprintf("request body over %d bytes", MaxBody)}, true
		}
		return webserver.Problem{Status: he.Code, Code: webserver.StatusCode(he.Code), Message: msg}, true
	case errors.Is(err, owners.ErrUnauthorized):
		return webserver.Problem{Status: http.StatusUnauthorized, Code: webserver.CodeUnauthorized, Message: "missing or unknown API key; send Authorization: Bearer <key>"}, true
	case errors.Is(err, link.ErrInvalidTarget):
		return webserver.Problem{Status: http.StatusBadRequest, Code: "invalid_target"}, true
	case errors.Is(err, link.ErrReservedCode):
		return webserver.Problem{Status: http.StatusBadRequest, Code: "reserved_code"}, true
	case errors.Is(err, link.ErrInvalidCode):
		return webserver.Problem{Status: http.StatusBadRequest, Code: "invalid_code"}, true
	case errors.Is(err, linkstore.ErrNotFound), errors.Is(err, redirect.ErrNotFound):
		return webserver.Problem{Status: http.StatusNotFound, Code: "not_found", Message: "no such link"}, true
	case errors.Is(err, linkstore.ErrCodeTaken):
		return webserver.Problem{Status: http.StatusConflict, Code: "code_taken", Message: "that code is taken; choose another or leave code out for a random one"}, true
	case errors.Is(err, redirect.ErrClickUnconfirmed):
		// Not "not recorded": JetStream may have stored it. The header
		// lets a client that does not read bodies (a load generator's
		// oracle) tell the two apart.
		h.Set("Retry-After", "1")
		h.Set(ClickHeader, "unconfirmed")
		return webserver.Problem{Status: http.StatusServiceUnavailable, Code: "click_unconfirmed",
			Message: "the click could not be confirmed (it may have been recorded); try again"}, true
	case errors.Is(err, redirect.ErrClickNotRecorded):
		h.Set("Retry-After", "1")
		return webserver.Problem{Status: http.StatusServiceUnavailable, Code: "click_not_recorded", Message: "the click could not be recorded; try again"}, true
	case isFull(err):
		h.Set("Retry-After", "10")
		return webserver.Problem{Status: http.StatusServiceUnavailable, Code: "outbox_full", Message: "event delivery is backed up; try again later"}, true
	case isUnavailable(err):
		h.Set("Retry-After", "1")
		return webserver.Problem{Status: http.StatusServiceUnavailable, Code: "unavailable", Message: "storage is unavailable; try again"}, true
	}
	return webserver.Problem{}, false
}

// countRequests counts every routed request by route template, method and
// status (handleError counts the unrouted ones and those answered 405).
func (a *API) countRequests(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		err := next(c)
		if err != nil {
			c.Error(err) // writes the response, so the status below is final
		}
		route, method, status := c.Path(), c.Request().Method, c.Response().Status
		if status == http.StatusFound && route == "/:code" && method == http.MethodGet {
			a.redirected.Inc()
			return nil
		}
		a.requests.WithLabelValues(route, method, statusText(status)).Inc()
		return nil
	}
}

// statusText avoids strconv's allocation for the statuses the hot path
// answers.
func statusText(s int) string {
	switch s {
	case 302:
		return "302"
	case 404:
		return "404"
	case 200:
		return "200"
	case 503:
		return "503"
	}
	return strconv.Itoa(s)
}

// ClickHeader on a 503 says "unconfirmed" when the click was sent to
// JetStream and never acknowledged: it may be recorded (and counted), unlike
// a plain 503 click_not_recorded, which is never counted. The load test's
// oracle reads it (loadtest/internal/httpload).
const ClickHeader = "Snip-Click"

// Canonical header names (so Header.Get does not canonicalise per call).
const (
	headerCFCountry = "Cf-Ipcountry"
	headerXCountry  = "X-Country"
)

var cacheControl = []string{"private, max-age=0"}

// redirect answers GET and HEAD /:code: 302 to the target once the click is
// in the outbox (HEAD: 302, no click); 404 for unknown codes. Every answer,
// errors included, is private, max-age=0: a shared cache in front may keep
// a 404 without it for minutes (Varnish and Fastly do), and would go on
// answering 404 for a code once it is created.
func (a *API) redirect(c echo.Context) error {
	start := time.Now()
	req := c.Request()
	h := c.Response().Header()
	h["Cache-Control"] = cacheControl
	code, ok := link.ParseCode(c.Param("code"))
	if !ok {
		if err := a.notAllowed(c); err != nil {
			return err
		}
		if a.Misses != nil {
			a.Misses.Inc()
		}
		return &apiError{status: http.StatusNotFound, code: "not_found", message: "no such link"}
	}
	country := req.Header.Get(headerCFCountry)
	if country == "" {
		country = req.Header.Get(headerXCountry)
	}
	ip, _ := netip.ParseAddr(c.RealIP())
	v := redirect.Visit{
		Code:      code,
		Time:      start,
		IP:        ip,
		UserAgent: req.Header.Get("User-Agent"),
		Referrer:  req.Header.Get("Referer"),
		Country:   visitor.Country(country),
		RequestID: c.Response().Header().Get(echo.HeaderXRequestID),
		Head:      req.Method == http.MethodHead,
	}
	l, err := a.Follow.Follow(req.Context(), v)
	if err != nil {
		return err
	}
	h["Location"] = []string{l.Target}
	c.Response().WriteHeader(http.StatusFound)
	if a.RedirectLatency != nil {
		a.RedirectLatency.Observe(time.Since(start).Seconds())
	}
	return nil
}

// notAllowed answers a request that echo's router gave /:code although
// another route's path matches it, only not its method (echo falls back to
// /:code, whose last segment matches any rest of a path, when the route
// lacks a method /:code has: HEAD /api/links/<code>, GET /api/links): 405
// with that route's Allow, counted under its template, as echo answers the
// route's other missing methods. It returns nil for a path no other route
// matches (a code that cannot exist: 404). Only codes ParseCode refused
// come here, never the redirect's hot path.
func (a *API) notAllowed(c echo.Context) error {
	if a.echo == nil || !strings.Contains(c.Param("code"), "/") {
		return nil // one segment: no other route has it
	}
	r := c.Request()
	path := r.URL.RawPath
	if path == "" {
		path = r.URL.Path
	}
	// Every routed path answers OPTIONS (registerOptions): the route an
	// OPTIONS finds is the one whose path this is.
	probe := a.echo.NewContext(nil, nil)
	a.echo.Router().Find(http.MethodOptions, path, probe)
	route := probe.Path()
	allow, ok := a.allow[route]
	if !ok || route == "/:code" {
		return nil
	}
	c.SetPath(route)
	c.Response().Header().Set(echo.HeaderAllow, allow)
	return echo.ErrMethodNotAllowed
}

// linkJSON is a link as the API shows it.
type linkJSON struct {
	Code     string             `json:"code"`
	ShortURL string             `json:"short_url"`
	Target   string             `json:"target"`
	Owner    string             `json:"owner"`
	Created  time.Time          `json:"created_at"`
	Preview  *linkstore.Preview `json:"preview,omitempty"`
}

func (a *API) toJSON(c echo.Context, l link.Link) linkJSON {
	base := a.PublicURL
	if base == "" {
		scheme := c.Scheme()
		base = scheme + "://" + c.Request().Host
	}
	return linkJSON{Code: l.Code, ShortURL: strings.TrimSuffix(base, "/") + "/" + l.Code, Target: l.Target, Owner: l.Owner, Created: l.Created}
}

func (a *API) owner(c echo.Context) (owners.Owner, error) {
	key := owners.BearerKey(c.Request().Header.Get(echo.HeaderAuthorization))
	if key == "" {
		return owners.Owner{}, owners.ErrUnauthorized
	}
	o, err := a.Owners.Authenticate(c.Request().Context(), key)
	if err != nil && !errors.Is(err, owners.ErrUnauthorized) {
		return owners.Owner{}, fmt.Errorf("%w: %w", linkstore.ErrUnavailable, err)
	}
	return o, err
}

// ownerAndCode authenticates the caller and parses :code (a code that
// cannot exist is simply not found).
func (a *API) ownerAndCode(c echo.Context) (owners.Owner, string, error) {
	o, err := a.owner(c)
	if err != nil {
		return owners.Owner{}, "", err
	}
	code, ok := link.ParseCode(c.Param("code"))
	if !ok {
		return owners.Owner{}, "", linkstore.ErrNotFound
	}
	return o, code, nil
}

// createRequest is the body of POST /api/links. "url" is accepted for
// "target" (the name other shorteners use); giving both is an error.
type createRequest struct {
	Target string `json:"target"`
	URL    string `json:"url,omitempty"`
	Code   string `json:"code,omitempty"`
}

// create answers POST /api/links: 201 with the link.
func (a *API) create(c echo.Context) error {
	o, err := a.owner(c)
	if err != nil {
		return err
	}
	if err := a.limitCreate(c, o); err != nil {
		return err
	}
	req, err := decodeCreate(c)
	if err != nil {
		return err
	}
	target, err := link.ValidateTarget(req.Target)
	if err != nil {
		return err
	}
	if err := a.checkLoop(c, target); err != nil {
		return err
	}
	if req.Code != "" {
		if err := link.ValidateCode(req.Code); err != nil {
			return err
		}
	}
	l, err := a.Links.Create(c.Request().Context(), o.ID, target, req.Code)
	if err != nil {
		return err
	}
	a.Cache.Invalidate(l.Code)
	c.Response().Header().Set(echo.HeaderLocation, "/api/links/"+l.Code)
	return c.JSON(http.StatusCreated, a.toJSON(c, l))
}

func decodeCreate(c echo.Context) (createRequest, error) {
	var req createRequest
	ct := c.Request().Header.Get(echo.HeaderContentType)
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil || mt != echo.MIMEApplicationJSON {
		return req, &apiError{status: http.StatusUnsupportedMediaType, code: "unsupported_media_type",
			message: fmt.Sprintf("Content-Type %q: send application/json", ct)}
	}
	dec := json.NewDecoder(c.Request().Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		var he *echo.HTTPError
		if errors.As(err, &he) {
			return req, he // the body limit, hit while reading
		}
		if errors.Is(err, io.EOF) {
			return req, badRequest("bad_request", "empty body; send {\"target\": \"https://...\"}")
		}
		return req, badRequest("bad_request", "body is not the expected JSON object: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		var he *echo.HTTPError
		if errors.As(err, &he) {
			return req, he
		}
		return req, badRequest("bad_request", "unexpected data after the JSON object")
	}
	switch {
	case req.Target != "" && req.URL != "":
		return req, badRequest("bad_request", "give the target as \"target\" or \"url\", not both")
	case req.Target == "":
		req.Target = req.URL
	}
	if req.Target == "" {
		return req, badRequest("invalid_target", "target is required")
	}
	return req, nil
}

// get answers GET /api/links/:code with the owner's link and its preview:
// status pending until the preview service has stored it, then ok with the
// fields, or unavailable with a reason. Another owner's link is 404,
// not 403, so codes cannot be probed.
func (a *API) get(c echo.Context) error {
	o, code, err := a.ownerAndCode(c)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	l, err := a.Links.GetOwned(ctx, o.ID, code)
	if err != nil {
		return err
	}
	out := a.toJSON(c, l)
	p, err := a.Links.Preview(ctx, code)
	if err != nil {
		return err
	}
	out.Preview = &p
	return c.JSON(http.StatusOK, out)
}

// delete answers DELETE /api/links/:code: 204. Another owner's link is 404.
func (a *API) delete(c echo.Context) error {
	o, code, err := a.ownerAndCode(c)
	if err != nil {
		return err
	}
	if err := a.Links.Delete(c.Request().Context(), o.ID, code); err != nil {
		return err
	}
	a.Cache.Invalidate(code)
	return c.NoContent(http.StatusNoContent)
}
