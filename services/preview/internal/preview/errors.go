package preview

import (
	"errors"
	"net/http"
	"time"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/failure"
	"github.com/snipdev/snip/services/preview/internal/fetch"
)

// Reasons a job fails: DEAD_LETTER subject tokens (dead.preview.<reason>)
// and metric labels. The first group is permanent: the job is dead-lettered
// at once; the second is transient: retried, and dead-lettered with that
// reason after the last try.
const (
	ReasonMalformed        = "malformed"          // the job payload is not a valid preview job
	ReasonUnknownVersion   = "unknown_version"    // a job schema this build does not read
	ReasonBadTarget        = "bad_target"         // not an http(s) URL, or credentials in it
	ReasonRefusedAddress   = "refused_address"    // resolves to a private, loopback, metadata... address
	ReasonNoSuchHost       = "no_such_host"       // DNS says the host does not exist
	ReasonTooManyRedirects = "too_many_redirects" // a redirect loop, or a chain longer than the cap
	ReasonNotHTML          = "not_html"           // an image, a PDF, JSON...
	ReasonTLS              = "tls"                // the certificate is not valid for the host
	ReasonNotFound         = "not_found"          // 404
	ReasonGone             = "gone"               // 410
	ReasonHTTP4xx          = "http_4xx"           // other 4xx (and 3xx without a Location)

	ReasonTimeout     = "timeout"      // connect or total fetch timeout
	ReasonUnreachable = "unreachable"  // connection refused or reset, a broken response
	ReasonRateLimited = "rate_limited" // 429 (Retry-After honoured)
	ReasonHTTP5xx     = "http_5xx"     // server errors (Retry-After honoured on 503)
	ReasonStore       = "store"        // Redis could not be read or written
)

// permanent and transient build the job's failure in the terms every Snip
// consumer shares (package failure): the work queue parks a permanent one at
// once and retries a transient one with backoff, honouring its Retry-After.
func permanent(reason string, err error) *failure.Error {
	return failure.Permanent(reason, err)
}

func transient(reason string, retryAfter time.Duration, err error) *failure.Error {
	return failure.RetryableAfter(reason, retryAfter, err)
}

// classifyDecode names a payload that cannot be a job.
func classifyDecode(err error) *failure.Error {
	if errors.Is(err, events.ErrUnknownVersion) {
		return permanent(ReasonUnknownVersion, err)
	}
	return permanent(ReasonMalformed, err)
}

// classifyFetch names a fetch failure and says whether retrying can help.
func classifyFetch(err error) *failure.Error {
	var se *fetch.StatusError
	switch {
	case errors.As(err, &se):
		switch {
		case se.Code == http.StatusNotFound:
			return permanent(ReasonNotFound, err)
		case se.Code == http.StatusGone:
			return permanent(ReasonGone, err)
		case se.Code == http.StatusTooManyRequests:
			return transient(ReasonRateLimited, se.RetryAfter, err)
		case se.Code >= 500:
			return transient(ReasonHTTP5xx, se.RetryAfter, err)
		case se.Transient():
			return transient(ReasonHTTP4xx, se.RetryAfter, err)
		}
		return permanent(ReasonHTTP4xx, err)
	case errors.Is(err, fetch.ErrBadURL):
		return permanent(ReasonBadTarget, err)
	case errors.Is(err, fetch.ErrRefused):
		return permanent(ReasonRefusedAddress, err)
	case errors.Is(err, fetch.ErrNoSuchHost):
		return permanent(ReasonNoSuchHost, err)
	case errors.Is(err, fetch.ErrTooManyRedirects):
		return permanent(ReasonTooManyRedirects, err)
	case errors.Is(err, fetch.ErrNotHTML):
		return permanent(ReasonNotHTML, err)
	case errors.Is(err, fetch.ErrTLS):
		return permanent(ReasonTLS, err)
	case errors.Is(err, fetch.ErrTimeout):
		return transient(ReasonTimeout, 0, err)
	}
	return transient(ReasonUnreachable, 0, err)
}
