package check

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// The webhooks user reads its group (and narrows its consumers' filters)
// and its FRAUD alerts consumer, replays
// CLICKS and FRAUD with ordered consumers, announces disabled endpoints, and
// can publish nothing else.
func TestWebhooksUserHasWhatItNeedsAndNoMore(t *testing.T) {
	url := startDeployServer(t)
	ctx := t.Context()
	admin := connectAs(t, url, "admin")
	if err := topology.Apply(ctx, admin.js, topology.Defaults()); err != nil {
		t.Fatalf("admin: topology apply: %v", err)
	}
	c := connectAs(t, url, "webhooks")
	if err := topology.Apply(ctx, c.js, topology.Defaults()); err != nil {
		t.Fatalf("topology check with the read-only path: %v", err)
	}
	if err := topology.ApplyWebhooks(ctx, c.js); err != nil {
		t.Fatalf("webhooks consumer check: %v", err)
	}
	var handled atomic.Int64
	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- reader.Run(rctx, c.js, reader.Config{Group: topology.GroupWebhooks, Member: "m", LeaseTTL: time.Second},
			func(_ context.Context, _ int, b []reader.Event) error { handled.Add(int64(len(b))); return nil })
	}()
	publishClick(t, admin.js, "acme", "kwebhooks")
	testenv.WaitFor(t, 30*time.Second, "webhooks handles clicks as its group", func() bool { return handled.Load() >= 1 })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// It narrows its group's consumers to the owners with click endpoints:
	// one filter (the subject-suffixed create) and several (the plain one).
	for v, in := range []topology.Interest{{"acme": nil}, {"acme": nil, "bob": nil}, {}} {
		if _, err := topology.NarrowGroup(ctx, c.js, topology.GroupWebhooks, topology.DefaultPartitions, in, int64(v+1)); err != nil {
			t.Fatalf("narrow the webhooks group to %v: %v", in, err)
		}
	}
	if _, err := admin.js.Publish(ctx, events.FraudAlertSubject("kwebhooks"), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	cc, err := c.js.Consumer(ctx, events.FraudStream, topology.WebhooksAlertsConsumer)
	if err != nil {
		t.Fatalf("alerts consumer: %v", err)
	}
	for _, m := range fetchAll(t, cc, 1) {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatalf("ack alert: %v", err)
		}
	}
	for _, stream := range []struct{ name, filter string }{
		{events.ClicksStream, "*.clicks.acme.*"}, {events.FraudStream, events.FraudAlertSubjects},
	} {
		oc, err := c.js.OrderedConsumer(ctx, stream.name, jetstream.OrderedConsumerConfig{FilterSubjects: []string{stream.filter}})
		if err != nil {
			t.Fatalf("ordered consumer on %s: %v", stream.name, err)
		}
		fetchAll(t, oc, 1)
	}
	if err := c.nc.Publish(topology.WebhooksDisabledSubjectPrefix+"acme", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	c.noViolations(t, "webhooks")
	_ = c.nc.Publish("clicks.acme.forged", nil)
	c.violated(t, "webhooks", "clicks.acme.forged")
	_ = c.nc.Publish("fraud.alerts.forged", nil)
	c.violated(t, "webhooks", "fraud.alerts.forged")
}
