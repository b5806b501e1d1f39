package traffic

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
)

// Publish publishes clicks to CLICKS in order, as the redirect's outbox
// relay would (Nats-Msg-Id = the event ID), at most window unacknowledged at
// once (keep it under the JetStream context's async limit, 4000 by
// default), and returns once all are stored.
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
		f, err := js.PublishAsync(events.ClickSubject(c.Owner, c.Code), data, jetstream.WithMsgID(c.ID), jetstream.WithStallWait(30*time.Second))
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

// MsgIDs reads every message of stream on subject filter and returns how
// many messages carry each Nats-Msg-Id: what tests count alerts by.
func MsgIDs(ctx context.Context, js jetstream.JetStream, stream, filter string) (map[string]int, error) {
	ids := map[string]int{}
	err := readAll(ctx, js, stream, filter, func(m jetstream.Msg) error {
		ids[m.Headers().Get(jetstream.MsgIDHeader)]++
		return nil
	})
	return ids, err
}

// VerdictLabels reads every verdict message of FRAUD_VERDICTS and returns
// how many labels name each click ID (across all messages), and how many
// messages there are: what tests count verdicts by.
func VerdictLabels(ctx context.Context, js jetstream.JetStream) (labels map[string]int, msgs int, err error) {
	labels = map[string]int{}
	err = readAll(ctx, js, events.FraudVerdictsStream, events.FraudVerdictSubjects, func(m jetstream.Msg) error {
		b, err := events.DecodeFraudVerdictBatch(m.Data())
		if err != nil {
			return err
		}
		if id := m.Headers().Get(jetstream.MsgIDHeader); id != b.ID {
			return fmt.Errorf("verdict message %s has Nats-Msg-Id %q", b.ID, id)
		}
		msgs++
		for _, l := range b.Labels {
			labels[l.ClickID]++
		}
		return nil
	})
	return labels, msgs, err
}

func readAll(ctx context.Context, js jetstream.JetStream, stream, filter string, fn func(jetstream.Msg) error) error {
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		return fmt.Errorf("read %s %s: %w", stream, filter, err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return fmt.Errorf("read %s %s: %w", stream, filter, err)
	}
	for left := info.NumPending; left > 0; {
		b, err := cons.Fetch(int(min(left, 1000)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return fmt.Errorf("read %s %s: %w", stream, filter, err)
		}
		got := 0
		for m := range b.Messages() {
			if err := fn(m); err != nil {
				return fmt.Errorf("read %s %s: %w", stream, filter, err)
			}
			got++
		}
		if got == 0 {
			return fmt.Errorf("read %s %s: %d messages announced, none delivered", stream, filter, left)
		}
		left -= uint64(got)
	}
	return nil
}
