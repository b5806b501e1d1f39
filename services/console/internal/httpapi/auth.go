package httpapi

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/snipdev/snip/pkg/consolesessions"
	"github.com/snipdev/snip/pkg/topology"
)

// The console is an operator tool with one shared secret, CONSOLE_TOKEN.
// With it set, every page and API call (the owners' stream aside, which
// owners' API keys open) needs it: as "Authorization: Bearer <token>" from a
// script, or from a browser as a session cookie the login form sets. The
// cookie holds a random session ID, when it was issued and an HMAC of both
// keyed by the token, not the token. A session ends at its expiry, at a
// logout (its ID is recorded as revoked), or when an operator revokes every
// session (those issued before then are refused): both are recorded in a
// NATS bucket every console instance reads at each request, so a copied
// cookie is refused everywhere from then on. When the bucket cannot be read
// (NATS away) sessions are refused, the Bearer token still works.
// Changing the token still ends every session too.
//
// Without a token the console only serves loopback (config refuses another
// listen address unless CONSOLE_INSECURE) and only answers requests whose
// Host is a loopback name or address: a web page the operator visits cannot
// reach it by pointing a DNS name at 127.0.0.1 (DNS rebinding).
//
// Mutating calls are POSTs, refused when a browser says they come from
// another origin (net/http's CrossOriginProtection reads Sec-Fetch-Site and
// Origin), so a page elsewhere cannot replay or redrive through the
// operator's cookie. Scripts with the Bearer token send neither header and
// pass.

const (
	cookieName = "snip_console_session"
	sessionTTL = topology.ConsoleSessionTTL
)

// AuthConfig is how operators prove who they are.
type AuthConfig struct {
	// Token is the shared secret; empty: loopback only, no login.
	Token string
	// Insecure serves without a token on any address (a choice the
	// operator made: CONSOLE_INSECURE).
	Insecure bool
	// SecureCookie marks the session cookie Secure (behind TLS).
	SecureCookie bool
	// FailureBurst failed logins or Bearer tokens a client may send at once,
	// then one per FailureInterval (defaults 5 and 2s). MaxClients bounds the
	// clients remembered (default 10000).
	FailureBurst    int
	FailureInterval time.Duration
	MaxClients      int
	// TrustedProxies are the reverse proxies whose X-Forwarded-For names the
	// client for these limits; none: the connection's peer is the client.
	TrustedProxies []netip.Prefix
}

type auth struct {
	cfg AuthConfig
	// tokenSum is the SHA-256 of cfg.Token, what tokenMatches compares.
	tokenSum [sha256.Size]byte
	cop      *http.CrossOriginProtection
	fails    *failures // failed logins and Bearer tokens, per client
	// sessions records the sessions ended early; natsDown says why NATS,
	// where it keeps them, is away (nil: not checked).
	sessions Sessions
	natsDown func(context.Context) error
	// log gets why a page's session could not be checked (its 503 page
	// does not say).
	log *slog.Logger
}

func newAuth(cfg AuthConfig, sessions Sessions, natsDown func(context.Context) error) *auth {
	if cfg.FailureBurst <= 0 {
		cfg.FailureBurst = 5
	}
	if cfg.FailureInterval <= 0 {
		cfg.FailureInterval = 2 * time.Second
	}
	if cfg.MaxClients <= 0 {
		cfg.MaxClients = 10000
	}
	f := newFailures(cfg.FailureInterval, cfg.FailureBurst, cfg.MaxClients)
	f.trusted = cfg.TrustedProxies
	return &auth{cfg: cfg, tokenSum: sha256.Sum256([]byte(cfg.Token)), cop: http.NewCrossOriginProtection(), fails: f,
		sessions: sessions, natsDown: natsDown}
}

// Ways a request authenticates (who).
const (
	whoBearer  = "bearer token"
	whoSession = "session"
)

// who authenticates the request and says how; err says why it is not:
// errNoToken, errSessionEnded, errOldSession, or errUnavailable when a
// session cannot be checked.
func (a *auth) who(r *http.Request) (who string, err error) {
	if a.cfg.Token == "" {
		return "anyone (no CONSOLE_TOKEN)", nil
	}
	if t, ok := bearerToken(r); ok && a.tokenMatches(t) {
		return whoBearer, nil
	}
	// Behind a proxy that asks for its own credentials (Basic, or an SSO
	// proxy passing its token on) every request of the operator's browser
	// carries an Authorization header that is not the console's: the
	// session cookie still counts.
	c, err := r.Cookie(cookieName)
	if err != nil {
		return "", errNoToken
	}
	s, err := a.parseSession(c.Value, time.Now())
	if err != nil {
		return "", err
	}
	if err := a.checkSession(r.Context(), s); err != nil {
		return "", err
	}
	return whoSession, nil
}

// checkSession asks the bucket whether s was ended: nil, errSessionEnded,
// or errUnavailable with why (NATS away: refused, not let through).
func (a *auth) checkSession(ctx context.Context, s session) error {
	if a.natsDown != nil {
		if err := a.natsDown(ctx); err != nil {
			return fmt.Errorf("check the session: %w: %w (the Bearer token still works)", errUnavailable, err)
		}
	}
	err := a.sessions.Check(ctx, s.id, s.issued)
	switch {
	case errors.Is(err, consolesessions.ErrEnded):
		return errSessionEnded
	case err != nil:
		return fmt.Errorf("check the session: %w: %w (the Bearer token still works)", errUnavailable, err)
	}
	return nil
}

