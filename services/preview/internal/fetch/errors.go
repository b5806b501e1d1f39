package fetch

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/snipdev/snip/pkg/netguard"
)

// Expected failures of Get. Callers tell permanent from transient ones with
// errors.Is and errors.As; each says which it is.
var (
	// ErrBadURL: the URL cannot be fetched at all: not http or https, no
	// host, or credentials in it. Permanent.
	ErrBadURL = errors.New("url not fetchable")
	// ErrRefused: the host resolves to an address the policy refuses
	// (private, loopback, link-local, metadata, ...). No connection was
	// made. Permanent.
	ErrRefused = netguard.ErrRefused
	// ErrNoSuchHost: DNS says the host does not exist. Permanent.
	ErrNoSuchHost = netguard.ErrNoSuchHost
	// ErrTooManyRedirects: more redirects than the cap, usually a loop.
	// Permanent.
	ErrTooManyRedirects = errors.New("too many redirects")
	// ErrNotHTML: the response is not text/html or application/xhtml+xml.
	// Permanent.
	ErrNotHTML = errors.New("not an html page")
	// ErrTLS: the server's certificate is not valid for the host. Permanent.
	ErrTLS = errors.New("tls certificate not valid")
	// ErrTimeout: connecting, or the whole exchange, took longer than its
	// limit. Transient.
	ErrTimeout = errors.New("timed out")
	// ErrTransport: the exchange failed below HTTP: connection refused or
	// reset, a broken response. Transient.
	ErrTransport = errors.New("transport failure")
)

// StatusError is a response whose status is not 2xx. It is transient for
// 408, 425, 429 and 5xx and permanent otherwise (see Transient).
type StatusError struct {
	Code   int
	Status string
	// RetryAfter is the server's Retry-After (429 and 503), zero if absent
	// or unparsable.
	RetryAfter time.Duration
}

func (e *StatusError) Error() string {
	if e.RetryAfter > 0 {
		return fmt.Sprintf("http status %s (retry after %s)", e.Status, e.RetryAfter)
	}
	return "http status " + e.Status
}

// Transient reports whether the same request may succeed later.
func (e *StatusError) Transient() bool {
	switch e.Code {
	case http.StatusRequestTimeout, http.StatusTooEarly, http.StatusTooManyRequests:
		return true
	}
	return e.Code >= 500
}
