package fraud

import "errors"

// ErrBadRules means a Rules field is out of range; the error says which.
var ErrBadRules = errors.New("invalid fraud rules")

// ErrBadNetwork means a listed network is not a CIDR the detector can match.
var ErrBadNetwork = errors.New("invalid listed network")
