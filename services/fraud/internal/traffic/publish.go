package traffic

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
)

// Publish publishes clicks to CLICKS in order, as the redirect's outbox
// relay would (Nats-Msg-Id = the event ID), at most window unacknowledged at
// once, and returns once all are stored.
func Publish(ctx context.Context, js jetstream.JetStream, clicks []Click, window int) error {
	pending := make([]jetstream.PubAckFuture, 0, window)
	wait := func() error {
		for _, f := range pending {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				return fmt.Errorf("publish click: %w", err)
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		pending = pending[:0]
		return nil
	}
	for _, c := range clicks {
		data, err := json.Marshal(c.Click)
		if err != nil {
			return fmt.Errorf("encode click: %w", err)
		}
		f, err := js.PublishAsync(events.ClickSubject(c.Owner, c.Code), data, jetstream.WithMsgID(c.ID))
		if err != nil {
			return fmt.Errorf("publish click: %w", err)
		}
		if pending = append(pending, f); len(pending) == window {
			if err := wait(); err != nil {
				return err
			}
		}
	}
	return wait()
}
