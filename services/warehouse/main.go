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
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/service"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/pkg/webserver"
	"github.com/snipdev/snip/services/warehouse/internal/chwriter"
	"github.com/snipdev/snip/services/warehouse/internal/loader"
)

func main() { service.Main("warehouse", loadConfig, run) }

// run wires the loader and runs it until ctx ends, then stops in stages
// (service.Run): the runtime stops fetching and drains (the loader inserts
// the batches in hand at once, and they are acked) and the loader stops;
// then the HTTP server, which outlives the drain so /metrics shows it; then
// NATS drains and ClickHouse closes.
func run(ctx context.Context, log *slog.Logger, cfg Config) error {
	return service.Run(ctx, log, "warehouse loader", cfg, func(ctx context.Context, g *service.Group) error {
		reg := prometheus.NewRegistry()
		web := webserver.New(log, reg)
		web.Echo.HTTPErrorHandler = webserver.ErrorHandler(log, nil)
		// ClickHouse may not be there yet: the pool connects lazily, and the
		// schema is applied as soon as the server answers. Until then the
		// service is not ready, and batches fail and wait in the stream.
		w, err := chwriter.Open(cfg.clickhouse(), log, reg)
		if err != nil {
			return err
		}
		g.Close("clickhouse", w.Close)
		web.AddReadiness("clickhouse", w.Ready)
		nc, js, err := g.NATS(cfg.NATS, "warehouse")
		if err != nil {
			return err
		}
		web.AddReadiness("nats", service.NATSReady(nc))

		g.Go(service.Work, "http", g.HTTP(web))
		g.Go(service.Intake, "schema", func(ctx context.Context) error {
			// Applied as soon as ClickHouse answers, so the service turns
			// ready without waiting for the first batch.
			return service.Backoff{First: 200 * time.Millisecond, Max: 10 * time.Second, Attempt: 30 * time.Second}.
				Retry(ctx, log, "wait for clickhouse", w.EnsureSchema)
		})
		g.Go(service.Intake, "loader", func(ctx context.Context) error { return load(ctx, log, cfg, js, w, reg) })
		return nil
	})
}

// load joins the group and loads until ctx ends.
func load(ctx context.Context, log *slog.Logger, cfg Config, js jetstream.JetStream, w *chwriter.Writer, reg *prometheus.Registry) error {
	start, backfill, err := prepare(ctx, log, cfg, js)
	if err != nil {
		return err
	}
	lcfg := cfg.loader()
	lcfg.Backfill, lcfg.Logger, lcfg.Metrics = backfill, log, reg
	l, err := loader.New(w, lcfg)
	if err != nil {
		return err
	}
	defer l.Close()
	rcfg := cfg.reader(start, log, reg)
	rcfg.Metadata = cutMetadata(backfill)
	// Stop intake first: once ctx ends the runtime fetches no more, and the
	// loader inserts what it holds at once instead of lingering.
	stopDrain := context.AfterFunc(ctx, l.Drain)
	defer stopDrain()
	return reader.Run(ctx, js, rcfg, l.Handle)
}

// backfillSlack starts a backfill's consumers this much before the window,
// by JetStream's stored time, so a click whose host clock ran ahead of the
// NATS server's is not cut; the loader then cuts by the click's own time.
const backfillSlack = 10 * time.Minute

// The consumer metadata keys where a backfill's cut is recorded: on each
// consumer of the group created with the cut (reader.Config.Metadata), in
// the same write that creates it.
const (
	cutSinceKey   = "snip.backfill.since"
	cutBacklogKey = "snip.backfill.backlog_until_seq"
)

// prepare applies the topology (unless told not to) and decides where the
// group's consumers start when they are created, and what the loader cuts.
// It waits for NATS and for CLICKS; only a configuration that cannot work
// is returned.
func prepare(ctx context.Context, log *slog.Logger, cfg Config, js jetstream.JetStream) (reader.Start, *loader.Backfill, error) {
	if err := cfg.Topology.Prepare(ctx, log, js); err != nil {
		return reader.Start{}, nil, err
	}
	var g group
	err := service.Retry(ctx, log, "look up consumer group", func(ctx context.Context) error {
		var err error
		g, err = lookUpGroup(ctx, js)
		return err
	})
	if err != nil {
		return reader.Start{}, nil, err
	}
	start, bf := startFor(g, cfg.Since, time.Now())
	name := topology.GroupWarehouseLoader
	switch {
	case g.consumers > 0 && g.consumers < g.partitions:
		// A first start that stopped before it had created every
		// partition's consumer (or partitions added to CLICKS since): the
		// rest are made as the first start would have made them.
		log.Warn("consumer group lacks some partitions' consumers: creating them as its first start would have",
			"group", name, "consumers", g.consumers, "partitions", g.partitions, "start", start.String(), "backfill", bf != nil)
	case g.consumers > 0:
		log.Info("resuming the consumer group where it was", "group", name, "backfill", bf != nil)
	case bf != nil:
		log.Info("new consumer group: loading the clicks of the backfill window from the log, then live",
			"group", name, "since", bf.Since, "backlog_until_seq", bf.BacklogUntilSeq)
	default:
		log.Info("new consumer group: loading everything the log retains, then live", "group", name)
	}
	return start, bf, nil
}

