// Package fraudpub publishes fraud alerts on the FRAUD stream and verdict
// messages (many labels each) on FRAUD_VERDICTS: asynchronously, within a
// bounded window of unacknowledged publishes, each with its deterministic ID
// as Nats-Msg-Id so the stream drops repeats. It is the JetStream side of
// fraud.Publisher.
package fraudpub

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/services/fraud/internal/fraud"
)

var _ fraud.Publisher = (*Publisher)(nil)

// Publisher publishes on FRAUD and FRAUD_VERDICTS.
type Publisher struct {
	js      jetstream.JetStream
	timeout time.Duration
}

// New returns a publisher on nc. At most window publishes wait for their
// acknowledgement at once (a publish beyond it waits for room, up to
// timeout); an acknowledgement that takes longer than timeout is an error.
func New(nc *nats.Conn, window int, timeout time.Duration) (*Publisher, error) {
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(window),
		jetstream.WithPublishAsyncTimeout(timeout))
	if err != nil {
		return nil, fmt.Errorf("fraud publisher: %w", err)
	}
	return &Publisher{js: js, timeout: timeout}, nil
}

// Publish sends every alert and verdict message and waits until the streams
// have acknowledged each one; it returns the first error otherwise. On an
// error some may have been stored: publishing them again is harmless.
func (p *Publisher) Publish(ctx context.Context, alerts []events.FraudAlert, verdicts []events.FraudVerdictBatch) (int, error) {
	futures := make([]jetstream.PubAckFuture, 0, len(alerts)+len(verdicts))
	var sendErr error
	send := func(subject, id string, v any) bool {
		data, err := json.Marshal(v)
		if err != nil {
			sendErr = fmt.Errorf("encode %s: %w", id, err)
			return false
		}
		f, err := p.js.PublishAsync(subject, data, jetstream.WithMsgID(id), jetstream.WithStallWait(p.timeout))
		if err != nil {
			sendErr = fmt.Errorf("publish %s: %w", id, err)
			return false
		}
		futures = append(futures, f)
		return true
	}
	for _, a := range alerts {
		if !send(events.FraudAlertSubject(a.Code), a.ID, a) {
			break
		}
	}
	for _, v := range verdicts {
		if sendErr != nil || !send(events.FraudVerdictBatchSubject(v.Partition), v.ID, v) {
			break
		}
	}
	// Wait for every publish that went out, even after a failure, so none is
	// still in flight when the caller retries.
	dups := 0
	var ackErr error
	for _, f := range futures {
		select {
		case ack := <-f.Ok():
			if ack.Duplicate {
				dups++
			}
		case err := <-f.Err():
			ackErr = cmp.Or(ackErr, fmt.Errorf("acknowledge %s: %w", f.Msg().Header.Get(jetstream.MsgIDHeader), err))
		case <-ctx.Done():
			return dups, fmt.Errorf("wait for acknowledgements: %w", ctx.Err())
		}
	}
	return dups, errors.Join(sendErr, ackErr)
}
