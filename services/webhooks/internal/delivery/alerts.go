package delivery

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
)

// ConsumeAlerts reads fraud alerts from the durable consumer consumer on
// FRAUD and routes each to its owner's endpoints, until ctx ends. An alert
// is acked once queued; a Redis failure naks it with a delay; a payload
// that is not an alert is terminated (it can never be routed). When ctx
// ends it stops pulling and, for at most drain, queues and acks the alerts
// already delivered to it: their Redis calls run on a context that ends
// only then, not on ctx, which would fail each of them (and nak the alert
// for another instance to take once its delay passed).
func ConsumeAlerts(ctx context.Context, js jetstream.JetStream, consumer string, in *Intake, log *slog.Logger, drain time.Duration) error {
	c, err := js.Consumer(ctx, events.FraudStream, consumer)
	if err != nil {
		return fmt.Errorf("fraud alerts consumer: %w", err)
	}
	hctx, cancelHandling := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHandling()
	cc, err := c.Consume(func(m jetstream.Msg) {
		a, err := events.DecodeFraudAlert(m.Data())
		if err != nil {
			log.Warn("webhooks: bad fraud alert, terminated", "subject", m.Subject(), "err", err)
			_ = m.Term()
			return
		}
		md, err := m.Metadata()
		if err != nil {
			_ = m.Nak()
			return
		}
		if err := in.HandleAlert(hctx, md.Sequence.Stream, a, m.Data()); err != nil {
			log.Warn("webhooks: route fraud alert", "id", a.ID, "err", err)
			_ = m.NakWithDelay(time.Second)
			return
		}
		_ = m.Ack()
	})
	if err != nil {
		return fmt.Errorf("fraud alerts consume: %w", err)
	}
	<-ctx.Done()
	cc.Drain()
	select {
	case <-cc.Closed():
	case <-time.After(drain):
	}
	return nil
}
