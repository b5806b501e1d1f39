package reader

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// oneOffInactive is how long the server keeps a one-off read's consumer
// after its last pull, where the read's own delete of it failed (the
// client's default is 5 minutes).
const oneOffInactive = 30 * time.Second

// OneOffRead creates an ordered consumer on stream for a read that ends
// (a stretch of events, then done), and returns with it the function that
// deletes it, for the caller to defer: a process that reads again and
// again (each rewind, rebuild or replay) then leaves no consumer behind.
// The delete outlives ctx (bounded by 5 s); should it not reach the
// server, the consumer goes after 30 s unused (cfg.InactiveThreshold, when
// not set).
func OneOffRead(ctx context.Context, js jetstream.JetStream, stream string, cfg jetstream.OrderedConsumerConfig) (jetstream.Consumer, func(), error) {
	if cfg.InactiveThreshold == 0 {
		cfg.InactiveThreshold = oneOffInactive
	}
	c, err := js.OrderedConsumer(ctx, stream, cfg)
	if err != nil {
		return nil, nil, err
	}
	return c, func() {
		// The server's consumer is created at the first pull, and named
		// anew at each reset: the one to delete is the latest.
		if ci := c.CachedInfo(); ci != nil {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = js.DeleteConsumer(dctx, stream, ci.Name)
		}
	}, nil
}
