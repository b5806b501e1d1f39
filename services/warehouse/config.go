package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/snipdev/snip/pkg/natsconn"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/warehouse/internal/chwriter"
	"github.com/snipdev/snip/services/warehouse/internal/loader"
	"github.com/snipdev/snip/services/warehouse/internal/schema"
)

// Config is the loader's configuration, read once from the environment (and
// the -since flag) in main.
type Config struct {
	// NATSURL is the NATS server (comma-separated for a cluster).
	NATSURL      string `env:"NATS_URL" envDefault:"nats://127.0.0.1:4222"`
	NATSUser     string `env:"NATS_USER"`
	NATSPassword string `env:"NATS_PASSWORD"`
	NATSCreds    string `env:"NATS_CREDS"`
	NATSInbox    string `env:"NATS_INBOX_PREFIX"`

	// ClickHouseAddrs are host:port of ClickHouse's native protocol (9000),
	// comma-separated; HTTP (8123) does not work with 18.16.
	ClickHouseAddrs []string `env:"CLICKHOUSE_ADDR" envDefault:"127.0.0.1:9000" envSeparator:","`
	// ClickHouseDatabase holds the tables; the loader creates it if missing.
	ClickHouseDatabase string `env:"CLICKHOUSE_DATABASE" envDefault:"snip"`
	ClickHouseUser     string `env:"CLICKHOUSE_USER" envDefault:"default"`
	ClickHousePassword string `env:"CLICKHOUSE_PASSWORD"`
	// ClickHouseDialTimeout bounds connecting and the handshake; it is what
	// bounds a call to a frozen server that has not answered the handshake.
	ClickHouseDialTimeout time.Duration `env:"CLICKHOUSE_DIAL_TIMEOUT" envDefault:"5s"`

	// BatchRows starts an insert once this many rows wait. Measured on 18.16
	// (docs/benchmarks.md): 10k-row inserts reach about 100k rows/s, 1k-row
	// ones a fifth of that. It is also the runtime's batch per partition, so
	// one busy partition can fill an insert alone.
	BatchRows int `env:"WAREHOUSE_BATCH_ROWS" envDefault:"10000"`
	// Linger starts an insert at most this long after its first row arrived:
	// at low traffic, about one insert a second, as ClickHouse asks.
	Linger time.Duration `env:"WAREHOUSE_LINGER" envDefault:"1s"`
	// InsertTimeout bounds one insert; a hung server fails it, and the
	// batch is retried. The slowest insert measured (100k rows) took 0.4s.
	InsertTimeout time.Duration `env:"WAREHOUSE_INSERT_TIMEOUT" envDefault:"20s"`
	// MaxRetryDelay caps the backoff between retries of a failing batch.
	MaxRetryDelay time.Duration `env:"WAREHOUSE_MAX_RETRY_DELAY" envDefault:"10s"`
	// Since, for a group that does not exist yet, loads only the clicks of
	// the last Since (e.g. 72h) from the retained log before following live;
	// 0 loads everything CLICKS retains. Ignored once the group exists.
	// The -since flag overrides it.
	Since time.Duration `env:"WAREHOUSE_SINCE" envDefault:"0"`
	// Member names this instance in the group (default hostname-pid-random).
	Member string `env:"WAREHOUSE_MEMBER"`
	// LeaseTTL is how long a crashed member keeps its partitions.
	LeaseTTL time.Duration `env:"WAREHOUSE_LEASE_TTL" envDefault:"3s"`

	// ApplyTopology applies the topology at start; false for a NATS user
	// without stream-admin permissions (run `snipctl topology apply` first;
	// the loader waits for CLICKS).
	ApplyTopology bool `env:"SNIP_APPLY_TOPOLOGY" envDefault:"true"`
	// The CLICKS topology, applied at start; the same variables configure
	// snipctl and the other services.
	Partitions     int           `env:"SNIP_PARTITIONS" envDefault:"8"`
	Replicas       int           `env:"SNIP_REPLICAS" envDefault:"1"`
	ClicksMaxAge   time.Duration `env:"SNIP_CLICKS_MAX_AGE" envDefault:"168h"`
	ClicksMaxBytes int64         `env:"SNIP_CLICKS_MAX_BYTES" envDefault:"-1"`

	// HTTPAddr serves /healthz, /readyz and /metrics.
	HTTPAddr string `env:"HTTP_ADDR" envDefault:":8083"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `env:"LOG_LEVEL" envDefault:"info"`
	// ShutdownTimeout bounds the graceful drain: the batches in hand are
	// inserted and acked within it, or left for the next member.
	ShutdownTimeout time.Duration `env:"SHUTDOWN_TIMEOUT" envDefault:"30s"`

	// Ready, if set, is called with the HTTP address once it accepts
	// connections (tests listen on 127.0.0.1:0).
	Ready func(addr string) `env:"-"`
}

// loadConfig reads the environment, then the flags in args (without the
// program name).
func loadConfig(environ, args []string) (Config, error) {
	var cfg Config
	if err := env.ParseWithOptions(&cfg, env.Options{Environment: env.ToMap(environ)}); err != nil {
		return Config{}, fmt.Errorf("load config: %w", err)
	}
	fs := flag.NewFlagSet("warehouse", flag.ContinueOnError)
	fs.DurationVar(&cfg.Since, "since", cfg.Since, "on a first start, load only the clicks of the last `duration` (e.g. 72h) from the log (env WAREHOUSE_SINCE)")
	if err := fs.Parse(args); err != nil {
		return Config{}, fmt.Errorf("load config: %w", err)
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("load config: unexpected arguments %q", fs.Args())
	}
	if err := cfg.validate(); err != nil {
		return Config{}, fmt.Errorf("load config: %w", err)
	}
	return cfg, nil
}

var errConfig = errors.New("invalid configuration")

func (c Config) validate() error {
	switch {
	case c.Since < 0:
		return fmt.Errorf("WAREHOUSE_SINCE %s: want >= 0: %w", c.Since, errConfig)
	case c.Since > 0 && c.Since > c.ClicksMaxAge:
		return fmt.Errorf("WAREHOUSE_SINCE %s is longer than CLICKS retains (%s): %w", c.Since, c.ClicksMaxAge, errConfig)
	case len(c.ClickHouseAddrs) == 0 || c.ClickHouseAddrs[0] == "":
		return fmt.Errorf("CLICKHOUSE_ADDR is empty: %w", errConfig)
	case c.BatchRows < 1 || c.BatchRows > 1_000_000:
		return fmt.Errorf("WAREHOUSE_BATCH_ROWS %d: want 1..1000000: %w", c.BatchRows, errConfig)
	case c.Linger <= 0 || c.Linger > time.Minute:
		return fmt.Errorf("WAREHOUSE_LINGER %s: want > 0 and <= 1m: %w", c.Linger, errConfig)
	case c.InsertTimeout <= 0 || c.MaxRetryDelay <= 0 || c.ClickHouseDialTimeout <= 0:
		return fmt.Errorf("WAREHOUSE_INSERT_TIMEOUT, WAREHOUSE_MAX_RETRY_DELAY and CLICKHOUSE_DIAL_TIMEOUT must be > 0: %w", errConfig)
	case !schema.ValidDatabase(c.ClickHouseDatabase):
		return fmt.Errorf("CLICKHOUSE_DATABASE %q: %w", c.ClickHouseDatabase, schema.ErrBadDatabaseName)
	case c.ShutdownTimeout <= 0:
		return fmt.Errorf("SHUTDOWN_TIMEOUT %s: want > 0: %w", c.ShutdownTimeout, errConfig)
	}
	if _, err := c.logLevel(); err != nil {
		return err
	}
	return nil
}

func (c Config) logLevel() (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return 0, fmt.Errorf("LOG_LEVEL %q: %w", c.LogLevel, errConfig)
	}
	return l, nil
}

func (c Config) nats() natsconn.Config {
	return natsconn.Config{URL: c.NATSURL, Name: "warehouse", User: c.NATSUser, Password: c.NATSPassword, CredsFile: c.NATSCreds, InboxPrefix: c.NATSInbox}
}

func (c Config) clickhouse() chwriter.Config {
	addrs := make([]string, 0, len(c.ClickHouseAddrs))
	for _, a := range c.ClickHouseAddrs {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	return chwriter.Config{
		Addrs:       addrs,
		Database:    c.ClickHouseDatabase,
		User:        c.ClickHouseUser,
		Password:    c.ClickHousePassword,
		DialTimeout: c.ClickHouseDialTimeout,
	}
}

func (c Config) topology() topology.Options {
	o := topology.Defaults()
	o.Partitions = c.Partitions
	o.Replicas = c.Replicas
	o.ClicksMaxAge = c.ClicksMaxAge
	o.ClicksMaxBytes = c.ClicksMaxBytes
	return o
}

func (c Config) loader() loader.Config {
	return loader.Config{MaxRows: c.BatchRows, Linger: c.Linger, InsertTimeout: c.InsertTimeout}
}

// logValue is the configuration as logged at start, secrets masked.
func (c Config) logValue() slog.Value {
	mask := func(s string) string {
		if s == "" {
			return ""
		}
		return "***"
	}
	return slog.GroupValue(
		slog.String("nats_url", c.NATSURL), slog.String("nats_user", c.NATSUser), slog.String("nats_password", mask(c.NATSPassword)),
		slog.String("nats_creds", c.NATSCreds),
		slog.Any("clickhouse_addr", c.ClickHouseAddrs), slog.String("clickhouse_database", c.ClickHouseDatabase),
		slog.String("clickhouse_user", c.ClickHouseUser), slog.String("clickhouse_password", mask(c.ClickHousePassword)),
		slog.Int("batch_rows", c.BatchRows), slog.Duration("linger", c.Linger), slog.Duration("insert_timeout", c.InsertTimeout),
		slog.Duration("since", c.Since), slog.String("member", c.Member), slog.Int("partitions", c.Partitions), slog.Bool("apply_topology", c.ApplyTopology),
		slog.String("http_addr", c.HTTPAddr), slog.Duration("shutdown_timeout", c.ShutdownTimeout),
	)
}
