package topology_test

import (
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

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
	// What it is sent, in stream order: the first two messages, fetched
	// until they come (the server signals its consumers a moment after it
	// acks a publish: a fetch that asks for no wait right after the
	// publishes can find nothing yet). The alert was stored first, so a
	// consumer that is sent it is sent it first.
	var subjects []string
	deadline := time.Now().Add(10 * time.Second)
	for len(subjects) < 2 && time.Now().Before(deadline) {
		mb, err := c.Fetch(2-len(subjects), jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range mb.Messages() {
			subjects = append(subjects, m.Subject())
		}
	}
	if want := []string{events.FraudVerdictSubject("acme", "abc"), events.FraudVerdictBatchSubject(3)}; !slices.Equal(subjects, want) {
		t.Fatalf("the verdict consumer is sent %q, want %q (the verdicts, not the alert)", subjects, want)
	}
}
