// Package redisconn opens the Redis client every Snip service uses, from one
// URL setting, so a deployment can move from one Redis to Redis Cluster by
// changing REDIS_URL alone:
//
//	redis://[user:password@]host:port/db            one server (or a Sentinel-less replica set's primary)
//	rediss://...                                    the same over TLS
//	redis+cluster://[user:password@]h1:p1,h2:p2     Redis Cluster (database 0 only)
//
// Code takes redis.UniversalClient, which both kinds implement. Keys that
// must change together carry a hash tag ({...}) so they land in one cluster
// slot; the services' READMEs list their keys.
package redisconn

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClusterStateReloadInterval is how often a cluster client re-reads the slot
// map (lazily, on its next command). go-redis does not re-read it when a
// master refuses connections, only after this interval (60 s by default), so
// after a failover it would keep dialing the dead master that long; one
// CLUSTER SLOTS a second per client bounds that to about a second.
const ClusterStateReloadInterval = time.Second

// Open parses url and returns a client. It does not connect; call Ping to
// check the server.
func Open(url string) (redis.UniversalClient, error) { return open(url, 0) }

// OpenWithTimeout is Open with every socket read and write of the client
// bounded by timeout, whatever the URL's read_timeout and write_timeout
// say: for a caller whose own bound on a command must hold exactly, neither
// cut short by a shorter read timeout nor stretched by a longer one. A
// command that times out is not retried once its context's deadline has
// passed, so a caller that gives each command a context of the same timeout
// learns of a failure no sooner than timeout after its command was sent,
// and not much later.
func OpenWithTimeout(url string, timeout time.Duration) (redis.UniversalClient, error) {
	if timeout <= 0 {
		return nil, fmt.Errorf("redis timeout %s: want more than 0", timeout)
	}
	return open(url, timeout)
}

func open(url string, timeout time.Duration) (redis.UniversalClient, error) {
	if rest, ok := strings.CutPrefix(url, "redis+cluster://"); ok {
		opts, err := redis.ParseClusterURL(clusterURL(rest))
		if err != nil {
			return nil, fmt.Errorf("parse redis cluster url: %w", err)
		}
		tune(&opts.DialTimeout, &opts.ReadTimeout, &opts.WriteTimeout)
		if timeout > 0 {
			opts.ReadTimeout, opts.WriteTimeout = timeout, timeout
		}
		if opts.ClusterStateReloadInterval == 0 {
			opts.ClusterStateReloadInterval = ClusterStateReloadInterval
		}
		return redis.NewClusterClient(opts), nil
	}
	opts, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("parse redis url: %w", err)
	}
	tune(&opts.DialTimeout, &opts.ReadTimeout, &opts.WriteTimeout)
	if timeout > 0 {
		opts.ReadTimeout, opts.WriteTimeout = timeout, timeout
	}
	return redis.NewClient(opts), nil
}

// clusterURL turns "[user:password@]h1:p1,h2:p2[/...][?query]" into the form
// go-redis parses: the first host in the URL, the others as addr parameters.
func clusterURL(rest string) string {
	authority, tail := rest, ""
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		authority, tail = rest[:i], rest[i:]
	}
	userinfo := ""
	if i := strings.LastIndex(authority, "@"); i >= 0 {
		userinfo, authority = authority[:i+1], authority[i+1:]
	}
	hosts := strings.Split(authority, ",")
	var extra strings.Builder
	for _, h := range hosts[1:] {
		if h = strings.TrimSpace(h); h != "" {
			extra.WriteString("addr=" + h + "&")
		}
	}
	path, query, _ := strings.Cut(tail, "?")
	q := strings.TrimSuffix(extra.String()+query, "&")
	u := "redis://" + userinfo + strings.TrimSpace(hosts[0]) + path
	if q != "" {
		u += "?" + q
	}
	return u
}

// tune sets timeouts that fail fast on a dead server instead of hanging
// request handlers: Redis answers in well under a millisecond when healthy.
func tune(dial, read, write *time.Duration) {
	if *dial == 0 || *dial == 5*time.Second {
		*dial = 2 * time.Second
	}
	if *read == 0 || *read == 3*time.Second {
		*read = 2 * time.Second
	}
	if *write == 0 || *write == 3*time.Second {
		*write = 2 * time.Second
	}
}

// Ping checks the server within ctx.
func Ping(ctx context.Context, c redis.UniversalClient) error {
	if err := c.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("ping redis: %w", err)
	}
	return nil
}
