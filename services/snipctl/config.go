package main

import (
	"fmt"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/snipdev/snip/pkg/natsconn"
	"github.com/snipdev/snip/pkg/topology"
)

// Config is where snipctl finds the system. The same variables configure the
// services, so one environment file serves both.
type Config struct {
	// NATSURL is the NATS server (comma-separated for a cluster).
	NATSURL      string `env:"NATS_URL" envDefault:"nats://127.0.0.1:4222"`
	NATSUser     string `env:"NATS_USER"`
	NATSPassword string `env:"NATS_PASSWORD"`
	NATSCreds    string `env:"NATS_CREDS"`
	NATSInbox    string `env:"NATS_INBOX_PREFIX"`
	// RedisURL is Redis (see pkg/redisconn for the cluster form).
	RedisURL string `env:"REDIS_URL" envDefault:"redis://127.0.0.1:6379/0"`
	// Partitions is the CLICKS partition count used when creating the stream.
	Partitions int `env:"SNIP_PARTITIONS" envDefault:"8"`
	// Replicas is the stream replication factor: 3 in a NATS cluster.
	Replicas int `env:"SNIP_REPLICAS" envDefault:"1"`
	// ClicksMaxAge is CLICKS retention.
	ClicksMaxAge time.Duration `env:"SNIP_CLICKS_MAX_AGE" envDefault:"168h"`
	// ClicksMaxBytes caps CLICKS on disk; -1 is no cap.
	ClicksMaxBytes int64 `env:"SNIP_CLICKS_MAX_BYTES" envDefault:"-1"`
	// Timeout bounds each command's calls to NATS and Redis.
	Timeout time.Duration `env:"SNIPCTL_TIMEOUT" envDefault:"30s"`
}

func loadConfig(environ []string) (Config, error) {
	var cfg Config
	if err := env.ParseWithOptions(&cfg, env.Options{Environment: env.ToMap(environ)}); err != nil {
		return Config{}, fmt.Errorf("load config: %w", err)
	}
	return cfg, nil
}

func (c Config) nats() natsconn.Config {
	return natsconn.Config{URL: c.NATSURL, Name: "snipctl", User: c.NATSUser, Password: c.NATSPassword, CredsFile: c.NATSCreds, InboxPrefix: c.NATSInbox}
}

func (c Config) topology() topology.Options {
	o := topology.Defaults()
	o.Partitions = c.Partitions
	o.Replicas = c.Replicas
	o.ClicksMaxAge = c.ClicksMaxAge
	o.ClicksMaxBytes = c.ClicksMaxBytes
	return o
}
