package fraud

import (
	"errors"
	"fmt"
)

// ErrBadRules means a Rules field is out of range; the error says which.
var ErrBadRules = errors.New("invalid fraud rules")

// ErrBadNetwork means a listed network is not a CIDR the detector can match.
var ErrBadNetwork = errors.New("invalid listed network")

// ErrNotInLog means an event is no longer (or not yet) in CLICKS.
var ErrNotInLog = errors.New("event not in the log")

// ErrUnknownLink means there are no fraud statistics for a link: no click of
// it has been judged, or it belongs to another owner (the API does not say
// which, so it cannot be used to probe for other owners' links).
var ErrUnknownLink = errors.New("no fraud statistics for this link")

// ErrStoreBehind means the store's high-water mark of a partition is behind
// events that were applied to it: it lost acknowledged writes (a Redis
// failover to a replica that lacked them, a crash that lost its last
// second of writes).
var ErrStoreBehind = errors.New("the store lost applied writes")

// StoreBehindError is Apply's answer when the partition's mark in the store
// is behind Batch.After: nothing was written.
type StoreBehindError struct {
	// Mark is the store's mark; After what the batch expected at least.
	Mark, After uint64
}

func (e *StoreBehindError) Error() string {
	return fmt.Sprintf("the store's mark is %d, behind %d applied before: %v", e.Mark, e.After, ErrStoreBehind)
}

func (e *StoreBehindError) Unwrap() error { return ErrStoreBehind }
