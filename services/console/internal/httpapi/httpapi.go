// Package httpapi is the console's HTTP side: the operator's page and the
// JSON endpoints its panels poll, the live clicks as Server-Sent Events, the
// replay and redrive actions, the owners' click stream, and the service's one
// echo error handler.
//
// Routes (operator routes need the console token when one is set; see
// auth.go):
//
//	GET  /                                 the page
//	GET  /login, POST /login               the session cookie
//	POST /logout                           end this session (everywhere)
//	POST /api/sessions/revoke              end every session (the Bearer token only)
//	GET  /static/*                         the page's script and style
//	GET  /api/readers                      groups per partition, other consumers
//	POST /api/readers/:group/replay        {"since"|"from"|"from_seq", "confirm": group, "force"}
//	GET  /api/readers/:group/replay        the latest replay's progress
//	GET  /api/live                         live clicks (SSE)
//	GET  /api/alerts                       recent fraud alerts
//	GET  /api/dlq                          dead letters per source and reason
//	GET  /api/dlq/letters?source&reason    letters of a group, oldest first
//	GET  /api/dlq/letters/:seq             one letter, headers and payload
//	POST /api/dlq/letters/:seq/redrive     send one letter home
//	POST /api/dlq/redrive                  {"source", "reason"}: send a group home
//	GET  /api/outbox                       the redirect outbox in Redis
//	GET  /api/webhooks                     owners' webhook endpoints: status, backlog
//	GET  /api/warehouse                    top links and clicks per hour
//	GET  /api/clicks/stream                an owner's clicks (SSE; owner API key)
package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/owners"
	"github.com/snipdev/snip/services/console/internal/alerts"
	"github.com/snipdev/snip/services/console/internal/dlq"
	"github.com/snipdev/snip/services/console/internal/livefeed"
	"github.com/snipdev/snip/services/console/internal/memo"
	"github.com/snipdev/snip/services/console/internal/outboxstate"
	"github.com/snipdev/snip/services/console/internal/ownerstream"
	"github.com/snipdev/snip/services/console/internal/readers"
	"github.com/snipdev/snip/services/console/internal/sse"
	"github.com/snipdev/snip/services/console/internal/warehouseview"
	"github.com/snipdev/snip/services/console/internal/webhookstate"
)

// Readers is the readers panel and its replays.
type Readers interface {
	Snapshot(ctx context.Context) (readers.Snapshot, error)
	Replay(ctx context.Context, group string, r readers.ReplayRequest) (readers.Replayed, error)
	ReplayStatus(ctx context.Context, group string) (readers.ReplayStatus, error)
}

// Live is the live clicks' hub.
type Live interface {
	Subscribe() (*livefeed.Subscription, error)
	Unsubscribe(*livefeed.Subscription)
	Stats() livefeed.Stats
}

// Alerts are the recent fraud alerts.
type Alerts interface{ Snapshot() alerts.Snapshot }

// DeadLetters reads and redrives DEAD_LETTER.
type DeadLetters interface {
	Groups(ctx context.Context) (dlq.Groups, error)
	Letters(ctx context.Context, source, reason string, limit int) ([]dlq.Letter, error)
	Letter(ctx context.Context, seq uint64) (dlq.Letter, error)
	Redrive(ctx context.Context, seq uint64) (dlq.Redriven, error)
	RedriveGroup(ctx context.Context, source, reason string) (dlq.GroupRedrive, error)
}

// Outbox reads the redirect outbox.
type Outbox interface {
	Snapshot(ctx context.Context) (outboxstate.Snapshot, error)
}

// Webhooks reads the webhooks service's endpoints.
type Webhooks interface {
	Snapshot(ctx context.Context, now time.Time) (webhookstate.Snapshot, error)
}

// Warehouse reads the warehouse panel.
type Warehouse interface {
	Snapshot(ctx context.Context, now time.Time) warehouseview.Snapshot
}

// OwnerStreams serves the owners' click streams.
type OwnerStreams interface {
	Serve(ctx context.Context, w http.ResponseWriter, owner string, start ownerstream.Start) error
}

// Authenticator resolves an owner's API key.
type Authenticator interface {
	Authenticate(ctx context.Context, key string) (owners.Owner, error)
}

