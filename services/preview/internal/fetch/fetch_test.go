package fetch_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/snipdev/snip/services/preview/internal/fetch"
)

// hostsResolver resolves names from a fixed table, like an /etc/hosts that
// a test controls; anything else does not exist.
type hostsResolver map[string][]netip.Addr

func (h hostsResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if ips, ok := h[host]; ok {
		return ips, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// countingServer is an httptest server on addr (e.g. "127.0.0.2:0") that
// counts requests.
type countingServer struct {
	*httptest.Server
	hits atomic.Int64
}

func startServer(t *testing.T, addr string, h http.HandlerFunc) *countingServer {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	s := &countingServer{}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.hits.Add(1)
		h(w, r)
	}))
	s.Listener.Close()
	s.Listener = ln
	s.Start()
	t.Cleanup(s.Close)
	return s
}

func htmlPage(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = io.WriteString(w, "<html><head><title>ok</title></head></html>")
}

func testConfig() fetch.Config {
	return fetch.Config{
		UserAgent:      "SnipPreview/test (+https://github.com/snipdev/snip)",
		ConnectTimeout: 2 * time.Second,
		Timeout:        5 * time.Second,
		MaxRedirects:   3,
		MaxBodyBytes:   64 << 10,
	}
}

func TestRefusedTargetsGetNoRequest(t *testing.T) {
	t.Parallel()
	local := startServer(t, "127.0.0.1:0", htmlPage)
	port := local.Listener.Addr().(*net.TCPAddr).Port
	p := func(host string) string { return "http://" + net.JoinHostPort(host, itoa(port)) + "/" }
	resolver := hostsResolver{
		"www.example-public.com": {netip.MustParseAddr("127.0.0.1")},
		"two.example-public.com": {netip.MustParseAddr("10.1.2.3"), netip.MustParseAddr("127.0.0.1")},
		"mapped.example.com":     {netip.MustParseAddr("::ffff:127.0.0.1")},
	}
	tests := []struct {
		name, url string
	}{
		{"loopback_v4", p("127.0.0.1")},
		{"loopback_v4_other", p("127.0.0.53")},
		{"private_10", "http://10.0.0.1/"},
		{"private_192_168", "http://192.168.1.1/"},
		{"cgnat", "http://100.64.0.1/"},
		{"metadata_v4", "http://169.254.169.254/latest/meta-data/"},
		{"metadata_v6", "http://[fd00:ec2::254]/"},
		{"loopback_v6", p("::1")},
		{"unspecified", p("0.0.0.0")},
		{"v4_mapped_loopback", p("::ffff:127.0.0.1")},
		{"v4_compatible_loopback", p("::127.0.0.1")},
		{"nat64_loopback", p("64:ff9b::7f00:1")},
		{"6to4_loopback", p("2002:7f00:1::1")},
		{"multicast", "http://224.0.0.1/"},
		{"public_name_resolving_to_loopback", p("www.example-public.com")},
		{"public_name_resolving_to_private_and_loopback", p("two.example-public.com")},
		{"public_name_resolving_to_mapped_loopback", p("mapped.example.com")},
	}
	f := fetch.New(func() fetch.Config { c := testConfig(); c.Resolver = resolver; return c }())
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			resp, err := f.Get(t.Context(), tc.url)
			if err == nil {
				resp.Body.Close()
			}
			if !errors.Is(err, fetch.ErrRefused) {
				t.Fatalf("Get(%s) = %v, want ErrRefused", tc.url, err)
			}
			// Refused before connecting: no connect timeout was waited for.
			if d := time.Since(start); d > time.Second {
				t.Errorf("refusal took %s; was a connection attempted?", d)
			}
		})
	}
	t.Cleanup(func() {
		if n := local.hits.Load(); n != 0 {
			t.Errorf("the local server got %d requests, want 0", n)
		}
	})
}

