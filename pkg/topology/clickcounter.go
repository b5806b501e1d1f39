package topology

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
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
	return applyConsumers(ctx, js, clickCounterConsumers(), Options{})
}

// clickCounterConsumers are the click counter's consumers, in the order
// ApplyClickCounter applies them.
func clickCounterConsumers() []Consumer {
	return []Consumer{
		{events.LinksStream, ClickCounterLinksConsumerConfig()},
		{events.FraudVerdictsStream, ClickCounterVerdictsConsumerConfig()},
	}
}

// applyConsumers applies cs in order, telling o.Applied of each.
func applyConsumers(ctx context.Context, js jetstream.JetStream, cs []Consumer, o Options) error {
	for _, c := range cs {
		if err := applyConsumer(ctx, js, c.Stream, c.Config); err != nil {
			return fmt.Errorf("apply topology: %w", err)
		}
		o.applied("consumer", c.Config.Durable, c.Stream)
	}
	return nil
}

// applyConsumer creates or updates a durable consumer, and does nothing when
// it is already as wanted, so a service whose NATS user may only read
// consumer info passes without admin rights.
//
// An update keeps what the existing consumer was created with where the
// server allows no change and Snip has nothing to change: where it began
// (deliver policy, start sequence or time: it has a position of its own
// now) and its limit of waiting pulls where want leaves it to the server.
// A setting the consumer works by that the server cannot update in place
// (ack policy, replay policy, push or pull, heartbeats, flow control,
// storage) is refused with ErrConsumerImmutable, naming the consumer, the
// setting and what the operator can do; so is any other refusal of the
// server's to update a setting in place.
func applyConsumer(ctx context.Context, js jetstream.JetStream, stream string, want jetstream.ConsumerConfig) error {
	c, err := js.Consumer(ctx, stream, want.Durable)
	if err == nil {
		have := c.CachedInfo().Config
		if consumerUpToDate(have, want) {
			return nil
		}
		if what := consumerImmutable(have, want); len(what) > 0 {
			return immutableError(stream, want.Durable, strings.Join(what, ", "))
		}
		want.DeliverPolicy, want.OptStartSeq, want.OptStartTime = have.DeliverPolicy, have.OptStartSeq, have.OptStartTime
		if want.MaxWaiting == 0 {
			want.MaxWaiting = have.MaxWaiting
		}
	} else if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("consumer %s: %w", want.Durable, err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, stream, want); err != nil {
		if refusedInPlace(err) {
			return immutableError(stream, want.Durable, err.Error())
		}
		return fmt.Errorf("consumer %s: %w", want.Durable, err)
	}
	return nil
}

// consumerImmutable lists the settings of the existing consumer have that
// differ from want's, that it works by, and that the server refuses to
// update in place (nats-server's checkNewConsumerConfig).
func consumerImmutable(have, want jetstream.ConsumerConfig) []string {
	var what []string
	if have.AckPolicy != want.AckPolicy {
		what = append(what, fmt.Sprintf("ack policy %s, want %s", have.AckPolicy, want.AckPolicy))
	}
	if have.ReplayPolicy != want.ReplayPolicy {
		what = append(what, fmt.Sprintf("replay policy %s, want %s", have.ReplayPolicy, want.ReplayPolicy))
	}
	if (have.DeliverSubject == "") != (want.DeliverSubject == "") {
		what = append(what, fmt.Sprintf("push (deliver subject %q), want pull", have.DeliverSubject))
	}
	if have.IdleHeartbeat != want.IdleHeartbeat {
		what = append(what, fmt.Sprintf("idle heartbeat %s, want %s", have.IdleHeartbeat, want.IdleHeartbeat))
	}
	if have.FlowControl != want.FlowControl {
		what = append(what, fmt.Sprintf("flow control %t, want %t", have.FlowControl, want.FlowControl))
	}
	if have.MemoryStorage != want.MemoryStorage {
		what = append(what, fmt.Sprintf("memory storage %t, want %t", have.MemoryStorage, want.MemoryStorage))
	}
	return what
}

// errCodeConsumerCreate is JetStream's error code for a consumer create or
// update the server refused with a reason of its own (JSConsumerCreateErrF).
const errCodeConsumerCreate = 10012

// refusedInPlace reports whether err is the server's refusal to update a
// consumer's setting in place: "<setting> can not be updated", "can not
// update pull consumer to push based" and the like.
func refusedInPlace(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != errCodeConsumerCreate {
		return false
	}
	return strings.Contains(apiErr.Description, "can not be updated") || strings.Contains(apiErr.Description, "can not update")
}

// immutableError is ErrConsumerImmutable for stream's consumer durable,
// saying what differs (what) and what the operator can do.
func immutableError(stream, durable, what string) error {
	advice, ok := consumerAdvice[durable]
	if !ok {
		advice = "delete it (nats consumer rm " + stream + " " + durable + ") and run snipctl topology apply"
	}
	return fmt.Errorf("consumer %s on %s: %s; %s: %w", durable, stream, what, advice, ErrConsumerImmutable)
}

// consumerAdvice says, for each consumer Apply declares, what the operator
// does about one that exists with a setting the server cannot update in
// place: whether deleting it and applying again is safe, and if not, how
// to keep its position.
var consumerAdvice = map[string]string{
	PreviewConsumer: "deleting it is safe: the jobs stay in " + events.PreviewJobsStream +
		" and come to the new consumer, with their tries counted afresh; nats consumer rm " +
		events.PreviewJobsStream + " " + PreviewConsumer + ", then snipctl topology apply",
	PreviewRescueConsumer: "deleting it is safe: the advisories stay in " + events.PreviewAdvisoriesStream +
		" and come to the new consumer; nats consumer rm " + events.PreviewAdvisoriesStream + " " +
		PreviewRescueConsumer + ", then snipctl topology apply",
	ClickCounterLinksConsumer: "deleting it is safe: the new consumer reads " + events.LinksStream +
		" from its first event again and the counter applies only what is newer than it recorded; nats consumer rm " +
		events.LinksStream + " " + ClickCounterLinksConsumer + ", then snipctl topology apply",
	ClickCounterVerdictsConsumer: "deleting it is safe: the new consumer reads " + events.FraudVerdictsStream +
		" from its first message again and the counter applies each label once; nats consumer rm " +
		events.FraudVerdictsStream + " " + ClickCounterVerdictsConsumer + ", then snipctl topology apply",
	WebhooksAlertsConsumer: "deleting it loses alerts: a new one starts at new alerts, so those not yet sent are never sent; " +
		"note its ack floor (nats consumer info " + events.FraudStream + " " + WebhooksAlertsConsumer +
		"), delete it, create it by hand starting at the sequence after the floor (nats consumer add " +
		events.FraudStream + " " + WebhooksAlertsConsumer + " --pull --deliver <floor+1> --defaults), then snipctl topology apply, which keeps where a consumer starts",
}

// consumerUpToDate reports whether the consumer have is configured as want
// in what Apply sets.
func consumerUpToDate(have, want jetstream.ConsumerConfig) bool {
	return have.FilterSubject == want.FilterSubject && have.AckPolicy == want.AckPolicy &&
		have.AckWait == want.AckWait && have.MaxDeliver == want.MaxDeliver &&
		have.MaxAckPending == want.MaxAckPending && have.Description == want.Description &&
		slices.Equal(have.BackOff, want.BackOff)
}
