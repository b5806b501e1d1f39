// Command clickcounter counts clicks: it reads CLICKS as the consumer group
// "click-counter", keeps per-link counts in Redis exactly once, applies fraud
// verdicts as corrections, rebuilds its counts when replayed, and serves
// them at GET /api/links/:code/stats. See README.md.
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
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/natsconn"
	"github.com/snipdev/snip/pkg/owners"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/redisconn"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/pkg/webserver"
	"github.com/snipdev/snip/services/clickcounter/internal/counter"
	"github.com/snipdev/snip/services/clickcounter/internal/httpapi"
	"github.com/snipdev/snip/services/clickcounter/internal/jsfeed"
	"github.com/snipdev/snip/services/clickcounter/internal/redisstore"
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
		fmt.Fprintln(os.Stderr, "clickcounter:", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	if err := run(ctx, log, cfg); err != nil {
		log.Error("clickcounter stopped", "err", err)
		os.Exit(1)
	}
}

// run starts the counter and blocks until ctx ends or a component fails;
// then every component stops taking work and finishes what it holds (HTTP
// requests, the batch in hand, feed messages), and the clients close last.
func run(ctx context.Context, log *slog.Logger, cfg Config) error {
	log.Info("starting clickcounter", "config", cfg)

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
			fatal = err // retrying cannot fix a configuration that contradicts the stream
			return nil
		}
		if err != nil {
			return err
		}
		return topology.ApplyClickCounter(ctx, js)
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
	var maxAge time.Duration
	if err := retry(ctx, log, "read CLICKS", func(ctx context.Context) error {
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
	if ctx.Err() != nil {
		return nil
	}

	// ---- The counter and its API
	reg := prometheus.NewRegistry()
	c, err := counter.New(counter.Options{
		Store: redisstore.New(rdb), Clicks: jsfeed.Clicks{JS: js}, Partitions: partitions,
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
			Group: topology.GroupClickCounter, Member: cfg.Member, Partitions: partitions,
			BatchSize: cfg.BatchSize, Linger: cfg.Linger, LeaseTTL: cfg.LeaseTTL, DrainTimeout: cfg.ShutdownTimeout,
			Start:    reader.StartAtOldest(),
			OnAssign: c.OnAssign, OnRevoke: c.OnRevoke, OnRewind: c.OnRewind,
			Logger: log, Metrics: reg,
		}, c.HandleBatch)
	})
	for _, f := range feeds(c, log, cfg.ShutdownTimeout) {
		start(f.Name, func(ctx context.Context) error { return f.Run(ctx, js, fm) })
	}
	start("janitor", func(ctx context.Context) error { c.RunJanitor(ctx); return nil })

	<-runCtx.Done()
	log.Info("stopping clickcounter")
	wg.Wait()
	close(errc)
	var errs []error
	for err := range errc {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// feeds are the counter's LINKS and FRAUD verdict feeds (the benchmarks run
// them as run does).
func feeds(c *counter.Counter, log *slog.Logger, drain time.Duration) []jsfeed.Feed {
	fs := []jsfeed.Feed{
		{Name: "links", Stream: events.LinksStream, Consumer: topology.ClickCounterLinksConsumer,
			Handle: jsfeed.Links(c.ApplyLinkEvents)},
		{Name: "verdicts", Stream: events.FraudStream, Consumer: topology.ClickCounterVerdictsConsumer,
			Handle: jsfeed.Verdicts(c.ApplyVerdicts)},
	}
	for i := range fs {
		fs[i].Source, fs[i].Log, fs[i].DrainTimeout = topology.GroupClickCounter, log, drain
	}
	return fs
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
