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
	case c.ShutdownTimeout <= 0:
		return fmt.Errorf("SHUTDOWN_TIMEOUT %s: want > 0", c.ShutdownTimeout)
	}
	return nil
}

// LogValue is the configuration as logged: secrets masked.
func (c Config) LogValue() slog.Value { return service.LogValue(c) }