// bearerToken is the credential of an "Authorization: Bearer" header; ok is
// false without one (no header, or another scheme: a proxy's Basic
// credentials, which are no guess of the console's token).
func bearerToken(r *http.Request) (token string, ok bool) {
	const p = "Bearer "
	h := r.Header.Get(echo.HeaderAuthorization)
	if len(h) < len(p) || !strings.EqualFold(h[:len(p)], p) {
		return "", false
	}
	return strings.TrimSpace(h[len(p):]), true
}

// tokenMatches compares in constant time, whatever the guess's length: it
// compares SHA-256 sums, which all have 32 bytes. subtle.ConstantTimeCompare
// on the token itself returns at once for a guess of another length, so
// how long a wrong guess took told the guesser the token's length.
func (a *auth) tokenMatches(t string) bool {
	if a.cfg.Token == "" {
		return false
	}
	sum := sha256.Sum256([]byte(t))
	return subtle.ConstantTimeCompare(sum[:], a.tokenSum[:]) == 1
}

// session is what a session cookie says: its ID and when it was issued.
type session struct {
	id     string
	issued time.Time
}

// mac signs a session's ID and issue time with the token.
func (a *auth) mac(id, issued string) string {
	m := hmac.New(sha256.New, []byte(a.cfg.Token))
	m.Write([]byte("snip-console-session-v2:" + id + "." + issued))
	return hex.EncodeToString(m.Sum(nil))
}

// newSession is a session cookie's value: a random ID (128 bits, hex), the
// time it was issued (unix milliseconds) and their MAC.
func (a *auth) newSession(now time.Time) string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	id, issued := hex.EncodeToString(b), strconv.FormatInt(now.UnixMilli(), 10)
	return id + "." + issued + "." + a.mac(id, issued)
}

// parseSession reads a session cookie: errOldSession for one issued before
// sessions had IDs (<expiry>.<mac>), errNoToken for one that is forged,
// malformed or expired.
func (a *auth) parseSession(v string, now time.Time) (session, error) {
	parts := strings.Split(v, ".")
	if len(parts) == 2 {
		return session{}, errOldSession
	}
	if len(parts) != 3 || len(parts[0]) != 32 {
		return session{}, errNoToken
	}
	id, issued, mac := parts[0], parts[1], parts[2]
	if !hmac.Equal([]byte(mac), []byte(a.mac(id, issued))) {
		return session{}, errNoToken
	}
	ms, err := strconv.ParseInt(issued, 10, 64)
	if err != nil {
		return session{}, errNoToken
	}
	t := time.UnixMilli(ms)
	if !now.Before(t.Add(sessionTTL)) {
		return session{}, errNoToken
	}
	return session{id: id, issued: t}, nil
}

func (a *auth) cookie(r *http.Request, value string, maxAge int) *http.Cookie {
	return &http.Cookie{
		Name: cookieName, Value: value, Path: "/", MaxAge: maxAge,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: a.cfg.SecureCookie || r.TLS != nil,
	}
}

// hostAllowed is the DNS-rebinding guard of a console without a token.
func (a *auth) hostAllowed(r *http.Request) bool {
	if a.cfg.Token != "" || a.cfg.Insecure {
		return true
	}
	return IsLoopbackHost(r.Host)
}

// IsLoopbackHost reports whether host (with or without a port) is
// "localhost" or a loopback address.
func IsLoopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// operator guards the console's pages and API.
func (a *auth) operator(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		if !a.hostAllowed(r) {
			return errForbiddenHost
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			if err := a.cop.Check(r); err != nil {
				return errCrossOrigin
			}
		}
		// A Bearer token is a guess until it matches (it or a session):
		// limited per client.
		var try attempt
		_, bearer := bearerToken(r)
		bearer = bearer && a.cfg.Token != ""
		if bearer {
			var err error
			if try, err = a.fails.begin(r, time.Now()); err != nil {
				return err
			}
		}
		who, err := a.who(r)
		if err != nil {
			return a.refuse(c, err)
		}
		if bearer {
			try.succeeded()
		}
		c.Set(whoKey, who)
		return next(c)
	}
}

const whoKey = "who"

// refuse answers a request that did not authenticate: the API with the
// error (401, or 503 when its session cannot be checked), a page with the
// login form, saying why when the session was ended or is from an earlier
// version, or, when its session cannot be checked, a browser with a 503
// page saying so and that the token still works. A session that ends is
// cleared from the browser.
func (a *auth) refuse(c echo.Context, err error) error {
	if errors.Is(err, errSessionEnded) || errors.Is(err, errOldSession) {
		c.SetCookie(a.cookie(c.Request(), "", -1))
	}
	if strings.HasPrefix(c.Request().URL.Path, "/api/") {
		return err
	}
	switch {
	case errors.Is(err, errSessionEnded):
		return c.Redirect(http.StatusSeeOther, "/login?session=ended")
	case errors.Is(err, errOldSession):
		return c.Redirect(http.StatusSeeOther, "/login?session=old")
	case errors.Is(err, errUnavailable):
		if !acceptsHTML(c.Request()) {
			return err
		}
		// A browser gets a page saying so, not the API's JSON; the cause
		// (NATS's address and error) goes to the log.
		if a.log != nil {
			a.log.Warn("console page refused: its session cannot be checked", "path", c.Request().URL.Path, "err", err)
		}
		var b strings.Builder
		if perr := pages.ExecuteTemplate(&b, "unavailable.html", pageData{}); perr != nil {
			return errors.Join(err, perr)
		}
		return c.HTML(http.StatusServiceUnavailable, b.String())
	}
	return c.Redirect(http.StatusSeeOther, "/login")
}

// acceptsHTML reports whether the request asks for a page (a browser's
// navigation: Accept names text/html).
func acceptsHTML(r *http.Request) bool {
	for _, v := range r.Header.Values(echo.HeaderAccept) {
		if strings.Contains(v, echo.MIMETextHTML) {
			return true
		}
	}
	return false
}
