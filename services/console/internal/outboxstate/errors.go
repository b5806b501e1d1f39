package outboxstate

import "errors"

// ErrNoOutbox means the redirect service has not created its outbox yet.
var ErrNoOutbox = errors.New("no outbox in redis yet (the redirect service has not started)")