// Sessions records the sessions ended before their expiry, for every
// console instance (pkg/consolesessions).
type Sessions interface {
	Check(ctx context.Context, id string, issued time.Time) error
	Revoke(ctx context.Context, id string) error
	RevokeAll(ctx context.Context, at time.Time) (time.Time, error)
}

// Deps are what the routes read and act on.
type Deps struct {
	Readers     Readers
	Live        Live
	Alerts      Alerts
	DeadLetters DeadLetters
	// Outbox is nil when Redis holds no outbox to read.
	Outbox Outbox
	// Webhooks is nil when Redis holds no webhook endpoints to read.
	Webhooks  Webhooks
	Warehouse Warehouse
	Streams   OwnerStreams
	Owners    Authenticator
	// KeyRecheck is how often an open owner stream checks its API key again,
	// so a rotated or revoked key ends it (default 2s).
	KeyRecheck time.Duration
	Auth       AuthConfig
	// Sessions ends sessions early; required with a token (Auth.Token).
	Sessions Sessions
	// Page is what the page shows of the configuration.
	Page PageConfig
	// SSE tunes the live clicks stream.
	LiveWriteTimeout time.Duration
	// NATS reports why the console's NATS connection is not connected
	// (service.NATSReady), nil when it is: the panels that read JetStream
	// answer "unavailable" with it at once instead of waiting for their
	// JetStream calls to time out one after another. Nil: not checked.
	NATS func(ctx context.Context) error
	// Stop closes when the service shuts down: live streams end.
	Stop    <-chan struct{}
	Log     *slog.Logger
	Metrics prometheus.Registerer
}

// PageConfig is shown on the page.
type PageConfig struct {
	// Refresh is how often the panels poll: the wait after one poll
	// answered before the next.
	Refresh time.Duration
	// Warn and Alarm are the oldest-unread-age thresholds.
	Warn, Alarm time.Duration
}

// letterLimit bounds a group's letters listed at once.
const letterLimit = 50

// groupRedriveTime bounds a group redrive within the server's 30 s write
// timeout; the rest stay for the next press.
const groupRedriveTime = 20 * time.Second

type api struct {
	d       Deps
	auth    *auth
	actions *prometheus.CounterVec

	readers   *memo.Value[readers.Snapshot]
	dlqGroups *memo.Value[dlq.Groups]
	outbox    *memo.Value[outboxstate.Snapshot]
	webhooks  *memo.Value[webhookstate.Snapshot]
	warehouse *memo.Value[warehouseview.Snapshot]
}

