package fraud

import "errors"

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
