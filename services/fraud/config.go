package main

import (
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/nats-io/nats.go"

	"github.com/snipdev/snip/pkg/natsconn"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/fraud/internal/fraud"
)

// Config is the fraud service's configuration, read once from the
// environment. The detector's thresholds are documented on fraud.Rules and
// in the README; their defaults are fraud.Defaults().
type Config struct {
	NATSURL      string `env:"NATS_URL" envDefault:"nats://127.0.0.1:4222"`
	NATSUser     string `env:"NATS_USER"`
	NATSPassword string `env:"NATS_PASSWORD"`
	NATSCreds    string `env:"NATS_CREDS"`
	NATSInbox    string `env:"NATS_INBOX_PREFIX"`
	RedisURL     string `env:"REDIS_URL" envDefault:"redis://127.0.0.1:6379/0"`
	// HTTPAddr serves the API, /healthz, /readyz and /metrics.
	HTTPAddr string     `env:"HTTP_ADDR" envDefault:":8082"`
	LogLevel slog.Level `env:"LOG_LEVEL" envDefault:"info"`
	// ShutdownTimeout bounds each step of a graceful stop: finishing and
	// acking the batch in hand, and answering the HTTP requests in flight.
	ShutdownTimeout time.Duration `env:"SHUTDOWN_TIMEOUT" envDefault:"30s"`
	// BootstrapOwners is "id:key,..." owners to create (demos and tests).
	BootstrapOwners string `env:"SNIP_BOOTSTRAP_OWNERS"`

	// ApplyTopology applies the topology at start, as `snipctl topology
	// apply` does (same variables). Set it false for a NATS user without
	// stream-admin permissions: the service then only reads CLICKS' partition
	// count, and waits until the topology exists.
	ApplyTopology  bool          `env:"SNIP_APPLY_TOPOLOGY" envDefault:"true"`
	Partitions     int           `env:"SNIP_PARTITIONS" envDefault:"8"`
	Replicas       int           `env:"SNIP_REPLICAS" envDefault:"1"`
	ClicksMaxAge   time.Duration `env:"SNIP_CLICKS_MAX_AGE" envDefault:"168h"`
	ClicksMaxBytes int64         `env:"SNIP_CLICKS_MAX_BYTES" envDefault:"-1"`

	// Member names this instance in the group (default: hostname-pid-random).
	Member string `env:"FRAUD_MEMBER"`
	// BatchSize is the most events judged per batch.
	BatchSize int `env:"FRAUD_BATCH_SIZE" envDefault:"500"`
	// Start is where a new group begins: "oldest" (all CLICKS retains),
	// "new", or a duration such as "72h" (that far back).
	Start string `env:"FRAUD_START" envDefault:"oldest"`
	// LeaseTTL is the failover time after a member dies (0: runtime default).
	LeaseTTL time.Duration `env:"FRAUD_LEASE_TTL" envDefault:"0s"`

	VisitorWindow       time.Duration `env:"FRAUD_VISITOR_WINDOW" envDefault:"1m"`
	VisitorThreshold    int           `env:"FRAUD_VISITOR_THRESHOLD" envDefault:"20"`
	FloodWindow         time.Duration `env:"FRAUD_FLOOD_WINDOW" envDefault:"1m"`
	FloodFloor          int           `env:"FRAUD_FLOOD_FLOOR" envDefault:"120"`
	FloodFactor         float64       `env:"FRAUD_FLOOD_FACTOR" envDefault:"10"`
	FloodHalfLife       time.Duration `env:"FRAUD_FLOOD_HALF_LIFE" envDefault:"2m"`
	FloodAdoptAfter     time.Duration `env:"FRAUD_FLOOD_ADOPT_AFTER" envDefault:"30m"`
	PairWindow          time.Duration `env:"FRAUD_PAIR_WINDOW" envDefault:"2s"`
	LabelAlertThreshold int           `env:"FRAUD_LABEL_ALERT_THRESHOLD" envDefault:"10"`
	AlertPeriod         time.Duration `env:"FRAUD_ALERT_PERIOD" envDefault:"1h"`
	MaxIdentities       int           `env:"FRAUD_MAX_IDENTITIES" envDefault:"200000"`
	MaxLinks            int           `env:"FRAUD_MAX_LINKS" envDefault:"100000"`
	MaxPairs            int           `env:"FRAUD_MAX_PAIRS" envDefault:"100000"`
	MaxClockSkew        time.Duration `env:"FRAUD_MAX_CLOCK_SKEW" envDefault:"1m"`
	// ListedNetworks and ListedNetworksFile list CIDRs (e.g. datacenter
	// ranges) whose clicks are labelled: comma-separated, and/or a file with
	// one per line ('#' comments).
	ListedNetworks     string `env:"FRAUD_LISTED_NETWORKS"`
	ListedNetworksFile string `env:"FRAUD_LISTED_NETWORKS_FILE"`

	// AlertsPerOwner caps the alerts kept per owner and partition in Redis,
	// and the most one API request returns.
	AlertsPerOwner int `env:"FRAUD_ALERTS_PER_OWNER" envDefault:"1000"`
	// PublishWindow is the most alerts and verdicts awaiting their
	// acknowledgement at once; PublishTimeout bounds each wait.
	PublishWindow  int           `env:"FRAUD_PUBLISH_WINDOW" envDefault:"4096"`
	PublishTimeout time.Duration `env:"FRAUD_PUBLISH_TIMEOUT" envDefault:"10s"`

	// Ready, if set, is called with the HTTP address once it accepts
	// connections (tests listen on 127.0.0.1:0).
	Ready func(addr string) `env:"-"`
	// Connected, if set, is given the NATS connection once made; tests use
	// it to cut a member off abruptly, as a crash would.
	Connected func(nc *nats.Conn) `env:"-"`
}

