// Package natsconn opens the NATS connection every Snip service uses, with
// the same reconnect policy and logging everywhere: it connects even when the
// server is not up yet, reconnects forever (through refused credentials
// too), and logs each disconnect and reconnect once. A service that must
// keep working without NATS (the redirect service) relies on both. While a
// connection is down, ConnectError says why its last attempt failed. A few
// server errors (a control line over the server's limit, an error nats.go
// does not know) still close the connection for good; a service's
// connection so closed stops the service (service.Group.NATS).
package natsconn

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"sync"
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
// connection may not be connected yet. Until it is, and whenever it
// reconnects, a publish does not fail: it waits in the reconnect buffer (8
// MiB) and is sent once connected, however late; a request waits for its
// reply until its timeout. A caller for which a late publish is worse than
// a failed one passes nats.ReconnectBufSize(-1) in extra: its publishes
// then fail at once while the connection is down.
func Connect(cfg Config, log *slog.Logger, extra ...nats.Option) (*nats.Conn, error) {
	servers, err := parseURLs(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("connect to nats: %w", err)
	}
	secrets := secretsOf(servers, cfg.Password)
	opts := []nats.Option{
		nats.Name(cfg.Name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectJitter(100*time.Millisecond, time.Second),
		nats.RetryOnFailedConnect(true),
		// nats.go closes the connection for good when a server refuses
		// the credentials twice in a row: a node that has not loaded the
		// account yet, or a reload that briefly has the wrong password,
		// would leave the service running, never ready, until restarted.
		// It is retried like any failed reconnect; once the connection
		// had been made each refusal is logged (the error handler), and
		// ConnectError names it in any case.
		nats.IgnoreAuthErrorAbort(),
		nats.ReconnectBufSize(8 << 20),
		nats.PingInterval(PingInterval),
		nats.MaxPingsOutstanding(MaxPingsOut),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil { // nil: the connection was closed on purpose
				log.Warn("nats disconnected", "err", hide(err, secrets))
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			failures.Delete(nc)
			log.Info("nats reconnected", "url", nc.ConnectedUrlRedacted())
		}),
		// Each failed attempt, the first connect's included (with
		// RetryOnFailedConnect nats.go reports it here too), and not
		// logged: one comes every ReconnectWait. nats.go keeps none of
		// them: LastError is cleared at each attempt.
		nats.ReconnectErrHandler(func(nc *nats.Conn, err error) {
			failures.Store(nc, hide(err, secrets))
		}),
		nats.ConnectHandler(func(nc *nats.Conn) { failures.Delete(nc) }),
		nats.ClosedHandler(func(nc *nats.Conn) { failures.Delete(nc) }),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subj := ""
			if sub != nil {
				subj = sub.Subject
			}
			log.Warn("nats async error", "subject", subj, "err", hide(err, secrets))
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
		return nil, fmt.Errorf("connect to nats %s: %w", redacted(servers), hide(err, secrets))
	}
	return nc, nil
}

// failures is, for each connection Connect made that is not connected,
// why its last attempt to connect failed. The handlers Connect sets keep
// it; an option in extra that replaces one of them leaves it stale.
var failures sync.Map // *nats.Conn -> error

// ConnectError is why nc's last attempt to connect failed ("dial tcp
// 127.0.0.1:4222: connect: connection refused", "dial tcp: lookup nats:
// no such host", "nats: Authorization Violation"), with any password
// hidden; nil once it is connected, after it is closed, before an attempt
// has failed, and for a connection Connect did not make. A readiness
// check says it while nc is down (service.NATSReady): nats.go's own
// LastError is cleared at each attempt and says nothing of a failed dial.
// When the first connect's dial is refused, nats.go reports "nats: no
// servers available for connection"; the next attempt, ReconnectWait
// later, names the refusal.
func ConnectError(nc *nats.Conn) error {
	if err, ok := failures.Load(nc); ok {
		return err.(error)
	}
	return nil
}

