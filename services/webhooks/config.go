package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"net/url"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/natsconn"
	"github.com/snipdev/snip/pkg/netguard"
	"github.com/snipdev/snip/pkg/topology"
)

// Config is the webhooks service's configuration, read once from the
// environment. The SNIP_* variables are the deployment's, shared with
// snipctl and the other services.
type Config struct {
	NATSURL      string `env:"NATS_URL" envDefault:"nats://127.0.0.1:4222"`
	NATSUser     string `env:"NATS_USER"`
	NATSPassword string `env:"NATS_PASSWORD"`
	NATSCreds    string `env:"NATS_CREDS"`
	// RedisURL holds endpoints, their queues and delivery records.
	RedisURL string `env:"REDIS_URL" envDefault:"redis://127.0.0.1:6379/0"`
	// HTTPAddr serves the owner API, /healthz, /readyz and /metrics.
	HTTPAddr string     `env:"HTTP_ADDR" envDefault:":8087"`
	LogLevel slog.Level `env:"LOG_LEVEL" envDefault:"info"`
	// ShutdownTimeout bounds each stage of a graceful stop.
	ShutdownTimeout time.Duration `env:"SHUTDOWN_TIMEOUT" envDefault:"30s"`
	// BootstrapOwners is "id:key,..." owners to ensure at start (demo, tests).
	BootstrapOwners string `env:"SNIP_BOOTSTRAP_OWNERS"`

	// The topology the service applies at start (as snipctl topology apply).
	Partitions     int           `env:"SNIP_PARTITIONS" envDefault:"8"`
	Replicas       int           `env:"SNIP_REPLICAS" envDefault:"1"`
	ClicksMaxAge   time.Duration `env:"SNIP_CLICKS_MAX_AGE" envDefault:"168h"`
	ClicksMaxBytes int64         `env:"SNIP_CLICKS_MAX_BYTES" envDefault:"-1"`

	// Member names this instance in the consumer group and in endpoint
	// leases; empty: host-pid-random.
	Member string `env:"WEBHOOKS_MEMBER"`
	// LeaseTTL is how long a dead instance keeps its partitions and its
	// endpoints: the failover time.
	LeaseTTL time.Duration `env:"WEBHOOKS_LEASE_TTL" envDefault:"3s"`

	// RetrySchedule are the waits before each retry of a failing batch; the
	// last repeats until the endpoint is disabled. The default spreads
	// about 11 hours of retries over 9 tries, and then one every 4 hours.
	RetrySchedule []time.Duration `env:"WEBHOOKS_RETRY_SCHEDULE" envSeparator:"," envDefault:"5s,30s,2m,5m,15m,30m,1h,2h,4h"`
	// RetryJitter spreads each wait by up to this fraction either way.
	RetryJitter float64 `env:"WEBHOOKS_RETRY_JITTER" envDefault:"0.2"`
	// DisableAfter disables an endpoint failing for this long. It must be
	// shorter than CLICKS' retention, so that what it missed can be replayed.
	DisableAfter time.Duration `env:"WEBHOOKS_DISABLE_AFTER" envDefault:"72h"`
	// MaxBacklog bounds each endpoint's queue; when full, its oldest events
	// are dropped (counted; replayable from the streams within retention).
	MaxBacklog int64 `env:"WEBHOOKS_MAX_BACKLOG" envDefault:"100000"`
	// BatchMax and BatchWait are the defaults for new endpoints: up to 100
	// events per POST, the oldest waiting at most 1s.
	BatchMax  int           `env:"WEBHOOKS_BATCH_MAX" envDefault:"100"`
	BatchWait time.Duration `env:"WEBHOOKS_BATCH_WAIT" envDefault:"1s"`
	// MaxBatchBytes bounds a request body.
	MaxBatchBytes int `env:"WEBHOOKS_MAX_BATCH_BYTES" envDefault:"262144"`
	// Timeout bounds one delivery attempt; ConnectTimeout its connect and
	// TLS handshake.
	Timeout        time.Duration `env:"WEBHOOKS_TIMEOUT" envDefault:"10s"`
	ConnectTimeout time.Duration `env:"WEBHOOKS_CONNECT_TIMEOUT" envDefault:"5s"`
	// MaxResponseBytes is the most of a response body read; the first 512
	// bytes are kept in the delivery record.
	MaxResponseBytes int64 `env:"WEBHOOKS_MAX_RESPONSE_BYTES" envDefault:"65536"`
	// MaxEndpointsPerOwner bounds an owner's endpoints: each has a queue
	// (up to WEBHOOKS_MAX_BACKLOG events) and a sender.
	MaxEndpointsPerOwner int `env:"WEBHOOKS_MAX_ENDPOINTS_PER_OWNER" envDefault:"20"`
	// RotationOverlap is how long the old secret keeps signing after a rotation.
	RotationOverlap time.Duration `env:"WEBHOOKS_ROTATION_OVERLAP" envDefault:"24h"`
	// Poll is how often an idle sender looks at its queue when events are
	// queued by another instance (its own intake wakes it at once).
	Poll time.Duration `env:"WEBHOOKS_POLL" envDefault:"500ms"`
	// AllowCIDRs are ranges deliveries may reach even though they are
	// private or loopback (a receiver inside the deployment).
	AllowCIDRs []netip.Prefix `env:"WEBHOOKS_ALLOW_CIDRS" envSeparator:","`
	// HTTPHosts may be reached over plain http; every other URL must be https.
	HTTPHosts []string `env:"WEBHOOKS_HTTP_HOSTS" envSeparator:","`
	UserAgent string   `env:"WEBHOOKS_USER_AGENT" envDefault:"Snip-Webhooks/1.0 (+https://github.com/snipdev/snip)"`

	// Ready, if set, is called with the HTTP address once it listens.
	Ready func(addr string) `env:"-"`
	// Resolver resolves endpoint hosts (tests map names to addresses).
	Resolver netguard.Resolver `env:"-"`
	// NATSOptions are extra connection options.
	NATSOptions []nats.Option `env:"-"`
	// Storage is the streams' storage: file (the zero value); tests use memory.
	Storage jetstream.StorageType `env:"-"`
}