// Register mounts every route on e and installs the error handler.
func Register(e *echo.Echo, d Deps) error {
	if d.Auth.Token != "" && d.Sessions == nil {
		return errors.New("console: a token needs a sessions store")
	}
	a := &api{
		d: d, auth: newAuth(d.Auth, d.Sessions, d.NATS),
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "snip", Subsystem: "console", Name: "actions_total",
			Help: "Operator actions (replay, redrive, redrive_group, login, logout, revoke_sessions) by result."}, []string{"action", "result"}),
	}
	a.auth.log = d.Log
	if d.Metrics != nil {
		if err := d.Metrics.Register(a.actions); err != nil {
			return fmt.Errorf("register metrics: %w", err)
		}
	}
	a.readers = memo.New(time.Second, natsFirst(d.NATS, d.Readers.Snapshot))
	a.dlqGroups = memo.New(time.Second, natsFirst(d.NATS, d.DeadLetters.Groups))
	a.outbox = memo.New(time.Second, func(ctx context.Context) (outboxstate.Snapshot, error) {
		if d.Outbox == nil {
			return outboxstate.Snapshot{}, fmt.Errorf("no redis: %w", errUnavailable)
		}
		return d.Outbox.Snapshot(ctx)
	})
	a.webhooks = memo.New(time.Second, func(ctx context.Context) (webhookstate.Snapshot, error) {
		if d.Webhooks == nil {
			return webhookstate.Snapshot{}, fmt.Errorf("no redis: %w", errUnavailable)
		}
		return d.Webhooks.Snapshot(ctx, time.Now())
	})
	a.warehouse = memo.New(10*time.Second, func(ctx context.Context) (warehouseview.Snapshot, error) {
		return d.Warehouse.Snapshot(ctx, time.Now()), nil
	})

	e.HTTPErrorHandler = ErrorHandler(d.Log)
	e.Use(securityHeaders)
	e.Use(middleware.BodyLimit(strconv.Itoa(maxBody)))

	// The owners' stream: an owner's API key, not the console token.
	e.GET("/api/clicks/stream", a.ownerStream)

	e.GET("/static/*", staticHandler())
	e.GET("/login", a.loginPage)
	e.POST("/login", a.login)
	// A logout needs no valid session: it ends the one its cookie names.
	e.POST("/logout", a.logout)
	op := e.Group("", a.auth.operator)
	op.GET("/", a.page)
	op.POST("/api/sessions/revoke", a.revokeSessions)
	op.GET("/api/readers", a.getReaders)
	op.POST("/api/readers/:group/replay", a.replay)
	op.GET("/api/readers/:group/replay", a.replayStatus)
	op.GET("/api/live", a.live)
	op.GET("/api/alerts", func(c echo.Context) error { return c.JSON(http.StatusOK, d.Alerts.Snapshot()) })
	op.GET("/api/dlq", a.dlq)
	op.GET("/api/dlq/letters", a.letters)
	op.GET("/api/dlq/letters/:seq", a.letter)
	op.POST("/api/dlq/letters/:seq/redrive", a.redrive)
	op.POST("/api/dlq/redrive", a.redriveGroup)
	op.GET("/api/outbox", a.getOutbox)
	op.GET("/api/webhooks", func(c echo.Context) error {
		return c.JSON(http.StatusOK, a.webhooksPanel(c.Request().Context()))
	})
	op.GET("/api/warehouse", func(c echo.Context) error {
		s, _ := a.warehouse.Get(c.Request().Context())
		return c.JSON(http.StatusOK, s)
	})
	return nil
}

// natsFirst is fn, which reads JetStream, unless the NATS connection is
// down (down says why): then fn is not called and the error is down's. A
// panel read with NATS away made JetStream calls that each waited for
// their timeout, so the panel said "unavailable" only at its 20 s limit.
func natsFirst[T any](down func(context.Context) error, fn func(context.Context) (T, error)) func(context.Context) (T, error) {
	if down == nil {
		return fn
	}
	return func(ctx context.Context) (T, error) {
		if err := down(ctx); err != nil {
			var zero T
			return zero, err
		}
		return fn(ctx)
	}
}

// natsAway is why the console's NATS connection is not connected (Deps.NATS),
// nil when it is or is not checked. The actions that call JetStream (the
// letters, a redrive, a replay and its progress) look first, as the panels
// do (natsFirst): with NATS away they answer "unavailable" at once, not
// once their JetStream calls have timed out one after another (up to about
// 20 s).
func (a *api) natsAway(ctx context.Context) error {
	if a.d.NATS == nil {
		return nil
	}
	return a.d.NATS(ctx)
}

// securityHeaders: nothing on the page comes from elsewhere, nothing frames
// it, no script runs that is not the console's own file.
func securityHeaders(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		h := c.Response().Header()
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "same-origin")
		h.Set(echo.HeaderCacheControl, "no-store")
		return next(c)
	}
}

// audit logs an operator action once, with who asked and from where.
func (a *api) audit(c echo.Context, action string, err error, attrs ...any) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	a.actions.WithLabelValues(action, result).Inc()
	attrs = append(attrs, "action", action, "result", result, "who", c.Get(whoKey), "remote", c.Request().RemoteAddr,
		"client", a.client(c.Request()), "user_agent", c.Request().UserAgent(), "request_id", c.Response().Header().Get(echo.HeaderXRequestID))
	if err != nil {
		attrs = append(attrs, "err", err)
	}
	a.d.Log.Info("console action", attrs...)
}

// client is the caller's address for the logs: the connection's peer, or
// behind a trusted proxy the client it forwarded (CONSOLE_TRUSTED_PROXIES),
// as the guessing limits tell clients apart; "" when it is not an address.
func (a *api) client(r *http.Request) string {
	if ip := clientAddr(r, a.auth.cfg.TrustedProxies); ip.IsValid() {
		return ip.String()
	}
	return ""
}

