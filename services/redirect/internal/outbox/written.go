package outbox

import (
	"context"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Written remembers, per shard and lane, the highest stream ID this instance
// wrote into the outbox (the group commit's clicks, the link store's events
// and jobs), so that shutdown can wait for this instance's own entries to
// be relayed, by whichever instance holds their shards, and for nothing
// else: other instances go on writing, and a shard another instance holds
// may be stuck, neither of which is this instance's to wait for. The zero
// value is not usable; NewWritten makes one. Safe for concurrent use.
type Written struct {
	layout Layout
	mu     sync.Mutex
	marks  []streamID // shard*len(Lanes)+lane; zero: nothing written
}

// streamID is a Redis stream entry ID, "ms-seq", as numbers.
type streamID struct{ ms, seq uint64 }

func (a streamID) less(b streamID) bool { return a.ms < b.ms || (a.ms == b.ms && a.seq < b.seq) }

func (a streamID) String() string {
	return strconv.FormatUint(a.ms, 10) + "-" + strconv.FormatUint(a.seq, 10)
}

func parseStreamID(id string) (streamID, bool) {
	msPart, seqPart, ok := strings.Cut(id, "-")
	ms, err1 := strconv.ParseUint(msPart, 10, 64)
	seq, err2 := strconv.ParseUint(seqPart, 10, 64)
	return streamID{ms, seq}, ok && err1 == nil && err2 == nil
}

// NewWritten returns an empty record for layout's shards.
func NewWritten(layout Layout) *Written {
	return &Written{layout: layout, marks: make([]streamID, layout.Shards*len(Lanes))}
}

func laneIndex(lane Lane) int {
	for i, l := range Lanes {
		if l == lane {
			return i
		}
	}
	return -1
}

// Note records that id (the stream ID Redis gave an XADD of this instance)
// was written into shard's lane. A nil Written notes nothing.
func (w *Written) Note(shard int, lane Lane, id string) {
	if w == nil {
		return
	}
	li := laneIndex(lane)
	sid, ok := parseStreamID(id)
	if li < 0 || !ok {
		return
	}
	w.mu.Lock()
	if m := &w.marks[shard*len(Lanes)+li]; m.less(sid) {
		*m = sid
	}
	w.mu.Unlock()
}

// Unrelayed returns how many lanes still hold an entry at or below the
// highest ID this instance wrote into them: entries no relay has deleted
// yet (published, parked or dropped as late), this instance's among them.
// One pipelined round trip.
func (w *Written) Unrelayed(ctx context.Context, rdb redis.UniversalClient) (int, error) {
	w.mu.Lock()
	type probe struct {
		key  string
		upTo string
	}
	var probes []probe
	for i, m := range w.marks {
		if m != (streamID{}) {
			probes = append(probes, probe{w.layout.OutboxKey(i/len(Lanes), Lanes[i%len(Lanes)]), m.String()})
		}
	}
	w.mu.Unlock()
	if len(probes) == 0 {
		return 0, nil
	}
	pipe := rdb.Pipeline()
	cmds := make([]*redis.XMessageSliceCmd, len(probes))
	for i, p := range probes {
		cmds[i] = pipe.XRangeN(ctx, p.key, "-", p.upTo, 1)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, err
	}
	n := 0
	for _, c := range cmds {
		if len(c.Val()) > 0 {
			n++
		}
	}
	return n, nil
}
