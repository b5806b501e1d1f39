// Command redirect is Snip's redirect service: the owners' link API, the
// redirect hot path that writes every click into a Redis outbox before its
// 302, and the relay that moves the outbox to JetStream (CLICKS, LINKS,
// PREVIEW_JOBS). README.md follows one click and one link through it.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/owners"
	"github.com/snipdev/snip/pkg/redisconn"
	"github.com/snipdev/snip/pkg/service"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/pkg/webserver"
	"github.com/snipdev/snip/services/redirect/internal/directpub"
	"github.com/snipdev/snip/services/redirect/internal/httpapi"
	"github.com/snipdev/snip/services/redirect/internal/linkstore"
	"github.com/snipdev/snip/services/redirect/internal/outbox"
	"github.com/snipdev/snip/services/redirect/internal/redirect"
	"github.com/snipdev/snip/services/redirect/internal/visitor"
)

func main() { service.Main("redirect", loadConfig, run) }

// startupTimeout is how long run waits for Redis at start before giving up
// (the orchestrator restarts it). NATS is not waited for.
const startupTimeout = 30 * time.Second

// run wires the service and serves until ctx ends, then stops in stages
// (service.Run): HTTP (waiting for requests in flight, whose clicks are
// committed before their 302); the group committer, a short drain of the
// outbox by the relay, then the background loops; NATS; Redis.
func run(ctx context.Context, log *slog.Logger, cfg Config) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	return service.Run(ctx, log, "redirect", cfg, func(ctx context.Context, g *service.Group) error {
		redis.SetLogger(redisLogger{log})
		trusted, _ := cfg.trustedProxies()
		// Redis: one client for requests, one for the relay, whose blocking
		// XREADs hold a connection per shard, and one for the group commit
		// (committerRedis: its timeout is SNIP_COMMIT_TIMEOUT).
		rdb, err := g.Redis(cfg.Redis)
		if err != nil {
			return err
		}
		relayRDB, err := g.Redis(service.Redis{URL: withPoolSize(cfg.Redis.URL, cfg.OutboxShards+8)})
		if err != nil {
			return err
		}
		commitRDB, err := committerRedis(cfg)
		if err != nil {
			return err
		}
		g.Close("redis committer", commitRDB.Close)
		wctx, cancel := context.WithTimeout(ctx, startupTimeout)
		defer cancel()
		if err := service.Retry(wctx, log, "wait for redis", func(ctx context.Context) error { return redisconn.Ping(ctx, rdb) }); err != nil {
			return err
		}
		if err := cfg.Owners.Bootstrap(ctx, log, owners.NewStore(rdb)); err != nil {
			return err
		}
		layout := outbox.NewLayout(cfg.OutboxShards)
		if err := outbox.CheckShards(ctx, rdb, layout); err != nil {
			return err
		}

		// NATS: connects in the background and reconnects forever; redirects
		// never wait for it. This connection applies the topology and
		// follows LINKS.
		_, js, err := g.NATS(cfg.NATS, "redirect "+cfg.Instance)
		if err != nil {
			return err
		}
		// The relay's own connection (relayNATSOptions: it buffers nothing
		// while it reconnects), so that a connection break in the middle of
		// a batch cannot store the batch's later entries before its lost
		// ones.
		relayNC, relayJS, err := relayNATS(g, cfg)
		if err != nil {
			return err
		}
		// A second connection for clicks recorded straight in JetStream when
		// the outbox does not answer in time. It buffers nothing while it
		// reconnects: a publish then fails at once instead of being stored
		// after the redirect answered with an error.
		directNC, directJS, err := g.NATS(cfg.NATS, "redirect direct "+cfg.Instance, nats.ReconnectBufSize(-1))
		if err != nil {
			return err
		}

		reg := prometheus.NewRegistry()
		om := outbox.NewMetrics(reg)
		rm := redirect.NewMetrics(reg)
		topoReady := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "snip", Subsystem: "redirect", Name: "topology_applied",
			Help: "1 once this instance has applied the JetStream topology."})
		reg.MustRegister(topoReady)

		perShard := cfg.OutboxMaxEntries / int64(cfg.OutboxShards)
		om.ShardCapacity.Set(float64(perShard))
		store := linkstore.New(rdb, layout, perShard)
		// What this instance wrote into the outbox: shutdown waits for it
		// to be relayed, not for the whole outbox (drainOutbox).
		written := outbox.NewWritten(layout)
		store.NoteWrites(written)
		keys := owners.NewStore(rdb)
		if cfg.OutboxWaitReplicas > 0 {
			short := func(op string, got int64, err error) {
				rm.WritesReplicaShort.WithLabelValues(op).Inc()
				log.Warn("write not acknowledged by Redis replicas in time; it is on the master only", "op", op, "replicas", got, "want", cfg.OutboxWaitReplicas, "err", err)
			}
			store.WaitForReplicas(cfg.OutboxWaitReplicas, cfg.OutboxWaitReplicasTimeout, short)
			keys.WaitForReplicas(cfg.OutboxWaitReplicas, cfg.OutboxWaitReplicasTimeout, short)
		}
		resolver := redirect.NewResolver(store, cfg.CacheSize, cfg.CacheTTL, cfg.CacheStaleIfError, cfg.LookupTimeout, rm)
		g.Close("link cache", func() error { resolver.Close(); return nil })
		committer := outbox.NewCommitter(commitRDB, layout, outbox.CommitterConfig{
			MaxBatch: cfg.CommitMaxBatch, Workers: cfg.CommitWorkers, Linger: cfg.CommitLinger, MaxEntries: perShard,
			Timeout: cfg.CommitTimeout, Cooldown: 500 * time.Millisecond,
			WaitReplicas: cfg.OutboxWaitReplicas, WaitTimeout: cfg.OutboxWaitReplicasTimeout, Written: written,
		}, om)
		committer.Start()
		svc := redirect.NewService(resolver, committer, directpub.New(directJS, cfg.DirectTimeout), visitor.NewIdentifier(rdb), layout,
			redirect.Options{Policy: cfg.UnrecordedPolicy, OutboxWait: cfg.OutboxWait, Validity: cfg.OutboxValidity}, rm)

		var topologyApplied atomic.Bool
		relayReady := func() bool { return relayNC.IsConnected() && topologyApplied.Load() }
		rcfg := relayConfig(cfg, relayNC)
		// Batches acknowledged but not trimmed are recorded in NATS on the
		// relay's own connection (decision 0177).
		rcfg.Records = outbox.NewRecords(relayJS)
		relay := outbox.NewRelay(relayRDB, relayJS, relayReady, layout, rcfg, log, om)
		monitor := outbox.NewMonitor(rdb, layout, committer, om, log)

		web := webserver.New(log, reg)
		// Ready while clicks can be recorded: through Redis, or, while Redis is
		// away, straight through JetStream. Failing readiness on Redis alone
		// would take every instance out of its load balancer at once and turn
		// a Redis outage into a redirect outage.
		web.AddReadiness("click_recording", func(ctx context.Context) error {
			err := redisconn.Ping(ctx, rdb)
			if err == nil {
				return nil
			}
			nerr := service.NATSReady(directNC)(ctx)
			if nerr == nil {
				return nil
			}
			return fmt.Errorf("%w; and the direct path: %w", err, nerr)
		})
		web.Echo.IPExtractor = httpapi.IPExtractor(trusted)
		api := &httpapi.API{
			Owners: owners.NewStore(rdb), Links: store, Follow: svc, Cache: resolver, Log: log,
			PublicURL: cfg.PublicURL, RedirectLatency: rm.Latency, Misses: rm.Misses,
			CreateLimit: owners.NewLimit(rdb, "links.create", cfg.LinkCreateLimit, cfg.LinkCreateWindow),
			Keys:        keys,
		}
		api.Register(web.Echo, reg)

		g.Go(service.Intake, "http", g.HTTP(web))
		// HTTP is stopped: every request that got an answer is done. Write
		// what the committer still holds, then give the relays a moment to
		// publish what this instance wrote into the outbox (what they cannot
		// publish now stays in Redis for the next start or another
		// instance). Other instances' entries are not waited for: they go
		// on writing while this one stops.
		g.OnStop(service.Work, "committer", committer.Close)
		g.OnStop(service.Work, "outbox", func() {
			drainOutbox(written, rdb, relayNC.IsConnected, min(5*time.Second, cfg.ShutdownTimeout), log)
		})
		// Background loops live until the HTTP server and the committer are done.
		g.Go(service.Work, "topology", func(ctx context.Context) error {
			if applyTopology(ctx, js, cfg.Topology, log) == nil {
				topologyApplied.Store(true)
				topoReady.Set(1)
			}
			return nil
		})
		g.Go(service.Work, "links", func(ctx context.Context) error { redirect.WatchLinks(ctx, js, resolver, log); return nil })
		g.Go(service.Work, "relay", relay.Run)
		g.Go(service.Work, "monitor", func(ctx context.Context) error { monitor.Run(ctx, cfg.MonitorInterval); return nil })
		return nil
	})
}

