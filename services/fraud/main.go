// Command fraud is Snip's fraud detection: a stateful reader of CLICKS, in
// its own consumer group, that spots bots by the clicks they leave (bursts by
// one visitor, floods on one link, bot and unfurler user agents, listed
// networks), publishes alerts and per-click verdicts on FRAUD, and serves
// each owner's alerts and flagged share over HTTP. See README.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/natsconn"
	"github.com/snipdev/snip/pkg/owners"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/redisconn"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/pkg/webserver"
	"github.com/snipdev/snip/services/fraud/internal/clicklog"
	"github.com/snipdev/snip/services/fraud/internal/fraud"
	"github.com/snipdev/snip/services/fraud/internal/fraudpub"
	"github.com/snipdev/snip/services/fraud/internal/httpapi"
	"github.com/snipdev/snip/services/fraud/internal/redisstore"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "healthcheck" {
		os.Exit(healthcheck())
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	cfg, err := loadConfig(os.Environ())
	if err != nil {
		fmt.Fprintln(os.Stderr, "fraud:", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	if err := run(ctx, log, cfg); err != nil {
		log.Error("fraud detection stopped", "err", err)
		os.Exit(1)
	}
}

// healthcheck is `fraud healthcheck`, the distroless image's Docker
// HEALTHCHECK: 0 if this service answers /healthz, else 1.
func healthcheck() int {
	cfg, err := loadConfig(os.Environ())
	if err != nil {
		fmt.Fprintln(os.Stderr, "fraud healthcheck:", err)
		return 1
	}
	if err := webserver.Probe(cfg.HTTPAddr); err != nil {
		fmt.Fprintln(os.Stderr, "fraud healthcheck:", err)
		return 1
	}
	return 0
}

// run wires the service and blocks until ctx ends or a component fails. On
// the way out it stops taking events (the runtime finishes, publishes, stores
// and acks the batch in hand within ShutdownTimeout), stops the HTTP server,
// then drains NATS and closes Redis.
func run(ctx context.Context, log *slog.Logger, cfg Config) error {
	log.Info("fraud detection starting", "config", cfg)
	rules, err := cfg.rules()
	if err != nil {
		return err
	}
	start, err := cfg.start(time.Now())
	if err != nil {
		return err
	}

	// NATS: the connection retries forever, so a start before NATS waits.
	nc, err := natsconn.Connect(cfg.nats(), log)
	if err != nil {
		return err
	}
	defer natsconn.DrainWithin(nc, cfg.ShutdownTimeout, log)
	if cfg.Connected != nil {
		cfg.Connected(nc)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	rdb, err := redisconn.Open(cfg.RedisURL)
	if err != nil {
		return err
	}
	defer rdb.Close()

	// Startup steps wait for their servers instead of failing the start.
	if cfg.ApplyTopology {
		if err := retry(ctx, log, "apply topology", func(ctx context.Context) error {
			return topology.Apply(ctx, js, cfg.topology())
		}); err != nil {
			return err
		}
	}
	var partitions int
	if err := retry(ctx, log, "read partitions", func(ctx context.Context) (err error) {
		partitions, err = topology.Partitions(ctx, js)
		return err
	}); err != nil {
		return err
	}
	ownerStore := owners.NewStore(rdb)
	if err := retry(ctx, log, "bootstrap owners", func(ctx context.Context) error {
		return ownerStore.EnsureFromSpec(ctx, cfg.BootstrapOwners)
	}); err != nil {
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
	rd := fraud.NewReader(det, clicklog.New(js, partitions), pub, store, log, fraud.NewMetrics(reg))

	web := webserver.New(log, reg)
	web.AddReadiness("nats", func(context.Context) error {
		if s := nc.Status(); s != nats.CONNECTED {
			return fmt.Errorf("nats %s", s)
		}
		return nil
	})
	web.AddReadiness("redis", func(ctx context.Context) error { return redisconn.Ping(ctx, rdb) })
	httpapi.New(ownerStore, store, log, cfg.AlertsPerOwner).Mount(web.Echo)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 2)
	go func() {
		errc <- web.Serve(ctx, cfg.HTTPAddr, cfg.Ready, cfg.ShutdownTimeout)
	}()
	go func() {
		err := reader.Run(ctx, js, reader.Config{
			Group:        topology.GroupFraudDetection,
			Member:       cfg.Member,
			Partitions:   partitions,
			BatchSize:    cfg.BatchSize,
			LeaseTTL:     cfg.LeaseTTL,
			DrainTimeout: cfg.ShutdownTimeout,
			Start:        start,
			OnAssign:     rd.OnAssign,
			OnRevoke:     rd.OnRevoke,
			OnRewind:     rd.OnRewind,
			Logger:       log.With("component", "reader"),
			Metrics:      reg,
		}, rd.Handle)
		if err != nil {
			err = fmt.Errorf("read clicks: %w", err)
		}
		errc <- err
	}()
	log.Info("fraud detection running", "partitions", partitions, "memory", det.Memory())
	first := <-errc // ctx ended, or a component failed
	cancel()
	second := <-errc
	log.Info("fraud detection stopped")
	return errors.Join(first, second)
}

// retry calls f until it succeeds, ctx ends, or it fails for a reason no
// wait will cure (a partition count that differs from the stream's).
func retry(ctx context.Context, log *slog.Logger, what string, f func(context.Context) error) error {
	delay := 250 * time.Millisecond
	for {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := f(cctx)
		cancel()
		switch {
		case err == nil:
			return nil
		case errors.Is(err, topology.ErrPartitionsChanged):
			return fmt.Errorf("%s: %w", what, err)
		}
		log.Warn("waiting to "+what, "err", err, "retry_in", delay)
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w (last error: %v)", what, ctx.Err(), err)
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Second)
	}
}