// group is what a starting loader finds of its consumer group.
type group struct {
	// partitions is CLICKS' partition count; consumers, how many of them
	// have their consumer.
	partitions, consumers int
	// cut is the backfill cut recorded on the consumers (nil: made
	// without one).
	cut *loader.Backfill
	// lastSeq is CLICKS' last sequence now.
	lastSeq uint64
}

// lookUpGroup reads, partition by partition, which consumers of the group
// exist and the cut recorded on them. Two first starts racing may record
// cuts a moment apart; the lowest partition's is taken.
func lookUpGroup(ctx context.Context, js jetstream.JetStream) (group, error) {
	n, err := topology.Partitions(ctx, js)
	if err != nil {
		return group{}, err
	}
	s, err := js.Stream(ctx, events.ClicksStream)
	if err != nil {
		return group{}, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return group{}, err
	}
	g := group{partitions: n, lastSeq: info.State.LastSeq}
	for p := range n {
		name := topology.GroupConsumerName(topology.GroupWarehouseLoader, p)
		c, err := s.Consumer(ctx, name)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			continue
		}
		if err != nil {
			return group{}, fmt.Errorf("look up consumer %s: %w", name, err)
		}
		g.consumers++
		if g.cut != nil {
			continue
		}
		if g.cut, err = cutOf(c.CachedInfo().Config.Metadata); err != nil {
			return group{}, service.Permanent(fmt.Errorf("consumer %s: %w", name, err))
		}
	}
	return g, nil
}

// startFor is where the group's consumers begin when they are created, and
// the cut the loader applies. A consumer that exists resumes where it was,
// whatever this says.
//
//   - A group with no consumers is new. It starts at the oldest event CLICKS
//     retains, or, with since, at the first event stored since now-since
//     (less backfillSlack), and the loader skips the backlog events (those
//     up to lastSeq, in the log when the group was created) whose click is
//     older than now-since. That cut is recorded on each consumer.
//   - A group with consumers keeps the cut recorded on them, if any, however
//     many partitions they cover: a partition whose consumer is created now
//     (its first start stopped half-way) starts where the others did, and
//     the loader goes on skipping the same backlog. A group made without a
//     cut goes on without one; since is ignored.
func startFor(g group, since time.Duration, now time.Time) (reader.Start, *loader.Backfill) {
	switch {
	case g.consumers > 0 && g.cut != nil:
		return reader.StartAtTime(g.cut.Since.Add(-backfillSlack)), g.cut
	case g.consumers > 0 || since <= 0:
		return reader.StartAtOldest(), nil
	}
	from := now.Add(-since)
	return reader.StartAtTime(from.Add(-backfillSlack)), &loader.Backfill{Since: from, BacklogUntilSeq: g.lastSeq}
}

// cutMetadata is bf as recorded on a consumer; nil for no cut.
func cutMetadata(bf *loader.Backfill) map[string]string {
	if bf == nil {
		return nil
	}
	return map[string]string{
		cutSinceKey:   bf.Since.UTC().Format(time.RFC3339Nano),
		cutBacklogKey: strconv.FormatUint(bf.BacklogUntilSeq, 10),
	}
}

// cutOf reads the cut recorded in a consumer's metadata; nil if none is.
func cutOf(md map[string]string) (*loader.Backfill, error) {
	since, okSince := md[cutSinceKey]
	backlog, okBacklog := md[cutBacklogKey]
	if !okSince && !okBacklog {
		return nil, nil
	}
	t, err := time.Parse(time.RFC3339Nano, since)
	if err != nil {
		return nil, fmt.Errorf("backfill cut: %s %q: %w", cutSinceKey, since, err)
	}
	seq, err := strconv.ParseUint(backlog, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("backfill cut: %s %q: %w", cutBacklogKey, backlog, err)
	}
	return &loader.Backfill{Since: t, BacklogUntilSeq: seq}, nil
}

func (c Config) reader(start reader.Start, log *slog.Logger, reg prometheus.Registerer) reader.Config {
	return reader.Config{
		Group:  topology.GroupWarehouseLoader,
		Member: c.Member,
		// A partition's batch may fill an insert alone; the runtime caps it.
		BatchSize: min(c.BatchRows, 100_000),
		LeaseTTL:  c.LeaseTTL,
		// A handler may wait far longer than one insert: in a catch-up
		// every partition's batch can fill a group of its own, so a batch
		// may queue behind a full group per partition at the single flusher,
		// each insert taking up to InsertTimeout when ClickHouse is slow
		// (8 x 20s at the defaults), and the runtime's prefetched batch
		// waits for that handler. The runtime marks both in progress every
		// AckWait/3 while they wait, so AckWait need not outlast that: it
		// only bounds how long a member that died or froze holds its events.
		// It must be at least 3 x MaxRetryDelay (the runtime's rule).
		AckWait:       max(60*time.Second, 3*c.MaxRetryDelay),
		MaxRetryDelay: c.MaxRetryDelay,
		DrainTimeout:  c.ShutdownTimeout,
		Start:         start,
		Logger:        log,
		Metrics:       reg,
	}
}
