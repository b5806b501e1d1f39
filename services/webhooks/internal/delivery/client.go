package delivery

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/snipdev/snip/pkg/failure"
	"github.com/snipdev/snip/pkg/netguard"
	"github.com/snipdev/snip/services/webhooks/internal/endpoint"
)

// ClientConfig are the limits on requests to owners' endpoints.
type ClientConfig struct {
	// Timeout bounds a whole attempt: connect, send, and the response
	// headers and the part of the body read.
	Timeout        time.Duration
	ConnectTimeout time.Duration
	// MaxResponseBytes is the most response body bytes read; the first
	// ResponseKept of them are kept in the delivery record.
	MaxResponseBytes int64
	ResponseKept     int
	UserAgent        string
	// Dialer vets every address connected to (SSRF).
	Dialer *netguard.Dialer
}

// Client posts signed batches. It follows no redirects and uses no proxy.
type Client struct {
	cfg  ClientConfig
	http *http.Client
}

// NewClient returns a Client with cfg's limits.
func NewClient(cfg ClientConfig) *Client {
	t := &http.Transport{
		Proxy:                  nil, // a proxy would hide the connected address from the SSRF guard
		DialContext:            cfg.Dialer.DialContext,
		TLSHandshakeTimeout:    cfg.ConnectTimeout,
		ResponseHeaderTimeout:  cfg.Timeout,
		MaxResponseHeaderBytes: 16 << 10,
		MaxIdleConns:           512,
		MaxIdleConnsPerHost:    4,
		IdleConnTimeout:        60 * time.Second,
		ForceAttemptHTTP2:      true,
		TLSClientConfig:        &tls.Config{MinVersion: tls.VersionTLS12},
	}
	return &Client{cfg: cfg, http: &http.Client{
		Transport: t, Timeout: cfg.Timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

// Result is the outcome of one attempt.
type Result struct {
	Code int
	// Response is the start of the response body.
	Response string
	// RetryAfter is the server's Retry-After on 429 and 503 (0 if none).
	RetryAfter time.Duration
	Err        error
	Duration   time.Duration
}

// OK reports a 2xx answer.
func (r Result) OK() bool { return r.Err == nil && r.Code >= 200 && r.Code <= 299 }

// ErrorText says why an attempt failed, for the delivery record.
func (r Result) ErrorText() string {
	switch {
	case r.Err != nil:
		return r.Err.Error()
	case r.Code >= 300 && r.Code <= 399:
		return "redirect not followed (HTTP " + strconv.Itoa(r.Code) + ")"
	case !r.OK():
		return "HTTP " + strconv.Itoa(r.Code)
	}
	return ""
}

// Post sends body to url with Standard Webhooks headers signed by secrets.
func (c *Client) Post(ctx context.Context, url string, secrets []string, webhookID string, body []byte, now time.Time) Result {
	start := time.Now()
	res := c.post(ctx, url, secrets, webhookID, body, now)
	res.Duration = time.Since(start)
	return res
}

func (c *Client) post(ctx context.Context, url string, secrets []string, webhookID string, body []byte, now time.Time) Result {
	sig, err := endpoint.Sign(secrets, webhookID, now, body)
	if err != nil {
		return Result{Err: err}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return Result{Err: fmt.Errorf("new request: %w", err)}
	}
	h := req.Header
	h.Set("Content-Type", "application/json")
	h.Set("User-Agent", c.cfg.UserAgent)
	h.Set(endpoint.HeaderID, webhookID)
	h.Set(endpoint.HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
	h.Set(endpoint.HeaderSignature, sig)
	resp, err := c.http.Do(req)
	if err != nil {
		return Result{Err: describe(err)}
	}
	defer resp.Body.Close()
	head := make([]byte, c.cfg.ResponseKept)
	n, _ := io.ReadFull(resp.Body, head)
	// Read (and discard) a bounded rest so the connection can be reused.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, c.cfg.MaxResponseBytes-int64(n)))
	res := Result{Code: resp.StatusCode, Response: string(head[:n])}
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
		res.RetryAfter = failure.RetryAfterHeader(resp.Header.Get("Retry-After"), time.Now())
	}
	return res
}

// describe names the failure: refused by the SSRF guard, timed out, or
// the transport's own error.
func describe(err error) error {
	var ne net.Error
	switch {
	case errors.Is(err, netguard.ErrRefused), errors.Is(err, netguard.ErrNoSuchHost):
		return err
	case errors.As(err, &ne) && ne.Timeout(), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("timed out: %w", err)
	}
	return err
}