func (a *api) getReaders(c echo.Context) error {
	s, err := a.readers.Get(c.Request().Context())
	if err != nil {
		return fmt.Errorf("read the readers: %w: %w", errUnavailable, err)
	}
	return c.JSON(http.StatusOK, s)
}

func (a *api) replay(c echo.Context) error {
	var req readers.ReplayRequest
	group := c.Param("group")
	if err := decodeJSON(c, &req); err != nil {
		return badFromSeq(group, err)
	}
	var r readers.Replayed
	err := a.natsAway(c.Request().Context())
	if err == nil {
		r, err = a.d.Readers.Replay(c.Request().Context(), group, req)
	}
	err = unavailable("replay "+group, err)
	a.audit(c, "replay", err, "group", group, "position", r.Position, "replay_id", r.ID, "force", req.Force)
	if err != nil {
		return err
	}
	a.readers.Forget()
	return c.JSON(http.StatusAccepted, map[string]any{"id": r.ID, "group": group, "position": r.Position,
		"note": readers.ReplayNote(group), "warnings": r.Warnings})
}

// badFromSeq is err, or when err is a from_seq that is no CLICKS sequence
// (below 0, a fraction, a string, past 2^64-1) the refusal that names it
// and says where sequences start, as "from_seq": 0 is refused, rather than
// the JSON decoder's text.
func badFromSeq(group string, err error) error {
	var te *json.UnmarshalTypeError
	if !errors.As(err, &te) || te.Field != "from_seq" {
		return err
	}
	v, isNumber := strings.CutPrefix(te.Value, "number ")
	if !isNumber {
		v = "(a " + te.Value + ")"
	}
	return fmt.Errorf("replay %s: from_seq %s: CLICKS sequences are whole numbers and start at 1 (the oldest retained): %w",
		group, v, readers.ErrBadReplay)
}

func (a *api) replayStatus(c echo.Context) error {
	group := c.Param("group")
	if err := a.natsAway(c.Request().Context()); err != nil {
		return unavailable("read the replay of "+group, err)
	}
	st, err := a.d.Readers.ReplayStatus(c.Request().Context(), group)
	if err != nil {
		return unavailable("read the replay of "+group, err)
	}
	return c.JSON(http.StatusOK, st)
}

// maxBody is the most a request body may hold: an action's JSON is far
// smaller. A longer one is a 413 "body_too_large", as the redirect's link
// API answers.
const maxBody = 16 << 10

// liveTick is how often the live stream sends its status (rate, skipped,
// dropped), which doubles as its heartbeat.
const liveTick = 2 * time.Second

func (a *api) live(c echo.Context) error {
	sub, err := a.d.Live.Subscribe()
	if err != nil {
		return err
	}
	defer a.d.Live.Unsubscribe(sub)
	s, err := sse.Open(c.Response(), 2*time.Second, a.d.LiveWriteTimeout)
	if err != nil {
		return nil // the client is gone
	}
	status := func() (sse.Event, bool) {
		st := a.d.Live.Stats()
		b, _ := json.Marshal(struct {
			livefeed.Stats
			Dropped uint64 `json:"dropped"`
		}{st, sub.Dropped()})
		return sse.Event{Name: "status", Data: b}, true
	}
	first, _ := status()
	for _, e := range append(sub.Recent(), first) {
		if err := s.Write(e); err != nil {
			return nil
		}
	}
	if err := s.Flush(); err != nil {
		return nil
	}
	ctx := c.Request().Context()
	if c.Get(whoKey) == whoSession {
		// A session ended while its page watches ends the stream too; the
		// page's reconnect is refused.
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		go a.watchSession(ctx, cancel, c.Request())
	}
	_ = s.Pump(ctx, sub.C(), a.d.Stop, liveTick, status)
	return nil
}

// watchSession checks r's session every liveTick until ctx ends, and calls
// ended when it no longer opens the console: ended (logged out, every
// session revoked) or expired (sessionTTL after its login; a page left open
// would otherwise watch every owner's clicks for as long as its connection
// lasts). A session that cannot be checked (NATS away) is not an ended one:
// the stream, which reads NATS too, goes on and the next check tries again.
func (a *api) watchSession(ctx context.Context, ended context.CancelFunc, r *http.Request) {
	t := time.NewTicker(liveTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := a.auth.who(r.WithContext(ctx)); err != nil && !errors.Is(err, errUnavailable) {
			a.d.Log.Info("live clicks: the page's session no longer opens the console; ending its stream", "why", err)
			ended()
			return
		}
	}
}

