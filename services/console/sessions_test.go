package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/console/internal/consoletest"
)

// logIn logs in at the console at base through the form and returns the
// session cookie's value.
func logIn(t *testing.T, base string) string {
	t.Helper()
	resp, err := noRedirects().PostForm(base+"/login", url.Values{"token": {testToken}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for _, c := range resp.Cookies() {
		if c.Name == "snip_console_session" && c.Value != "" {
			return c.Value
		}
	}
	t.Fatalf("login: %d without a session cookie", resp.StatusCode)
	return ""
}

// withSession is a request's headers with the session cookie value v, from
// the console's own origin.
func withSession(base, v string) map[string]string {
	return map[string]string{"Cookie": "snip_console_session=" + v, "Origin": base, "Sec-Fetch-Site": "same-origin"}
}

// sessionOpens reports whether the session v opens the API of the console
// at base; otherwise the answer's status and body.
func sessionOpens(t *testing.T, base, v string) (bool, int, string) {
	t.Helper()
	code, b := do(t, nil, http.MethodGet, base+"/api/alerts", nil, withSession(base, v))
	return code == http.StatusOK, code, string(b)
}

// Logging out ends the session, not only the cookie in this browser: a copy
// of the cookie (one a thief took) is refused afterwards, by this console
// and by another instance sharing its NATS, with a 401 that says the
// session was ended, and the page sends it to the login form saying so.
// Before, a logout only asked the browser to forget the cookie, and the
// copy worked until its expiry.
func TestLogoutEndsTheSessionForACopyOfItsCookie(t *testing.T) {
	t.Parallel()
	a := start(t, withToken)
	b := startOn(t, a.js, log(t), withToken)
	stolen := logIn(t, a.url)
	for _, s := range []*system{a, b} {
		if ok, code, body := sessionOpens(t, s.url, stolen); !ok {
			t.Fatalf("a fresh session: %d %s", code, body)
		}
	}

	resp := doResp(t, http.MethodPost, a.url+"/logout", withSession(a.url, stolen))
	cleared := false
	for _, c := range resp.Cookies() {
		cleared = cleared || (c.Name == "snip_console_session" && c.MaxAge < 0)
	}
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/login?session=out" || !cleared {
		t.Fatalf("logout: %d to %q, cookie cleared %v; want 303 to /login?session=out and the cookie cleared",
			resp.StatusCode, resp.Header.Get("Location"), cleared)
	}
	for name, s := range map[string]*system{"the console logged out of": a, "another console": b} {
		ok, code, body := sessionOpens(t, s.url, stolen)
		if ok || code != http.StatusUnauthorized || !strings.Contains(body, "ended") {
			t.Errorf("the copied cookie on %s after the logout: %d %s; want 401 saying the session was ended", name, code, body)
		}
		page := doResp(t, http.MethodGet, s.url+"/", withSession(s.url, stolen))
		if loc := page.Header.Get("Location"); page.StatusCode != http.StatusSeeOther || loc != "/login?session=ended" {
			t.Errorf("the page with the copied cookie on %s: %d to %q, want 303 to /login?session=ended", name, page.StatusCode, loc)
		}
	}
	if _, body := do(t, nil, http.MethodGet, a.url+"/login?session=ended", nil, nil); !strings.Contains(string(body), "log in again") {
		t.Errorf("the login form after an ended session does not say so:\n%s", body)
	}
	// A logout from another site is refused and ends nothing.
	other := logIn(t, a.url)
	h := withSession(a.url, other)
	h["Origin"], h["Sec-Fetch-Site"] = "http://evil.example", "cross-site"
	if code, _ := do(t, nil, http.MethodPost, a.url+"/logout", nil, h); code != http.StatusForbidden {
		t.Errorf("cross-site logout: %d, want 403", code)
	}
	if ok, code, body := sessionOpens(t, a.url, other); !ok {
		t.Errorf("the session after a refused cross-site logout: %d %s", code, body)
	}
	if n := metric(t, a, `snip_console_actions_total{action="logout",result="ok"}`); n != 1 {
		t.Errorf("logouts counted: %v, want 1", n)
	}
}

// doResp sends a request without following redirects and returns the
// response, its body read and closed.
func doResp(t *testing.T, method, u string, header map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := noRedirects().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// An operator who fears a cookie was copied revokes every session with the
// token: every session issued before then is refused on every console
// instance sharing the NATS, also one the revoking console never saw, and a
// login afterwards works on all of them. A session may not revoke them
// (only the token): the revocation is the token holder's.
func TestRevokingEverySessionEndsThemOnEveryInstance(t *testing.T) {
	t.Parallel()
	a := start(t, withToken)
	b := startOn(t, a.js, log(t), withToken)
	onA, onB := logIn(t, a.url), logIn(t, b.url)
	for _, s := range []*system{a, b} {
		for _, v := range []string{onA, onB} {
			if ok, code, body := sessionOpens(t, s.url, v); !ok {
				t.Fatalf("a fresh session: %d %s", code, body)
			}
		}
	}
	if code, body := do(t, nil, http.MethodPost, a.url+"/api/sessions/revoke", nil, withSession(a.url, onA)); code != http.StatusForbidden {
		t.Errorf("revoke every session with a session: %d %s, want 403", code, body)
	}

	code, body := do(t, nil, http.MethodPost, a.url+"/api/sessions/revoke", nil, bearer)
	var revoked struct {
		NotBefore time.Time `json:"not_before"`
	}
	if err := json.Unmarshal(body, &revoked); code != http.StatusOK || err != nil || revoked.NotBefore.IsZero() {
		t.Fatalf("revoke every session: %d %s", code, body)
	}
	for name, s := range map[string]*system{"the revoking console": a, "another console": b} {
		for _, v := range []string{onA, onB} {
			if ok, code, body := sessionOpens(t, s.url, v); ok || code != http.StatusUnauthorized {
				t.Errorf("a session issued before the revocation, on %s: %d %s; want 401", name, code, body)
			}
		}
	}
	// The token still works, and a new login does, everywhere.
	getJSON(t, b, "/api/alerts", &struct{}{})
	fresh := logIn(t, b.url)
	for name, s := range map[string]*system{"the revoking console": a, "another console": b} {
		if ok, code, body := sessionOpens(t, s.url, fresh); !ok {
			t.Errorf("a login after the revocation, on %s: %d %s", name, code, body)
		}
	}
	// A second revocation with an earlier time never moves not_before back.
	code, body = do(t, nil, http.MethodPost, b.url+"/api/sessions/revoke", nil, bearer)
	if code != http.StatusOK {
		t.Errorf("revoke again: %d %s", code, body)
	}
	if n := metric(t, a, `snip_console_actions_total{action="revoke_sessions",result="ok"}`); n != 1 {
		t.Errorf("revocations counted on the revoking console: %v, want 1", n)
	}
}

// A cookie of the console before sessions had IDs (<expiry>.<HMAC>) is
// refused with a 401 that asks to log in again, and the page sends it to
// the login form saying why: not a 500, not a silent loop.
func TestASessionFromBeforeSessionsHadIDsAsksToLogInAgain(t *testing.T) {
	t.Parallel()
	s := start(t, withToken)
	exp := strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10)
	m := hmac.New(sha256.New, []byte(testToken))
	m.Write([]byte("snip-console-session:" + exp))
	old := exp + "." + hex.EncodeToString(m.Sum(nil))

	ok, code, body := sessionOpens(t, s.url, old)
	if ok || code != http.StatusUnauthorized || !strings.Contains(body, "log in again") {
		t.Errorf("the API with an old cookie: %d %s; want 401 asking to log in again", code, body)
	}
	resp := doResp(t, http.MethodGet, s.url+"/", withSession(s.url, old))
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/login?session=old" {
		t.Errorf("the page with an old cookie: %d to %q, want 303 to /login?session=old", resp.StatusCode, resp.Header.Get("Location"))
	}
	if _, b := do(t, nil, http.MethodGet, s.url+"/login?session=old", nil, nil); !strings.Contains(string(b), "earlier version") {
		t.Errorf("the login form after an old cookie does not say why:\n%s", b)
	}
	if ok, code, body := sessionOpens(t, s.url, logIn(t, s.url)); !ok {
		t.Errorf("a new login: %d %s", code, body)
	}
}

