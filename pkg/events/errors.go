package events

import "errors"

// Sentinel errors returned by the Decode functions. Readers treat both as
// permanent: the event is parked on DEAD_LETTER, never retried.
var (
	// ErrMalformed means the payload is not valid JSON for the event type or
	// lacks a required field.
	ErrMalformed = errors.New("malformed event")
	// ErrUnknownVersion means the payload's schema version is one this build
	// does not understand (newer producer, or garbage).
	ErrUnknownVersion = errors.New("unknown event schema version")
)
