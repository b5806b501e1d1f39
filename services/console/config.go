package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/snipdev/snip/pkg/service"
	"github.com/snipdev/snip/services/console/internal/httpapi"
)

// Config is the console's configuration, read once from the environment.
type Config struct {
	service.Base
	service.NATS
	// Redis is where the owners' API keys and the redirect outbox are.
	service.Redis

	// ClickHouseAddrs are host:port of ClickHouse's native protocol; empty
	// leaves the warehouse panel out.
	ClickHouseAddrs    []string `env:"CLICKHOUSE_ADDR" envSeparator:","`
	ClickHouseDatabase string   `env:"CLICKHOUSE_DATABASE" envDefault:"snip"`
	ClickHouseUser     string   `env:"CLICKHOUSE_USER" envDefault:"default"`
	ClickHousePassword string   `env:"CLICKHOUSE_PASSWORD" secret:"true"`

	// Token is the operators' shared secret (16 characters or more). Without
	// it the console serves loopback only, unless Insecure.
	Token string `env:"CONSOLE_TOKEN" secret:"true"`
	// Insecure allows a console without a token on a non-loopback address.
	Insecure bool `env:"CONSOLE_INSECURE"`
	// CookieSecure marks the session cookie Secure (the console is behind TLS).
	CookieSecure bool `env:"CONSOLE_COOKIE_SECURE"`
	// AllowDevToken accepts a token published in this repository (compose's
	// former default), for a laptop demo only.
	AllowDevToken bool `env:"CONSOLE_ALLOW_DEV_TOKEN"`
	// AuthFailureBurst failed logins or Bearer tokens one client (an IPv4
	// address, an IPv6 /64) may send at once, then one per
	// AuthFailureInterval; correct ones cost nothing.
	AuthFailureBurst    int           `env:"CONSOLE_AUTH_FAILURE_BURST" envDefault:"5"`
	AuthFailureInterval time.Duration `env:"CONSOLE_AUTH_FAILURE_INTERVAL" envDefault:"2s"`
	// TrustedProxies are CIDRs (or addresses) of reverse proxies whose
	// X-Forwarded-For names the client for those limits; empty: the
	// connection's peer is the client.
	TrustedProxies []string `env:"CONSOLE_TRUSTED_PROXIES" envSeparator:","`

	// LagWarn and LagAlarm colour the age of the oldest unread event (and the
	// outbox's oldest entry): the same 1 and 5 minutes the alert rules use.
	LagWarn  time.Duration `env:"CONSOLE_LAG_WARN" envDefault:"60s"`
	LagAlarm time.Duration `env:"CONSOLE_LAG_ALARM" envDefault:"5m"`
	// Refresh is how often the page polls the panels: the wait after one
	// poll answered before the next (polls never overlap).
	Refresh time.Duration `env:"CONSOLE_REFRESH" envDefault:"2s"`

	// The live clicks: clicks a new page gets at once, each page's queue,
	// pages watching at once, clicks a second shown.
	LiveRecent      int     `env:"CONSOLE_LIVE_RECENT" envDefault:"50"`
	LiveBuffer      int     `env:"CONSOLE_LIVE_BUFFER" envDefault:"256"`
	LiveMaxBrowsers int     `env:"CONSOLE_LIVE_MAX_BROWSERS" envDefault:"16"`
	LiveMaxRate     float64 `env:"CONSOLE_LIVE_MAX_RATE" envDefault:"200"`

	// AlertsKeep fraud alerts are kept, read from AlertsSince back at start.
	AlertsKeep  int           `env:"CONSOLE_ALERTS_KEEP" envDefault:"100"`
	AlertsSince time.Duration `env:"CONSOLE_ALERTS_SINCE" envDefault:"24h"`

	// The owners' click streams: per owner and per instance.
	OwnerStreamsPerOwner int `env:"CONSOLE_OWNER_STREAMS_PER_OWNER" envDefault:"4"`
	OwnerStreamsMax      int `env:"CONSOLE_OWNER_STREAMS_MAX" envDefault:"1000"`
	// OwnerStreamOpenBurst streams an owner may open at once, then one per
	// OwnerStreamOpenInterval (429 beyond): each open creates a JetStream
	// consumer. 10 lets every one of 4 streams reconnect twice at once.
	OwnerStreamOpenBurst    int           `env:"CONSOLE_OWNER_STREAM_OPEN_BURST" envDefault:"10"`
	OwnerStreamOpenInterval time.Duration `env:"CONSOLE_OWNER_STREAM_OPEN_INTERVAL" envDefault:"3s"`
	// OwnerKeyRecheck is how often an open owner stream checks its API key
	// again: a rotated or revoked key ends the stream within it.
	OwnerKeyRecheck time.Duration `env:"CONSOLE_OWNER_KEY_RECHECK" envDefault:"2s"`
	// SSEHeartbeat is the owners' streams' keepalive interval; SSEWriteTimeout
	// disconnects a client (owner or page) that stops reading.
	SSEHeartbeat    time.Duration `env:"CONSOLE_SSE_HEARTBEAT" envDefault:"15s"`
	SSEWriteTimeout time.Duration `env:"CONSOLE_SSE_WRITE_TIMEOUT" envDefault:"10s"`
}

// minTokenLen and minTokenDistinct keep the token out of guessing range:
// 16 characters of which at least 8 differ (20 spaces, or "aaaa...", are
// refused).
const (
	minTokenLen      = 16
	minTokenDistinct = 8
)

