package main

import (
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/service"
	"github.com/snipdev/snip/services/fraud/internal/fraud"
)

// Config is the fraud service's configuration, read once from the
// environment. The detector's thresholds are documented on fraud.Rules and
// in the README; their defaults are fraud.Defaults().
type Config struct {
	service.Base
	service.NATS
	service.Redis
	service.Topology
	// Owners are ensured at start (SNIP_BOOTSTRAP_OWNERS: demos, tests).
	service.Owners

	// Member names this instance in the group (default: hostname-pid-random).
	Member string `env:"FRAUD_MEMBER"`
	// BatchSize is the most events judged per batch.
	BatchSize int `env:"FRAUD_BATCH_SIZE" envDefault:"2000"`
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

	// WaitReplicas, when above 0, makes each batch's statistics and alert
	// list wait (a barrier write in the partition's Redis slot, then WAIT)
	// until that many replicas have them before the batch is acked, for at
	// most WaitReplicasTimeout: a Redis master that dies right after the
	// ack then loses none of them. A wait that falls short is counted
	// (snip_fraud_replica_wait_short_total) and the batch acked all the same.
	// 0: off; 1 for Redis Cluster or a replicated Redis (never on a Redis
	// without replicas: every batch would wait the timeout).
	WaitReplicas        int           `env:"FRAUD_WAIT_REPLICAS" envDefault:"0"`
	WaitReplicasTimeout time.Duration `env:"FRAUD_WAIT_REPLICAS_TIMEOUT" envDefault:"100ms"`
}

// loadConfig reads the environment (fraud detection takes no arguments).
func loadConfig(environ, _ []string) (Config, error) {
	cfg := Config{Base: service.Base{HTTPAddr: ":8082", ShutdownTimeout: 30 * time.Second}}
	return service.LoadConfig(environ, cfg, func(c *Config) error {
		if _, err := c.start(time.Now()); err != nil {
			return err
		}
		if c.WaitReplicas < 0 {
			return fmt.Errorf("FRAUD_WAIT_REPLICAS %d: want 0 (off) or more", c.WaitReplicas)
		}
		if c.WaitReplicas > 0 && (c.WaitReplicasTimeout < time.Millisecond || c.WaitReplicasTimeout > 10*time.Second) {
			return fmt.Errorf("FRAUD_WAIT_REPLICAS_TIMEOUT %s: want 1ms..10s", c.WaitReplicasTimeout)
		}
		_, err := c.rules()
		return err
	})
}

// LogValue is the configuration as logged: secrets masked.
func (c Config) LogValue() slog.Value { return service.LogValue(c) }

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
