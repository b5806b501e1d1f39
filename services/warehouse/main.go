// Command warehouse is the warehouse loader: the third reader of CLICKS, in
// its own consumer group, loading every click into ClickHouse in few, large,
// idempotent inserts, acking only what ClickHouse accepted. When ClickHouse
// is down or slow it stops, the stream holds the backlog, and it catches up
// when ClickHouse returns. Started for the first time with -since 72h it
// loads the last three days from the log first, then follows live.
//
// See README.md for one click's journey through it.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/labstack/echo/v4"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/natsconn"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/pkg/webserver"
	"github.com/snipdev/snip/services/warehouse/internal/chwriter"
	"github.com/snipdev/snip/services/warehouse/internal/loader"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "healthcheck" {
		cfg, err := loadConfig(os.Environ(), nil)
		if err == nil {
			err = webserver.Probe(cfg.HTTPAddr)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "warehouse healthcheck:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	cfg, err := loadConfig(os.Environ(), os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "warehouse:", err)
		os.Exit(2)
	}
	level, _ := cfg.logLevel() // validated by loadConfig
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if err := run(ctx, log, cfg); err != nil {
		log.Error("warehouse loader stopped", "err", err)
		stop()
		os.Exit(1)
	}
}

// run wires the loader and runs it until ctx ends, then shuts down from the
// outside in: the runtime stops fetching and drains (the loader inserts the
// batches in hand at once, and they are acked), the loader stops, then the
// clients close.
func run(ctx context.Context, log *slog.Logger, cfg Config) error {
	log.Info("starting warehouse loader", "config", cfg.logValue())
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	reg := prometheus.NewRegistry()
	web := webserver.New(log, reg)
	web.Echo.HTTPErrorHandler = errorHandler(log)

	// ClickHouse may not be there yet: the pool connects lazily, and the
	// schema is applied as soon as the server answers. Until then the
	// service is not ready, and batches fail and wait in the stream.
	w, err := chwriter.Open(cfg.clickhouse(), log, reg)
	if err != nil {
		return err
	}
	defer w.Close()
	web.AddReadiness("clickhouse", w.Ready)

	nc, err := natsconn.Connect(cfg.nats(), log)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	web.AddReadiness("nats", func(context.Context) error {
		if !nc.IsConnected() {
			return errors.New("not connected")
		}
		return nil
	})

	// The HTTP server outlives the drain, so /metrics shows it; it stops
	// last, or first if it fails.
	httpCtx, stopHTTP := context.WithCancel(context.WithoutCancel(ctx))
	defer stopHTTP()
	httpDone := make(chan struct{})
	go func() {
		defer close(httpDone)
		if err := web.Serve(httpCtx, cfg.HTTPAddr, cfg.Ready, cfg.ShutdownTimeout); err != nil {
			cancel(err)
		}
	}()
	schemaDone := make(chan struct{})
	go func() {
		defer close(schemaDone)
		waitForClickHouse(ctx, log, w)
	}()

	err = load(ctx, log, cfg, js, w, reg)
	cancel(nil)
	<-schemaDone
	stopHTTP()
	<-httpDone
	if cause := context.Cause(ctx); err == nil && cause != nil && !errors.Is(cause, context.Canceled) {
		err = cause // the HTTP server failed
	}
	return err
}

// load joins the group and loads until ctx ends.
func load(ctx context.Context, log *slog.Logger, cfg Config, js jetstream.JetStream, w *chwriter.Writer, reg *prometheus.Registry) error {
	start, backfill, err := prepare(ctx, log, cfg, js)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	lcfg := cfg.loader()
	lcfg.Backfill, lcfg.Logger, lcfg.Metrics = backfill, log, reg
	l, err := loader.New(w, lcfg)
	if err != nil {
		return err
	}
	defer l.Close()
	// Stop intake first: once ctx ends the runtime fetches no more, and the
	// loader inserts what it holds at once instead of lingering.
	stopDrain := context.AfterFunc(ctx, l.Drain)
	defer stopDrain()
	return reader.Run(ctx, js, cfg.reader(start, log, reg), l.Handle)
}

// backfillSlack starts a backfill's consumers this much before the window,
// by JetStream's stored time, so a click whose host clock ran ahead of the
// NATS server's is not cut; the loader then cuts by the click's own time.
const backfillSlack = 10 * time.Minute