// committerRedis opens the group commit's own Redis client, whose socket
// reads and writes wait SNIP_COMMIT_TIMEOUT, whatever REDIS_URL's
// read_timeout says: a group commit then fails no sooner than that after it
// was sent (the commit's context has the same deadline, so it is not
// retried past it), and not much later. The config keeps SNIP_COMMIT_TIMEOUT
// above SNIP_OUTBOX_VALIDITY + SNIP_OUTBOX_WAIT: by the time a click's
// commit has failed, its entry's validity has passed, so an XADD that Redis
// runs after the failure (it was frozen with the write in its socket) is
// late and never relayed, and the request the failure answered with 503
// click_not_recorded is not counted (decisions/0014). A shorter read
// timeout would fail the commit while the entry could still be stored in
// time.
func committerRedis(cfg Config) (redis.UniversalClient, error) {
	return redisconn.OpenWithTimeout(cfg.Redis.URL, cfg.CommitTimeout)
}

// relayNATSOptions are the options of the relay's NATS connection beyond
// the service's. ReconnectBufSize(-1): while the connection reconnects a
// publish fails at once instead of waiting in the client's buffer. With a
// buffer, a break in the middle of a batch loses what was on the wire,
// stores the rest of the batch at the reconnect, and the relay's retry then
// stores the lost entries after them: a client-side resend, out of order.
// Without one, the rest of the batch fails and the relay retries the lane
// from its head.
var relayNATSOptions = []nats.Option{nats.ReconnectBufSize(-1)}