// With NATS away a session cannot be checked against the sessions ended
// early, and is refused (503 saying so; to a browser asking for the page,
// an HTML page) rather than let through: a
// revocation must not depend on NATS staying up. The Bearer token, which
// no revocation concerns, still opens what needs no NATS (the outbox, in
// Redis). A logout then says it did not log out, and keeps the cookie so
// it can be pressed again.
func TestWithNATSAwaySessionsAreRefusedAndTheTokenWorks(t *testing.T) {
	t.Parallel()
	n, js := consoletest.NATS(t)
	s := startOn(t, js, log(t), withToken)
	v := logIn(t, s.url)
	if ok, code, body := sessionOpens(t, s.url, v); !ok {
		t.Fatalf("a fresh session: %d %s", code, body)
	}
	n.Stop()
	testenv.WaitFor(t, 10*time.Second, "the console's /readyz to say NATS is down", func() bool {
		code, b := do(t, nil, http.MethodGet, s.url+"/readyz", nil, nil)
		return code == http.StatusServiceUnavailable && strings.Contains(string(b), "nats")
	})
	began := time.Now()
	code, b := do(t, nil, http.MethodGet, s.url+"/api/outbox", nil, withSession(s.url, v))
	if took := time.Since(began); code != http.StatusServiceUnavailable || !strings.Contains(string(b), "check the session: unavailable: nats") ||
		!strings.Contains(string(b), "Bearer token still works") || took > 2*time.Second {
		t.Errorf("a session with NATS away: %d %s after %s; want 503 at once saying the session cannot be checked", code, b, took)
	}
	// The page, as a browser asks for it: an HTML page saying so, not the
	// API's JSON.
	page := withSession(s.url, v)
	page["Accept"] = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, s.url+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range page {
		req.Header.Set(k, v)
	}
	pageResp, err := noRedirects().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(pageResp.Body)
	pageResp.Body.Close()
	if ct := pageResp.Header.Get("Content-Type"); pageResp.StatusCode != http.StatusServiceUnavailable || !strings.HasPrefix(ct, "text/html") ||
		!strings.Contains(string(body), "cannot check sessions right now") || !strings.Contains(string(body), "Authorization: Bearer &lt;CONSOLE_TOKEN&gt;") {
		t.Errorf("the page with a session and NATS away: %d %s\n%s\nwant a 503 HTML page saying the sessions cannot be checked and the token still works", pageResp.StatusCode, ct, body)
	}
	if code, b := do(t, nil, http.MethodGet, s.url+"/api/outbox", nil, bearer); code != http.StatusOK {
		t.Errorf("the token with NATS away: %d %s", code, b)
	}
	resp := doResp(t, http.MethodPost, s.url+"/logout", withSession(s.url, v))
	if resp.StatusCode != http.StatusServiceUnavailable || len(resp.Cookies()) != 0 {
		t.Errorf("logout with NATS away: %d, cookies %v; want 503 and the cookie kept", resp.StatusCode, resp.Cookies())
	}
}

