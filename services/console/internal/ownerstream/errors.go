package ownerstream

import (
	"errors"
	"fmt"
	"time"
)

// Errors Serve returns before a stream opens, which the HTTP layer answers,
// and the cause that ends an open stream for its key.
var (
	// ErrBadStart means Last-Event-ID, since_seq or since is malformed.
	ErrBadStart = errors.New("invalid stream start")
	// ErrBadOwner means the owner ID is not a subject token.
	ErrBadOwner = errors.New("invalid owner id")
	// ErrOwnerLimit means the owner has the most streams allowed open.
	ErrOwnerLimit = errors.New("too many streams for this owner")
	// ErrOpenRate means the owner opens streams faster than allowed (each is
	// a JetStream consumer); the error is an *OpenRateError with the wait.
	ErrOpenRate = errors.New("streams opened too often for this owner")
	// ErrTooManyStreams means this instance serves the most streams it may.
	ErrTooManyStreams = errors.New("too many streams on this instance")
	// ErrUnavailable means CLICKS cannot be read now (NATS away).
	ErrUnavailable = errors.New("click stream unavailable")
	// ErrKeyRevoked is the cause the caller gives when it cancels an open
	// stream's context because the owner's API key was revoked or rotated:
	// the stream ends, counted as revoked rather than as the client leaving.
	ErrKeyRevoked = errors.New("api key revoked or rotated")
)

// OpenRateError is ErrOpenRate with the time until the owner may open its
// next stream.
type OpenRateError struct{ Wait time.Duration }

func (e *OpenRateError) Error() string {
	return fmt.Sprintf("%s: wait %s", ErrOpenRate, e.Wait.Round(time.Second))
}

func (e *OpenRateError) Unwrap() error { return ErrOpenRate }
