package main

import (
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/snipdev/snip/pkg/service"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/redirect/internal/redirect"
)

// Config is the redirect service's configuration, read once from the
// environment (README.md has the table).
type Config struct {
	service.Base
	service.NATS
	service.Redis
	// The topology, applied at start (retried in the background: redirects
	// are served meanwhile, into the outbox).
	service.Topology

	// Owners are ensured at start (SNIP_BOOTSTRAP_OWNERS: demos, tests).
	service.Owners
	// PublicURL is the base of short_url in API answers, e.g.
	// https://sn.ip; empty derives it from each request's Host.
	PublicURL string `env:"SNIP_PUBLIC_URL"`
	// TrustedProxies are CIDRs whose X-Forwarded-For is believed; empty
	// means the connection's peer is the client.
	TrustedProxies []string `env:"SNIP_TRUSTED_PROXIES" envSeparator:","`
	// LinkCreateLimit links per LinkCreateWindow each owner may create (all
	// its keys together, every instance together); 0: no limit. Over it:
	// 429 with Retry-After.
	LinkCreateLimit  int           `env:"SNIP_LINK_CREATE_LIMIT" envDefault:"6000"`
	LinkCreateWindow time.Duration `env:"SNIP_LINK_CREATE_WINDOW" envDefault:"1m"`

	// OutboxShards is the number of outbox shards (and relay leases). Fixed
	// once the outbox exists: the service refuses to start with another.
	OutboxShards int `env:"SNIP_OUTBOX_SHARDS" envDefault:"16"`
	// OutboxMaxEntries bounds each lane of the outbox over all shards
	// (each shard holds at most OutboxMaxEntries/OutboxShards). A click is
	// about 500 bytes in Redis, so the default is about 1 GB of clicks:
	// 30 minutes of a NATS outage at 1,000 clicks/s.
	OutboxMaxEntries int64 `env:"SNIP_OUTBOX_MAX_ENTRIES" envDefault:"2000000"`
	// UnrecordedPolicy is what a redirect does when its click can be
	// recorded neither in the outbox nor straight in JetStream: "reject"
	// (503, never counted) or "redirect" (302 anyway, counted in
	// clicks_unrecorded_total, the click lost).
	UnrecordedPolicy redirect.Policy `env:"SNIP_UNRECORDED_POLICY" envDefault:"reject"`
	// OutboxWait is how long a redirect waits for Redis to store its click
	// before publishing it straight to JetStream instead (and waiting for
	// the ack, at most DirectTimeout). It bounds what a stopped Redis adds
	// to a redirect.
	OutboxWait time.Duration `env:"SNIP_OUTBOX_WAIT" envDefault:"100ms"`
	// OutboxValidity: a click's outbox entry is relayed only if Redis stored
	// it (by its stream ID, Redis's clock) within this long of the
	// redirect handing it over (this host's clock); a later one is deleted
	// unpublished, because the redirect had stopped waiting for it. The
	// margin above SNIP_OUTBOX_WAIT tolerates Redis's clock running ahead.
	OutboxValidity time.Duration `env:"SNIP_OUTBOX_VALIDITY" envDefault:"1s"`
	// OutboxWaitReplicas, when above 0, makes each group commit wait (Redis
	// WAIT) until that many replicas of each master it wrote to have the
	// batch, for at most OutboxWaitReplicasTimeout. A click whose master's
	// replicas fell short is published straight to CLICKS as well, so the
	// master's crash before its replica caught up cannot lose it. 0: off
	// (replication stays asynchronous). 1 is the setting for Redis Cluster
	// or a replicated Redis; on a Redis without replicas every click would
	// wait the timeout and take the direct path too. Link creations and
	// deletions and API key rotations wait the same way (a short wait is
	// counted in snip_redirect_writes_replica_wait_short_total and answered
	// as usual).
	OutboxWaitReplicas int `env:"SNIP_OUTBOX_WAIT_REPLICAS" envDefault:"0"`
	// OutboxWaitReplicasTimeout bounds that wait. It must be below
	// SNIP_OUTBOX_WAIT, which bounds the whole outbox write.
	OutboxWaitReplicasTimeout time.Duration `env:"SNIP_OUTBOX_WAIT_REPLICAS_TIMEOUT" envDefault:"50ms"`
	// DirectTimeout bounds each wait for JetStream's ack of a click
	// published straight to CLICKS (directpub.Attempts when acks time out).
	DirectTimeout time.Duration `env:"SNIP_DIRECT_TIMEOUT" envDefault:"500ms"`
	// LookupTimeout bounds a link lookup in Redis on a cache miss.
	LookupTimeout time.Duration `env:"SNIP_LOOKUP_TIMEOUT" envDefault:"250ms"`
	// CommitMaxBatch and CommitWorkers shape the group commit.
	CommitMaxBatch int `env:"SNIP_COMMIT_MAX_BATCH" envDefault:"256"`
	CommitWorkers  int `env:"SNIP_COMMIT_WORKERS" envDefault:"2"`
	// CommitLinger is how long a group commit waits for more clicks after
	// its first, when clicks arrive that densely (outbox.CommitterConfig);
	// it adds at most that to a redirect. 0: never waits.
	CommitLinger time.Duration `env:"SNIP_COMMIT_LINGER" envDefault:"500us"`
	// CommitTimeout bounds one group commit's Redis round trip: the
	// committer's own Redis client waits this long for each read and write
	// (REDIS_URL's read_timeout and write_timeout do not apply to it), and a
	// commit is not retried past it. It must exceed OutboxValidity +
	// OutboxWait, so that a commit fails only once its clicks' validity has
	// passed (committerRedis says why).
	CommitTimeout time.Duration `env:"SNIP_COMMIT_TIMEOUT" envDefault:"2s"`
	// RelayWindow is the most entries per lane in flight to JetStream.
	RelayWindow int `env:"SNIP_RELAY_WINDOW" envDefault:"512"`
	// RelayLinger is how long a shard's relay waits after a small batch so
	// the next one is larger (fewer Redis and JetStream round trips); it
	// delays publishing, never a redirect.
	RelayLinger time.Duration `env:"SNIP_RELAY_LINGER" envDefault:"20ms"`
	// RelayLeaseTTL is how long a dead instance's shards wait to be taken
	// over; at most maxRelayWait.
	RelayLeaseTTL time.Duration `env:"SNIP_RELAY_LEASE_TTL" envDefault:"5s"`
	// PublishTimeout bounds the wait for one JetStream ack; more than 0 (0
	// would wait for an ack that never comes forever, the shard stuck while
	// its lease is renewed) and at most maxRelayWait.
	PublishTimeout time.Duration `env:"SNIP_PUBLISH_TIMEOUT" envDefault:"5s"`
	// MonitorInterval is how often outbox depth and age are sampled; more
	// than 0.
	MonitorInterval time.Duration `env:"SNIP_OUTBOX_SAMPLE_INTERVAL" envDefault:"1s"`

	// CacheSize and CacheTTL bound the in-process link cache.
	CacheSize int           `env:"SNIP_CACHE_SIZE" envDefault:"100000"`
	CacheTTL  time.Duration `env:"SNIP_CACHE_TTL" envDefault:"60s"`
	// CacheStaleIfError is how long past CacheTTL a cached link still
	// redirects while its lookup in Redis fails; 0 turns it off.
	CacheStaleIfError time.Duration `env:"SNIP_CACHE_STALE_IF_ERROR" envDefault:"1h"`
	// Instance names this process in relay leases; default hostname-pid.
	Instance string `env:"SNIP_INSTANCE"`
}

