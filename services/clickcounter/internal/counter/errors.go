package counter

import "errors"

// Expected failures. Callers check them with errors.Is.
var (
	// ErrLinkNotFound means there is no such link for the asking owner: it
	// does not exist, it was deleted, or it belongs to another owner.
	ErrLinkNotFound = errors.New("link not found")
	// ErrInvalidRange means a stats query asked for a range out of bounds.
	ErrInvalidRange = errors.New("invalid stats range")
	// ErrWrongPartition means a click was read from a partition its link
	// code does not hash to, so its counts would be written where no reader
	// looks. It is permanent: the event is parked.
	ErrWrongPartition = errors.New("click is in the wrong partition")
	// ErrContention means a batch or verdict lost its compare-and-set to
	// concurrent writers too many times in a row; it is transient.
	ErrContention = errors.New("partition state kept changing")
)