func (a *api) dlq(c echo.Context) error {
	p, err := a.dlqPanel(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, p)
}

// dlqPanel is the dead-letters panel: the groups with the most letters,
// and how many letters and groups there are in all.
func (a *api) dlqPanel(ctx context.Context) (dlq.Groups, error) {
	gs, err := a.dlqGroups.Get(ctx)
	if err != nil {
		return dlq.Groups{}, fmt.Errorf("read dead letters: %w: %w", errUnavailable, err)
	}
	return gs, nil
}

func (a *api) letters(c echo.Context) error {
	if err := a.natsAway(c.Request().Context()); err != nil {
		return unavailable("read dead letters", err)
	}
	ls, err := a.d.DeadLetters.Letters(c.Request().Context(), c.QueryParam("source"), c.QueryParam("reason"), letterLimit)
	if err != nil {
		return unavailable("read dead letters", err)
	}
	return c.JSON(http.StatusOK, map[string]any{"letters": ls, "limit": letterLimit})
}

func parseSeq(s string) (uint64, error) {
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("%q is not a dead-letter sequence: %w", s, errBadRequest)
	}
	return n, nil
}

func (a *api) letter(c echo.Context) error {
	seq, err := parseSeq(c.Param("seq"))
	if err != nil {
		return err
	}
	if err := a.natsAway(c.Request().Context()); err != nil {
		return unavailable(fmt.Sprintf("read dead letter %d", seq), err)
	}
	l, err := a.d.DeadLetters.Letter(c.Request().Context(), seq)
	if err != nil {
		return unavailable(fmt.Sprintf("read dead letter %d", seq), err)
	}
	return c.JSON(http.StatusOK, l)
}

func (a *api) redrive(c echo.Context) error {
	seq, err := parseSeq(c.Param("seq"))
	if err != nil {
		return err
	}
	var r dlq.Redriven
	err = a.natsAway(c.Request().Context())
	if err == nil {
		r, err = a.d.DeadLetters.Redrive(c.Request().Context(), seq)
	}
	err = unavailable(fmt.Sprintf("redrive dead letter %d", seq), err)
	a.audit(c, "redrive", err, "dead_seq", seq, "to", r.Subject, "new_seq", r.NewSeq)
	if err != nil {
		return err
	}
	a.dlqGroups.Forget()
	return c.JSON(http.StatusOK, r)
}

func (a *api) redriveGroup(c echo.Context) error {
	var req struct {
		Source string `json:"source"`
		Reason string `json:"reason"`
	}
	if err := decodeJSON(c, &req); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), groupRedriveTime)
	defer cancel()
	var r dlq.GroupRedrive
	err := a.natsAway(ctx)
	if err == nil {
		r, err = a.d.DeadLetters.RedriveGroup(ctx, req.Source, req.Reason)
	} else {
		err = unavailable(fmt.Sprintf("redrive dead letters (source %s, reason %s)", req.Source, req.Reason), err)
	}
	if err == nil && r.Error != "" {
		a.audit(c, "redrive_group", fmt.Errorf("%s", r.Error), "source", req.Source, "reason", req.Reason, "redriven", r.Redriven, "refused", r.RefusedCount)
	} else {
		a.audit(c, "redrive_group", err, "source", req.Source, "reason", req.Reason, "redriven", r.Redriven, "refused", r.RefusedCount)
	}
	if err != nil {
		return err
	}
	a.dlqGroups.Forget()
	return c.JSON(http.StatusOK, r)
}

func (a *api) getOutbox(c echo.Context) error {
	return c.JSON(http.StatusOK, a.outboxPanel(c.Request().Context()))
}

// outboxPanel is the outbox panel, or why there is none.
func (a *api) outboxPanel(ctx context.Context) map[string]any {
	s, err := a.outbox.Get(ctx)
	if err != nil {
		return map[string]any{"available": false, "error": err.Error()}
	}
	return map[string]any{"available": true, "outbox": s}
}