// A page's live clicks stream, open when its session is ended (here by a
// logout with a copy of its cookie), ends within a few seconds: a thief's
// open page does not go on watching.
func TestAnEndedSessionsLiveStreamEnds(t *testing.T) {
	t.Parallel()
	s := start(t, withToken)
	v := logIn(t, s.url)
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, s.url+"/api/live", nil)
	req.Header.Set("Cookie", "snip_console_session="+v)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /api/live with a session: %d", resp.StatusCode)
	}
	ended := make(chan error, 1)
	go func() { _, err := io.Copy(io.Discard, resp.Body); ended <- err }()
	if r := doResp(t, http.MethodPost, s.url+"/logout", withSession(s.url, v)); r.StatusCode != http.StatusSeeOther {
		t.Fatalf("logout: %d", r.StatusCode)
	}
	select {
	case err := <-ended:
		if err != nil {
			t.Errorf("the stream ended with %v, want its end", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("the live stream of an ended session still runs 10 s after the logout")
	}
}

// sessionIssued is a session cookie the console at testToken issued at
// issued, as its login writes one (<id>.<unix ms>.<mac>): a login at a
// chosen time, which the login form cannot make.
func sessionIssued(issued time.Time) string {
	id, at := "0123456789abcdef0123456789abcdef", strconv.FormatInt(issued.UnixMilli(), 10)
	m := hmac.New(sha256.New, []byte(testToken))
	m.Write([]byte("snip-console-session-v2:" + id + "." + at))
	return id + "." + at + "." + hex.EncodeToString(m.Sum(nil))
}

// A page's live clicks stream, open when its session expires (12 hours
// after its login), ends within a few seconds, as one whose session was
// ended does: the stream of a page left open went on showing every owner's
// clicks for as long as its connection lasted.
func TestAnExpiredSessionsLiveStreamEnds(t *testing.T) {
	t.Parallel()
	s := start(t, withToken)
	v := sessionIssued(time.Now().Add(-topology.ConsoleSessionTTL + 3*time.Second))
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, s.url+"/api/live", nil)
	req.Header.Set("Cookie", "snip_console_session="+v)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /api/live with a session 3 s before its expiry: %d", resp.StatusCode)
	}
	ended := make(chan error, 1)
	go func() { _, err := io.Copy(io.Discard, resp.Body); ended <- err }()
	select {
	case err := <-ended:
		if err != nil {
			t.Errorf("the stream ended with %v, want its end", err)
		}
	case <-time.After(15 * time.Second):
		t.Error("the live stream of a session that expired 12 s ago still runs")
	}
	if ok, code, body := sessionOpens(t, s.url, v); ok || code != http.StatusUnauthorized {
		t.Errorf("the expired session: %d %s, want 401", code, body)
	}
}
