// Command webhooks delivers owners' events to their own HTTPS endpoints: it
// reads CLICKS as the consumer group "webhooks" and fraud alerts from FRAUD,
// copies each event into the queue of every endpoint that wants it, and
// sends each endpoint's queue in signed batches (Standard Webhooks), retried
// with backoff, one sender per endpoint so that a slow or dead endpoint
// delays no other. It serves the owner API at /api/webhooks/endpoints. See
// README.md.
package main

import (
	"context"
	"encoding/json"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/netguard"
	"github.com/snipdev/snip/pkg/owners"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/service"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/pkg/webserver"
	"github.com/snipdev/snip/services/webhooks/internal/delivery"
	"github.com/snipdev/snip/services/webhooks/internal/endpoint"
	"github.com/snipdev/snip/services/webhooks/internal/httpapi"
	"github.com/snipdev/snip/services/webhooks/internal/redisstore"
)

func main() { service.Main("webhooks", loadConfig, run) }

// run starts the service once NATS and Redis answer, and runs it until ctx
// ends or a component fails; then intake stops (HTTP; the batch in hand is
// queued and acked), senders stop (each starts no other POST; the one in
// flight finishes and is recorded, a delivered batch leaving the queue,
// within ShutdownTimeout; one cut short then stays recorded in flight and
// is sent again, with the same webhook-id, by whoever takes the endpoint
// next), NATS drains and Redis closes (service.Run).
func run(ctx context.Context, log *slog.Logger, cfg Config) error {
	return service.Run(ctx, log, "webhooks", cfg, func(ctx context.Context, g *service.Group) error {
		member := cfg.member()
		nc, js, err := g.NATS(cfg.NATS, "webhooks")
		if err != nil {
			return err
		}
		rdb, err := g.Redis(cfg.Redis)
		if err != nil {
			return err
		}
		if err := cfg.Topology.Prepare(ctx, log, js, topology.ApplyWebhooks); err != nil {
			return err
		}
		ownerStore := owners.NewStore(rdb)
		if err := cfg.Owners.Bootstrap(ctx, log, ownerStore); err != nil {
			return err
		}
		partitions, err := service.Partitions(ctx, log, js)
		if err != nil {
			return err
		}

		reg := prometheus.NewRegistry()
		metrics, err := delivery.NewMetrics(reg)
		if err != nil {
			return err
		}
		store := redisstore.New(rdb, cfg.MaxBacklog)
		if cfg.WaitReplicas > 0 {
			short := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "snip", Subsystem: "webhooks", Name: "replica_wait_short_total",
				Help: "Writes (op: enqueue, put) whose Redis replicas did not confirm them within WEBHOOKS_WAIT_REPLICAS_TIMEOUT: acked or answered all the same, on the master alone until its replicas catch up."},
				[]string{"op"})
			reg.MustRegister(short)
			store.WaitForReplicas(cfg.WaitReplicas, cfg.WaitReplicasTimeout, func(op string, err error) {
				short.WithLabelValues(op).Inc()
				log.Warn("the Redis replicas did not confirm a write in time; it is on the master only", "op", op, "err", err)
			})
		}
		dialer := netguard.NewDialer(netguard.NewPolicy(cfg.AllowCIDRs), cfg.Resolver, cfg.ConnectTimeout)
		client := delivery.NewClient(delivery.ClientConfig{
			Timeout: cfg.Timeout, ConnectTimeout: cfg.ConnectTimeout, MaxResponseBytes: cfg.MaxResponseBytes,
			ResponseKept: 512, UserAgent: cfg.UserAgent, Dialer: dialer,
		})
		sender := delivery.NewSender(store, client, delivery.SenderConfig{
			Schedule: cfg.RetrySchedule, Jitter: cfg.RetryJitter, DisableAfter: cfg.DisableAfter,
			MaxBatchBytes: cfg.MaxBatchBytes, Poll: cfg.Poll,
		}, metrics, log)
		sender.OnDisabled = func(_ context.Context, e endpoint.Endpoint) {
			b, _ := json.Marshal(map[string]any{"endpoint": e.ID, "owner": e.Owner, "url": e.URL,
				"disabled_at": e.DisabledAt, "reason": e.DisabledReason})
			if err := nc.Publish(topology.WebhooksDisabledSubjectPrefix+e.Owner, b); err != nil {
				log.Warn("webhooks: announce disabled endpoint", "endpoint", e.ID, "err", err)
			}
		}
		manager := delivery.NewManager(store, sender, member, cfg.LeaseTTL, log)
		manager.StopWait = cfg.ShutdownTimeout
		intake := delivery.NewIntake(store, metrics)
		intake.Notify = manager.Wake
		replayer := delivery.NewReplayer(js, store, intake, log, delivery.ReplayerConfig{
			Pending: 16, Partitions: partitions, Instance: member, LeaseTTL: cfg.LeaseTTL,
		})
		narrower := delivery.NewNarrower(store, js, topology.GroupWebhooks, partitions, member, log)
		admin := &delivery.Admin{
			Store: store, Client: client, Dialer: dialer, Replayer: replayer, Intake: intake, Narrower: narrower,
			RotationOverlap: cfg.RotationOverlap, MaxPerOwner: cfg.MaxEndpointsPerOwner,
			Rules: endpoint.Rules{HTTPHosts: cfg.HTTPHosts, DefaultBatchMax: cfg.BatchMax, DefaultBatchWait: cfg.BatchWait},
		}
		web := webserver.New(log, reg)
		httpapi.Register(web.Echo, ownerStore, admin, log)
		web.AddReadiness("redis", service.RedisReady(rdb))
		web.AddReadiness("nats", service.NATSReady(nc))

		g.Go(service.Intake, "http", g.HTTP(web))
		g.Go(service.Intake, "reader", func(ctx context.Context) error {
			return reader.Run(ctx, js, reader.Config{
				Group: topology.GroupWebhooks, Member: member, Partitions: partitions,
				LeaseTTL: cfg.LeaseTTL, DrainTimeout: cfg.ShutdownTimeout,
				Start:  reader.StartAtNew(),
				Logger: log, Metrics: reg,
			}, intake.HandleClicks)
		})
		g.Go(service.Intake, "alerts", func(ctx context.Context) error {
			return delivery.ConsumeAlerts(ctx, js, topology.WebhooksAlertsConsumer, intake, log, cfg.ShutdownTimeout)
		})
		g.Go(service.Intake, "replayer", replayer.Run)
		g.Go(service.Intake, "narrower", narrower.Run)
		g.Go(service.Work, "senders", manager.Run)
		return nil
	})
}
