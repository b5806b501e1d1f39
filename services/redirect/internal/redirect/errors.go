package redirect

import "errors"

var (
	// ErrNotFound means no live link has the code.
	ErrNotFound = errors.New("no such link")
	// ErrClickNotRecorded means the click could not be written to the
	// outbox and the policy says not to redirect without it (503).
	ErrClickNotRecorded = errors.New("click could not be recorded")
)
