// Package webhookstate reads the webhooks service's endpoints in Redis for
// the console: each owner endpoint's status (active, paused, disabled and
// why), its backlog and the age of its oldest undelivered event, and how
// long it has been failing.
//
// It reads the key layout the webhooks service documents (its package
// redisstore): the set snip:wh:endpoints, per endpoint the hash
// snip:wh:{<id>}:ep (field cfg: the endpoint's JSON; failing_since in Unix
// ms; last_error) and the stream snip:wh:{<id>}:q (an entry carries the
// event's time in ns in field ts). Everything is read in one pipelined round
// trip; nothing is written.
//
// An endpoint's URL is shown as its host only: its path and query may carry
// an owner's token. The webhooks service writes its last error, and a
// disabled endpoint's reason, from the HTTP client's error, which quotes the
// whole URL (Post "https://host/path?token=…": …); every URL in them is
// shown as its scheme and host too.
package webhookstate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// MaxShown bounds the endpoints listed: the most troubled first.
const MaxShown = 50

// Endpoint is one endpoint as the console shows it.
type Endpoint struct {
	ID    string `json:"id"`
	Owner string `json:"owner"`
	// Host is the endpoint's host; the path may carry an owner's token and
	// is not shown.
	Host   string `json:"host"`
	Status string `json:"status"`
	// DisabledReason and LastError are the webhooks service's, with every
	// URL in them cut to its scheme and host (HostsOnly).
	DisabledReason string        `json:"disabled_reason,omitempty"`
	Backlog        int64         `json:"backlog"`
	OldestAge      time.Duration `json:"-"`
	FailingFor     time.Duration `json:"-"`
	// OldestAgeS and FailingForS are the same in seconds, for the page.
	OldestAgeS  float64 `json:"oldest_age_s"`
	FailingForS float64 `json:"failing_for_s"`
	LastError   string  `json:"last_error,omitempty"`
}

// Snapshot is every endpoint's state, the most troubled first.
type Snapshot struct {
	Endpoints []Endpoint `json:"endpoints"`
	// Total, Disabled and Failing count all endpoints, shown or not.
	Total    int   `json:"total"`
	Disabled int   `json:"disabled"`
	Failing  int   `json:"failing"`
	Backlog  int64 `json:"backlog"`
}

// Reader reads the layout from one Redis.
type Reader struct{ rdb redis.UniversalClient }

// New returns a Reader on rdb.
func New(rdb redis.UniversalClient) *Reader { return &Reader{rdb: rdb} }

func key(id, part string) string { return "snip:wh:{" + id + "}:" + part }

// Snapshot reads every endpoint at now.
func (r *Reader) Snapshot(ctx context.Context, now time.Time) (Snapshot, error) {
	ids, err := r.rdb.SMembers(ctx, "snip:wh:endpoints").Result()
	if err != nil {
		return Snapshot{}, fmt.Errorf("webhook endpoints: %w", err)
	}
	slices.Sort(ids)
	type cmds struct {
		ep    *redis.MapStringStringCmd
		n     *redis.IntCmd
		first *redis.XMessageSliceCmd
	}
	cs := make([]cmds, len(ids))
	_, err = r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			cs[i] = cmds{ep: p.HGetAll(ctx, key(id, "ep")), n: p.XLen(ctx, key(id, "q")), first: p.XRangeN(ctx, key(id, "q"), "-", "+", 1)}
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return Snapshot{}, fmt.Errorf("webhook endpoints: %w", err)
	}
	var s Snapshot
	for i, id := range ids {
		m := cs[i].ep.Val()
		var cfg struct {
			Owner          string    `json:"owner"`
			URL            string    `json:"url"`
			Paused         bool      `json:"paused"`
			DisabledAt     time.Time `json:"disabled_at"`
			DisabledReason string    `json:"disabled_reason"`
		}
		if m["cfg"] == "" || json.Unmarshal([]byte(m["cfg"]), &cfg) != nil {
			continue // deleted meanwhile, or not a layout this build reads
		}
		e := Endpoint{ID: id, Owner: cfg.Owner, Status: "active", Backlog: cs[i].n.Val(), LastError: HostsOnly(m["last_error"])}
		if u, err := url.Parse(cfg.URL); err == nil {
			e.Host = u.Host
		}
		switch {
		case !cfg.DisabledAt.IsZero():
			e.Status, e.DisabledReason = "disabled", HostsOnly(cfg.DisabledReason)
			s.Disabled++
		case cfg.Paused:
			e.Status = "paused"
		}
		if ms, _ := strconv.ParseInt(m["failing_since"], 10, 64); ms > 0 {
			e.FailingFor = now.Sub(time.UnixMilli(ms))
			s.Failing++
		}
		if first := cs[i].first.Val(); len(first) > 0 {
			if v, ok := first[0].Values["ts"].(string); ok {
				if ns, err := strconv.ParseInt(v, 10, 64); err == nil {
					e.OldestAge = now.Sub(time.Unix(0, ns))
				}
			}
		}
		e.OldestAgeS, e.FailingForS = e.OldestAge.Seconds(), e.FailingFor.Seconds()
		s.Total++
		s.Backlog += e.Backlog
		s.Endpoints = append(s.Endpoints, e)
	}
	rank := func(e Endpoint) int {
		switch {
		case e.Status == "disabled":
			return 0
		case e.FailingFor > 0:
			return 1
		}
		return 2
	}
	slices.SortStableFunc(s.Endpoints, func(a, b Endpoint) int {
		if ra, rb := rank(a), rank(b); ra != rb {
			return ra - rb
		}
		return int(b.OldestAge - a.OldestAge)
	})
	if len(s.Endpoints) > MaxShown {
		s.Endpoints = s.Endpoints[:MaxShown]
	}
	return s, nil
}

// urlInText is a URL as an error quotes it: a scheme, "://", and what
// follows up to a space or a quote.
var urlInText = regexp.MustCompile(`[A-Za-z][A-Za-z0-9+.-]*://[^\s"'<>]+`)

// HostsOnly returns text with every URL in it cut to its scheme and host,
// "/…" standing for a path or query cut off: an endpoint's URL may carry
// an owner's token, and the webhooks service's errors quote it whole. A
// URL that does not parse is shown as "(a URL)".
func HostsOnly(text string) string {
	return urlInText.ReplaceAllStringFunc(text, func(raw string) string {
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" {
			return "(a URL)"
		}
		out := u.Scheme + "://" + u.Host
		if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Opaque != "" {
			out += "/…"
		}
		return out
	})
}
