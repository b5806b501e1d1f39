package topology_test

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

func TestApplyDeclaresTheWebhooksAlertsConsumer(t *testing.T) {
	t.Parallel()
	js := testenv.StartNATS(t).JetStream(t)
	ctx := t.Context()
	for range 2 { // idempotent
		if err := topology.Apply(ctx, js, topology.Defaults()); err != nil {
			t.Fatalf("apply: %v", err)
		}
	}
	c, err := js.Consumer(ctx, events.FraudStream, topology.WebhooksAlertsConsumer)
	if err != nil {
		t.Fatal(err)
	}
	cfg := c.CachedInfo().Config
	if cfg.FilterSubject != events.FraudAlertSubjects || cfg.AckPolicy != jetstream.AckExplicitPolicy {
		t.Errorf("consumer %s: filter %q ack %v, want %q and explicit acks", topology.WebhooksAlertsConsumer, cfg.FilterSubject, cfg.AckPolicy, events.FraudAlertSubjects)
	}
}
