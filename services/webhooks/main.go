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
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/natsconn"
	"github.com/snipdev/snip/pkg/netguard"
	"github.com/snipdev/snip/pkg/owners"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/redisconn"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/pkg/webserver"
	"github.com/snipdev/snip/services/webhooks/internal/delivery"
	"github.com/snipdev/snip/services/webhooks/internal/endpoint"
	"github.com/snipdev/snip/services/webhooks/internal/httpapi"
	"github.com/snipdev/snip/services/webhooks/internal/redisstore"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "healthcheck" {
		cfg, err := loadConfig(os.Environ())
		if err == nil {
			err = webserver.Probe(cfg.HTTPAddr)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "healthcheck:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	cfg, err := loadConfig(os.Environ())
	if err != nil {
		fmt.Fprintln(os.Stderr, "webhooks:", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	if err := run(ctx, log, cfg); err != nil {
		log.Error("webhooks stopped", "err", err)
		os.Exit(1)
	}
}

// run starts the service and blocks until ctx ends or a component fails;
// then intake stops (the batch in hand is queued and acked), senders stop
// (a batch in flight stays recorded and is sent again, with the same
// webhook-id, by whoever takes the endpoint next), and clients close last.
func run(ctx context.Context, log *slog.Logger, cfg Config) error {
	log.Info("starting webhooks", "config", cfg)
	member := cfg.member()

	// ---- NATS and Redis
	nc, err := natsconn.Connect(cfg.nats(), log, cfg.NATSOptions...)
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

	// ---- Topology, owners: wait for NATS and Redis rather than fail.
	var fatal error
	if err := retry(ctx, log, "apply topology", func(ctx context.Context) error {
		err := topology.Apply(ctx, js, cfg.topology())
		if errors.Is(err, topology.ErrPartitionsChanged) {
			fatal = err
			return nil
		}
		if err != nil {
			return err
		}
		return topology.ApplyWebhooks(ctx, js)
	}); err != nil {
		return err
	}
	if fatal != nil {
		return fatal
	}
	ownerStore := owners.NewStore(rdb)
	if cfg.BootstrapOwners != "" {
		if err := retry(ctx, log, "bootstrap owners", func(ctx context.Context) error {
			return ownerStore.EnsureFromSpec(ctx, cfg.BootstrapOwners)
		}); err != nil {
			return err
		}
	}
	var partitions int
	if err := retry(ctx, log, "read CLICKS", func(ctx context.Context) error {
		partitions, err = topology.Partitions(ctx, js)
		return err
	}); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return nil
	}

	// ---- Intake, senders, owner API
	reg := prometheus.NewRegistry()
	metrics, err := delivery.NewMetrics(reg)
	if err != nil {
		return err
	}
	store := redisstore.New(rdb, cfg.MaxBacklog)
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
	intake := delivery.NewIntake(store, metrics)
	intake.Notify = manager.Wake
	replayer := delivery.NewReplayer(js, store, intake, log, 16)
	admin := &delivery.Admin{
		Store: store, Client: client, Dialer: dialer, Replayer: replayer, Intake: intake,
		RotationOverlap: cfg.RotationOverlap, MaxPerOwner: cfg.MaxEndpointsPerOwner,
		Rules: endpoint.Rules{HTTPHosts: cfg.HTTPHosts, DefaultBatchMax: cfg.BatchMax, DefaultBatchWait: cfg.BatchWait},
	}
	web := webserver.New(log, reg)
	httpapi.Register(web.Echo, ownerStore, admin, log)
	web.AddReadiness("redis", func(ctx context.Context) error { return redisconn.Ping(ctx, rdb) })
	web.AddReadiness("nats", func(context.Context) error {
		if st := nc.Status(); st != nats.CONNECTED {
			return fmt.Errorf("nats %s", st)
		}
		return nil
	})

	// ---- Run every component until one fails or ctx ends.
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, 5)
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
	start("reader", func(ctx context.Context) error {
		return reader.Run(ctx, js, reader.Config{
			Group: topology.GroupWebhooks, Member: member, Partitions: partitions,
			LeaseTTL: cfg.LeaseTTL, DrainTimeout: cfg.ShutdownTimeout,
			Start:  reader.StartAtNew(),
			Logger: log, Metrics: reg,
		}, intake.HandleClicks)
	})
	start("alerts", func(ctx context.Context) error {
		return delivery.ConsumeAlerts(ctx, js, topology.WebhooksAlertsConsumer, intake, log, cfg.ShutdownTimeout)
	})
	start("senders", manager.Run)
	start("replayer", replayer.Run)

	<-runCtx.Done()
	log.Info("stopping webhooks")
	wg.Wait()
	close(errc)
	var errs []error
	for err := range errc {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// retry calls f until it succeeds or ctx ends (then it returns nil: the
// caller checks ctx), logging each failure.
func retry(ctx context.Context, log *slog.Logger, what string, f func(ctx context.Context) error) error {
	for wait := 250 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := f(actx)
		cancel()
		if err == nil {
			return nil
		}
		log.Warn(what+": retrying", "err", err, "in", wait)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}
