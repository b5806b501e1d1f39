package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/natsconn"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/pkg/workqueue"
	"github.com/snipdev/snip/services/preview/internal/fetch"
)

// Config is the preview worker's configuration, read once from the
// environment (see README.md for the table).
type Config struct {
	NATSURL      string `env:"NATS_URL" envDefault:"nats://127.0.0.1:4222"`
	NATSUser     string `env:"NATS_USER"`
	NATSPassword string `env:"NATS_PASSWORD"`
	NATSCreds    string `env:"NATS_CREDS"`
	NATSInbox    string `env:"NATS_INBOX_PREFIX"`
	RedisURL     string `env:"REDIS_URL" envDefault:"redis://127.0.0.1:6379/0"`
	// HTTPAddr serves /healthz, /readyz and /metrics.
	HTTPAddr string     `env:"HTTP_ADDR" envDefault:":8084"`
	LogLevel slog.Level `env:"LOG_LEVEL" envDefault:"info"`
	// ShutdownTimeout is how long jobs in hand may take to finish after
	// SIGTERM; what has not finished then is handed back to the queue.
	ShutdownTimeout time.Duration `env:"SHUTDOWN_TIMEOUT" envDefault:"20s"`

	// ApplyTopology runs topology.Apply at start, as every service does: it
	// creates what is missing and updates only what differs, so a NATS user
	// that may only read stream info passes when `snipctl topology apply`
	// ran first. Off: only look the consumer up.
	ApplyTopology bool `env:"SNIP_APPLY_TOPOLOGY" envDefault:"true"`
	// The deployment's topology, read from the same variables as snipctl's,
	// so one environment file serves both.
	Partitions     int           `env:"SNIP_PARTITIONS" envDefault:"8"`
	Replicas       int           `env:"SNIP_REPLICAS" envDefault:"1"`
	ClicksMaxAge   time.Duration `env:"SNIP_CLICKS_MAX_AGE" envDefault:"168h"`
	ClicksMaxBytes int64         `env:"SNIP_CLICKS_MAX_BYTES" envDefault:"-1"`

	// Concurrency is the most jobs one instance works on at once. Fetches
	// mostly wait on the network, so it is well above the CPU count.
	Concurrency int `env:"PREVIEW_CONCURRENCY" envDefault:"8"`

	// ConnectTimeout bounds each TCP connect and TLS handshake.
	ConnectTimeout time.Duration `env:"PREVIEW_CONNECT_TIMEOUT" envDefault:"5s"`
	// FetchTimeout bounds a whole fetch: redirects, headers, the body.
	FetchTimeout time.Duration `env:"PREVIEW_FETCH_TIMEOUT" envDefault:"15s"`
	// MaxRedirects is the most redirects followed (browsers allow 20;
	// real previews need 2 or 3).
	MaxRedirects int `env:"PREVIEW_MAX_REDIRECTS" envDefault:"5"`
	// MaxBodyBytes is the most of a page read: its head, where the tags are.
	MaxBodyBytes int64 `env:"PREVIEW_MAX_BODY_BYTES" envDefault:"524288"`
	// AllowCIDRs are ranges fetched even though they are private, loopback
	// or otherwise refused (comma-separated, e.g. "10.1.0.0/16").
	AllowCIDRs []netip.Prefix `env:"PREVIEW_ALLOW_CIDRS" envSeparator:","`
	// UserAgent is sent with every fetch: it names Snip and where to learn
	// about the fetcher.
	UserAgent string `env:"PREVIEW_USER_AGENT" envDefault:"Mozilla/5.0 (compatible; SnipPreview/1.0; +https://github.com/snipdev/snip)"`

	// RetryBase, RetryMax and RetryJitter are the backoff of transient
	// failures: try n is retried after RetryBase*2^(n-1), capped at
	// RetryMax, plus up to RetryJitter of that at random.
	RetryBase   time.Duration `env:"PREVIEW_RETRY_BASE" envDefault:"1s"`
	RetryMax    time.Duration `env:"PREVIEW_RETRY_MAX" envDefault:"1m"`
	RetryJitter float64       `env:"PREVIEW_RETRY_JITTER" envDefault:"0.5"`
	// RetryAfterMax caps how long a Retry-After header may delay a retry.
	RetryAfterMax time.Duration `env:"PREVIEW_RETRY_AFTER_MAX" envDefault:"5m"`
	// PullWait is how long a pull request waits on the server for jobs. An
	// idle instance sends one request per PullWait; a stop waits for the
	// outstanding one to end (so no job is sent to a worker that left).
	PullWait time.Duration `env:"PREVIEW_PULL_WAIT" envDefault:"1s"`
	// BacklogInterval is how often the dead-letter backlog gauge is sampled.
	BacklogInterval time.Duration `env:"PREVIEW_BACKLOG_INTERVAL" envDefault:"30s"`

	// Ready, if set, is called with the HTTP address once it listens (tests).
	Ready func(addr string) `env:"-"`
	// Resolver, if set, replaces DNS for fetches (tests).
	Resolver fetch.Resolver `env:"-"`
}

