package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/snipdev/snip/pkg/service"
	"github.com/snipdev/snip/services/warehouse/internal/chwriter"
	"github.com/snipdev/snip/services/warehouse/internal/loader"
	"github.com/snipdev/snip/services/warehouse/internal/schema"
)

// Config is the loader's configuration, read once from the environment (and
// the -since flag) in main.
type Config struct {
	service.Base
	service.NATS
	// The CLICKS topology, applied at start; the same variables configure
	// snipctl and the other services.
	service.Topology

	// ClickHouseAddrs are host:port of ClickHouse's native protocol (9000),
	// comma-separated; HTTP (8123) does not work with 18.16.
	ClickHouseAddrs []string `env:"CLICKHOUSE_ADDR" envDefault:"127.0.0.1:9000" envSeparator:","`
	// ClickHouseDatabase holds the tables; the loader creates it if missing.
	ClickHouseDatabase string `env:"CLICKHOUSE_DATABASE" envDefault:"snip"`
	ClickHouseUser     string `env:"CLICKHOUSE_USER" envDefault:"default"`
	ClickHousePassword string `env:"CLICKHOUSE_PASSWORD" secret:"true"`
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
	// MaxDaysPerInsert caps the days of clicks (partitions of the clicks
	// table) one INSERT statement touches; a batch spanning more goes as
	// several. Below the max_partitions_per_insert_block (default 100) of
	// the loader's ClickHouse user.
	MaxDaysPerInsert int `env:"WAREHOUSE_MAX_DAYS_PER_INSERT" envDefault:"90"`
	// MaxRetryDelay caps the backoff between retries of a failing batch.
	MaxRetryDelay time.Duration `env:"WAREHOUSE_MAX_RETRY_DELAY" envDefault:"10s"`
	// Since, for a group that does not exist yet, loads only the clicks of
	// the last Since (e.g. 72h) from the retained log before following live;
	// 0 loads everything CLICKS retains. Ignored once the group exists: the
	// cut a first start made is recorded on the group's consumers, and a
	// start that finds only some of them creates the rest with that cut.
	// The -since flag overrides it.
	Since time.Duration `env:"WAREHOUSE_SINCE" envDefault:"0"`
	// Member names this instance in the group (default hostname-pid-random).
	Member string `env:"WAREHOUSE_MEMBER"`
	// LeaseTTL is how long a crashed member keeps its partitions.
	LeaseTTL time.Duration `env:"WAREHOUSE_LEASE_TTL" envDefault:"3s"`
}

// loadConfig reads the environment, then the flags in args (without the
// program name).
func loadConfig(environ, args []string) (Config, error) {
	cfg, err := service.LoadConfig(environ, Config{Base: service.Base{HTTPAddr: ":8083", ShutdownTimeout: 30 * time.Second}}, nil)
	if err != nil {
		return Config{}, err
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
	case c.MaxDaysPerInsert < 1:
		return fmt.Errorf("WAREHOUSE_MAX_DAYS_PER_INSERT %d: want >= 1: %w", c.MaxDaysPerInsert, errConfig)
	case c.Linger <= 0 || c.Linger > time.Minute:
		return fmt.Errorf("WAREHOUSE_LINGER %s: want > 0 and <= 1m: %w", c.Linger, errConfig)
	case c.InsertTimeout <= 0 || c.MaxRetryDelay <= 0 || c.ClickHouseDialTimeout <= 0:
		return fmt.Errorf("WAREHOUSE_INSERT_TIMEOUT, WAREHOUSE_MAX_RETRY_DELAY and CLICKHOUSE_DIAL_TIMEOUT must be > 0: %w", errConfig)
	case !schema.ValidDatabase(c.ClickHouseDatabase):
		return fmt.Errorf("CLICKHOUSE_DATABASE %q: %w", c.ClickHouseDatabase, schema.ErrBadDatabaseName)
	case c.ShutdownTimeout <= 0:
		return fmt.Errorf("SHUTDOWN_TIMEOUT %s: want > 0: %w", c.ShutdownTimeout, errConfig)
	}
	return nil
}

func (c Config) clickhouse() chwriter.Config {
	addrs := make([]string, 0, len(c.ClickHouseAddrs))
	for _, a := range c.ClickHouseAddrs {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	return chwriter.Config{
		Addrs:            addrs,
		Database:         c.ClickHouseDatabase,
		User:             c.ClickHouseUser,
		Password:         c.ClickHousePassword,
		DialTimeout:      c.ClickHouseDialTimeout,
		MaxDaysPerInsert: c.MaxDaysPerInsert,
	}
}

func (c Config) loader() loader.Config {
	return loader.Config{MaxRows: c.BatchRows, Linger: c.Linger, InsertTimeout: c.InsertTimeout}
}

// LogValue is the configuration as logged: secrets masked.
func (c Config) LogValue() slog.Value { return service.LogValue(c) }
