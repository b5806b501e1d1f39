package ownerstream

import "errors"

// Errors Serve returns before a stream opens; the HTTP layer answers them.
var (
	// ErrBadStart means Last-Event-ID, since_seq or since is malformed.
	ErrBadStart = errors.New("invalid stream start")
	// ErrBadOwner means the owner ID is not a subject token.
	ErrBadOwner = errors.New("invalid owner id")
	// ErrOwnerLimit means the owner has the most streams allowed open.
	ErrOwnerLimit = errors.New("too many streams for this owner")
	// ErrTooManyStreams means this instance serves the most streams it may.
	ErrTooManyStreams = errors.New("too many streams on this instance")
	// ErrUnavailable means CLICKS cannot be read now (NATS away).
	ErrUnavailable = errors.New("click stream unavailable")
)
