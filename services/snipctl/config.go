package main

import (
	"fmt"
	"time"

	"github.com/snipdev/snip/pkg/service"
)

// Config is where snipctl finds the system: the services' own NATS, Redis
// and topology blocks (pkg/service), so one environment file serves both.
// SNIP_APPLY_TOPOLOGY is the services'; `snipctl topology apply` applies.
type Config struct {
	service.NATS
	service.Redis
	service.Topology
	// Timeout bounds each command's calls to NATS and Redis, and each of
	// the demo's HTTP calls to the services it runs (health, links,
	// webhook endpoints).
	Timeout time.Duration `env:"SNIPCTL_TIMEOUT" envDefault:"30s"`
}

func loadConfig(environ []string) (Config, error) {
	return service.LoadConfig(environ, Config{}, func(c *Config) error {
		if c.Timeout <= 0 {
			// Every call would end at once, as "context deadline exceeded".
			return fmt.Errorf("SNIPCTL_TIMEOUT %s: want more than 0", c.Timeout)
		}
		return nil
	})
}
