package main

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/owners"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/console/internal/consoletest"
)

// from is an HTTP client whose connections come from the loopback address
// ip (127.0.0.0/8 is all loopback on Linux): one client as the console tells
// clients apart.
func from(t *testing.T, ip string) *http.Client {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return d.DialContext(ctx, network, addr)
	}}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func login(t *testing.T, c *http.Client, s *system, token string) *http.Response {
	t.Helper()
	resp, err := c.PostForm(s.url+"/login", url.Values{"token": {token}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// Failed logins and Bearer guesses are limited per client: a guesser is
// refused (429 with Retry-After) once it has failed its burst, before its
// guesses are even checked, while every other client's correct logins and
// tokens go through, however many, at the same time.
func TestGuessingIsLimitedPerClientAndCorrectLoginsPass(t *testing.T) {
	t.Parallel()
	const burst = 3
	s := start(t, func(c *Config) {
		withToken(c)
		c.AuthFailureBurst, c.AuthFailureInterval = burst, time.Hour // no refill during the test
	})
	guesser, operator := from(t, "127.0.0.2"), from(t, "127.0.0.1")

	for i := range burst {
		if resp := login(t, guesser, s, "wrong-token-0123456789"); resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("wrong login %d: %d, want 401", i+1, resp.StatusCode)
		}
	}
	for _, token := range []string{"wrong-token-0123456789", testToken} {
		resp := login(t, guesser, s, token)
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
			t.Errorf("guesser's login after %d failures: %d (Retry-After %q), want 429 with Retry-After", burst, resp.StatusCode, resp.Header.Get("Retry-After"))
		}
	}
	// The same client's Bearer guesses share its allowance.
	if code, _ := do(t, guesser, http.MethodGet, s.url+"/api/readers", nil, map[string]string{"Authorization": "Bearer wrong-token-0123456789"}); code != http.StatusTooManyRequests {
		t.Errorf("guesser's Bearer token after its failed logins: %d, want 429", code)
	}

	// Meanwhile the operator logs in, again and again.
	for i := range 2 * burst {
		if resp := login(t, operator, s, testToken); resp.StatusCode != http.StatusSeeOther {
			t.Fatalf("operator's correct login %d while another client is locked out: %d, want 303", i+1, resp.StatusCode)
		}
		if code, _ := do(t, operator, http.MethodGet, s.url+"/api/readers", nil, bearer); code != http.StatusOK {
			t.Fatalf("operator's Bearer token %d: %d, want 200", i+1, code)
		}
	}

	// Bearer guesses from a client of their own are limited the same way.
	scripter := from(t, "127.0.0.3")
	wrong := map[string]string{"Authorization": "Bearer wrong-token-0123456789"}
	for i := range burst {
		if code, _ := do(t, scripter, http.MethodGet, s.url+"/api/readers", nil, wrong); code != http.StatusUnauthorized {
			t.Fatalf("wrong Bearer token %d: %d, want 401", i+1, code)
		}
	}
	if code, b := do(t, scripter, http.MethodGet, s.url+"/api/readers", nil, wrong); code != http.StatusTooManyRequests || !strings.Contains(string(b), "too_many_attempts") {
		t.Errorf("Bearer guess after %d failures: %d %s, want 429 too_many_attempts", burst, code, b)
	}

	// And owners' API keys on the click stream.
	if err := owners.NewStore(s.rdb).Ensure(t.Context(), "acme", "snip_acme_test_key_0123456789"); err != nil {
		t.Fatal(err)
	}
	keyGuesser := from(t, "127.0.0.4")
	badKey := map[string]string{"Authorization": "Bearer snip_guess_key_0123456789"}
	for i := range burst {
		if code, _ := do(t, keyGuesser, http.MethodGet, s.url+"/api/clicks/stream", nil, badKey); code != http.StatusUnauthorized {
			t.Fatalf("wrong API key %d: %d, want 401", i+1, code)
		}
	}
	if code, _ := do(t, keyGuesser, http.MethodGet, s.url+"/api/clicks/stream", nil, badKey); code != http.StatusTooManyRequests {
		t.Errorf("API key guess after %d failures: %d, want 429", burst, code)
	}
}

// A stream opened with a key that is then revoked (or rotated) ends within
// the recheck interval, counted as revoked (not as the client leaving), and
// reconnecting with that key is refused.
func TestRevokedKeyEndsAnOpenOwnerStream(t *testing.T) {
	t.Parallel()
	s := start(t, func(c *Config) { withToken(c); c.OwnerKeyRecheck = 200 * time.Millisecond })
	store := owners.NewStore(s.rdb)
	const key = "snip_acme_test_key_0123456789"
	if err := store.Ensure(t.Context(), "acme", key); err != nil {
		t.Fatal(err)
	}
	resp, r := ownerClient(t, s, key, "?since_seq=0", "")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: %d", resp.StatusCode)
	}
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := r.Next(); err != nil {
				ended <- err
				return
			}
		}
	}()
	if _, err := store.Revoke(t.Context(), "acme"); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	select {
	case <-ended:
		// The key is checked every 200 ms from the stream's start, a few
		// milliseconds before the revocation; checked every 2 s (the
		// default, as if the setting were not passed on), the stream would
		// end about 2 s after it. The bound leaves a loaded machine 1.6 s
		// to schedule the check.
		took := time.Since(revoked)
		t.Logf("stream ended %s after the revocation", took.Round(time.Millisecond))
		if took > 1800*time.Millisecond {
			t.Errorf("the stream ended %s after its key was revoked, want about the recheck interval (200 ms)", took.Round(time.Millisecond))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stream went on 10 s after its key was revoked")
	}
	const endedTotal = "snip_console_owner_streams_ended_total"
	testenv.WaitFor(t, 10*time.Second, "the stream counted as ended", func() bool {
		return metric(t, s, endedTotal+`{reason="revoked"}`)+metric(t, s, endedTotal+`{reason="client"}`) > 0
	})
	if r, c := metric(t, s, endedTotal+`{reason="revoked"}`), metric(t, s, endedTotal+`{reason="client"}`); r != 1 || c != 0 {
		t.Errorf(`the stream ended by its key's revocation counted as reason="revoked" %v times and reason="client" %v times, want 1 and 0`, r, c)
	}
	if again, _ := ownerClient(t, s, key, "", ""); again.StatusCode != http.StatusUnauthorized {
		t.Errorf("reconnect with the revoked key: %d, want 401", again.StatusCode)
	}
}

