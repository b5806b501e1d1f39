// Package fetch gets web pages for previews without becoming a way into the
// network it runs in (server-side request forgery).
//
// Every connection, to the first URL and to every redirect hop, goes through
// a netguard.Dialer, which checks the address actually being connected to
// against a netguard.Policy, after DNS resolution and before the connect(2)
// call. Because the check is on the socket's address rather than
// on a name, DNS rebinding (a name that resolves to a public address when
// checked and a private one when used) cannot get past it. Proxies from the
// environment are ignored: a proxy would make the connected address
// meaningless.
//
// Besides that: http and https only, no credentials in URLs, a connect
// timeout and a total timeout, a redirect cap, a body cap (only the head of
// a page is read), a content-type check, and an honest User-Agent.
package fetch

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"time"

	"github.com/snipdev/snip/pkg/failure"
	"github.com/snipdev/snip/pkg/netguard"
)

// Resolver looks up a host's addresses. *net.Resolver implements it; tests
// pass one that maps public-looking names to local addresses.
type Resolver = netguard.Resolver

// Config are a Fetcher's limits.
type Config struct {
	// UserAgent names the fetcher and where to learn about it.
	UserAgent string
	// ConnectTimeout bounds each TCP connect and TLS handshake.
	ConnectTimeout time.Duration
	// Timeout bounds a whole fetch: redirects, headers and reading the body.
	Timeout time.Duration
	// MaxRedirects is the most redirects followed.
	MaxRedirects int
	// MaxBodyBytes is the most body bytes read; a page's head is in its
	// first few kilobytes, the rest is never downloaded.
	MaxBodyBytes int64
	// Allow lists ranges that would otherwise be refused.
	Allow []netip.Prefix
	// Resolver resolves host names (default net.DefaultResolver).
	Resolver Resolver
}

// Fetcher gets pages. It is safe for concurrent use and keeps connections
// alive between fetches.
type Fetcher struct {
	cfg    Config
	client *http.Client
}

// New returns a Fetcher with cfg's limits.
func New(cfg Config) *Fetcher {
	dialer := netguard.NewDialer(netguard.NewPolicy(cfg.Allow), cfg.Resolver, cfg.ConnectTimeout)
	f := &Fetcher{cfg: cfg}
	transport := &http.Transport{
		Proxy:                  nil, // never: see the package doc
		DialContext:            dialer.DialContext,
		ForceAttemptHTTP2:      true,
		TLSHandshakeTimeout:    cfg.ConnectTimeout,
		ResponseHeaderTimeout:  cfg.Timeout,
		MaxResponseHeaderBytes: 64 << 10,
		MaxIdleConns:           256,
		MaxIdleConnsPerHost:    4,
		IdleConnTimeout:        30 * time.Second,
		TLSClientConfig:        &tls.Config{MinVersion: tls.VersionTLS12},
	}
	f.client = &http.Client{
		Transport:     transport,
		Timeout:       cfg.Timeout,
		CheckRedirect: f.checkRedirect,
	}
	return f
}

func (f *Fetcher) checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) > f.cfg.MaxRedirects {
		return fmt.Errorf("%d redirects, the last to %s: %w", len(via), req.URL.Redacted(), ErrTooManyRedirects)
	}
	return checkURL(req.URL)
}

func checkURL(u *url.URL) error {
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("scheme %q: %w", u.Scheme, ErrBadURL)
	case u.Hostname() == "":
		return fmt.Errorf("no host in %q: %w", u.Redacted(), ErrBadURL)
	case u.User != nil:
		return fmt.Errorf("credentials in %q: %w", u.Redacted(), ErrBadURL)
	}
	return nil
}

// Response is a fetched HTML page. Close its Body.
type Response struct {
	// URL is where the page was found, after redirects: relative links in
	// it resolve against this.
	URL *url.URL
	// ContentType is the Content-Type header (with its charset parameter),
	// or the sniffed type when the server sent none.
	ContentType string
	// Body yields at most MaxBodyBytes. Its read errors wrap ErrTimeout or
	// ErrTransport like Get's.
	Body io.ReadCloser
}

// Get fetches rawURL. A non-2xx status is a *StatusError; a response that is
// not HTML is ErrNotHTML; every other failure wraps one of the package's
// errors, or ctx's error when ctx ended.
func (f *Fetcher) Get(ctx context.Context, rawURL string) (*Response, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("parse url: %v: %w", err, ErrBadURL)
	}
	if err := checkURL(u); err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, fmt.Errorf("new request: %v: %w", err, ErrBadURL)
	}
	req.Header.Set("User-Agent", f.cfg.UserAgent)
	req.Header.Set("Accept", "text/html,application/xhtml+xml;q=0.9,*/*;q=0.1")
	resp, err := f.client.Do(req)
	if err != nil {
		return nil, classify(ctx.Err(), fmt.Errorf("get %s: %w", u.Redacted(), err))
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		resp.Body.Close()
		return nil, fmt.Errorf("get %s: %w", resp.Request.URL.Redacted(), &StatusError{
			Code: resp.StatusCode, Status: resp.Status, RetryAfter: failure.RetryAfterHeader(resp.Header.Get("Retry-After"), time.Now()),
		})
	}
	body := &body{r: bufio.NewReaderSize(io.LimitReader(resp.Body, f.cfg.MaxBodyBytes), 512), c: resp.Body}
	ct := resp.Header.Get("Content-Type")
	if ct == "" {
		head, _ := body.r.Peek(512)
		ct = http.DetectContentType(head)
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil || mt != "text/html" && mt != "application/xhtml+xml" {
		resp.Body.Close()
		return nil, fmt.Errorf("get %s: content type %q: %w", resp.Request.URL.Redacted(), ct, ErrNotHTML)
	}
	return &Response{URL: resp.Request.URL, ContentType: ct, Body: body}, nil
}

// classify wraps a client error in the package error that says what kind of
// failure it was. Errors that already wrap one (from Control, dial or
// CheckRedirect) keep it; when the caller's context ended (ctxErr), that is
// the cause, whatever the client reports.
func classify(ctxErr, err error) error {
	if ctxErr != nil {
		return fmt.Errorf("%w: %w", ctxErr, err)
	}
	for _, known := range []error{ErrRefused, ErrNoSuchHost, ErrTooManyRedirects, ErrBadURL} {
		if errors.Is(err, known) {
			return err
		}
	}
	var (
		netErr   net.Error
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		verify   *tls.CertificateVerificationError
	)
	switch {
	case errors.As(err, &unknown), errors.As(err, &hostname), errors.As(err, &invalid), errors.As(err, &verify):
		return fmt.Errorf("%w: %w", ErrTLS, err)
	case errors.As(err, &netErr) && netErr.Timeout(), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w: %w", ErrTimeout, err)
	}
	return fmt.Errorf("%w: %w", ErrTransport, err)
}

type body struct {
	r *bufio.Reader
	c io.Closer
}

// Read classifies read errors like Get's. It cannot tell the caller's
// cancellation from the fetch timeout; a caller that cancels checks its own
// context first.
func (b *body) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF {
		err = classify(nil, fmt.Errorf("read body: %w", err))
	}
	return n, err
}

func (b *body) Close() error { return b.c.Close() }
