package main

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/snipdev/snip/pkg/service"
	"github.com/snipdev/snip/services/clickcounter/internal/counter"
)

// Config is the click counter's configuration, read once from the
// environment. The SNIP_* variables are the deployment's, shared with
// snipctl and the other services.
type Config struct {
	service.Base
	service.NATS
	// Redis is where the counts live.
	service.Redis
	// The topology the service applies at start (as snipctl topology apply).
	service.Topology
	// Owners are ensured at start (SNIP_BOOTSTRAP_OWNERS: demos, tests).
	service.Owners

	// Member names this instance in the consumer group; empty: host-pid-random.
	Member string `env:"CLICKCOUNTER_MEMBER"`
	// BatchSize is the most events counted in one Redis write. A write
	// costs about the same for 500 events as for 2,000 (the batch is
	// aggregated per link first), so catching up a backlog runs at the bare
	// consumer's speed with 2,000 and at half of it with 500
	// (docs/benchmarks.md). Live traffic makes small batches anyway (Linger).
	BatchSize int `env:"CLICKCOUNTER_BATCH_SIZE" envDefault:"2000"`
	// Linger is the longest a batch waits to fill: the floor of the counts'
	// staleness at low traffic.
	Linger time.Duration `env:"CLICKCOUNTER_LINGER" envDefault:"100ms"`
	// LeaseTTL is how long a dead member keeps its partitions: the failover time.
	LeaseTTL time.Duration `env:"CLICKCOUNTER_LEASE_TTL" envDefault:"3s"`
	// DedupWindow is how long an event ID is remembered after it was
	// counted, against the same event stored a second time under another
	// sequence (a relay retry after JetStream's duplicate window). Memory:
	// 10-20 bytes per event counted within the window (README).
	DedupWindow time.Duration `env:"CLICKCOUNTER_DEDUP_WINDOW" envDefault:"10m"`

	// WaitReplicas, when above 0, makes the LINKS and verdict feeds wait
	// (Redis WAIT, after a barrier write on each master they wrote to)
	// until that many replicas have a batch's writes before they ack it,
	// for at most WaitReplicasTimeout: a Redis master that dies right after
	// the ack then loses none of them. A wait that falls short is counted
	// (snip_clickcounter_replica_wait_short_total) and the batch acked all
	// the same. 0: off. 1 for Redis Cluster or a replicated Redis; never on
	// a Redis without replicas (every batch would wait the timeout). The
	// click counts do not need it: the counter reads back from CLICKS what
	// Redis lost.
	WaitReplicas int `env:"CLICKCOUNTER_WAIT_REPLICAS" envDefault:"0"`
	// WaitReplicasTimeout bounds that wait.
	WaitReplicasTimeout time.Duration `env:"CLICKCOUNTER_WAIT_REPLICAS_TIMEOUT" envDefault:"100ms"`

	// Hooks inject faults in tests.
	Hooks counter.Hooks `env:"-"`
}

// loadConfig reads the environment (the counter takes no arguments).
func loadConfig(environ, _ []string) (Config, error) {
	cfg := Config{Base: service.Base{HTTPAddr: ":8081", ShutdownTimeout: 30 * time.Second}}
	return service.LoadConfig(environ, cfg, (*Config).validate)
}

func (c Config) validate() error {
	switch {
	case c.BatchSize < 1 || c.BatchSize > 10_000:
		return fmt.Errorf("CLICKCOUNTER_BATCH_SIZE %d: want 1..10000", c.BatchSize)
	case c.Linger <= 0:
		return fmt.Errorf("CLICKCOUNTER_LINGER %s: want > 0", c.Linger)
	case c.DedupWindow < time.Second:
		return fmt.Errorf("CLICKCOUNTER_DEDUP_WINDOW %s: want >= 1s", c.DedupWindow)
	case c.WaitReplicas < 0:
		return fmt.Errorf("CLICKCOUNTER_WAIT_REPLICAS %d: want 0 (off) or more", c.WaitReplicas)
	case c.WaitReplicas > 0 && (c.WaitReplicasTimeout < time.Millisecond || c.WaitReplicasTimeout > 10*time.Second):
		return fmt.Errorf("CLICKCOUNTER_WAIT_REPLICAS_TIMEOUT %s: want 1ms..10s", c.WaitReplicasTimeout)
	case c.ShutdownTimeout <= 0:
		return fmt.Errorf("SHUTDOWN_TIMEOUT %s: want > 0", c.ShutdownTimeout)
	}
	return nil
}

// LogValue is the configuration as logged: secrets masked.
func (c Config) LogValue() slog.Value { return service.LogValue(c) }