func TestAllowListedRangeIsFetched(t *testing.T) {
	t.Parallel()
	local := startServer(t, "127.0.0.1:0", htmlPage)
	cfg := testConfig()
	cfg.Allow = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	cfg.Resolver = hostsResolver{"site.test": {netip.MustParseAddr("127.0.0.1")}}
	f := fetch.New(cfg)
	port := itoa(local.Listener.Addr().(*net.TCPAddr).Port)
	for _, u := range []string{"http://127.0.0.1:" + port + "/", "http://site.test:" + port + "/"} {
		resp, err := f.Get(t.Context(), u)
		if err != nil {
			t.Fatalf("Get(%s): %v", u, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(b), "<title>ok</title>") {
			t.Fatalf("body = %q", b)
		}
	}
	// 127.0.0.2 is loopback too, but outside the allow-listed /32.
	if _, err := f.Get(t.Context(), "http://127.0.0.2:"+port+"/"); !errors.Is(err, fetch.ErrRefused) {
		t.Fatalf("Get(127.0.0.2) = %v, want ErrRefused", err)
	}
}

func TestGetOutcomes(t *testing.T) {
	t.Parallel()
	// A server outside the allow-list, to redirect into: it must get no hits.
	inside := startServer(t, "127.0.0.2:0", htmlPage)
	big := strings.Repeat("x", 1<<20)
	var srv *countingServer
	srv = startServer(t, "127.0.0.1:0", func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ok":
			htmlPage(w, r)
		case "/xhtml":
			w.Header().Set("Content-Type", "application/xhtml+xml")
			_, _ = io.WriteString(w, "<html/>")
		case "/no-content-type":
			w.Header()["Content-Type"] = nil
			_, _ = io.WriteString(w, "<!DOCTYPE html><html><head><title>sniffed</title></head></html>")
		case "/png":
			w.Header().Set("Content-Type", "image/png")
			_, _ = w.Write([]byte("\x89PNG\r\n\x1a\n"))
		case "/json":
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, "{}")
		case "/404":
			http.NotFound(w, r)
		case "/410":
			w.WriteHeader(http.StatusGone)
		case "/503":
			w.Header().Set("Retry-After", "7")
			w.WriteHeader(http.StatusServiceUnavailable)
		case "/503-overflow":
			// More seconds than a time.Duration holds: multiplied by a
			// second, they wrapped around to a negative delay, which the
			// worker ignored (retrying at its own backoff, 1s).
			w.Header().Set("Retry-After", "9223372037")
			w.WriteHeader(http.StatusServiceUnavailable)
		case "/503-beyond-int64":
			w.Header().Set("Retry-After", "99999999999999999999")
			w.WriteHeader(http.StatusServiceUnavailable)
		case "/429-date":
			w.Header().Set("Retry-After", time.Now().Add(90*time.Second).UTC().Format(http.TimeFormat))
			w.WriteHeader(http.StatusTooManyRequests)
		case "/loop":
			http.Redirect(w, r, "/loop", http.StatusFound)
		case "/hop":
			http.Redirect(w, r, "/ok", http.StatusMovedPermanently)
		case "/to-ftp":
			http.Redirect(w, r, "ftp://example.com/", http.StatusFound)
		case "/to-inside":
			http.Redirect(w, r, inside.URL+"/", http.StatusFound)
		case "/to-metadata":
			http.Redirect(w, r, "http://169.254.169.254/latest/meta-data/", http.StatusFound)
		case "/slow":
			select {
			case <-r.Context().Done():
			case <-time.After(10 * time.Second):
			}
		case "/huge":
			w.Header().Set("Content-Type", "text/html")
			_, _ = io.WriteString(w, "<html><head><title>huge</title></head><body>")
			for range 64 {
				if _, err := io.WriteString(w, big); err != nil {
					return
				}
			}
		default:
			http.NotFound(w, r)
		}
	})
	cfg := testConfig()
	cfg.Allow = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	cfg.Timeout = 1 * time.Second
	cfg.Resolver = hostsResolver{} // every name is unknown; no real DNS in tests
	f := fetch.New(cfg)
	closed := closedPort(t)

	tests := []struct {
		name       string
		url        string
		wantErr    error
		wantStatus int
		transient  bool
		retryAfter time.Duration // minimum
		wantFinal  string
		wantBody   int // bytes read, when no error
	}{
		{name: "html", url: srv.URL + "/ok", wantFinal: "/ok", wantBody: 43},
		{name: "xhtml", url: srv.URL + "/xhtml", wantFinal: "/xhtml", wantBody: 7},
		{name: "no_content_type_is_sniffed", url: srv.URL + "/no-content-type", wantFinal: "/no-content-type", wantBody: 63},
		{name: "redirect_is_followed", url: srv.URL + "/hop", wantFinal: "/ok", wantBody: 43},
		{name: "huge_page_is_cut_at_the_cap", url: srv.URL + "/huge", wantFinal: "/huge", wantBody: 64 << 10},
		{name: "image_is_not_html", url: srv.URL + "/png", wantErr: fetch.ErrNotHTML},
		{name: "json_is_not_html", url: srv.URL + "/json", wantErr: fetch.ErrNotHTML},
		{name: "not_found", url: srv.URL + "/404", wantStatus: 404},
		{name: "gone", url: srv.URL + "/410", wantStatus: 410},
		{name: "unavailable_with_retry_after_seconds", url: srv.URL + "/503", wantStatus: 503, transient: true, retryAfter: 7 * time.Second},
		{name: "retry_after_beyond_a_duration_is_the_longest", url: srv.URL + "/503-overflow", wantStatus: 503, transient: true, retryAfter: 100 * 365 * 24 * time.Hour},
		{name: "retry_after_beyond_int64_is_the_longest", url: srv.URL + "/503-beyond-int64", wantStatus: 503, transient: true, retryAfter: 100 * 365 * 24 * time.Hour},
		{name: "rate_limited_with_retry_after_date", url: srv.URL + "/429-date", wantStatus: 429, transient: true, retryAfter: 80 * time.Second},
		{name: "redirect_loop", url: srv.URL + "/loop", wantErr: fetch.ErrTooManyRedirects},
		{name: "redirect_to_ftp", url: srv.URL + "/to-ftp", wantErr: fetch.ErrBadURL},
		{name: "redirect_to_refused_loopback", url: srv.URL + "/to-inside", wantErr: fetch.ErrRefused},
		{name: "redirect_to_metadata", url: srv.URL + "/to-metadata", wantErr: fetch.ErrRefused},
		{name: "slow_page_times_out", url: srv.URL + "/slow", wantErr: fetch.ErrTimeout},
		{name: "closed_port_is_transport_failure", url: "http://" + closed + "/", wantErr: fetch.ErrTransport},
		{name: "no_such_host", url: "http://nonexistent.invalid/", wantErr: fetch.ErrNoSuchHost},
		{name: "ftp_scheme", url: "ftp://example.com/", wantErr: fetch.ErrBadURL},
		{name: "javascript_scheme", url: "javascript:alert(1)", wantErr: fetch.ErrBadURL},
		{name: "credentials", url: "http://user:pass@example.com/", wantErr: fetch.ErrBadURL},
		{name: "no_host", url: "http:///path", wantErr: fetch.ErrBadURL},
		{name: "unparsable", url: "http://[::1", wantErr: fetch.ErrBadURL},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			resp, err := f.Get(t.Context(), tc.url)
			var se *fetch.StatusError
			switch {
			case tc.wantStatus != 0:
				if !errors.As(err, &se) || se.Code != tc.wantStatus || se.Transient() != tc.transient || se.RetryAfter < tc.retryAfter {
					t.Fatalf("Get = %v, want status %d (transient %v, retry after >= %s)", err, tc.wantStatus, tc.transient, tc.retryAfter)
				}
				return
			case tc.wantErr != nil:
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("Get = %v, want %v", err, tc.wantErr)
				}
				return
			case err != nil:
				t.Fatalf("Get: %v", err)
			}
			defer resp.Body.Close()
			if resp.URL.Path != tc.wantFinal {
				t.Errorf("final URL %s, want path %s", resp.URL, tc.wantFinal)
			}
			n, err := io.Copy(io.Discard, resp.Body)
			if err != nil || n != int64(tc.wantBody) {
				t.Errorf("read %d bytes, %v; want %d", n, err, tc.wantBody)
			}
		})
	}
	t.Cleanup(func() {
		if n := inside.hits.Load(); n != 0 {
			t.Errorf("the refused server got %d requests, want 0", n)
		}
	})
}

