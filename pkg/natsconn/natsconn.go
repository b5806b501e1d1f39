// Package natsconn opens the NATS connection every Snip service uses, with
// the same reconnect policy and logging everywhere: it connects even when the
// server is not up yet, reconnects forever, and logs each disconnect and
// reconnect once. A service that must keep working without NATS (the
// redirect service) relies on both.
package natsconn

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// PingInterval and MaxPingsOut decide how soon a client gives up on a server
// that keeps its socket open and answers nothing (a frozen process, a
// half-open connection): when a ping finds MaxPingsOut earlier pings
// unanswered, about 15 s after the freeze (measured), it disconnects and
// reconnects, to another node of a cluster if there is one. nats.go's default (2 minutes, 2 pings) left a relay or a group
// member connected to a frozen node without acks for the whole freeze.
const (
	PingInterval = 5 * time.Second
	MaxPingsOut  = 2
)

// Config says where and as whom to connect.
type Config struct {
	// URL is one or more comma-separated server URLs.
	URL string
	// Name identifies the client in server monitoring (e.g. "redirect").
	Name string
	// User and Password, or CredsFile, authenticate; all empty is anonymous.
	User      string
	Password  string
	CredsFile string
	// InboxPrefix is the prefix of the connection's reply subjects (JetStream
	// API replies, pulled messages, KV watches). Empty means InboxPrefix(User)
	// when User is set, and NATS's shared "_INBOX" otherwise. deploy/nats lets
	// each user subscribe only below its own prefix, so no service can read
	// replies meant for another.
	InboxPrefix string
}

// InboxPrefix is the inbox prefix of a NATS user: "_INBOX_" and the user name,
// with characters that may not appear in a subject token replaced by "_".
func InboxPrefix(user string) string {
	b := []byte(user)
	for i, c := range b {
		if c <= ' ' || c == '.' || c == '*' || c == '>' || c >= 0x7f {
			b[i] = '_'
		}
	}
	return "_INBOX_" + string(b)
}

// Connect connects as cfg says. With RetryOnFailedConnect the returned
// connection may not be connected yet; publishes and requests fail until it is.
func Connect(cfg Config, log *slog.Logger, extra ...nats.Option) (*nats.Conn, error) {
	opts := []nats.Option{
		nats.Name(cfg.Name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectJitter(100*time.Millisecond, time.Second),
		nats.RetryOnFailedConnect(true),
		nats.ReconnectBufSize(8 << 20),
		nats.PingInterval(PingInterval),
		nats.MaxPingsOutstanding(MaxPingsOut),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil { // nil: the connection was closed on purpose
				log.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("nats reconnected", "url", nc.ConnectedUrlRedacted())
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subj := ""
			if sub != nil {
				subj = sub.Subject
			}
			log.Warn("nats async error", "subject", subj, "err", err)
		}),
	}
	switch {
	case cfg.CredsFile != "":
		opts = append(opts, nats.UserCredentials(cfg.CredsFile))
	case cfg.User != "":
		opts = append(opts, nats.UserInfo(cfg.User, cfg.Password))
	}
	prefix := cfg.InboxPrefix
	if prefix == "" && cfg.User != "" {
		prefix = InboxPrefix(cfg.User)
	}
	if prefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(prefix))
	}
	nc, err := nats.Connect(cfg.URL, append(opts, extra...)...)
	if err != nil {
		return nil, fmt.Errorf("connect to nats %s: %w", redacted(cfg.URL), err)
	}
	return nc, nil
}

// redacted is urls (comma-separated) with each URL's password, or its
// token (nats://token@host), shown as "xxxxx", for errors, which services
// log; a URL that does not parse is not shown.
func redacted(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		u, err := url.Parse(strings.TrimSpace(p))
		if err != nil {
			parts[i] = "(unparsable URL)"
			continue
		}
		if u.User != nil {
			if _, ok := u.User.Password(); ok {
				u.User = url.UserPassword(u.User.Username(), "xxxxx")
			} else {
				u.User = url.User("xxxxx")
			}
		}
		parts[i] = u.String()
	}
	return strings.Join(parts, ",")
}

// Drain drains nc and waits until it is closed: subscriptions finish what they
// hold, pending publishes and their acks go out. If ctx ends first, nc is
// closed at once and ctx's error is returned. It polls nc.IsClosed rather than
// setting a closed handler, so a handler given at Connect stays in place.
func Drain(ctx context.Context, nc *nats.Conn) error {
	if err := nc.Drain(); err != nil {
		nc.Close()
		return err
	}
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for !nc.IsClosed() {
		select {
		case <-ctx.Done():
			nc.Close()
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// DrainWithin is Drain with a timeout, logging when the connection had to be
// closed before it drained: a service's last step at shutdown.
func DrainWithin(nc *nats.Conn, timeout time.Duration, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := Drain(ctx, nc); err != nil {
		log.Warn("nats drain did not finish; connection closed", "err", err)
	}
}
