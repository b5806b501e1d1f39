package service

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// A service whose SNIP_CLICKS_MAX_AGE is shorter than the CLICKS the
// operator applied stops at start with topology.ErrRetentionShrinks, as for
// a partition count that contradicts the stream, rather than retrying until
// it is stopped: no retry cures it. CLICKS keeps its age limit.
func TestPrepareStopsAtARetentionThatWouldShrinkTheStream(t *testing.T) {
	t.Parallel()
	ns := testenv.StartNATS(t)
	js := ns.JetStream(t)
	operator := Topology{ApplyTopology: true, Partitions: 4, Replicas: 1, ClicksMaxAge: 30 * 24 * time.Hour, ClicksMaxBytes: -1}
	if err := topology.Apply(t.Context(), js, operator.Options()); err != nil {
		t.Fatal(err)
	}
	svc := operator
	svc.ClicksMaxAge = 168 * time.Hour
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	err := svc.Prepare(ctx, discard, js)
	if !errors.Is(err, topology.ErrRetentionShrinks) || ctx.Err() != nil {
		t.Fatalf("Prepare = %v (context: %v), want ErrRetentionShrinks at once", err, ctx.Err())
	}
	s, err := js.Stream(t.Context(), "CLICKS")
	if err != nil {
		t.Fatal(err)
	}
	if got := s.CachedInfo().Config.MaxAge; got != operator.ClicksMaxAge {
		t.Fatalf("CLICKS max age %s after the service's start, want %s", got, operator.ClicksMaxAge)
	}
}

// A service started without the cluster's SNIP_REPLICAS stops at start with
// topology.ErrReplicasLowered rather than scaling every stream down to one
// copy, or retrying until it is stopped. CLICKS keeps its three replicas.
func TestPrepareStopsAtFewerReplicasThanTheStreamsHave(t *testing.T) {
	t.Parallel()
	c := testenv.StartNATSCluster(t)
	js := c.JetStream(t)
	operator := Topology{ApplyTopology: true, Partitions: 2, Replicas: 3, ClicksMaxAge: 168 * time.Hour, ClicksMaxBytes: -1}
	c.ApplyTopology(t, js, operator.Options())
	svc := operator
	svc.Replicas = 1
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	err := svc.Prepare(ctx, discard, js)
	if !errors.Is(err, topology.ErrReplicasLowered) || ctx.Err() != nil {
		t.Fatalf("Prepare = %v (context: %v), want ErrReplicasLowered at once", err, ctx.Err())
	}
	s, err := js.Stream(t.Context(), "CLICKS")
	if err != nil {
		t.Fatal(err)
	}
	if got := s.CachedInfo().Config.Replicas; got != 3 {
		t.Fatalf("CLICKS has %d replicas after the service's start, want 3", got)
	}
}

// A consumer that exists with a setting the server cannot update in place
// (the webhooks' alerts consumer with another ack policy) stops a service at
// start with topology.ErrConsumerImmutable, naming the consumer, from Apply
// and from the service's own consumers alike, rather than retrying the
// server's refusal until it is stopped.
func TestPrepareStopsAtAConsumerTheServerCannotUpdate(t *testing.T) {
	t.Parallel()
	ns := testenv.StartNATS(t)
	js := ns.JetStream(t)
	svc := Topology{ApplyTopology: true, Partitions: 4, Replicas: 1, ClicksMaxAge: 168 * time.Hour, ClicksMaxBytes: -1}
	if err := topology.Apply(t.Context(), js, svc.Options()); err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteConsumer(t.Context(), events.FraudStream, topology.WebhooksAlertsConsumer); err != nil {
		t.Fatal(err)
	}
	other := topology.WebhooksAlertsConsumerConfig()
	other.AckPolicy = jetstream.AckAllPolicy
	if _, err := js.CreateConsumer(t.Context(), events.FraudStream, other); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		svc  Topology
	}{{"apply", svc}, {"own consumers", Topology{}}} {
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		err := tc.svc.Prepare(ctx, discard, js, topology.ApplyWebhooks)
		if !errors.Is(err, topology.ErrConsumerImmutable) || !strings.Contains(err.Error(), topology.WebhooksAlertsConsumer) || ctx.Err() != nil {
			t.Errorf("%s: Prepare = %v (context: %v), want ErrConsumerImmutable naming %s at once", tc.name, err, ctx.Err(), topology.WebhooksAlertsConsumer)
		}
		cancel()
	}
}
