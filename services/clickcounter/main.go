// Command clickcounter counts clicks: it reads CLICKS as the consumer group
// "click-counter", keeps per-link counts in Redis exactly once, applies fraud
// verdicts as corrections, rebuilds its counts when replayed, and serves
// them at GET /api/links/:code/stats. See README.md.
package main

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/owners"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/service"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/pkg/webserver"
	"github.com/snipdev/snip/services/clickcounter/internal/counter"
	"github.com/snipdev/snip/services/clickcounter/internal/httpapi"
	"github.com/snipdev/snip/services/clickcounter/internal/jsfeed"
	"github.com/snipdev/snip/services/clickcounter/internal/redisstore"
)

func main() { service.Main("clickcounter", loadConfig, run) }

// run starts the counter once NATS and Redis answer, and runs it until ctx
// ends or a component fails; then HTTP, the reader and the feeds stop and
// finish what they hold (requests, the batch in hand, feed messages), the
// janitor stops, NATS drains and Redis closes (service.Run).
func run(ctx context.Context, log *slog.Logger, cfg Config) error {
	return service.Run(ctx, log, "clickcounter", cfg, func(ctx context.Context, g *service.Group) error {
		nc, js, err := g.NATS(cfg.NATS, "clickcounter")
		if err != nil {
			return err
		}
		rdb, err := g.Redis(cfg.Redis)
		if err != nil {
			return err
		}
		if err := cfg.Topology.Prepare(ctx, log, js, topology.ApplyClickCounter); err != nil {
			return err
		}
		ownerStore := owners.NewStore(rdb)
		if err := cfg.Owners.Bootstrap(ctx, log, ownerStore); err != nil {
			return err
		}
		var partitions int
		var maxAge time.Duration
		if err := service.Retry(ctx, log, "read CLICKS", func(ctx context.Context) error {
			s, err := js.Stream(ctx, events.ClicksStream)
			if err != nil {
				return err
			}
			maxAge = s.CachedInfo().Config.MaxAge
			partitions, err = topology.Partitions(ctx, js)
			return err
		}); err != nil {
			return err
		}
		if maxAge <= 0 {
			// Snip's topology always gives CLICKS an age limit; one
			// lifted by hand (MaxAge 0) is refused here with what to do,
			// not counted: a verdict's label is kept for as long as CLICKS
			// may hold its click (a recount counts it again under it), so
			// without a limit every label would be kept for ever.
			return errors.New("CLICKS has no age limit (MaxAge 0): the click counter needs one; set SNIP_CLICKS_MAX_AGE and apply the topology (snipctl topology apply --shrink-retention: CLICKS then discards what is older)")
		}

		reg := prometheus.NewRegistry()
		store := redisstore.New(rdb)
		store.WaitForReplicas(cfg.WaitReplicas, cfg.WaitReplicasTimeout)
		c, err := counter.New(counter.Options{
			Store: store, Clicks: jsfeed.Clicks{JS: js}, Partitions: partitions,
			DedupWindow: cfg.DedupWindow, ClicksMaxAge: maxAge, Logger: log, Metrics: reg, Hooks: cfg.Hooks,
		})
		if err != nil {
			return err
		}
		fm, err := jsfeed.NewMetrics(reg)
		if err != nil {
			return err
		}
		web := webserver.New(log, reg)
		httpapi.Register(web.Echo, ownerStore, c, log)
		web.AddReadiness("redis", service.RedisReady(rdb))
		web.AddReadiness("nats", service.NATSReady(nc))

		g.Go(service.Intake, "http", g.HTTP(web))
		g.Go(service.Intake, "reader", func(ctx context.Context) error {
			return reader.Run(ctx, js, reader.Config{
				Group: topology.GroupClickCounter, Member: cfg.Member, Partitions: partitions,
				BatchSize: cfg.BatchSize, Linger: cfg.Linger, LeaseTTL: cfg.LeaseTTL, DrainTimeout: cfg.ShutdownTimeout,
				Start:    reader.StartAtOldest(),
				OnAssign: c.OnAssign, OnRevoke: c.OnRevoke, OnRewind: c.OnRewind, OnPassed: c.OnPassed,
				Logger: log, Metrics: reg,
			}, c.HandleBatch)
		})
		for _, f := range feeds(c, log, cfg.ShutdownTimeout) {
			g.Go(service.Intake, f.Name, func(ctx context.Context) error { return f.Run(ctx, js, fm) })
		}
		g.Go(service.Work, "janitor", func(ctx context.Context) error { c.RunJanitor(ctx); return nil })
		return nil
	})
}

// feeds are the counter's LINKS and FRAUD_VERDICTS feeds (the benchmarks run
// them as run does). Each creates its consumer again, as the topology
// declares it, if an operator deletes it: a replay from the stream's start
// applies nothing twice (link events and labels are applied by sequence).
func feeds(c *counter.Counter, log *slog.Logger, drain time.Duration) []jsfeed.Feed {
	fs := []jsfeed.Feed{
		{Name: "links", Stream: events.LinksStream, Consumer: topology.ClickCounterLinksConsumer,
			Declared: topology.ClickCounterLinksConsumerConfig(), Handle: jsfeed.Links(c.ApplyLinkEvents)},
		{Name: "verdicts", Stream: events.FraudVerdictsStream, Consumer: topology.ClickCounterVerdictsConsumer,
			Declared: topology.ClickCounterVerdictsConsumerConfig(), Handle: jsfeed.Verdicts(c.ApplyVerdicts)},
	}
	for i := range fs {
		fs[i].Source, fs[i].Log, fs[i].DrainTimeout = topology.GroupClickCounter, log, drain
	}
	return fs
}
