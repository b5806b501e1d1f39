package main

import (
	"fmt"

	"github.com/caarlos0/env/v11"

	"github.com/snipdev/snip/pkg/natsconn"
)

// Config is where the system under test is. The NATS variables are the ones
// the services read, so one environment file serves both; everything about a
// run is a flag.
type Config struct {
	NATSURL      string `env:"NATS_URL" envDefault:"nats://127.0.0.1:4222"`
	NATSUser     string `env:"NATS_USER"`
	NATSPassword string `env:"NATS_PASSWORD"`
	NATSCreds    string `env:"NATS_CREDS"`
	NATSInbox    string `env:"NATS_INBOX_PREFIX"`
	// APIKey is the owner key for creating links and reading stats. The
	// default is `make demo`'s demo owner key (local only, see snipctl demo).
	APIKey string `env:"SNIP_API_KEY" envDefault:"snip_demo_local_only_0123456789"`
}

func loadConfig(environ []string) (Config, error) {
	var cfg Config
	if err := env.ParseWithOptions(&cfg, env.Options{Environment: env.ToMap(environ)}); err != nil {
		return Config{}, fmt.Errorf("load config: %w", err)
	}
	return cfg, nil
}

func (c Config) nats(name string) natsconn.Config {
	return natsconn.Config{URL: c.NATSURL, Name: name, User: c.NATSUser, Password: c.NATSPassword, CredsFile: c.NATSCreds, InboxPrefix: c.NATSInbox}
}
