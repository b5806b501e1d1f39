package topology_test

import (
	"slices"
	"testing"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

func TestApplyClickCounterDeclaresItsConsumers(t *testing.T) {
	t.Parallel()
	js := testenv.StartNATS(t).JetStream(t)
	ctx := t.Context()
	if err := topology.Apply(ctx, js, topology.Defaults()); err != nil {
		t.Fatal(err)
	}
	for range 2 { // idempotent
		if err := topology.ApplyClickCounter(ctx, js); err != nil {
			t.Fatalf("apply: %v", err)
		}
	}
	for stream, name := range map[string]string{
		events.LinksStream:         topology.ClickCounterLinksConsumer,
		events.FraudVerdictsStream: topology.ClickCounterVerdictsConsumer,
	} {
		c, err := js.Consumer(ctx, stream, name)
		if err != nil {
			t.Fatalf("consumer %s on %s: %v", name, stream, err)
		}
		if c.CachedInfo().Config.Durable != name {
			t.Errorf("consumer %s: durable %q", name, c.CachedInfo().Config.Durable)
		}
	}
	// The verdict consumer sees verdicts (a message of many labels, and a
	// single verdict of an older detector), not alerts.
	if _, err := js.Publish(ctx, events.FraudAlertSubject("abc"), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, events.FraudVerdictSubject("acme", "abc"), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, events.FraudVerdictBatchSubject(3), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	c, err := js.Consumer(ctx, events.FraudVerdictsStream, topology.ClickCounterVerdictsConsumer)
	if err != nil {
		t.Fatal(err)
	}
	// What it is sent, not its NumPending, which the server counts a moment
	// after it acks the publishes: every stored message is deliverable.
	mb, err := c.FetchNoWait(10)
	if err != nil {
		t.Fatal(err)
	}
	var subjects []string
	for m := range mb.Messages() {
		subjects = append(subjects, m.Subject())
	}
	if want := []string{events.FraudVerdictSubject("acme", "abc"), events.FraudVerdictBatchSubject(3)}; !slices.Equal(subjects, want) {
		t.Fatalf("the verdict consumer is sent %q, want %q (the verdicts, not the alert)", subjects, want)
	}
}