// parseURLs parses urls as nats.go does: split at commas, blanks trimmed,
// empty entries skipped, nats:// in front of an entry without a scheme. An
// entry that does not parse is refused by its place ("entry 2 of 3") and a
// reason in our own words, never by its text or url.Parse's error: both
// quote the entry, or a piece of it that may be a piece of its password (in
// "nats://app:pa/ss@host" an unescaped '/' makes "pa" the port). nats.go's
// own error quotes the whole entry, password included.
func parseURLs(urls string) ([]*url.URL, error) {
	parts := strings.Split(urls, ",")
	var out []*url.URL
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if !strings.Contains(p, "://") {
			p = "nats://" + p
		}
		u, err := url.Parse(p)
		if err != nil {
			return nil, fmt.Errorf("NATS URL entry %d of %d is not a valid URL: %s", i+1, len(parts), whyUnparsable(p, err))
		}
		out = append(out, u)
	}
	return out, nil
}

// whyUnparsable says what is wrong with an entry url.Parse refused, in
// words that quote nothing of it.
func whyUnparsable(entry string, err error) string {
	var escape url.EscapeError
	var host url.InvalidHostError
	switch {
	case strings.ContainsFunc(entry, func(r rune) bool { return r < ' ' || r == 0x7f }):
		return "it holds a control character"
	case errors.As(err, &escape):
		return "it holds a '%' that is not a %XX escape (write '%' in a password as %25)"
	case errors.As(err, &host):
		return "its host holds a character a host name may not (a space?)"
	}
	return "check the port, and write '/', '?', '#' or '%' in a password %-escaped"
}

// redacted is the URLs with each one's password, or its token
// (nats://token@host), shown as "xxxxx", for errors, which services log.
// Only the scheme, the user and the host are shown: a path, query or
// fragment is "/...", for a password written with an unescaped '/', '?'
// or '#' where its ':' should be ("nats://app#pass@host") leaves it there.
func redacted(urls []*url.URL) string {
	parts := make([]string, len(urls))
	for i, u := range urls {
		r := url.URL{Scheme: u.Scheme, Host: u.Host}
		if u.User != nil {
			if _, ok := u.User.Password(); ok {
				r.User = url.UserPassword(u.User.Username(), "xxxxx")
			} else {
				r.User = url.User("xxxxx")
			}
		}
		parts[i] = r.String()
		if u.Path != "" || u.RawQuery != "" || u.Fragment != "" || u.ForceQuery {
			parts[i] += "/..."
		}
	}
	return strings.Join(parts, ",")
}

// secretsOf lists what an error must not show: each URL's password or
// token, as written (escaped) and as sent (unescaped), and the configured
// password.
func secretsOf(urls []*url.URL, password string) []string {
	var s []string
	add := func(v string) {
		if v != "" && !slices.Contains(s, v) {
			s = append(s, v)
		}
	}
	for _, u := range urls {
		if u.User == nil {
			continue
		}
		secret, ok := u.User.Password()
		if !ok {
			secret = u.User.Username()
		}
		add(secret)
		add(url.PathEscape(secret))
		add(url.QueryEscape(secret))
		if _, after, ok := strings.Cut(u.User.String(), ":"); ok {
			add(after)
		} else {
			add(u.User.String())
		}
	}
	add(password)
	// The longest first: a secret that holds another is replaced whole.
	slices.SortFunc(s, func(a, b string) int { return len(b) - len(a) })
	return s
}

// hide returns err, or, when its text shows one of secrets, an error with
// that text and every secret in it replaced by "xxxxx". The replacement
// does not wrap err, whose text still shows them. nats.go's errors are not
// known to hold a URL's secret once parseURLs has accepted the URLs; this
// keeps it so if one ever does.
func hide(err error, secrets []string) error {
	msg := err.Error()
	clean := msg
	for _, s := range secrets {
		clean = strings.ReplaceAll(clean, s, "xxxxx")
	}
	if clean == msg {
		return err
	}
	return errors.New(clean)
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