func loadConfig(environ []string) (Config, error) {
	var cfg Config
	if err := env.ParseWithOptions(&cfg, env.Options{Environment: env.ToMap(environ)}); err != nil {
		return Config{}, fmt.Errorf("load config: %w", err)
	}
	if err := cfg.validate(); err != nil {
		return Config{}, fmt.Errorf("load config: %w", err)
	}
	return cfg, nil
}

func (c Config) validate() error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(c.Concurrency >= 1, "PREVIEW_CONCURRENCY %d: want >= 1", c.Concurrency)
	check(c.ConnectTimeout > 0, "PREVIEW_CONNECT_TIMEOUT %s: want > 0", c.ConnectTimeout)
	check(c.FetchTimeout > 0, "PREVIEW_FETCH_TIMEOUT %s: want > 0", c.FetchTimeout)
	check(c.MaxRedirects >= 0, "PREVIEW_MAX_REDIRECTS %d: want >= 0", c.MaxRedirects)
	check(c.MaxBodyBytes >= 1024, "PREVIEW_MAX_BODY_BYTES %d: want >= 1024", c.MaxBodyBytes)
	check(c.RetryBase > 0 && c.RetryMax >= c.RetryBase, "PREVIEW_RETRY_BASE %s, PREVIEW_RETRY_MAX %s: want 0 < base <= max", c.RetryBase, c.RetryMax)
	check(c.RetryJitter >= 0 && c.RetryJitter <= 1, "PREVIEW_RETRY_JITTER %v: want 0..1", c.RetryJitter)
	check(c.RetryAfterMax >= 0, "PREVIEW_RETRY_AFTER_MAX %s: want >= 0", c.RetryAfterMax)
	check(c.ShutdownTimeout > 0, "SHUTDOWN_TIMEOUT %s: want > 0", c.ShutdownTimeout)
	check(c.PullWait >= 10*time.Millisecond, "PREVIEW_PULL_WAIT %s: want >= 10ms", c.PullWait)
	check(c.UserAgent != "", "PREVIEW_USER_AGENT: want a value")
	return errors.Join(errs...)
}

// LogValue masks secrets when the config is logged at start.
func (c Config) LogValue() slog.Value {
	mask := func(s string) string {
		if s == "" {
			return ""
		}
		return "***"
	}
	allow := make([]string, len(c.AllowCIDRs))
	for i, p := range c.AllowCIDRs {
		allow[i] = p.String()
	}
	return slog.GroupValue(
		slog.String("nats_url", c.NATSURL), slog.String("nats_user", c.NATSUser), slog.String("nats_password", mask(c.NATSPassword)),
		slog.String("nats_creds", c.NATSCreds), slog.String("redis_url", redact(c.RedisURL)), slog.String("http_addr", c.HTTPAddr),
		slog.Duration("shutdown_timeout", c.ShutdownTimeout), slog.Bool("apply_topology", c.ApplyTopology), slog.Int("concurrency", c.Concurrency),
		slog.Duration("connect_timeout", c.ConnectTimeout), slog.Duration("fetch_timeout", c.FetchTimeout), slog.Int("max_redirects", c.MaxRedirects),
		slog.Int64("max_body_bytes", c.MaxBodyBytes), slog.Any("allow_cidrs", allow), slog.String("user_agent", c.UserAgent),
		slog.Duration("retry_base", c.RetryBase), slog.Duration("retry_max", c.RetryMax), slog.Float64("retry_jitter", c.RetryJitter),
		slog.Duration("retry_after_max", c.RetryAfterMax), slog.Duration("pull_wait", c.PullWait),
	)
}

func (c Config) nats() natsconn.Config {
	return natsconn.Config{URL: c.NATSURL, Name: "preview", User: c.NATSUser, Password: c.NATSPassword, CredsFile: c.NATSCreds, InboxPrefix: c.NATSInbox}
}

func (c Config) fetch() fetch.Config {
	return fetch.Config{
		UserAgent: c.UserAgent, ConnectTimeout: c.ConnectTimeout, Timeout: c.FetchTimeout,
		MaxRedirects: c.MaxRedirects, MaxBodyBytes: c.MaxBodyBytes, Allow: c.AllowCIDRs, Resolver: c.Resolver,
	}
}

func (c Config) queue(log *slog.Logger, reg prometheus.Registerer) workqueue.Config {
	return workqueue.Config{
		Stream: events.PreviewJobsStream, Consumer: topology.PreviewConsumer, Source: "preview",
		Concurrency: c.Concurrency,
		Backoff: workqueue.Backoff{
			Base: c.RetryBase, Max: c.RetryMax, Jitter: c.RetryJitter, RetryAfterMax: c.RetryAfterMax,
		},
		BacklogInterval: c.BacklogInterval,
		PullWait:        c.PullWait,
		ShutdownTimeout: c.ShutdownTimeout,
		Logger:          log,
		Metrics:         reg,
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
