package link

import "errors"

// Sentinel errors. Each wraps a sentence that tells the API caller what is
// wrong, so the HTTP layer can show err.Error() as it is.
var (
	// ErrInvalidTarget means the target URL is not an absolute http(s) URL
	// this service is willing to redirect to.
	ErrInvalidTarget = errors.New("invalid target URL")
	// ErrInvalidCode means a custom code breaks the charset or length rules.
	ErrInvalidCode = errors.New("invalid code")
	// ErrReservedCode means a custom code collides with a path the service
	// itself uses (api, healthz, ...).
	ErrReservedCode = errors.New("reserved code")
)
