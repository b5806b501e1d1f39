// Command preview is Snip's preview worker: one of any number of competing
// consumers of the PREVIEW_JOBS work queue. For each job it fetches the link's
// target page safely, extracts title, description, image and site name, and
// stores them in Redis; it retries transient failures with backoff and parks
// the rest on DEAD_LETTER. See README.md.
package main

import (
	"context"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/service"
	"github.com/snipdev/snip/pkg/webserver"
	"github.com/snipdev/snip/pkg/workqueue"
	"github.com/snipdev/snip/services/preview/internal/fetch"
	"github.com/snipdev/snip/services/preview/internal/preview"
	"github.com/snipdev/snip/services/preview/internal/redisstore"
)

func main() { service.Main("preview", loadConfig, run) }

// run wires the worker and runs it until ctx ends or a component fails;
// then HTTP and the queue stop together (the queue lets jobs in hand finish
// within cfg.ShutdownTimeout), NATS drains and Redis closes (service.Run).
// The topology is applied by the queue's component, so the service's own
// routes and readiness checks (the queue's) answer while it waits for NATS.
func run(ctx context.Context, log *slog.Logger, cfg Config) error {
	return service.Run(ctx, log, "preview", cfg, func(ctx context.Context, g *service.Group) error {
		nc, js, err := g.NATS(cfg.NATS, "preview")
		if err != nil {
			return err
		}
		rdb, err := g.Redis(cfg.Redis)
		if err != nil {
			return err
		}
		reg := prometheus.NewRegistry()
		web := webserver.New(log, reg)
		web.Echo.HTTPErrorHandler = webserver.ErrorHandler(log, nil)
		svc := preview.New(redisstore.New(rdb), fetch.New(cfg.fetch()), log, reg)
		qcfg := cfg.queue(log, reg)
		qcfg.Done = svc.Done
		q := workqueue.New(js, qcfg, svc.Process, svc.OnDead)
		web.AddReadiness("nats", service.NATSReady(nc))
		web.AddReadiness("redis", service.RedisReady(rdb))
		web.AddReadiness("queue", q.Ready)

		g.Go(service.Intake, "http", g.HTTP(web))
		g.Go(service.Intake, "queue", func(ctx context.Context) error {
			if err := cfg.Topology.Prepare(ctx, log, js); err != nil {
				return err
			}
			return q.Run(ctx)
		})
		return nil
	})
}
