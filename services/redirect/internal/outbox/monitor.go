package outbox

import (
	"context"
	"log/slog"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Monitor samples every shard's outbox: depth (XLEN) and the age of the
// oldest entry (the head's stream ID is its Unix ms), into the metrics, and
// feeds the clicks lanes' depths to the committer's fullness check. Every
// instance samples every shard: it is one pipelined round trip.
type Monitor struct {
	rdb       redis.UniversalClient
	layout    Layout
	committer *Committer
	m         *Metrics
	log       *slog.Logger
}

// NewMonitor returns a monitor; committer may be nil.
func NewMonitor(rdb redis.UniversalClient, layout Layout, committer *Committer, m *Metrics, log *slog.Logger) *Monitor {
	return &Monitor{rdb: rdb, layout: layout, committer: committer, m: m, log: log}
}

// Run samples every interval until ctx ends.
func (mo *Monitor) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if _, err := mo.Sample(ctx); err != nil && ctx.Err() == nil {
			mo.log.Debug("outbox monitor", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Depth is one lane's sampled state over all shards.
type Depth struct {
	Entries   int64
	OldestAge time.Duration
}

// Sample reads every shard once and updates the metrics. It returns the
// totals per lane name.
func (mo *Monitor) Sample(ctx context.Context) (map[string]Depth, error) {
	type probe struct {
		shard int
		lane  Lane
		n     *redis.IntCmd
		head  *redis.XMessageSliceCmd
	}
	probes := make([]probe, 0, mo.layout.Shards*len(Lanes))
	pipe := mo.rdb.Pipeline()
	for s := range mo.layout.Shards {
		for _, l := range Lanes {
			key := mo.layout.OutboxKey(s, l)
			probes = append(probes, probe{shard: s, lane: l, n: pipe.XLen(ctx, key), head: pipe.XRangeN(ctx, key, "-", "+", 1)})
		}
	}
	dead := make([]*redis.IntCmd, mo.layout.Shards)
	for s := range mo.layout.Shards {
		dead[s] = pipe.XLen(ctx, mo.layout.DeadKey(s))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, err
	}
	now := time.Now()
	totals := map[string]Depth{}
	for _, p := range probes {
		n := p.n.Val()
		var age time.Duration
		if h := p.head.Val(); len(h) > 0 {
			age = max(now.Sub(streamIDTime(h[0].ID)), 0)
		}
		shard := strconv.Itoa(p.shard)
		mo.m.Depth.WithLabelValues(shard, p.lane.Name).Set(float64(n))
		mo.m.OldestAge.WithLabelValues(shard, p.lane.Name).Set(age.Seconds())
		t := totals[p.lane.Name]
		t.Entries += n
		t.OldestAge = max(t.OldestAge, age)
		totals[p.lane.Name] = t
		if p.lane == LaneClicks && mo.committer != nil {
			mo.committer.SetDepth(p.shard, n)
		}
	}
	for name, t := range totals {
		mo.m.DepthSum.WithLabelValues(name).Set(float64(t.Entries))
		mo.m.OldestAgeMax.WithLabelValues(name).Set(t.OldestAge.Seconds())
	}
	var deadN int64
	for _, d := range dead {
		deadN += d.Val()
	}
	mo.m.DeadEntries.Set(float64(deadN))
	return totals, nil
}

// streamIDTime is the time in a Redis stream entry ID ("<ms>-<seq>").
func streamIDTime(id string) time.Time {
	for i := 0; i < len(id); i++ {
		if id[i] == '-' {
			ms, err := strconv.ParseInt(id[:i], 10, 64)
			if err != nil {
				return time.Time{}
			}
			return time.UnixMilli(ms)
		}
	}
	return time.Time{}
}