// TestASessionPassesBesideAProxysAuthorization: behind a proxy that asks
// for its own credentials (nginx's auth_basic, an SSO proxy passing its
// token on) every request of the operator's browser carries an
// Authorization header that is not the console's Bearer token. The
// session cookie still opens the page and the API, however many requests,
// and such a header is no guess of the token; without a session it opens
// nothing.
func TestASessionPassesBesideAProxysAuthorization(t *testing.T) {
	t.Parallel()
	const burst = 3
	s := start(t, func(c *Config) {
		withToken(c)
		c.AuthFailureBurst, c.AuthFailureInterval = burst, time.Hour // no refill during the test
	})
	browser := from(t, "127.0.0.5")
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	browser.Jar = jar
	if resp := login(t, browser, s, testToken); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("login: %d, want 303", resp.StatusCode)
	}
	for _, proxy := range []string{"Basic b3BlcmF0b3I6cHJveHktcGFzc3dvcmQ=", "Bearer an-sso-proxys-own-token-0123456789"} {
		for i := range 2 * burst {
			for _, path := range []string{"/", "/api/readers"} {
				if code, b := do(t, browser, http.MethodGet, s.url+path, nil, map[string]string{"Authorization": proxy}); code != http.StatusOK {
					t.Fatalf("GET %s %d with the session and Authorization: %s: %d %.200s, want 200", path, i+1, proxy, code, b)
				}
			}
		}
	}

	// Without the session the proxy's header opens nothing.
	stranger := from(t, "127.0.0.6")
	basic := map[string]string{"Authorization": "Basic b3BlcmF0b3I6cHJveHktcGFzc3dvcmQ="}
	if code, _ := do(t, stranger, http.MethodGet, s.url+"/api/readers", nil, basic); code != http.StatusUnauthorized {
		t.Errorf("GET /api/readers with Basic credentials and no session: %d, want 401", code)
	}
	if code, _ := do(t, stranger, http.MethodGet, s.url+"/", nil, basic); code != http.StatusSeeOther {
		t.Errorf("GET / with Basic credentials and no session: %d, want 303 to /login", code)
	}
}

// Behind a trusted proxy an action's log line names the client the proxy
// forwarded, not only the proxy: every operator behind it has the proxy's
// address, and "from where" is what the log is for.
func TestActionsAreLoggedWithTheForwardedClient(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	_, js := consoletest.NATS(t)
	s := startOn(t, js, slog.New(slog.NewJSONHandler(&logs, nil)), func(c *Config) {
		withToken(c)
		c.TrustedProxies = []string{"127.0.0.1"}
	})
	h := map[string]string{"Authorization": "Bearer " + testToken, "X-Forwarded-For": "198.51.100.7"}
	do(t, from(t, "127.0.0.1"), http.MethodPost, s.url+"/api/readers/some-group/replay", map[string]any{"from_seq": 1, "confirm": "some-group"}, h)
	var line string
	testenv.WaitFor(t, 10*time.Second, "the replay logged", func() bool {
		for l := range strings.SplitSeq(logs.String(), "\n") {
			if strings.Contains(l, `"msg":"console action"`) && strings.Contains(l, `"action":"replay"`) {
				line = l
				return true
			}
		}
		return false
	})
	if !strings.Contains(line, `"client":"198.51.100.7"`) {
		t.Errorf("the action's log line does not name the forwarded client 198.51.100.7: %s", line)
	}
}
