package topology

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
)

// The click counter's own consumers, besides its consumer group on CLICKS.
const (
	// ClickCounterLinksConsumer reads LINKS so the counter knows each code's
	// owner (and links with no clicks yet) without reading the redirect
	// service's Redis keys, which are not a contract.
	ClickCounterLinksConsumer = "click-counter-links"
	// ClickCounterVerdictsConsumer reads the fraud verdicts the counter
	// applies as corrections.
	ClickCounterVerdictsConsumer = "click-counter-verdicts"
)

// FeedAckWait is the AckWait of the counter's LINKS and FRAUD_VERDICTS consumers:
// what a killed instance held comes back to the others this long after its
// death. The feeds mark messages in progress every FeedAckWait/3 while they
// hold them, so a live instance's slow batch is not redelivered.
const FeedAckWait = 2 * time.Second

// ClickCounterLinksConsumerConfig is a durable consumer on every LINKS
// event, from the first. All counter instances share it (each event is
// handled by one of them); the counter applies an event only if its sequence
// is above the last one recorded for the code, so redelivery and
// out-of-order handling by two instances are harmless.
func ClickCounterLinksConsumerConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       ClickCounterLinksConsumer,
		Description:   "Click counter: link owners and deletions, for the stats API",
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		FilterSubject: events.LinksSubjects,
		AckWait:       FeedAckWait,
		MaxDeliver:    -1,
		MaxAckPending: 1000,
	}
}

// ClickCounterVerdictsConsumerConfig is a durable consumer on every verdict
// message FRAUD_VERDICTS retains, from the first, shared by all counter
// instances. Each message labels many clicks; the labels about one click are
// ordered by their message's FRAUD_VERDICTS sequence in Redis, so messages
// may be handled out of order and redelivered without effect.
func ClickCounterVerdictsConsumerConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       ClickCounterVerdictsConsumer,
		Description:   "Click counter: fraud verdicts applied as corrections",
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		FilterSubject: events.FraudVerdictSubjects,
		AckWait:       FeedAckWait,
		MaxDeliver:    -1,
		MaxAckPending: 1000,
	}
}

// ApplyClickCounter creates or updates the click counter's LINKS and
// FRAUD_VERDICTS consumers. The streams must exist (Apply first).
func ApplyClickCounter(ctx context.Context, js jetstream.JetStream) error {
	for _, c := range []struct {
		stream string
		cfg    jetstream.ConsumerConfig
	}{
		{events.LinksStream, ClickCounterLinksConsumerConfig()},
		{events.FraudVerdictsStream, ClickCounterVerdictsConsumerConfig()},
	} {
		if err := applyConsumer(ctx, js, c.stream, c.cfg); err != nil {
			return fmt.Errorf("apply topology: %w", err)
		}
	}
	return nil
}

// applyConsumer creates or updates a durable consumer, and does nothing when
// it is already as wanted, so a service whose NATS user may only read
// consumer info passes without admin rights.
func applyConsumer(ctx context.Context, js jetstream.JetStream, stream string, want jetstream.ConsumerConfig) error {
	c, err := js.Consumer(ctx, stream, want.Durable)
	if err == nil {
		if consumerUpToDate(c.CachedInfo().Config, want) {
			return nil
		}
	} else if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("consumer %s: %w", want.Durable, err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, stream, want); err != nil {
		return fmt.Errorf("consumer %s: %w", want.Durable, err)
	}
	return nil
}

// consumerUpToDate reports whether the consumer have is configured as want
// in what Apply sets.
func consumerUpToDate(have, want jetstream.ConsumerConfig) bool {
	return have.FilterSubject == want.FilterSubject && have.AckPolicy == want.AckPolicy &&
		have.AckWait == want.AckWait && have.MaxDeliver == want.MaxDeliver &&
		have.MaxAckPending == want.MaxAckPending && have.Description == want.Description &&
		slices.Equal(have.BackOff, want.BackOff)
}
