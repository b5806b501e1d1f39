// Command preview is Snip's preview worker: one of any number of competing
// consumers of the PREVIEW_JOBS work queue. For each job it fetches the link's
// target page safely, extracts title, description, image and site name, and
// stores them in Redis; it retries transient failures with backoff and parks
// the rest on DEAD_LETTER. See README.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/natsconn"
	"github.com/snipdev/snip/pkg/redisconn"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/pkg/webserver"
	"github.com/snipdev/snip/pkg/workqueue"
	"github.com/snipdev/snip/services/preview/internal/fetch"
	"github.com/snipdev/snip/services/preview/internal/preview"
	"github.com/snipdev/snip/services/preview/internal/redisstore"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "healthcheck" {
		cfg, err := loadConfig(os.Environ())
		if err == nil {
			err = webserver.Probe(cfg.HTTPAddr)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	cfg, err := loadConfig(os.Environ())
	if err != nil {
		fmt.Fprintln(os.Stderr, "preview:", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	if err := run(ctx, log, cfg); err != nil {
		log.Error("preview stopped", "err", err)
		os.Exit(1)
	}
}

// run wires the worker and blocks until ctx ends or a component fails, then
// shuts down: HTTP and the queue stop together (the queue lets jobs in hand
// finish within cfg.ShutdownTimeout), then Redis and NATS close.
func run(ctx context.Context, log *slog.Logger, cfg Config) error {
	log.Info("starting", "config", cfg)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	nc, err := natsconn.Connect(cfg.nats(), log)
	if err != nil {
		return err
	}
	defer func() {
		// Acks and NAKs are fire-and-forget publishes: flush them out.
		_ = nc.FlushTimeout(2 * time.Second)
		nc.Close()
	}()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	rdb, err := redisconn.Open(cfg.RedisURL)
	if err != nil {
		return err
	}
	defer rdb.Close()

	reg := prometheus.NewRegistry()
	web := webserver.New(log, reg)
	web.Echo.HTTPErrorHandler = httpErrorHandler(log)
	svc := preview.New(redisstore.New(rdb), fetch.New(cfg.fetch()), log, reg)
	q := workqueue.New(js, cfg.queue(log, reg), svc.Process, svc.OnDead)
	web.AddReadiness("nats", func(context.Context) error {
		if !nc.IsConnected() {
			return fmt.Errorf("nats: %s", nc.Status())
		}
		return nil
	})
	web.AddReadiness("redis", func(ctx context.Context) error { return redisconn.Ping(ctx, rdb) })
	web.AddReadiness("queue", q.Ready)

	errc := make(chan error, 2)
	go func() { errc <- web.Serve(ctx, cfg.HTTPAddr, cfg.Ready, cfg.ShutdownTimeout) }()
	go func() {
		if cfg.ApplyTopology {
			if err := applyTopology(ctx, log, js, cfg.topology()); err != nil {
				errc <- err
				return
			}
		}
		errc <- q.Run(ctx)
	}()
	var first error
	for range 2 {
		if err := <-errc; err != nil && first == nil {
			first = err
			cancel() // one failed: stop the other
		}
	}
	log.Info("stopped")
	return first
}

// applyTopology applies the topology, retrying until NATS answers or ctx
// ends. A CLICKS partition count that differs from SNIP_PARTITIONS is a
// configuration error, returned.
func applyTopology(ctx context.Context, log *slog.Logger, js jetstream.JetStream, o topology.Options) error {
	wait := 250 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := topology.Apply(actx, js, o)
		cancel()
		switch {
		case err == nil || ctx.Err() != nil:
			return nil
		case errors.Is(err, topology.ErrPartitionsChanged):
			return err
		}
		log.Warn("apply topology; retrying", "err", err, "in", wait)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
			wait = min(2*wait, 10*time.Second)
		}
	}
}

// httpErrorHandler is the service's one error handler: JSON bodies, and a
// log line only for what is not the client's mistake.
func httpErrorHandler(log *slog.Logger) echo.HTTPErrorHandler {
	return func(err error, c echo.Context) {
		if c.Response().Committed {
			return
		}
		code, msg := http.StatusInternalServerError, "internal error"
		var he *echo.HTTPError
		if errors.As(err, &he) {
			code, msg = he.Code, fmt.Sprint(he.Message)
		}
		if code >= 500 {
			log.Error("http", "path", c.Path(), "err", err)
		}
		_ = c.JSON(code, map[string]string{"error": msg})
	}
}

func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable)"
	}
	return u.Redacted()
}
