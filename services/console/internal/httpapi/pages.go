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
		Who: who, LoggedIn: a.d.Auth.Token != "",
		RefreshMS: a.d.Page.Refresh.Milliseconds(), WarnSeconds: a.d.Page.Warn.Seconds(), AlarmSeconds: a.d.Page.Alarm.Seconds(),
		Initial: a.initial(c.Request().Context()),
	})
}

func (a *api) loginPage(c echo.Context) error {
	if a.d.Auth.Token == "" {
		return c.Redirect(http.StatusSeeOther, "/")
	}
	return a.render(c, http.StatusOK, "login.html", pageData{})
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
	c.SetCookie(a.auth.cookie(r, a.auth.session(time.Now()), int(sessionTTL.Seconds())))
	return c.Redirect(http.StatusSeeOther, "/")
}

func (a *api) logout(c echo.Context) error {
	c.SetCookie(a.auth.cookie(c.Request(), "", -1))
	if a.d.Auth.Token == "" {
		return c.Redirect(http.StatusSeeOther, "/")
	}
	return c.Redirect(http.StatusSeeOther, "/login")
}
