package reader

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/topology"
)

// withDefaults fills unset fields and checks the rest.
func (c Config) withDefaults() (Config, error) {
	if !events.ValidToken(c.Group) {
		return c, fmt.Errorf("group %q is not a subject token: %w", c.Group, ErrBadConfig)
	}
	if c.Member == "" {
		c.Member = defaultMember()
	}
	if !events.ValidToken(c.Member) {
		return c, fmt.Errorf("member %q is not a subject token: %w", c.Member, ErrBadConfig)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if c.BatchSize == 0 {
		c.BatchSize = 500
	}
	def(&c.Linger, 100*time.Millisecond)
	def(&c.LeaseTTL, 3*time.Second)
	def(&c.AckWait, 60*time.Second)
	def(&c.AckTimeout, 10*time.Second)
	def(&c.MaxRetryDelay, min(10*time.Second, c.AckWait/3))
	def(&c.DrainTimeout, 30*time.Second)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case c.Partitions < 0:
		return c, fmt.Errorf("partitions %d: %w", c.Partitions, ErrBadConfig)
	case c.BatchSize < 1 || c.BatchSize > 100_000:
		return c, fmt.Errorf("batch size %d, want 1..100000: %w", c.BatchSize, ErrBadConfig)
	case c.LeaseTTL < time.Second:
		return c, fmt.Errorf("lease TTL %s, want >= 1s (JetStream's per-message TTL granularity): %w", c.LeaseTTL, ErrBadConfig)
	case c.AckWait < 2*c.LeaseTTL:
		return c, fmt.Errorf("ack wait %s, want >= 2 x lease TTL: %w", c.AckWait, ErrBadConfig)
	case c.MaxRetryDelay > c.AckWait/3:
		return c, fmt.Errorf("max retry delay %s, want <= ack wait / 3: %w", c.MaxRetryDelay, ErrBadConfig)
	case c.Linger <= 0 || c.AckTimeout <= 0 || c.MaxRetryDelay <= 0 || c.DrainTimeout <= 0:
		return c, fmt.Errorf("linger, ack timeout, max retry delay and drain timeout must be > 0: %w", ErrBadConfig)
	}
	return c, nil
}

// consumerConfig is partition p's consumer as this member would create it.
func (c Config) consumerConfig(p int) jetstream.ConsumerConfig {
	gc := topology.GroupConsumer{
		AckWait:       c.AckWait,
		PinnedTTL:     c.LeaseTTL,
		MaxAckPending: max(1000, 2*c.BatchSize),
	}
	switch c.Start.policy {
	case startNew:
		gc.DeliverPolicy = jetstream.DeliverNewPolicy
	case startTime, startWithin:
		t := c.Start.from(time.Now())
		gc.DeliverPolicy, gc.OptStartTime = jetstream.DeliverByStartTimePolicy, &t
	default:
		gc.DeliverPolicy = jetstream.DeliverAllPolicy
	}
	cc := topology.GroupConsumerConfig(c.Group, p, gc)
	for k, v := range c.Metadata {
		if _, ok := cc.Metadata[k]; !ok {
			cc.Metadata[k] = v
		}
	}
	return cc
}

// idleWait is how long one pull waits when the partition is idle. It stays
// well under the pinned TTL so an idle owner keeps its pin.
func (c Config) idleWait() time.Duration {
	return min(max(c.LeaseTTL/2, 100*time.Millisecond), 5*time.Second)
}

func (c Config) newBackoff() *backoff.ExponentialBackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 100 * time.Millisecond
	b.MaxInterval = c.MaxRetryDelay
	b.RandomizationFactor = 0.3
	b.Multiplier = 2
	return b
}

func defaultMember() string {
	host, _ := os.Hostname()
	var b [3]byte
	_, _ = rand.Read(b[:])
	return sanitizeToken(host) + "-" + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(b[:])
}

// newInstance is a random token that tells this run's lease from another
// process's under the same member name.
func newInstance() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// sanitizeToken maps s onto subject-token characters.
func sanitizeToken(s string) string {
	if s == "" {
		return "x"
	}
	var b strings.Builder
	for i := 0; i < len(s) && b.Len() < 40; i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' {
			b.WriteByte(c)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}