// devTokens are tokens this repository has published; the console refuses
// them unless CONSOLE_ALLOW_DEV_TOKEN says this is a demo.
var devTokens = []string{"console-dev-token"}

// trustedProxies parses CONSOLE_TRUSTED_PROXIES.
func (c Config) trustedProxies() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, v := range c.TrustedProxies {
		v = strings.TrimSpace(v)
		if v == "" {
			continue
		}
		if p, err := netip.ParsePrefix(v); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(v)
		if err != nil {
			return nil, fmt.Errorf("CONSOLE_TRUSTED_PROXIES: %q is not a CIDR or an address", v)
		}
		out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
	}
	return out, nil
}

func (c Config) trustedProxiesErr() error {
	_, err := c.trustedProxies()
	return err
}

// tokenProblem says what is wrong with a console token, or nil.
func tokenProblem(t string, allowDev bool) error {
	distinct := map[rune]bool{}
	for _, r := range t {
		if unicode.IsSpace(r) || unicode.IsControl(r) {
			return errors.New("CONSOLE_TOKEN: no spaces or control characters")
		}
		distinct[r] = true
	}
	switch {
	case len(t) < minTokenLen:
		return fmt.Errorf("CONSOLE_TOKEN: want %d characters or more", minTokenLen)
	case len(distinct) < minTokenDistinct:
		return fmt.Errorf("CONSOLE_TOKEN: want %d different characters or more (e.g. openssl rand -hex 24)", minTokenDistinct)
	case !allowDev && slices.Contains(devTokens, t):
		return errors.New("CONSOLE_TOKEN is a development token published in this repository: " +
			"set your own (e.g. openssl rand -hex 24), or CONSOLE_ALLOW_DEV_TOKEN=true for a laptop demo")
	}
	return nil
}

// loadConfig reads the environment (the console takes no arguments).
func loadConfig(environ, _ []string) (Config, error) {
	cfg := Config{Base: service.Base{HTTPAddr: ":8085", ShutdownTimeout: 10 * time.Second}}
	return service.LoadConfig(environ, cfg, (*Config).validate)
}

func (c Config) validate() error {
	switch {
	case c.Token != "" && tokenProblem(c.Token, c.AllowDevToken) != nil:
		return tokenProblem(c.Token, c.AllowDevToken)
	case c.AuthFailureBurst < 1 || c.AuthFailureInterval <= 0:
		return errors.New("CONSOLE_AUTH_FAILURE_BURST >= 1 and CONSOLE_AUTH_FAILURE_INTERVAL > 0")
	case c.trustedProxiesErr() != nil:
		return c.trustedProxiesErr()
	case c.Token == "" && !c.Insecure && !loopbackListen(c.HTTPAddr):
		return fmt.Errorf("HTTP_ADDR %q is not a loopback address and CONSOLE_TOKEN is not set: "+
			"set a token, listen on 127.0.0.1, or set CONSOLE_INSECURE=true", c.HTTPAddr)
	case c.LagWarn <= 0 || c.LagAlarm <= c.LagWarn:
		return fmt.Errorf("CONSOLE_LAG_WARN %s, CONSOLE_LAG_ALARM %s: want 0 < warn < alarm", c.LagWarn, c.LagAlarm)
	case c.Refresh < 500*time.Millisecond:
		return fmt.Errorf("CONSOLE_REFRESH %s: want >= 500ms", c.Refresh)
	case c.LiveRecent < 1 || c.LiveBuffer < 1 || c.LiveMaxBrowsers < 1 || c.LiveMaxRate <= 0:
		// A new page always gets some recent clicks (livefeed takes 0 for
		// its default): 0 would not mean none, so it is refused.
		return errors.New("CONSOLE_LIVE_*: want recent, buffer, max browsers, max rate > 0")
	case c.AlertsKeep < 1 || c.AlertsSince <= 0:
		return errors.New("CONSOLE_ALERTS_KEEP and CONSOLE_ALERTS_SINCE: want > 0")
	case c.OwnerKeyRecheck < 100*time.Millisecond:
		return errors.New("CONSOLE_OWNER_KEY_RECHECK: want 100ms or more")
	case c.OwnerStreamsPerOwner < 1 || c.OwnerStreamsMax < c.OwnerStreamsPerOwner:
		return errors.New("CONSOLE_OWNER_STREAMS_PER_OWNER >= 1 and CONSOLE_OWNER_STREAMS_MAX >= it")
	case c.OwnerStreamOpenBurst < 1 || c.OwnerStreamOpenInterval <= 0:
		return errors.New("CONSOLE_OWNER_STREAM_OPEN_BURST >= 1 and CONSOLE_OWNER_STREAM_OPEN_INTERVAL > 0")
	case c.SSEHeartbeat <= 0 || c.SSEWriteTimeout <= 0 || c.ShutdownTimeout <= 0:
		return errors.New("CONSOLE_SSE_HEARTBEAT, CONSOLE_SSE_WRITE_TIMEOUT and SHUTDOWN_TIMEOUT: want > 0")
	}
	return nil
}

// loopbackListen reports whether addr listens on loopback only; an empty
// host (every interface) does not.
func loopbackListen(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	return err == nil && host != "" && httpapi.IsLoopbackHost(host)
}

// LogValue is the configuration as logged: secrets masked.
func (c Config) LogValue() slog.Value { return service.LogValue(c) }
