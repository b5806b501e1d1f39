package livefeed

import "errors"

// ErrTooManyBrowsers means MaxBrowsers already watch.
var ErrTooManyBrowsers = errors.New("too many browsers watching the live clicks")
