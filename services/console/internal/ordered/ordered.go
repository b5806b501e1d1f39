// Package ordered opens the console's ordered consumers (the live clicks,
// each owner's stream, the fraud alerts) and cleans up after them: an
// ordered consumer is ephemeral on the server and outlives the client by its
// inactive threshold unless deleted, and a busy console opens and closes
// many.
package ordered

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// inactiveThreshold is how long the server keeps a consumer whose client
// died without deleting it.
const inactiveThreshold = 30 * time.Second

// Iterator is an open ordered consumer's message iterator.
type Iterator struct {
	jetstream.MessagesContext
	js jetstream.JetStream
	c  jetstream.Consumer
}

// Open creates an ordered consumer on stream and returns its iterator, which
// fetches at most pullAhead messages ahead of Next. Close it when done.
func Open(ctx context.Context, js jetstream.JetStream, stream string, cfg jetstream.OrderedConsumerConfig, pullAhead int) (*Iterator, error) {
	if cfg.InactiveThreshold == 0 {
		cfg.InactiveThreshold = inactiveThreshold
	}
	c, err := js.OrderedConsumer(ctx, stream, cfg)
	if err != nil {
		return nil, fmt.Errorf("ordered consumer on %s: %w", stream, err)
	}
	it, err := c.Messages(jetstream.PullMaxMessages(pullAhead))
	if err != nil {
		return nil, fmt.Errorf("ordered consumer on %s: %w", stream, err)
	}
	return &Iterator{MessagesContext: it, js: js, c: c}, nil
}

// Close stops the iterator (Next returns jetstream.ErrMsgIteratorClosed) and
// deletes the consumer on the server.
func (it *Iterator) Close() {
	it.Stop()
	info := it.c.CachedInfo()
	if info == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = it.js.DeleteConsumer(ctx, info.Stream, info.Name)
}
