package httpapi

import (
	"errors"

	"github.com/snipdev/snip/services/redirect/internal/linkstore"
	"github.com/snipdev/snip/services/redirect/internal/outbox"
)

func isFull(err error) bool { return errors.Is(err, outbox.ErrFull) }

func isUnavailable(err error) bool {
	return errors.Is(err, outbox.ErrUnavailable) || errors.Is(err, linkstore.ErrUnavailable) || errors.Is(err, outbox.ErrClosed)
}
