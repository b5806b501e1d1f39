package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/service"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/pkg/workqueue"
	"github.com/snipdev/snip/services/preview/internal/fetch"
)

// Config is the preview worker's configuration, read once from the
// environment (see README.md for the table).
type Config struct {
	service.Base
	service.NATS
	service.Redis
	// The deployment's topology, read from the same variables as snipctl's,
	// so one environment file serves both.
	service.Topology

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

	// Resolver, if set, replaces DNS for fetches (tests).
	Resolver fetch.Resolver `env:"-"`
}

// loadConfig reads the environment (the worker takes no arguments).
func loadConfig(environ, _ []string) (Config, error) {
	cfg := Config{Base: service.Base{HTTPAddr: ":8084", ShutdownTimeout: 20 * time.Second}}
	return service.LoadConfig(environ, cfg, (*Config).validate)
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
	// The queue would take 0 or less for its default, 30s.
	check(c.BacklogInterval > 0, "PREVIEW_BACKLOG_INTERVAL %s: want > 0", c.BacklogInterval)
	check(c.UserAgent != "", "PREVIEW_USER_AGENT: want a value")
	return errors.Join(errs...)
}

// LogValue is the configuration as logged: secrets masked.
func (c Config) LogValue() slog.Value { return service.LogValue(c) }

func (c Config) fetch() fetch.Config {
	return fetch.Config{
		UserAgent: c.UserAgent, ConnectTimeout: c.ConnectTimeout, Timeout: c.FetchTimeout,
		MaxRedirects: c.MaxRedirects, MaxBodyBytes: c.MaxBodyBytes, Allow: c.AllowCIDRs, Resolver: c.Resolver,
	}
}

func (c Config) queue(log *slog.Logger, reg prometheus.Registerer) workqueue.Config {
	return workqueue.Config{
		Stream: events.PreviewJobsStream, Consumer: topology.PreviewConsumer, Source: "preview",
		Advisories: events.PreviewAdvisoriesStream, Rescuer: topology.PreviewRescueConsumer,
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
