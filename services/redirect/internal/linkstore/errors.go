package linkstore

import "errors"

var (
	// ErrNotFound means there is no live link with that code (or it is
	// another owner's, which the API does not reveal).
	ErrNotFound = errors.New("link not found")
	// ErrCodeTaken means the code is in use (or was, by a deleted link).
	ErrCodeTaken = errors.New("code already taken")
	// ErrUnavailable means Redis failed (down, too slow) or a concurrent
	// change got in the way; trying again later may work.
	ErrUnavailable = errors.New("link store unavailable")
)
