package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/snipdev/snip/pkg/netguard"
	"github.com/snipdev/snip/pkg/service"
)

// Config is the webhooks service's configuration, read once from the
// environment. The SNIP_* variables are the deployment's, shared with
// snipctl and the other services.
type Config struct {
	service.Base
	service.NATS
	// Redis holds endpoints, their queues and delivery records.
	service.Redis
	// The topology the service applies at start (as snipctl topology apply).
	service.Topology
	// Owners are ensured at start (SNIP_BOOTSTRAP_OWNERS: demos, tests).
	service.Owners

	// Member names this instance in the consumer group and in endpoint
	// leases; empty: host-pid-random.
	Member string `env:"WEBHOOKS_MEMBER"`
	// LeaseTTL is how long a dead instance keeps its partitions and its
	// endpoints: the failover time. It is also how long a replay of a
	// crashed instance still reads queued or running before it reads
	// interrupted.
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
	// RotationOverlap is how long the old secret keeps signing after a
	// rotation: 0 or more.
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

	// WaitReplicas, when above 0, makes the queued events of a CLICKS batch
	// and an endpoint's configuration wait (a barrier write in each Redis
	// slot written, then WAIT) until that many replicas have them, for at
	// most WaitReplicasTimeout, before the batch is acked or the API
	// answers: a Redis master that dies right after loses none of them. A
	// wait that falls short is counted
	// (snip_webhooks_replica_wait_short_total) and the call goes on. 0: off;
	// 1 for Redis Cluster or a replicated Redis (never on a Redis without
	// replicas: every write would wait the timeout).
	WaitReplicas        int           `env:"WEBHOOKS_WAIT_REPLICAS" envDefault:"0"`
	WaitReplicasTimeout time.Duration `env:"WEBHOOKS_WAIT_REPLICAS_TIMEOUT" envDefault:"100ms"`

	// Resolver resolves endpoint hosts (tests map names to addresses).
	Resolver netguard.Resolver `env:"-"`
}

// loadConfig reads the environment (the service takes no arguments).
func loadConfig(environ, _ []string) (Config, error) {
	cfg := Config{Base: service.Base{HTTPAddr: ":8087", ShutdownTimeout: 30 * time.Second}}
	return service.LoadConfig(environ, cfg, (*Config).validate)
}

func (c Config) validate() error {
	switch {
	case len(c.RetrySchedule) == 0:
		return errors.New("WEBHOOKS_RETRY_SCHEDULE: want at least one wait")
	case c.RetryJitter < 0 || c.RetryJitter >= 1:
		return fmt.Errorf("WEBHOOKS_RETRY_JITTER %v: want 0 <= j < 1", c.RetryJitter)
	case c.DisableAfter <= 0 || c.DisableAfter >= c.ClicksMaxAge:
		return fmt.Errorf("WEBHOOKS_DISABLE_AFTER %s: want > 0 and < SNIP_CLICKS_MAX_AGE (%s), so missed events stay replayable", c.DisableAfter, c.ClicksMaxAge)
	case c.RotationOverlap < 0:
		return fmt.Errorf("WEBHOOKS_ROTATION_OVERLAP %s: want 0 (the old secret stops signing at the rotation) or more", c.RotationOverlap)
	case c.MaxEndpointsPerOwner < 1:
		return fmt.Errorf("WEBHOOKS_MAX_ENDPOINTS_PER_OWNER %d: want >= 1", c.MaxEndpointsPerOwner)
	case c.WaitReplicas < 0:
		return fmt.Errorf("WEBHOOKS_WAIT_REPLICAS %d: want 0 (off) or more", c.WaitReplicas)
	case c.WaitReplicas > 0 && (c.WaitReplicasTimeout < time.Millisecond || c.WaitReplicasTimeout > 10*time.Second):
		return fmt.Errorf("WEBHOOKS_WAIT_REPLICAS_TIMEOUT %s: want 1ms..10s", c.WaitReplicasTimeout)
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

// LogValue is the configuration as logged: secrets masked.
func (c Config) LogValue() slog.Value { return service.LogValue(c) }

// member is the instance name: WEBHOOKS_MEMBER or host-pid-random.
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
