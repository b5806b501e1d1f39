// Package outboxstate reads the redirect service's outbox in Redis for the
// console: per lane, the entries waiting to be relayed to JetStream and the
// age of the oldest, the entries parked when even DEAD_LETTER refused them,
// the live relays and the shards no relay holds.
//
// It reads the key layout the redirect service documents in its README
// ("Redis keys"): snip:outbox:shards (the shard count), per shard N the
// streams snip:{sN}:outbox:<lane> (an entry's ID is its Unix ms), the lease
// snip:{sN}:outbox:lease and the parking stream snip:{sN}:outbox:dead, and the
// sorted set snip:outbox:relays of live relays scored by when their heartbeat
// expires. Everything is read in one pipelined round trip (cluster clients
// split it per slot); nothing is written.
package outboxstate

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Lanes are the outbox lanes, in the redirect's order: clicks to CLICKS,
// link events to LINKS, preview jobs to PREVIEW_JOBS.
var Lanes = []string{"clicks", "links", "jobs"}

// Lane is one lane over every shard.
type Lane struct {
	Name    string `json:"lane"`
	Entries int64  `json:"entries"`
	// OldestAge is the age in seconds of the oldest entry of any shard.
	OldestAge float64 `json:"oldest_age_s"`
	Level     string  `json:"level"`
}

// Snapshot is the outbox panel.
type Snapshot struct {
	Shards int    `json:"shards"`
	Lanes  []Lane `json:"lanes"`
	// Dead counts entries parked in Redis because DEAD_LETTER refused them.
	Dead int64 `json:"dead_entries"`
	// Relays counts the relay instances with a live heartbeat.
	Relays int64 `json:"relays"`
	// Unleased counts shards no relay holds: nobody moves their entries.
	Unleased int `json:"unleased_shards"`
}

// Reader reads the outbox.
type Reader struct {
	rdb   redis.UniversalClient
	level func(time.Duration) string
}

// New returns a reader; level colours the oldest entry's age.
func New(rdb redis.UniversalClient, level func(time.Duration) string) *Reader {
	return &Reader{rdb: rdb, level: level}
}

func tag(shard int) string { return "snip:{s" + strconv.Itoa(shard) + "}:" }

// Snapshot reads the outbox now.
func (r *Reader) Snapshot(ctx context.Context) (Snapshot, error) {
	n, err := r.rdb.Get(ctx, "snip:outbox:shards").Int()
	if errors.Is(err, redis.Nil) {
		return Snapshot{}, ErrNoOutbox
	}
	if err != nil {
		return Snapshot{}, fmt.Errorf("read outbox shards: %w", err)
	}
	if n < 1 || n > 1<<16 {
		return Snapshot{}, fmt.Errorf("read outbox: shard count %d out of range", n)
	}
	type probe struct {
		lane int
		n    *redis.IntCmd
		head *redis.XMessageSliceCmd
	}
	probes := make([]probe, 0, n*len(Lanes))
	dead := make([]*redis.IntCmd, n)
	leases := make([]*redis.IntCmd, n)
	pipe := r.rdb.Pipeline()
	for s := range n {
		for i, l := range Lanes {
			key := tag(s) + "outbox:" + l
			probes = append(probes, probe{lane: i, n: pipe.XLen(ctx, key), head: pipe.XRangeN(ctx, key, "-", "+", 1)})
		}
		dead[s] = pipe.XLen(ctx, tag(s)+"outbox:dead")
		leases[s] = pipe.Exists(ctx, tag(s)+"outbox:lease")
	}
	relays := pipe.ZCount(ctx, "snip:outbox:relays", strconv.FormatInt(time.Now().UnixMilli(), 10), "+inf")
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return Snapshot{}, fmt.Errorf("read outbox: %w", err)
	}
	now := time.Now()
	snap := Snapshot{Shards: n, Lanes: make([]Lane, len(Lanes)), Relays: relays.Val()}
	oldest := make([]time.Duration, len(Lanes))
	for i, l := range Lanes {
		snap.Lanes[i].Name = l
	}
	for _, p := range probes {
		snap.Lanes[p.lane].Entries += p.n.Val()
		if h := p.head.Val(); len(h) > 0 {
			oldest[p.lane] = max(oldest[p.lane], now.Sub(idTime(h[0].ID)))
		}
	}
	for i := range snap.Lanes {
		snap.Lanes[i].OldestAge = oldest[i].Seconds()
		snap.Lanes[i].Level = r.level(oldest[i])
	}
	for s := range n {
		snap.Dead += dead[s].Val()
		if leases[s].Val() == 0 {
			snap.Unleased++
		}
	}
	return snap, nil
}

// idTime is the time in a Redis stream entry ID ("<ms>-<seq>").
func idTime(id string) time.Time {
	ms, _, _ := strings.Cut(id, "-")
	v, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return time.Now()
	}
	return time.UnixMilli(v)
}