// relayNATS opens the relay's own NATS connection (drained at shutdown
// after the relay has stopped) and its JetStream context: a window of
// RelayWindow entries per lane in flight, each ack awaited at most
// PublishTimeout.
func relayNATS(g *service.Group, cfg Config) (*nats.Conn, jetstream.JetStream, error) {
	nc, _, err := g.NATS(cfg.NATS, "redirect relay "+cfg.Instance, relayNATSOptions...)
	if err != nil {
		return nil, nil, err
	}
	js, err := relayJetStream(nc, cfg)
	return nc, js, err
}

func relayJetStream(nc *nats.Conn, cfg Config) (jetstream.JetStream, error) {
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(cfg.OutboxShards*len(outbox.Lanes)*cfg.RelayWindow),
		jetstream.WithPublishAsyncTimeout(cfg.PublishTimeout))
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	return js, nil
}

// relayConfig is the relay's configuration; nc is its connection, whose
// reconnects stop a batch (outbox.RelayConfig.Reconnects).
func relayConfig(cfg Config, nc *nats.Conn) outbox.RelayConfig {
	return outbox.RelayConfig{
		Instance: cfg.Instance, Window: cfg.RelayWindow, LeaseTTL: cfg.RelayLeaseTTL, Block: time.Second, Linger: cfg.RelayLinger,
		Reconnects: func() uint64 { return nc.Stats().Reconnects },
	}
}

// withPoolSize sets pool_size on a redis URL (both forms redisconn takes).
func withPoolSize(url string, n int) string {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + "pool_size=" + strconv.Itoa(n)
}

// applyTopology applies the JetStream topology unless SNIP_APPLY_TOPOLOGY
// says not to, retrying while NATS is away: redirects are served meanwhile,
// into the outbox. It returns nil once the streams are there to publish to;
// the relay waits for that. When Apply fails for another reason (a NATS user
// without stream-admin rights, a partition count that differs from the
// existing stream) but the streams exist, it logs why and relays into them
// as they are.
func applyTopology(ctx context.Context, js jetstream.JetStream, t service.Topology, log *slog.Logger) error {
	return service.Retry(ctx, log, "apply topology", func(ctx context.Context) error {
		err := errNotApplied
		if t.ApplyTopology {
			if err = topology.Apply(ctx, js, t.Options()); err == nil {
				log.Info("topology applied", "partitions", t.Partitions)
				return nil
			}
		}
		if !streamsExist(ctx, js) {
			return err
		}
		if t.ApplyTopology {
			log.Error("topology not applied; the streams exist, relaying into them as they are", "err", err)
		}
		return nil
	})
}

// errNotApplied: SNIP_APPLY_TOPOLOGY=false, and the streams are not there yet.
var errNotApplied = errors.New("SNIP_APPLY_TOPOLOGY is false: waiting for the streams (snipctl topology apply)")

// streamsExist reports whether every stream the relay publishes to exists.
func streamsExist(ctx context.Context, js jetstream.JetStream) bool {
	for _, name := range []string{events.ClicksStream, events.LinksStream, events.PreviewJobsStream, events.DeadLetterStream} {
		if _, err := js.Stream(ctx, name); err != nil {
			return false
		}
	}
	return true
}

// drainOutbox waits until every entry this instance wrote into the outbox
// has been relayed (deleted from its lane by the relay of its shard, this
// instance's or another's), NATS is away, or d passes. Entries other
// instances wrote are not its to wait for: under their traffic the outbox
// is never empty, and a shard whose relay is stuck holds entries this
// instance may have no part in. What is not relayed by then stays in Redis,
// for the relay that takes the shard over.
func drainOutbox(w *outbox.Written, rdb redis.UniversalClient, connected func() bool, d time.Duration, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for connected() {
		n, err := w.Unrelayed(ctx, rdb)
		if err != nil || n == 0 {
			return
		}
		select {
		case <-ctx.Done():
			log.Info("outbox entries this instance wrote are not all relayed at shutdown; the relays that take their shards publish them", "lanes", n)
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// redisLogger sends go-redis's internal messages (dial retries while Redis
// is down) to the service log at debug level; the errors that matter are
// returned to, and logged by, the code that called Redis.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, "redis: "+fmt.Sprintf(format, v...))
}
