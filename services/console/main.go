// Command console is Snip's operator console and the owners' live click
// stream. One web page shows what every reader of the system is doing (lag
// and the age of the oldest unread event per group and partition, the other
// consumers, the redirect outbox), the clicks as they arrive, fraud alerts,
// dead letters, and the warehouse's figures, with replay and redrive
// buttons. GET /api/clicks/stream streams each owner's own clicks as
// Server-Sent Events, resumable with Last-Event-ID. See README.md.
package main

import (
	"context"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/consolesessions"
	"github.com/snipdev/snip/pkg/owners"
	"github.com/snipdev/snip/pkg/service"
	"github.com/snipdev/snip/pkg/webserver"
	"github.com/snipdev/snip/services/console/internal/alerts"
	"github.com/snipdev/snip/services/console/internal/dlq"
	"github.com/snipdev/snip/services/console/internal/httpapi"
	"github.com/snipdev/snip/services/console/internal/livefeed"
	"github.com/snipdev/snip/services/console/internal/outboxstate"
	"github.com/snipdev/snip/services/console/internal/ownerstream"
	"github.com/snipdev/snip/services/console/internal/readers"
	"github.com/snipdev/snip/services/console/internal/warehouseview"
	"github.com/snipdev/snip/services/console/internal/webhookstate"
)

func main() { service.Main("console", loadConfig, run) }

// run wires the console and serves until ctx ends. Nothing waits for NATS,
// Redis or ClickHouse at start: each panel says what it cannot read. On
// shutdown the event streams end first (their clients reconnect, owners with
// Last-Event-ID), then the HTTP server and the feeds stop, NATS drains and
// the clients close (service.Run).
func run(ctx context.Context, log *slog.Logger, cfg Config) error {
	trusted, err := cfg.trustedProxies()
	if err != nil {
		return err
	}
	return service.Run(ctx, log, "console", cfg, func(ctx context.Context, g *service.Group) error {
		nc, js, err := g.NATS(cfg.NATS, "console")
		if err != nil {
			return err
		}
		rdb, err := g.Redis(cfg.Redis)
		if err != nil {
			return err
		}
		wh, err := warehouseview.Open(warehouseview.Config{
			Addrs: cfg.ClickHouseAddrs, Database: cfg.ClickHouseDatabase, User: cfg.ClickHouseUser, Password: cfg.ClickHousePassword,
		})
		if err != nil {
			return err
		}
		g.Close("clickhouse", wh.Close)

		reg := prometheus.NewRegistry()
		th := readers.Thresholds{Warn: cfg.LagWarn, Alarm: cfg.LagAlarm}
		hub := livefeed.New(js, livefeed.Config{
			Recent: cfg.LiveRecent, Buffer: cfg.LiveBuffer, MaxBrowsers: cfg.LiveMaxBrowsers, MaxRate: cfg.LiveMaxRate,
			Logger: log, Metrics: reg,
		})
		fraudAlerts := alerts.New(js, alerts.Config{Keep: cfg.AlertsKeep, Since: cfg.AlertsSince, Logger: log})
		streams := ownerstream.New(js, ownerstream.Config{
			PerOwner: cfg.OwnerStreamsPerOwner, Max: cfg.OwnerStreamsMax, Heartbeat: cfg.SSEHeartbeat,
			OpenBurst: cfg.OwnerStreamOpenBurst, OpenInterval: cfg.OwnerStreamOpenInterval,
			WriteTimeout: cfg.SSEWriteTimeout, Logger: log, Metrics: reg,
		})
		stopStreams := make(chan struct{})
		web := webserver.New(log, reg)
		err = httpapi.Register(web.Echo, httpapi.Deps{
			Readers: readers.New(js, th), Live: hub, Alerts: fraudAlerts, DeadLetters: dlq.New(js),
			Outbox: outboxstate.New(rdb, th.Level), Webhooks: webhookstate.New(rdb), Warehouse: wh, Streams: streams, Owners: owners.NewStore(rdb), KeyRecheck: cfg.OwnerKeyRecheck,
			Auth: httpapi.AuthConfig{Token: cfg.Token, Insecure: cfg.Insecure, SecureCookie: cfg.CookieSecure,
				FailureBurst: cfg.AuthFailureBurst, FailureInterval: cfg.AuthFailureInterval, TrustedProxies: trusted},
			Sessions:         consolesessions.New(js),
			Page:             httpapi.PageConfig{Refresh: cfg.Refresh, Warn: cfg.LagWarn, Alarm: cfg.LagAlarm},
			LiveWriteTimeout: cfg.SSEWriteTimeout, NATS: service.NATSReady(nc), Stop: stopStreams, Log: log, Metrics: reg,
		})
		if err != nil {
			return err
		}
		web.AddReadiness("nats", service.NATSReady(nc))
		web.AddReadiness("redis", service.RedisReady(rdb))

		// Event streams outlive any request deadline: end them as the stop
		// begins, so the HTTP server's graceful shutdown does not wait for them.
		g.OnStop(service.Intake, "event streams", func() {
			close(stopStreams)
			streams.Close()
		})
		g.Go(service.Intake, "http", g.HTTP(web))
		g.Go(service.Intake, "live clicks", hub.Run)
		g.Go(service.Intake, "fraud alerts", fraudAlerts.Run)
		return nil
	})
}
