package ownerstream

import "errors"

// Errors Serve returns before a stream opens, which the HTTP layer answers,
// and the cause that ends an open stream for its key.
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
	// ErrKeyRevoked is the cause the caller gives when it cancels an open
	// stream's context because the owner's API key was revoked or rotated:
	// the stream ends, counted as revoked rather than as the client leaving.
	ErrKeyRevoked = errors.New("api key revoked or rotated")
)
