package topology

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
)

// GroupWebhooks is the webhooks service's consumer group on CLICKS.
const GroupWebhooks = "webhooks"

// WebhooksAlertsConsumer reads the fraud alerts the webhooks service sends
// to owners' endpoints.
const WebhooksAlertsConsumer = "webhooks-alerts"

// WebhooksDisabledSubjectPrefix is where the webhooks service announces an
// endpoint it disabled: webhooks.disabled.<owner> (core NATS).
const WebhooksDisabledSubjectPrefix = "webhooks.disabled."

// WebhooksAlertsConsumerConfig is a durable consumer on fraud alerts, from
// the new ones on (endpoints are created later than most alerts; a replay
// covers the past), shared by all webhooks instances.
func WebhooksAlertsConsumerConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       WebhooksAlertsConsumer,
		Description:   "Webhooks: fraud alerts for owners' endpoints",
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverNewPolicy,
		FilterSubject: events.FraudAlertSubjects,
		AckWait:       30 * time.Second,
		MaxDeliver:    -1,
		MaxAckPending: 1000,
	}
}

// ApplyWebhooks creates or updates the webhooks service's FRAUD consumer.
// The streams must exist (Apply first).
func ApplyWebhooks(ctx context.Context, js jetstream.JetStream) error {
	return applyConsumers(ctx, js, webhooksConsumers(), Options{})
}

// webhooksConsumers are the webhooks service's consumers.
func webhooksConsumers() []Consumer {
	return []Consumer{{events.FraudStream, WebhooksAlertsConsumerConfig()}}
}