func loadConfig(environ []string) (Config, error) {
	var cfg Config
	if err := env.ParseWithOptions(&cfg, env.Options{Environment: env.ToMap(environ)}); err != nil {
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
	case len(c.RetrySchedule) == 0:
		return errors.New("WEBHOOKS_RETRY_SCHEDULE: want at least one wait")
	case c.RetryJitter < 0 || c.RetryJitter >= 1:
		return fmt.Errorf("WEBHOOKS_RETRY_JITTER %v: want 0 <= j < 1", c.RetryJitter)
	case c.DisableAfter <= 0 || c.DisableAfter >= c.ClicksMaxAge:
		return fmt.Errorf("WEBHOOKS_DISABLE_AFTER %s: want > 0 and < SNIP_CLICKS_MAX_AGE (%s), so missed events stay replayable", c.DisableAfter, c.ClicksMaxAge)
	case c.MaxEndpointsPerOwner < 1:
		return fmt.Errorf("WEBHOOKS_MAX_ENDPOINTS_PER_OWNER %d: want >= 1", c.MaxEndpointsPerOwner)
	case c.MaxBacklog < 1:
		return fmt.Errorf("WEBHOOKS_MAX_BACKLOG %d: want >= 1", c.MaxBacklog)
	case c.BatchMax < 1 || c.BatchMax > 1000:
		return fmt.Errorf("WEBHOOKS_BATCH_MAX %d: want 1..1000", c.BatchMax)
	case c.BatchWait < 0 || c.BatchWait > time.Minute:
		return fmt.Errorf("WEBHOOKS_BATCH_WAIT %s: want 0..1m", c.BatchWait)
	case c.MaxBatchBytes < 4096:
		return fmt.Errorf("WEBHOOKS_MAX_BATCH_BYTES %d: want >= 4096", c.MaxBatchBytes)
	case c.Timeout <= 0 || c.ConnectTimeout <= 0:
		return errors.New("WEBHOOKS_TIMEOUT and WEBHOOKS_CONNECT_TIMEOUT: want > 0")
	case c.MaxResponseBytes < 512:
		return fmt.Errorf("WEBHOOKS_MAX_RESPONSE_BYTES %d: want >= 512", c.MaxResponseBytes)
	case c.Poll <= 0 || c.LeaseTTL < time.Second || c.ShutdownTimeout <= 0:
		return errors.New("WEBHOOKS_POLL, SHUTDOWN_TIMEOUT: want > 0; WEBHOOKS_LEASE_TTL: want >= 1s")
	}
	for _, d := range c.RetrySchedule {
		if d <= 0 {
			return fmt.Errorf("WEBHOOKS_RETRY_SCHEDULE: %s: want > 0", d)
		}
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
	sched := make([]string, len(c.RetrySchedule))
	for i, d := range c.RetrySchedule {
		sched[i] = d.String()
	}
	allow := make([]string, len(c.AllowCIDRs))
	for i, p := range c.AllowCIDRs {
		allow[i] = p.String()
	}
	return slog.GroupValue(
		slog.String("nats_url", c.NATSURL), slog.String("nats_user", c.NATSUser),
		slog.String("nats_password", mask(c.NATSPassword)), slog.String("nats_creds", c.NATSCreds),
		slog.String("redis_url", maskURL(c.RedisURL)), slog.String("http_addr", c.HTTPAddr),
		slog.String("bootstrap_owners", mask(c.BootstrapOwners)),
		slog.Int("partitions", c.Partitions), slog.String("member", c.Member),
		slog.Duration("lease_ttl", c.LeaseTTL), slog.String("retry_schedule", strings.Join(sched, ",")),
		slog.Float64("retry_jitter", c.RetryJitter), slog.Duration("disable_after", c.DisableAfter),
		slog.Int64("max_backlog", c.MaxBacklog), slog.Int("max_endpoints_per_owner", c.MaxEndpointsPerOwner), slog.Int("batch_max", c.BatchMax), slog.Duration("batch_wait", c.BatchWait),
		slog.Int("max_batch_bytes", c.MaxBatchBytes), slog.Duration("timeout", c.Timeout),
		slog.Duration("connect_timeout", c.ConnectTimeout), slog.Int64("max_response_bytes", c.MaxResponseBytes),
		slog.Duration("rotation_overlap", c.RotationOverlap), slog.Any("allow_cidrs", allow),
		slog.Any("http_hosts", c.HTTPHosts), slog.Duration("shutdown_timeout", c.ShutdownTimeout),
	)
}

func (c Config) nats() natsconn.Config {
	return natsconn.Config{URL: c.NATSURL, Name: "webhooks", User: c.NATSUser, Password: c.NATSPassword, CredsFile: c.NATSCreds}
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

// member is the instance name: WEBHOOKS_MEMBER or host-pid.
func (c Config) member() string {
	if c.Member != "" {
		return c.Member
	}
	h, _ := os.Hostname()
	clean := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '-'
	}, h)
	return clean + "-" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatInt(time.Now().UnixNano()%1_000_000, 36)
}

// maskURL hides the password of a URL.
func maskURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable)"
	}
	return u.Redacted()
}
