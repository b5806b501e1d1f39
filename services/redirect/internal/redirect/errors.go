package redirect

import "errors"

var (
	// ErrNotFound means no live link has the code.
	ErrNotFound = errors.New("no such link")
	// ErrClickNotRecorded means the click could not be written to the
	// outbox and the policy says not to redirect without it (503).
	ErrClickNotRecorded = errors.New("click could not be recorded")
	// ErrClickUnconfirmed means both paths failed, the last one with its
	// outcome unknown: the click was sent to JetStream and no ack came on
	// any attempt, so it may be stored (and then counted). Answered 503
	// click_unconfirmed, which a client tells apart from click_not_recorded.
	ErrClickUnconfirmed = errors.New("click not confirmed: it may have been recorded")
)