func TestUserAgentIsSent(t *testing.T) {
	t.Parallel()
	var got atomic.Value
	srv := startServer(t, "127.0.0.1:0", func(w http.ResponseWriter, r *http.Request) {
		got.Store(r.UserAgent())
		htmlPage(w, r)
	})
	cfg := testConfig()
	cfg.Allow = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	resp, err := fetch.New(cfg).Get(t.Context(), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got.Load() != cfg.UserAgent {
		t.Fatalf("User-Agent %q, want %q", got.Load(), cfg.UserAgent)
	}
}

// TestProxyFromTheEnvironmentIsNotUsed: the package ignores HTTP_PROXY and
// the like (a proxy would make the address checked the proxy's, not the
// page's). Not parallel: it sets the environment.
func TestProxyFromTheEnvironmentIsNotUsed(t *testing.T) {
	proxy := startServer(t, "127.0.0.1:0", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusBadGateway) })
	for _, k := range []string{"HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy"} {
		t.Setenv(k, proxy.URL)
	}
	for _, k := range []string{"NO_PROXY", "no_proxy"} {
		t.Setenv(k, "")
	}
	site := startServer(t, "127.0.0.1:0", htmlPage)
	cfg := testConfig()
	cfg.Allow = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")} // the proxy's address too
	// A name, not 127.0.0.1: the environment's proxy is never used for localhost.
	cfg.Resolver = hostsResolver{"site.test": {netip.MustParseAddr("127.0.0.1")}}
	resp, err := fetch.New(cfg).Get(t.Context(), "http://site.test:"+itoa(site.Listener.Addr().(*net.TCPAddr).Port)+"/")
	if err != nil {
		t.Fatalf("Get with HTTP_PROXY set: %v", err)
	}
	resp.Body.Close()
	if p, s := proxy.hits.Load(), site.hits.Load(); p != 0 || s != 1 {
		t.Fatalf("the proxy got %d requests and the site %d; want 0 and 1", p, s)
	}
}

func TestCancelledContextIsNotATimeout(t *testing.T) {
	t.Parallel()
	srv := startServer(t, "127.0.0.1:0", func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	cfg := testConfig()
	cfg.Allow = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(100*time.Millisecond, cancel)
	_, err := fetch.New(cfg).Get(ctx, srv.URL)
	if !errors.Is(err, context.Canceled) || errors.Is(err, fetch.ErrTimeout) {
		t.Fatalf("Get = %v, want context.Canceled and not ErrTimeout", err)
	}
}

func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func itoa(n int) string { return strconv.Itoa(n) }
