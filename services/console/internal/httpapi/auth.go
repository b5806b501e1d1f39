package httpapi

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
)

// The console is an operator tool with one shared secret, CONSOLE_TOKEN.
// With it set, every page and API call (the owners' stream aside, which
// owners' API keys open) needs it: as "Authorization: Bearer <token>" from a
// script, or from a browser as a session cookie the login form sets. The
// cookie holds an expiry and an HMAC of it keyed by the token, not the token:
// no server state, and changing the token ends every session.
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
	sessionTTL = 12 * time.Hour
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
	cfg   AuthConfig
	cop   *http.CrossOriginProtection
	fails *failures // failed logins and Bearer tokens, per client
}

func newAuth(cfg AuthConfig) *auth {
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
	return &auth{cfg: cfg, cop: http.NewCrossOriginProtection(), fails: f}
}

// who authenticates the request and says how; ok is false when it is not.
func (a *auth) who(r *http.Request) (who string, ok bool) {
	if a.cfg.Token == "" {
		return "anyone (no CONSOLE_TOKEN)", true
	}
	if t, ok := bearerToken(r); ok && a.tokenMatches(t) {
		return "bearer token", true
	}
	// Behind a proxy that asks for its own credentials (Basic, or an SSO
	// proxy passing its token on) every request of the operator's browser
	// carries an Authorization header that is not the console's: the
	// session cookie still counts.
	if c, err := r.Cookie(cookieName); err == nil && a.validSession(c.Value, time.Now()) {
		return "session", true
	}
	return "", false
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

// tokenMatches compares in constant time.
func (a *auth) tokenMatches(t string) bool {
	return a.cfg.Token != "" && subtle.ConstantTimeCompare([]byte(t), []byte(a.cfg.Token)) == 1
}

func (a *auth) mac(exp string) string {
	m := hmac.New(sha256.New, []byte(a.cfg.Token))
	m.Write([]byte("snip-console-session:" + exp))
	return hex.EncodeToString(m.Sum(nil))
}

func (a *auth) session(now time.Time) string {
	exp := strconv.FormatInt(now.Add(sessionTTL).Unix(), 10)
	return exp + "." + a.mac(exp)
}

func (a *auth) validSession(v string, now time.Time) bool {
	exp, mac, ok := strings.Cut(v, ".")
	if !ok {
		return false
	}
	if !hmac.Equal([]byte(mac), []byte(a.mac(exp))) {
		return false
	}
	t, err := strconv.ParseInt(exp, 10, 64)
	return err == nil && now.Unix() < t
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
		who, ok := a.who(r)
		if !ok {
			if strings.HasPrefix(r.URL.Path, "/api/") {
				return errNoToken
			}
			return c.Redirect(http.StatusSeeOther, "/login")
		}
		if bearer {
			try.succeeded()
		}
		c.Set(whoKey, who)
		return next(c)
	}
}

const whoKey = "who"
