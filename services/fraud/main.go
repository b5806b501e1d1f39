// Command fraud is Snip's fraud detection: a stateful reader of CLICKS, in
// its own consumer group, that spots bots by the clicks they leave (bursts by
// one visitor, floods on one link, bot and unfurler user agents, listed
// networks), publishes alerts on FRAUD and verdicts (one message per batch,
// many labels) on FRAUD_VERDICTS, and serves
// each owner's alerts and flagged share over HTTP. See README.md.
package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/owners"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/service"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/pkg/webserver"
	"github.com/snipdev/snip/services/fraud/internal/clicklog"
	"github.com/snipdev/snip/services/fraud/internal/fraud"
	"github.com/snipdev/snip/services/fraud/internal/fraudpub"
	"github.com/snipdev/snip/services/fraud/internal/httpapi"
	"github.com/snipdev/snip/services/fraud/internal/kvorigin"
	"github.com/snipdev/snip/services/fraud/internal/redisstore"
)

func main() { service.Main("fraud", loadConfig, run) }

// run wires the service once NATS and Redis answer, and runs it until ctx
// ends or a component fails. On the way out the reader stops taking events
// (it finishes, publishes, stores and acks the batch in hand within
// ShutdownTimeout) as the HTTP server stops; then NATS drains and Redis
// closes (service.Run).
func run(ctx context.Context, log *slog.Logger, cfg Config) error {
	return service.Run(ctx, log, "fraud detection", cfg, func(ctx context.Context, g *service.Group) error {
		rules, err := cfg.rules()
		if err != nil {
			return err
		}
		start, err := cfg.start(time.Now())
		if err != nil {
			return err
		}
		nc, js, err := g.NATS(cfg.NATS, "fraud")
		if err != nil {
			return err
		}
		rdb, err := g.Redis(cfg.Redis)
		if err != nil {
			return err
		}
		if err := cfg.Topology.Prepare(ctx, log, js); err != nil {
			return err
		}
		partitions, err := service.Partitions(ctx, log, js)
		if err != nil {
			return err
		}
		ownerStore := owners.NewStore(rdb)
		if err := cfg.Owners.Bootstrap(ctx, log, ownerStore); err != nil {
			return err
		}

		det, err := fraud.NewDetector(rules)
		if err != nil {
			return err
		}
		pub, err := fraudpub.New(nc, cfg.PublishWindow, cfg.PublishTimeout)
		if err != nil {
			return err
		}
		store := redisstore.New(rdb, partitions, cfg.AlertsPerOwner)
		reg := prometheus.NewRegistry()
		if cfg.WaitReplicas > 0 {
			short := prometheus.NewCounter(prometheus.CounterOpts{Name: "snip_fraud_replica_wait_short_total",
				Help: "Batches whose statistics and alerts the Redis replicas did not confirm within FRAUD_WAIT_REPLICAS_TIMEOUT before the ack: acked all the same, on the master alone until its replicas catch up."})
			reg.MustRegister(short)
			store.WaitForReplicas(cfg.WaitReplicas, cfg.WaitReplicasTimeout, func(p int, err error) {
				short.Inc()
				log.Warn("the Redis replicas did not confirm a batch's statistics in time; they are on the master only", "partition", p, "err", err)
			})
		}
		origins := kvorigin.New(js, topology.GroupFraudDetection)
		rd := fraud.NewReader(det, clicklog.New(js, partitions), pub, store, origins, log, fraud.NewMetrics(reg))
		web := webserver.New(log, reg)
		web.AddReadiness("nats", service.NATSReady(nc))
		web.AddReadiness("redis", service.RedisReady(rdb))
		httpapi.New(ownerStore, store, log, cfg.AlertsPerOwner).Mount(web.Echo)

		g.Go(service.Intake, "http", g.HTTP(web))
		g.Go(service.Intake, "read clicks", func(ctx context.Context) error {
			return reader.Run(ctx, js, reader.Config{
				Group: topology.GroupFraudDetection, Member: cfg.Member, Partitions: partitions,
				BatchSize: cfg.BatchSize, LeaseTTL: cfg.LeaseTTL, DrainTimeout: cfg.ShutdownTimeout, Start: start,
				OnAssign: rd.OnAssign, OnRevoke: rd.OnRevoke, OnRewind: rd.OnRewind,
				Logger: log.With("component", "reader"), Metrics: reg,
			}, rd.Handle)
		})
		log.Info("fraud detection running", "partitions", partitions, "memory", det.Memory())
		return nil
	})
}
