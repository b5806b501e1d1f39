package dlq

import "errors"

// ErrBadFilter means a source or reason is not a subject token.
var ErrBadFilter = errors.New("source and reason must be subject tokens")