// loadConfig reads the environment (the service takes no arguments).
func loadConfig(environ, _ []string) (Config, error) {
	cfg := Config{Base: service.Base{HTTPAddr: ":8080", ShutdownTimeout: 15 * time.Second}}
	return service.LoadConfig(environ, cfg, (*Config).validate)
}

func (c *Config) validate() error {
	switch {
	case c.UnrecordedPolicy != redirect.PolicyRedirect && c.UnrecordedPolicy != redirect.PolicyReject:
		return fmt.Errorf("SNIP_UNRECORDED_POLICY %q: want redirect or reject", c.UnrecordedPolicy)
	case c.OutboxShards < 1 || c.OutboxShards > 1024:
		return fmt.Errorf("SNIP_OUTBOX_SHARDS %d: want 1..1024", c.OutboxShards)
	case c.OutboxMaxEntries < int64(c.OutboxShards):
		return fmt.Errorf("SNIP_OUTBOX_MAX_ENTRIES %d: want at least one per shard", c.OutboxMaxEntries)
	case c.OutboxWait <= 0 || c.OutboxWait > 5*time.Second:
		return fmt.Errorf("SNIP_OUTBOX_WAIT %s: want more than 0, at most 5s", c.OutboxWait)
	case c.OutboxValidity < c.OutboxWait:
		return fmt.Errorf("SNIP_OUTBOX_VALIDITY %s: want at least SNIP_OUTBOX_WAIT (%s)", c.OutboxValidity, c.OutboxWait)
	case c.OutboxWaitReplicas < 0:
		return fmt.Errorf("SNIP_OUTBOX_WAIT_REPLICAS %d: want 0 (off) or more", c.OutboxWaitReplicas)
	case c.OutboxWaitReplicas > 0 && (c.OutboxWaitReplicasTimeout < time.Millisecond || c.OutboxWaitReplicasTimeout >= c.OutboxWait):
		return fmt.Errorf("SNIP_OUTBOX_WAIT_REPLICAS_TIMEOUT %s: want at least 1ms and less than SNIP_OUTBOX_WAIT (%s)",
			c.OutboxWaitReplicasTimeout, c.OutboxWait)
	case c.CommitLinger < 0 || c.CommitLinger+c.replicaWait() >= c.OutboxWait:
		return fmt.Errorf("SNIP_COMMIT_LINGER %s: want 0 or more, and with the replica wait (%s) less than SNIP_OUTBOX_WAIT (%s)",
			c.CommitLinger, c.replicaWait(), c.OutboxWait)
	case c.DirectTimeout <= 0:
		return fmt.Errorf("SNIP_DIRECT_TIMEOUT %s: want more than 0", c.DirectTimeout)
	case c.LookupTimeout <= 0:
		return fmt.Errorf("SNIP_LOOKUP_TIMEOUT %s: want more than 0", c.LookupTimeout)
	case c.CommitTimeout <= c.OutboxValidity+c.OutboxWait:
		return fmt.Errorf("SNIP_COMMIT_TIMEOUT %s: want more than SNIP_OUTBOX_VALIDITY + SNIP_OUTBOX_WAIT (%s), so that a commit fails only once its clicks' validity has passed",
			c.CommitTimeout, c.OutboxValidity+c.OutboxWait)
	case c.RelayLeaseTTL < 300*time.Millisecond || c.RelayLeaseTTL > maxRelayWait:
		return fmt.Errorf("SNIP_RELAY_LEASE_TTL %s: want at least 300ms, at most %s", c.RelayLeaseTTL, maxRelayWait)
	case c.PublishTimeout <= 0 || c.PublishTimeout > maxRelayWait:
		return fmt.Errorf("SNIP_PUBLISH_TIMEOUT %s: want more than 0, at most %s", c.PublishTimeout, maxRelayWait)
	case c.MonitorInterval <= 0:
		return fmt.Errorf("SNIP_OUTBOX_SAMPLE_INTERVAL %s: want more than 0", c.MonitorInterval)
	case c.CacheSize < 1:
		return fmt.Errorf("SNIP_CACHE_SIZE %d: want at least 1", c.CacheSize)
	case c.CacheTTL <= 0:
		// Every link would expire as it is cached: a Redis lookup per redirect.
		return fmt.Errorf("SNIP_CACHE_TTL %s: want more than 0", c.CacheTTL)
	case c.CacheStaleIfError < 0:
		return fmt.Errorf("SNIP_CACHE_STALE_IF_ERROR %s: want 0 (off) or more", c.CacheStaleIfError)
	// The committer and the relay would take a size below 1 for 1: a
	// group commit per click, one entry per lane in flight.
	case c.CommitMaxBatch < 1:
		return fmt.Errorf("SNIP_COMMIT_MAX_BATCH %d: want at least 1", c.CommitMaxBatch)
	case c.CommitWorkers < 1:
		return fmt.Errorf("SNIP_COMMIT_WORKERS %d: want at least 1", c.CommitWorkers)
	case c.RelayWindow < 1:
		return fmt.Errorf("SNIP_RELAY_WINDOW %d: want at least 1", c.RelayWindow)
	case c.RelayLinger < 0:
		return fmt.Errorf("SNIP_RELAY_LINGER %s: want 0 or more", c.RelayLinger)
	case c.LinkCreateLimit < 0 || (c.LinkCreateLimit > 0 && c.LinkCreateWindow < time.Second):
		return fmt.Errorf("SNIP_LINK_CREATE_LIMIT %d per SNIP_LINK_CREATE_WINDOW %s: want a limit >= 0 (0: none) and a window of 1s or more",
			c.LinkCreateLimit, c.LinkCreateWindow)
	}
	if _, err := c.trustedProxies(); err != nil {
		return err
	}
	if c.Instance == "" {
		host, _ := os.Hostname()
		c.Instance = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	return nil
}

// maxRelayWait bounds SNIP_PUBLISH_TIMEOUT and SNIP_RELAY_LEASE_TTL: the
// relay sends an entry again after an ack did not come in time, or after a
// takeover, and the streams drop the second copy only within their
// duplicate window (topology.DefaultClicksDuplicates, 2 minutes). A quarter
// of it each leaves room for both in one retry, and the relay's backoff.
const maxRelayWait = topology.DefaultClicksDuplicates / 4

// replicaWait is the longest a group commit waits for replicas (0: off).
func (c *Config) replicaWait() time.Duration {
	if c.OutboxWaitReplicas > 0 {
		return c.OutboxWaitReplicasTimeout
	}
	return 0
}

func (c *Config) trustedProxies() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range c.TrustedProxies {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if !strings.Contains(s, "/") {
			a, err := netip.ParseAddr(s)
			if err != nil {
				return nil, fmt.Errorf("SNIP_TRUSTED_PROXIES %q: %w", s, err)
			}
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("SNIP_TRUSTED_PROXIES %q: %w", s, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// LogValue is the configuration as logged: secrets masked.
func (c Config) LogValue() slog.Value { return service.LogValue(c) }