// prepare applies the topology (unless told not to) and decides where a new
// group starts. It waits for NATS and for CLICKS; only a configuration that
// cannot work is returned.
func prepare(ctx context.Context, log *slog.Logger, cfg Config, js jetstream.JetStream) (reader.Start, *loader.Backfill, error) {
	notify := func(what string) backoff.Notify {
		return func(err error, d time.Duration) {
			log.Warn(what+": retrying", "err", err, "in", d.Round(time.Millisecond))
		}
	}
	if cfg.ApplyTopology {
		_, err := backoff.Retry(ctx, func() (struct{}, error) {
			actx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			err := topology.Apply(actx, js, cfg.topology())
			if errors.Is(err, topology.ErrPartitionsChanged) {
				return struct{}{}, backoff.Permanent(err)
			}
			return struct{}{}, err
		}, retryForever(), backoff.WithNotify(notify("apply topology")))
		if err != nil {
			return reader.Start{}, nil, err
		}
	}
	type group struct {
		isNew   bool
		lastSeq uint64
	}
	g, err := backoff.Retry(ctx, func() (group, error) {
		gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		s, err := js.Stream(gctx, events.ClicksStream)
		if err != nil {
			return group{}, err
		}
		info, err := s.Info(gctx)
		if err != nil {
			return group{}, err
		}
		_, err = reader.Lag(gctx, js, topology.GroupWarehouseLoader)
		switch {
		case errors.Is(err, reader.ErrNoGroup):
			return group{isNew: true, lastSeq: info.State.LastSeq}, nil
		case err != nil:
			return group{}, err
		}
		return group{}, nil
	}, retryForever(), backoff.WithNotify(notify("look up consumer group")))
	if err != nil {
		return reader.Start{}, nil, err
	}
	start, bf := startFor(g.isNew, cfg.Since, time.Now(), g.lastSeq)
	switch {
	case !g.isNew:
		log.Info("resuming the consumer group where it was", "group", topology.GroupWarehouseLoader)
	case bf != nil:
		log.Info("new consumer group: loading the clicks of the backfill window from the log, then live",
			"group", topology.GroupWarehouseLoader, "since", bf.Since, "backlog_until_seq", bf.BacklogUntilSeq)
	default:
		log.Info("new consumer group: loading everything the log retains, then live", "group", topology.GroupWarehouseLoader)
	}
	return start, bf, nil
}

// startFor is where a group begins. A group that exists resumes where it
// was, whatever the configuration says. A new one starts at the oldest event
// CLICKS retains, or, with since, at the first event stored since now-since
// (less backfillSlack), and the loader skips the backlog events (those up to
// lastSeq, in the log when the group was created) whose click is older than
// now-since.
func startFor(isNew bool, since time.Duration, now time.Time, lastSeq uint64) (reader.Start, *loader.Backfill) {
	if !isNew || since <= 0 {
		return reader.StartAtOldest(), nil
	}
	from := now.Add(-since)
	return reader.StartAtTime(from.Add(-backfillSlack)), &loader.Backfill{Since: from, BacklogUntilSeq: lastSeq}
}

// waitForClickHouse applies the schema as soon as ClickHouse answers, so the
// service turns ready without waiting for the first batch.
func waitForClickHouse(ctx context.Context, log *slog.Logger, w *chwriter.Writer) {
	_, _ = backoff.Retry(ctx, func() (struct{}, error) {
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		return struct{}{}, w.EnsureSchema(sctx)
	}, retryForever(), backoff.WithNotify(func(err error, d time.Duration) {
		log.Warn("waiting for clickhouse", "err", err, "retry_in", d.Round(time.Millisecond))
	}))
}

func retryForever() backoff.RetryOption {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 200 * time.Millisecond
	b.MaxInterval = 10 * time.Second
	return backoff.WithBackOff(b)
}

func (c Config) reader(start reader.Start, log *slog.Logger, reg prometheus.Registerer) reader.Config {
	return reader.Config{
		Group:  topology.GroupWarehouseLoader,
		Member: c.Member,
		// A partition's batch may fill an insert alone; the runtime caps it.
		BatchSize: min(c.BatchRows, 100_000),
		LeaseTTL:  c.LeaseTTL,
		// A handler waits for at most two inserts (the one running and its
		// own) plus the linger, and the runtime's prefetched batch waits for
		// that handler before its own turn: AckWait must outlast both.
		AckWait:       max(60*time.Second, 5*c.InsertTimeout, 3*c.MaxRetryDelay),
		MaxRetryDelay: c.MaxRetryDelay,
		DrainTimeout:  c.ShutdownTimeout,
		Start:         start,
		Logger:        log,
		Metrics:       reg,
	}
}

// errorHandler is the service's one echo error handler. The loader serves
// only the operational endpoints, so errors are unknown routes and methods.
func errorHandler(log *slog.Logger) echo.HTTPErrorHandler {
	return func(err error, c echo.Context) {
		if c.Response().Committed {
			return
		}
		code, msg := http.StatusInternalServerError, "internal error"
		var he *echo.HTTPError
		if errors.As(err, &he) {
			code, msg = he.Code, fmt.Sprint(he.Message)
		} else {
			log.Error("http request", "err", err, "path", c.Request().URL.Path)
		}
		_ = c.JSON(code, map[string]string{"error": msg})
	}
}
