package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"reflect"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/natsconn"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/clickcounter/internal/counter"
)

// Config is the click counter's configuration, read once from the
// environment. The SNIP_* variables are the deployment's, shared with
// snipctl and the other services.
type Config struct {
	NATSURL      string `env:"NATS_URL" envDefault:"nats://127.0.0.1:4222"`
	NATSUser     string `env:"NATS_USER"`
	NATSPassword string `env:"NATS_PASSWORD"`
	NATSCreds    string `env:"NATS_CREDS"`
	NATSInbox    string `env:"NATS_INBOX_PREFIX"`
	// RedisURL is where the counts live (see pkg/redisconn for the cluster form).
	RedisURL string `env:"REDIS_URL" envDefault:"redis://127.0.0.1:6379/0"`
	// HTTPAddr serves the stats API, /healthz, /readyz and /metrics.
	HTTPAddr string     `env:"HTTP_ADDR" envDefault:":8081"`
	LogLevel slog.Level `env:"LOG_LEVEL" envDefault:"info"`
	// ShutdownTimeout bounds each stage of a graceful stop: HTTP requests in
	// flight, and the batch in hand (finished and acked).
	ShutdownTimeout time.Duration `env:"SHUTDOWN_TIMEOUT" envDefault:"30s"`
	// BootstrapOwners is "id:key,..." owners to ensure at start (demo, tests).
	BootstrapOwners string `env:"SNIP_BOOTSTRAP_OWNERS"`

	// The topology the service applies at start (as snipctl topology apply).
	Partitions     int           `env:"SNIP_PARTITIONS" envDefault:"8"`
	Replicas       int           `env:"SNIP_REPLICAS" envDefault:"1"`
	ClicksMaxAge   time.Duration `env:"SNIP_CLICKS_MAX_AGE" envDefault:"168h"`
	ClicksMaxBytes int64         `env:"SNIP_CLICKS_MAX_BYTES" envDefault:"-1"`

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

	// Ready, if set, is called with the HTTP address once it listens.
	Ready func(addr string) `env:"-"`
	// Hooks inject faults in tests.
	Hooks counter.Hooks `env:"-"`
	// NATSOptions are extra connection options (tests cut the connection
	// with a custom dialer).
	NATSOptions []nats.Option `env:"-"`
	// Storage is the streams' storage: file (the zero value); tests use memory.
	Storage jetstream.StorageType `env:"-"`
}

func loadConfig(environ []string) (Config, error) {
	var cfg Config
	if err := env.ParseWithOptions(&cfg, env.Options{Environment: env.ToMap(environ)}); err != nil {
		// Name the variable, not the Go field.
		var pe env.ParseError
		if errors.As(err, &pe) {
			if f, ok := reflect.TypeFor[Config]().FieldByName(pe.Name); ok {
				return Config{}, fmt.Errorf("load config: %s: %w", f.Tag.Get("env"), pe.Err)
			}
		}
		return Config{}, fmt.Errorf("load config: %w", err)
	}
	if err := cfg.validate(); err != nil {
		return Config{}, fmt.Errorf("load config: %w", err)
	}
	return cfg, nil
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

// LogValue prints the configuration with secrets masked.
func (c Config) LogValue() slog.Value {
	mask := func(s string) string {
		if s == "" {
			return ""
		}
		return "***"
	}
	return slog.GroupValue(
		slog.String("nats_url", c.NATSURL), slog.String("nats_user", c.NATSUser),
		slog.String("nats_password", mask(c.NATSPassword)), slog.String("nats_creds", c.NATSCreds),
		slog.String("redis_url", maskURL(c.RedisURL)), slog.String("http_addr", c.HTTPAddr),
		slog.String("bootstrap_owners", mask(c.BootstrapOwners)),
		slog.Int("partitions", c.Partitions), slog.Int("replicas", c.Replicas),
		slog.Duration("clicks_max_age", c.ClicksMaxAge), slog.String("member", c.Member),
		slog.Int("batch_size", c.BatchSize), slog.Duration("linger", c.Linger),
		slog.Duration("lease_ttl", c.LeaseTTL), slog.Duration("dedup_window", c.DedupWindow),
		slog.Duration("shutdown_timeout", c.ShutdownTimeout),
	)
}

func (c Config) nats() natsconn.Config {
	return natsconn.Config{URL: c.NATSURL, Name: "clickcounter", User: c.NATSUser, Password: c.NATSPassword, CredsFile: c.NATSCreds, InboxPrefix: c.NATSInbox}
}

func (c Config) topology() topology.Options {
	o := topology.Defaults()
	o.Partitions = c.Partitions
	o.Replicas = c.Replicas
	o.ClicksMaxAge = c.ClicksMaxAge
	o.ClicksMaxBytes = c.ClicksMaxBytes
	o.Storage = c.Storage
	return o
}

// maskURL hides the password of a URL.
func maskURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable)"
	}
	return u.Redacted()
}
