package httpapi

import (
	"embed"
	"html/template"
	"io/fs"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
)

// The page is plain HTML, a little vanilla JavaScript and CSS, embedded in
// the binary: the console works with no internet access and loads nothing
// from anywhere else (the Content-Security-Policy says so too). Everything
// the page shows from the system is put in the DOM as text (textContent),
// never as HTML, and the server-rendered parts go through html/template.
//
//go:embed web/*.html web/static/*
var webFS embed.FS

var pages = template.Must(template.ParseFS(webFS, "web/*.html"))

func staticHandler() echo.HandlerFunc {
	sub, _ := fs.Sub(webFS, "web/static")
	files := http.StripPrefix("/static/", http.FileServer(http.FS(sub)))
	return func(c echo.Context) error {
		files.ServeHTTP(c.Response(), c.Request())
		return nil
	}
}

type pageData struct {
	Who          string
	LoggedIn     bool
	RefreshMS    int64
	WarnSeconds  float64
	AlarmSeconds float64
	Error        string
	// Notice is what the login form says first (a session ended, logged out).
	Notice string
	// Initial is the panels' first figures as JSON (initial.go; decision 0091).
	Initial string
}

func (a *api) render(c echo.Context, status int, name string, d pageData) error {
	var b strings.Builder
	if err := pages.ExecuteTemplate(&b, name, d); err != nil {
		return err
	}
	return c.HTML(status, b.String())
}

func (a *api) page(c echo.Context) error {
	who, _ := c.Get(whoKey).(string)
	return a.render(c, http.StatusOK, "index.html", pageData{
		Who: who, LoggedIn: who == whoSession,
		RefreshMS: a.d.Page.Refresh.Milliseconds(), WarnSeconds: a.d.Page.Warn.Seconds(), AlarmSeconds: a.d.Page.Alarm.Seconds(),
		Initial: a.initial(c.Request().Context()),
	})
}

func (a *api) loginPage(c echo.Context) error {
	if a.d.Auth.Token == "" {
		return c.Redirect(http.StatusSeeOther, "/")
	}
	return a.render(c, http.StatusOK, "login.html", pageData{Notice: loginNotices[c.QueryParam("session")]})
}

// loginNotices are what the login form says after a redirect (?session=).
var loginNotices = map[string]string{
	"out":   "Logged out: this session is ended on every console instance.",
	"ended": "Your session was ended (logged out, or every session was revoked): log in again.",
	"old":   "Your session is from an earlier version of the console, whose sessions could not be ended: log in again.",
}

// login checks the token from the form and sets the session cookie. Failed
// attempts are limited per client (failures): the token is long, guessing it
// should also be slow, and one client's failures never hold up another's
// correct login.
func (a *api) login(c echo.Context) error {
	if a.d.Auth.Token == "" {
		return c.Redirect(http.StatusSeeOther, "/")
	}
	r := c.Request()
	if err := a.auth.cop.Check(r); err != nil {
		return errCrossOrigin
	}
	try, err := a.auth.fails.begin(r, time.Now())
	if err != nil {
		a.actions.WithLabelValues("login", "limited").Inc()
		setRetryAfter(c.Response().Header(), err)
		return a.render(c, http.StatusTooManyRequests, "login.html", pageData{Error: "Too many failed logins from this address; wait a few seconds."})
	}
	token := c.FormValue("token")
	if !a.auth.tokenMatches(token) {
		a.actions.WithLabelValues("login", "refused").Inc()
		a.d.Log.Warn("console login refused", "remote", r.RemoteAddr, "client", a.client(r), "user_agent", r.UserAgent())
		return a.render(c, http.StatusUnauthorized, "login.html", pageData{Error: "That is not the console's token."})
	}
	try.succeeded()
	a.actions.WithLabelValues("login", "ok").Inc()
	a.d.Log.Info("console login", "remote", r.RemoteAddr, "client", a.client(r), "user_agent", r.UserAgent())
	c.SetCookie(a.auth.cookie(r, a.auth.newSession(time.Now()), int(sessionTTL.Seconds())))
	return c.Redirect(http.StatusSeeOther, "/")
}

// logout ends the session the request's cookie names, on every console
// instance (its ID is recorded as revoked: a copy of the cookie is refused
// from then on), and clears the cookie. A request without a session (none,
// expired, forged, ended already) only clears the cookie. When the session
// cannot be recorded as ended (NATS away), the answer says so and the
// cookie stays, so the logout can be pressed again.
func (a *api) logout(c echo.Context) error {
	r := c.Request()
	if !a.auth.hostAllowed(r) {
		return errForbiddenHost
	}
	if err := a.auth.cop.Check(r); err != nil {
		return errCrossOrigin
	}
	if a.d.Auth.Token == "" {
		return c.Redirect(http.StatusSeeOther, "/")
	}
	var s session
	if ck, err := r.Cookie(cookieName); err == nil {
		s, _ = a.auth.parseSession(ck.Value, time.Now())
	}
	if s.id != "" {
		c.Set(whoKey, whoSession)
		err := a.natsAway(r.Context())
		if err == nil {
			err = a.d.Sessions.Revoke(r.Context(), s.id)
		}
		err = unavailable("end the session", err)
		a.audit(c, "logout", err, "session", s.id)
		if err != nil {
			return a.render(c, http.StatusServiceUnavailable, "login.html", pageData{
				Error: "Not logged out: the session could not be ended (" + err.Error() + "). Press Log out again once NATS is back.",
			})
		}
	}
	c.SetCookie(a.auth.cookie(r, "", -1))
	return c.Redirect(http.StatusSeeOther, "/login?session=out")
}

// revokeSessions ends every session issued before now, on every console
// instance: an operator who fears a cookie was copied, with the token.
func (a *api) revokeSessions(c echo.Context) error {
	if a.d.Auth.Token == "" {
		return errNoSessions
	}
	if c.Get(whoKey) != whoBearer {
		return errTokenRequired
	}
	ctx := c.Request().Context()
	var nb time.Time
	err := a.natsAway(ctx)
	if err == nil {
		nb, err = a.d.Sessions.RevokeAll(ctx, time.Now())
	}
	err = unavailable("revoke every session", err)
	a.audit(c, "revoke_sessions", err, "not_before", nb)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"not_before": nb.UTC()})
}