func loadConfig(environ []string) (Config, error) {
	var cfg Config
	if err := env.ParseWithOptions(&cfg, env.Options{Environment: env.ToMap(environ)}); err != nil {
		return Config{}, fmt.Errorf("load config: %w", err)
	}
	if _, err := cfg.start(time.Now()); err != nil {
		return Config{}, fmt.Errorf("load config: %w", err)
	}
	if _, err := cfg.rules(); err != nil {
		return Config{}, fmt.Errorf("load config: %w", err)
	}
	return cfg, nil
}

// LogValue masks the secrets when the config is logged.
func (c Config) LogValue() slog.Value {
	mask := func(s string) string {
		if s == "" {
			return ""
		}
		return "***"
	}
	return slog.GroupValue(
		slog.String("nats_url", maskURL(c.NATSURL)), slog.String("nats_user", c.NATSUser),
		slog.String("nats_password", mask(c.NATSPassword)), slog.String("nats_creds", c.NATSCreds),
		slog.String("redis_url", maskURL(c.RedisURL)), slog.String("http_addr", c.HTTPAddr),
		slog.String("member", c.Member), slog.String("start", c.Start), slog.Int("batch_size", c.BatchSize),
		slog.Duration("visitor_window", c.VisitorWindow), slog.Int("visitor_threshold", c.VisitorThreshold),
		slog.Duration("flood_window", c.FloodWindow), slog.Int("flood_floor", c.FloodFloor),
		slog.Float64("flood_factor", c.FloodFactor), slog.Duration("flood_half_life", c.FloodHalfLife),
		slog.Duration("pair_window", c.PairWindow), slog.Int("label_alert_threshold", c.LabelAlertThreshold),
		slog.Int("max_identities", c.MaxIdentities), slog.String("listed_networks_file", c.ListedNetworksFile),
	)
}

// maskURL hides a password in a URL's user information.
func maskURL(u string) string {
	at := strings.LastIndexByte(u, '@')
	scheme := strings.Index(u, "://")
	if at < 0 || scheme < 0 || at < scheme {
		return u
	}
	return u[:scheme+3] + "***" + u[at:]
}

func (c Config) nats() natsconn.Config {
	return natsconn.Config{URL: c.NATSURL, Name: "fraud", User: c.NATSUser, Password: c.NATSPassword, CredsFile: c.NATSCreds, InboxPrefix: c.NATSInbox}
}

func (c Config) topology() topology.Options {
	o := topology.Defaults()
	o.Partitions = c.Partitions
	o.Replicas = c.Replicas
	o.ClicksMaxAge = c.ClicksMaxAge
	o.ClicksMaxBytes = c.ClicksMaxBytes
	return o
}

// start parses Start.
func (c Config) start(now time.Time) (reader.Start, error) {
	switch c.Start {
	case "oldest":
		return reader.StartAtOldest(), nil
	case "new":
		return reader.StartAtNew(), nil
	}
	d, err := time.ParseDuration(c.Start)
	if err != nil || d <= 0 {
		return reader.Start{}, fmt.Errorf("FRAUD_START %q: want oldest, new or a positive duration", c.Start)
	}
	return reader.StartAtTime(now.Add(-d)), nil
}

// rules builds and validates the detector's rules, reading the networks file.
func (c Config) rules() (fraud.Rules, error) {
	r := fraud.Rules{
		VisitorWindow: c.VisitorWindow, VisitorThreshold: c.VisitorThreshold,
		FloodWindow: c.FloodWindow, FloodFloor: c.FloodFloor, FloodFactor: c.FloodFactor,
		FloodHalfLife: c.FloodHalfLife, FloodAdoptAfter: c.FloodAdoptAfter,
		PairWindow: c.PairWindow, LabelAlertThreshold: c.LabelAlertThreshold, AlertPeriod: c.AlertPeriod,
		MaxIdentities: c.MaxIdentities, MaxLinks: c.MaxLinks, MaxPairs: c.MaxPairs, MaxClockSkew: c.MaxClockSkew,
	}
	nets, err := fraud.ParseNetworks(strings.NewReader(c.ListedNetworks))
	if err != nil {
		return fraud.Rules{}, fmt.Errorf("FRAUD_LISTED_NETWORKS: %w", err)
	}
	if c.ListedNetworksFile != "" {
		f, err := os.Open(c.ListedNetworksFile)
		if err != nil {
			return fraud.Rules{}, fmt.Errorf("FRAUD_LISTED_NETWORKS_FILE: %w", err)
		}
		defer f.Close()
		more, err := fraud.ParseNetworks(f)
		if err != nil {
			return fraud.Rules{}, fmt.Errorf("FRAUD_LISTED_NETWORKS_FILE %s: %w", c.ListedNetworksFile, err)
		}
		nets = append(nets, more...)
	}
	r.ListedNetworks = nets
	if err := r.Validate(); err != nil {
		return fraud.Rules{}, err
	}
	if c.AlertsPerOwner < 1 || c.PublishWindow < 1 || c.PublishTimeout <= 0 || c.BatchSize < 1 {
		return fraud.Rules{}, fmt.Errorf("FRAUD_ALERTS_PER_OWNER %d, FRAUD_PUBLISH_WINDOW %d, FRAUD_BATCH_SIZE %d must be >= 1 and FRAUD_PUBLISH_TIMEOUT %s > 0: %w",
			c.AlertsPerOwner, c.PublishWindow, c.BatchSize, c.PublishTimeout, fraud.ErrBadRules)
	}
	return r, nil
}
