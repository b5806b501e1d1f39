// Package directpub records a click straight in JetStream: the redirect's
// second durable path, used when the Redis outbox does not answer in time.
// The click is published to its CLICKS subject with Nats-Msg-Id set to the
// event ID (so the copy the outbox may still relay later is dropped by the
// stream's duplicate window) and Nats-Expected-Stream CLICKS, and Publish
// returns only once JetStream acknowledged it. Like the outbox relay, it
// publishes only clicks that pass events.ReadClick, the readers' rule.
//
// An ack that does not come in time is ambiguous: the stream may have stored
// the click and the ack be slow (a loaded server), and a click answered with
// an error must not be counted. So a timed-out publish is sent again with the
// same Nats-Msg-Id, up to Attempts in all: the first ack that comes, new or
// duplicate, says the click is stored. Only when none comes is the error
// returned (and then the click may still be in CLICKS: decision 0014 in
// docs/decisions lists when a request answered 503 can still be counted).
//
// The connection it is given must not buffer publishes while it reconnects
// (nats.ReconnectBufSize(-1)): a buffered click would be stored after the
// redirect had answered with an error, and then counted.
package directpub

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
)

// ErrUnconfirmed means an attempt's ack did not come in time and no later
// attempt got one (a later one may have failed otherwise: the connection
// down by then): JetStream may have stored the click or not. Other errors
// mean it did not (the connection was down, the stream refused it, the
// click broke the rule of validity).
var ErrUnconfirmed = errors.New("no ack from JetStream on any attempt")

// Attempts is how many times a click whose ack timed out is published, in
// all; each attempt waits at most the publisher's timeout.
const Attempts = 3

// Publisher publishes clicks synchronously.
type Publisher struct {
	js      jetstream.JetStream
	timeout time.Duration
}

// New returns a publisher that waits at most timeout for each ack.
func New(js jetstream.JetStream, timeout time.Duration) *Publisher {
	return &Publisher{js: js, timeout: timeout}
}

// PublishClick publishes one click and returns nil once JetStream has
// stored it (or already had it: a duplicate ack means stored). An error
// means it is not known to be stored.
func (p *Publisher) PublishClick(ctx context.Context, id, subject, data []byte) error {
	// The rule of validity every reader applies, as the relay applies it
	// before publishing: a click they would all park is not published (the
	// redirect then answers with an error, and nothing is counted).
	if _, err := events.ReadClick(data, string(subject), 0, time.Now()); err != nil {
		return fmt.Errorf("publish click %s to %s: %w", id, subject, err)
	}
	msg := &nats.Msg{
		Subject: string(subject),
		// The caller's buffer may be reused once this returns; the client
		// has written the bytes by then, but copy to be independent of it.
		Data:   append([]byte(nil), data...),
		Header: nats.Header{events.HeaderMsgID: []string{string(id)}},
	}
	var err error
	sent := 0 // attempts whose ack did not come in time: each may be stored
	for range Attempts {
		if err = p.publish(ctx, msg); err == nil || !timedOut(err) || ctx.Err() != nil {
			break
		}
		sent++
	}
	switch {
	case err == nil:
		return nil
	case sent > 0 && ctx.Err() == nil:
		// However a later attempt failed (the connection is down by now,
		// say), an earlier one may have been stored.
		return fmt.Errorf("publish click %s to %s: %w after %d attempts: %w", id, subject, ErrUnconfirmed, sent, err)
	default:
		return fmt.Errorf("publish click %s to %s: %w", id, subject, err)
	}
}

func (p *Publisher) publish(ctx context.Context, msg *nats.Msg) error {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	// The client retries only "no responders" (nothing received the
	// message), within ctx.
	_, err := p.js.PublishMsg(ctx, msg, jetstream.WithExpectStream(events.ClicksStream))
	return err
}

// timedOut reports an error after which the click may have been stored.
func timedOut(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)
}
