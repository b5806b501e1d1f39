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
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/natsconn"
	"github.com/snipdev/snip/pkg/owners"
	"github.com/snipdev/snip/pkg/redisconn"
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

func main() {
	if len(os.Args) > 1 && os.Args[1] == "healthcheck" {
		cfg, err := loadConfig(os.Environ())
		if err == nil {
			err = webserver.Probe(cfg.HTTPAddr)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "console healthcheck:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	cfg, err := loadConfig(os.Environ())
	if err != nil {
		fmt.Fprintln(os.Stderr, "console:", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	if err := run(ctx, log, cfg); err != nil {
		log.Error("console stopped", "err", err)
		stop()
		os.Exit(1)
	}
}

// run wires the console and serves until ctx ends. Nothing waits for NATS,
// Redis or ClickHouse at start: each panel says what it cannot read. On
// shutdown the event streams end first (their clients reconnect, owners with
// Last-Event-ID), then the HTTP server stops, then the clients close.
func run(ctx context.Context, log *slog.Logger, cfg Config) error {
	log.Info("starting console", "config", cfg)
	trusted, err := cfg.trustedProxies()
	if err != nil {
		return err
	}

	nc, err := natsconn.Connect(cfg.nats(), log)
	if err != nil {
		return err
	}
	defer natsconn.DrainWithin(nc, cfg.ShutdownTimeout, log)
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	rdb, err := redisconn.Open(cfg.RedisURL)
	if err != nil {
		return err
	}
	defer rdb.Close()
	wh, err := warehouseview.Open(warehouseview.Config{
		Addrs: cfg.ClickHouseAddrs, Database: cfg.ClickHouseDatabase, User: cfg.ClickHouseUser, Password: cfg.ClickHousePassword,
	})
	if err != nil {
		return err
	}
	defer wh.Close()

	reg := prometheus.NewRegistry()
	th := readers.Thresholds{Warn: cfg.LagWarn, Alarm: cfg.LagAlarm}
	hub := livefeed.New(js, livefeed.Config{
		Recent: cfg.LiveRecent, Buffer: cfg.LiveBuffer, MaxBrowsers: cfg.LiveMaxBrowsers, MaxRate: cfg.LiveMaxRate,
		Logger: log, Metrics: reg,
	})
	fraudAlerts := alerts.New(js, alerts.Config{Keep: cfg.AlertsKeep, Since: cfg.AlertsSince, Logger: log})
	streams := ownerstream.New(js, ownerstream.Config{
		PerOwner: cfg.OwnerStreamsPerOwner, Max: cfg.OwnerStreamsMax, Heartbeat: cfg.SSEHeartbeat,
		WriteTimeout: cfg.SSEWriteTimeout, Logger: log, Metrics: reg,
	})
	stopStreams := make(chan struct{})

	web := webserver.New(log, reg)
	err = httpapi.Register(web.Echo, httpapi.Deps{
		Readers: readers.New(js, th), Live: hub, Alerts: fraudAlerts, DeadLetters: dlq.New(js),
		Outbox: outboxstate.New(rdb, th.Level), Webhooks: webhookstate.New(rdb), Warehouse: wh, Streams: streams, Owners: owners.NewStore(rdb), KeyRecheck: cfg.OwnerKeyRecheck,
		Auth: httpapi.AuthConfig{Token: cfg.Token, Insecure: cfg.Insecure, SecureCookie: cfg.CookieSecure,
			FailureBurst: cfg.AuthFailureBurst, FailureInterval: cfg.AuthFailureInterval, TrustedProxies: trusted},
		Page:             httpapi.PageConfig{Refresh: cfg.Refresh, Warn: cfg.LagWarn, Alarm: cfg.LagAlarm},
		LiveWriteTimeout: cfg.SSEWriteTimeout, Stop: stopStreams, Log: log, Metrics: reg,
	})
	if err != nil {
		return err
	}
	web.AddReadiness("nats", func(context.Context) error {
		if st := nc.Status(); st != nats.CONNECTED {
			return fmt.Errorf("nats %s", st)
		}
		return nil
	})
	web.AddReadiness("redis", func(ctx context.Context) error { return redisconn.Ping(ctx, rdb) })

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Event streams outlive any request deadline: end them as soon as the
	// service stops, so the HTTP server's graceful shutdown does not wait
	// for them.
	stopAfter := context.AfterFunc(runCtx, func() {
		close(stopStreams)
		streams.Close()
	})
	defer stopAfter()
	var wg sync.WaitGroup
	errc := make(chan error, 3)
	start := func(name string, f func(ctx context.Context) error) {
		wg.Go(func() {
			if err := f(runCtx); err != nil {
				errc <- fmt.Errorf("%s: %w", name, err)
				cancel()
			}
		})
	}
	start("http", func(ctx context.Context) error {
		return web.Serve(ctx, cfg.HTTPAddr, cfg.Ready, cfg.ShutdownTimeout)
	})
	start("live clicks", hub.Run)
	start("fraud alerts", fraudAlerts.Run)

	<-runCtx.Done()
	log.Info("stopping console")
	wg.Wait()
	close(errc)
	var errs []error
	for err := range errc {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
