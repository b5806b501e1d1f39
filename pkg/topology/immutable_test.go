package topology_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// A consumer Apply declares that exists with another ack policy (made by
// hand, or by another version), which the server cannot update in place,
// is refused with ErrConsumerImmutable naming the consumer, the setting and
// what the operator can do, not with the server's bare refusal; the
// consumer is left as it is. Once the operator deletes it, Apply creates it
// as declared.
func TestApplyNamesAConsumerTheServerCannotUpdateInPlace(t *testing.T) {
	t.Parallel()
	js := testenv.StartNATS(t).JetStream(t)
	ctx := t.Context()
	if err := topology.Apply(ctx, js, topology.Defaults()); err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteConsumer(ctx, events.LinksStream, topology.ClickCounterLinksConsumer); err != nil {
		t.Fatal(err)
	}
	other := topology.ClickCounterLinksConsumerConfig()
	other.AckPolicy = jetstream.AckAllPolicy
	if _, err := js.CreateConsumer(ctx, events.LinksStream, other); err != nil {
		t.Fatal(err)
	}

	err := topology.Apply(ctx, js, topology.Defaults())
	if !errors.Is(err, topology.ErrConsumerImmutable) {
		t.Fatalf("apply over a consumer with another ack policy: %v, want ErrConsumerImmutable", err)
	}
	for _, want := range []string{topology.ClickCounterLinksConsumer, events.LinksStream, "ack policy", "deleting it is safe", "snipctl topology apply"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	c, err := js.Consumer(ctx, events.LinksStream, topology.ClickCounterLinksConsumer)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.CachedInfo().Config.AckPolicy; got != jetstream.AckAllPolicy {
		t.Fatalf("ack policy %s after the refused apply, want it left as it was (all)", got)
	}

	if err := js.DeleteConsumer(ctx, events.LinksStream, topology.ClickCounterLinksConsumer); err != nil {
		t.Fatal(err)
	}
	if err := topology.Apply(ctx, js, topology.Defaults()); err != nil {
		t.Fatalf("apply after the operator deleted the consumer: %v", err)
	}
	if c, err = js.Consumer(ctx, events.LinksStream, topology.ClickCounterLinksConsumer); err != nil || c.CachedInfo().Config.AckPolicy != jetstream.AckExplicitPolicy {
		t.Fatalf("consumer after apply: %v, %v; want it created with explicit acks", c, err)
	}
}

// A consumer that began elsewhere than Apply declares (the alerts' consumer
// made to start at the first alert, not at new ones) is updated in what
// Apply changes, and keeps where it began: the server refuses to change a
// deliver policy, and an existing consumer has a position of its own.
func TestApplyKeepsWhereAnExistingConsumerBegan(t *testing.T) {
	t.Parallel()
	js := testenv.StartNATS(t).JetStream(t)
	ctx := t.Context()
	if err := topology.Apply(ctx, js, topology.Defaults()); err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteConsumer(ctx, events.FraudStream, topology.WebhooksAlertsConsumer); err != nil {
		t.Fatal(err)
	}
	other := topology.WebhooksAlertsConsumerConfig()
	other.DeliverPolicy = jetstream.DeliverAllPolicy
	other.AckWait = 5 * time.Second
	if _, err := js.CreateConsumer(ctx, events.FraudStream, other); err != nil {
		t.Fatal(err)
	}
	if err := topology.Apply(ctx, js, topology.Defaults()); err != nil {
		t.Fatalf("apply over a consumer that began at the first alert: %v", err)
	}
	c, err := js.Consumer(ctx, events.FraudStream, topology.WebhooksAlertsConsumer)
	if err != nil {
		t.Fatal(err)
	}
	cfg := c.CachedInfo().Config
	if want := topology.WebhooksAlertsConsumerConfig().AckWait; cfg.AckWait != want || cfg.DeliverPolicy != jetstream.DeliverAllPolicy {
		t.Fatalf("consumer after apply: ack wait %s, deliver policy %s; want %s (updated) and all (kept)", cfg.AckWait, cfg.DeliverPolicy, want)
	}
}

// The server's refusal to update a setting in place is what refusedInPlace
// recognises (for the settings Apply cannot see differ).
func TestRefusedInPlaceIsTheServersAnswer(t *testing.T) {
	t.Parallel()
	js := testenv.StartNATS(t).JetStream(t)
	ctx := t.Context()
	if err := topology.Apply(ctx, js, topology.Defaults()); err != nil {
		t.Fatal(err)
	}
	cfg := topology.ClickCounterLinksConsumerConfig()
	cfg.AckPolicy = jetstream.AckAllPolicy
	_, err := js.UpdateConsumer(ctx, events.LinksStream, cfg)
	if err == nil || !topology.RefusedInPlace(err) {
		t.Fatalf("update of the ack policy: %v; want the server's refusal, recognised", err)
	}
	cfg = topology.ClickCounterLinksConsumerConfig()
	cfg.MaxWaiting = 7
	_, err = js.UpdateConsumer(ctx, events.LinksStream, cfg)
	if err == nil || !topology.RefusedInPlace(err) {
		t.Fatalf("update of max waiting: %v; want the server's refusal, recognised", err)
	}
	if _, err := js.UpdateConsumer(ctx, events.LinksStream, jetstream.ConsumerConfig{Durable: "nope", AckPolicy: jetstream.AckExplicitPolicy}); err == nil || topology.RefusedInPlace(err) {
		t.Fatalf("update of a consumer that does not exist: %v; want an error that is not a refusal in place", err)
	}
}