// webhooksPanel is the owners' webhooks panel, or why there is none.
func (a *api) webhooksPanel(ctx context.Context) map[string]any {
	s, err := a.webhooks.Get(ctx)
	if err != nil {
		return map[string]any{"available": false, "error": err.Error()}
	}
	return map[string]any{"available": true, "webhooks": s}
}

// ownerStream serves GET /api/clicks/stream to the owner of the API key.
// The filter is built from the key's owner inside Serve: nothing the client
// sends chooses whose clicks it gets.
func (a *api) ownerStream(c echo.Context) error {
	r := c.Request()
	key := owners.BearerKey(r.Header.Get(echo.HeaderAuthorization))
	if key == "" {
		return owners.ErrUnauthorized
	}
	// A key is a guess until it matches, as the console token is.
	try, err := a.auth.fails.begin(r, time.Now())
	if err != nil {
		return err
	}
	o, err := a.d.Owners.Authenticate(r.Context(), key)
	if err != nil && !errors.Is(err, owners.ErrUnauthorized) {
		try.succeeded() // not a guess: Redis is away
		return &publicError{msg: ownerUnavailable, err: fmt.Errorf("authenticate owner: %w: %w", errUnavailable, err)}
	}
	if err != nil {
		return err
	}
	try.succeeded()
	q := r.URL.Query()
	start, err := ownerstream.ParseStart(r.Header.Get("Last-Event-ID"), q.Get("since_seq"), q.Get("since"))
	if err != nil {
		return err
	}
	// The key was good at the start; a stream may last hours. When the key
	// is rotated or revoked the stream ends, counted as revoked (the
	// client's reconnect is then refused).
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	go a.watchKey(ctx, cancel, key, o.ID)
	err = a.d.Streams.Serve(ctx, c.Response(), o.ID, start)
	switch {
	case errors.Is(err, ownerstream.ErrUnavailable):
		return &publicError{msg: ownerUnavailable, err: err}
	case errors.Is(err, ownerstream.ErrTooManyStreams):
		// How many streams the instance serves is the operators' figure
		// (the log line and snip_console_owner_streams), not the caller's.
		return &publicError{msg: ownerBusy, err: err}
	}
	return err
}

// watchKey checks key every KeyRecheck until ctx ends, and cancels ctx with
// ownerstream.ErrKeyRevoked when the key no longer opens owner's account. A
// Redis error is not a revocation: the stream goes on and the next check
// tries again.
func (a *api) watchKey(ctx context.Context, revoked context.CancelCauseFunc, key, owner string) {
	every := a.d.KeyRecheck
	if every <= 0 {
		every = 2 * time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		o, err := a.d.Owners.Authenticate(ctx, key)
		if errors.Is(err, owners.ErrUnauthorized) || (err == nil && o.ID != owner) {
			a.d.Log.Info("owner stream: API key revoked or rotated; ending the stream", "owner", owner)
			revoked(ownerstream.ErrKeyRevoked)
			return
		}
	}
}

// unavailable is err as the operator is answered when what failed was
// NATS or JetStream, not the request: err itself when the error table
// knows it (a refusal: not found, not redrivable, a bad replay), otherwise
// a 503 "unavailable" saying what could not be read or done, and the
// client's error, as the panels say it. Without it such an error was a 500
// "internal error" whose cause only the log had.
func unavailable(what string, err error) error {
	if err == nil {
		return nil
	}
	if _, code := statusOf(err); code != "" {
		return err
	}
	return fmt.Errorf("%s: %w: %w", what, errUnavailable, err)
}

// decodeJSON reads a JSON body that is one object with no unknown fields:
// anything after it (a second object, stray text) is refused, as the
// redirect's link API does, rather than ignored.
// A body over maxBody, hit while reading (a chunked body, or one longer
// than its Content-Length said), is the body limit's 413, not a 400.
func decodeJSON(c echo.Context, v any) error {
	dec := json.NewDecoder(c.Request().Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if he := (*echo.HTTPError)(nil); errors.As(err, &he) {
			return he
		}
		return fmt.Errorf("decode body: %w: %w", err, errBadRequest)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		if he := (*echo.HTTPError)(nil); errors.As(err, &he) {
			return he
		}
		return fmt.Errorf("decode body: unexpected data after the JSON object: %w", errBadRequest)
	}
	return nil
}
