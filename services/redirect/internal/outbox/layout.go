package outbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/events"
)

// Lane is one outbox stream per shard, relayed independently of the other
// lanes, so a refusal on one destination (a full PREVIEW_JOBS queue) never
// holds up another (clicks). Order is kept within a lane, which is all that
// matters: the lanes go to different JetStream streams.
type Lane struct {
	// Name is the last token of the outbox key and the metrics label.
	Name string
	// Stream is the JetStream stream every entry of the lane must land in
	// (sent as Nats-Expected-Stream, so a misrouted subject is refused).
	Stream string
}

// The lanes.
var (
	LaneClicks = Lane{Name: "clicks", Stream: events.ClicksStream}
	LaneLinks  = Lane{Name: "links", Stream: events.LinksStream}
	LaneJobs   = Lane{Name: "jobs", Stream: events.PreviewJobsStream}
	// Lanes lists every lane, in the order the relay reads them.
	Lanes = []Lane{LaneClicks, LaneLinks, LaneJobs}
)

// Keys that are not per shard.
const (
	// ShardsKey holds the shard count the outbox was created with.
	ShardsKey = "snip:outbox:shards"
	// RelaysKey is the sorted set of live relay instances, scored by the
	// time (Unix ms) their heartbeat expires.
	RelaysKey = "snip:outbox:relays"
)

// Entry field names.
const (
	fieldID      = "id"
	fieldSubject = "subject"
	fieldData    = "data"
	// fieldUntil is a click entry's validity, Unix ms on the writer's
	// clock: see Late.
	fieldUntil = "until"
)

// Layout maps link codes to shards and shards to keys. The zero value is not
// usable; Shards must be at least 1 and never change for a deployment
// (CheckShards enforces it).
type Layout struct {
	Shards int
	tags   []string   // "snip:{sN}:" per shard
	keys   [][]string // outbox key per shard and lane, precomputed for the hot path
	boxed  [][]any    // the same keys boxed once, for commands built without allocating
}

// NewLayout returns the layout for n shards.
func NewLayout(n int) Layout {
	l := Layout{Shards: n, tags: make([]string, n), keys: make([][]string, n), boxed: make([][]any, n)}
	for i := range n {
		l.tags[i] = "snip:{s" + strconv.Itoa(i) + "}:"
		for _, lane := range Lanes {
			l.keys[i] = append(l.keys[i], l.tags[i]+"outbox:"+lane.Name)
			l.boxed[i] = append(l.boxed[i], l.keys[i][len(l.keys[i])-1])
		}
	}
	return l
}

// Shard returns the shard of a link code: FNV-1a 32 modulo the shard count
// (written out, because hash/fnv's interface value costs an allocation on
// the hot path).
func (l Layout) Shard(code string) int {
	h := uint32(2166136261)
	for i := 0; i < len(code); i++ {
		h ^= uint32(code[i])
		h *= 16777619
	}
	return int(h % uint32(l.Shards))
}

// LinkKey is the key of a link's hash.
func (l Layout) LinkKey(code string) string { return l.tags[l.Shard(code)] + "link:" + code }

// OutboxKey is the key of a shard's outbox stream for one lane.
func (l Layout) OutboxKey(shard int, lane Lane) string {
	for i, ln := range Lanes {
		if ln == lane {
			return l.keys[shard][i]
		}
	}
	return l.tags[shard] + "outbox:" + lane.Name
}

func (l Layout) boxedKey(shard int, lane Lane) any {
	for i, ln := range Lanes {
		if ln == lane {
			return l.boxed[shard][i]
		}
	}
	return l.OutboxKey(shard, lane)
}

// LeaseKey is the key of a shard's relay lease.
func (l Layout) LeaseKey(shard int) string { return l.tags[shard] + "outbox:lease" }

// DeadKey is the stream where the relay parks entries that JetStream refused
// for good and that DEAD_LETTER refused too.
func (l Layout) DeadKey(shard int) string { return l.tags[shard] + "outbox:dead" }

// CheckShards records the shard count on first start and refuses a
// different one later.
func CheckShards(ctx context.Context, rdb redis.UniversalClient, l Layout) error {
	if _, err := rdb.SetNX(ctx, ShardsKey, l.Shards, 0).Result(); err != nil {
		return fmt.Errorf("check outbox shards: %w", err)
	}
	have, err := rdb.Get(ctx, ShardsKey).Int()
	if err != nil {
		return fmt.Errorf("check outbox shards: %w", err)
	}
	if have != l.Shards {
		return fmt.Errorf("check outbox shards: redis has %d, configured %d: %w", have, l.Shards, ErrShardsChanged)
	}
	return nil
}

// Add queues an XADD of one entry on p, a pipeline or a MULTI. It is how
// every writer puts an event into the outbox.
func Add(ctx context.Context, p redis.Cmdable, key, id, subject string, data []byte) *redis.StringCmd {
	return p.XAdd(ctx, &redis.XAddArgs{Stream: key, ID: "*", Values: []any{fieldID, id, fieldSubject, subject, fieldData, data}})
}

// Entry is an outbox entry as the relay reads it.
type Entry struct {
	StreamID string // Redis stream entry ID (ms-seq)
	ID       string // event ID
	Subject  string
	Data     string
	Until    int64 // validity, Unix ms; 0: none
}

// Late reports whether an entry stored at storedMS (the millisecond part of
// the stream ID Redis assigned, on Redis's clock) missed its validity until
// (Unix ms on the writer's clock; 0: no validity). The relay deletes a late
// entry without publishing it, and the redirect counts a click as written
// to the outbox only when its entry is not late, so both apply this one
// rule to the same two numbers: a click the redirect answered 302 for on
// the strength of the outbox is never dropped, whatever the clocks say, and
// a write that reached Redis after the redirect stopped waiting for it is
// never published from the outbox (decisions/0014).
func Late(storedMS, until int64) bool { return until > 0 && storedMS > until }

// late reports whether the entry is Late.
func (e Entry) late() bool { return Late(streamIDMillis(e.StreamID), e.Until) }

// streamIDMillis is the millisecond part of a stream ID ("ms-seq"); 0 when
// malformed.
func streamIDMillis(id string) int64 {
	var ms int64
	for i := 0; i < len(id) && id[i] != '-'; i++ {
		if id[i] < '0' || id[i] > '9' {
			return 0
		}
		ms = ms*10 + int64(id[i]-'0')
	}
	return ms
}

var errMalformedEntry = errors.New("outbox entry lacks id, subject or data")

func parseEntry(m redis.XMessage) (Entry, error) {
	id, _ := m.Values[fieldID].(string)
	subj, _ := m.Values[fieldSubject].(string)
	data, _ := m.Values[fieldData].(string)
	e := Entry{StreamID: m.ID, ID: id, Subject: subj, Data: data}
	if id == "" || subj == "" || data == "" {
		return e, errMalformedEntry
	}
	if u, ok := m.Values[fieldUntil].(string); ok {
		n, err := strconv.ParseInt(u, 10, 64)
		if err != nil || n <= 0 {
			return e, errMalformedEntry
		}
		e.Until = n
	}
	return e, nil
}
