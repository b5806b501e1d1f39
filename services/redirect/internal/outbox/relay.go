package outbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	mrand "math/rand/v2"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/deadletter"
	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/failure"
)

// RelayConfig tunes the relay.
type RelayConfig struct {
	// Instance names this relay in the relays set and in lease tokens.
	Instance string
	// Window is the most entries of one lane published before waiting for
	// their acks (the bounded PublishAsync window).
	Window int
	// LeaseTTL bounds takeover: a dead instance's shards are all taken over
	// within LeaseTTL of its death. Leases (and an instance's heartbeat,
	// which makes it count toward the others' fair share) live
	// LeaseTTL - LeaseTTL/10 without renewal, and instances renew them, and
	// look for free shards, every LeaseTTL/10.
	LeaseTTL time.Duration
	// Block is the longest a relay waits in XREAD for new entries.
	Block time.Duration
	// MaxBackoff caps the wait before retrying a lane after an error.
	MaxBackoff time.Duration
	// Linger is how long a shard waits after a batch smaller than Window
	// before reading again, so entries accumulate into fewer, larger
	// batches (Kafka's linger.ms): it adds at most Linger to the time a
	// click takes to reach JetStream, and nothing to a redirect.
	Linger time.Duration
	// Reconnects, if set, reports how often the relay's NATS connection has
	// reconnected (nats.Conn.Stats().Reconnects). A batch sends nothing more
	// once it changed: what the batch wrote on the old connection may be
	// lost, and a later entry stored on the new one would then be stored
	// before the lost one's retry. The connection must buffer nothing while
	// it reconnects (nats.ReconnectBufSize(-1)), so a publish between the
	// break and the reconnect fails at once instead of being stored at the
	// reconnect, after the entries lost before it.
	Reconnects func() uint64
	// Records is where the relay records a batch JetStream acknowledged
	// whose trim Redis did not answer, for an instance that takes the
	// shard over before this one trims it (decision 0177); each lane's
	// record is read when the shard is taken, before the lane. nil: no
	// records (tests of other things, benchmarks); the service always
	// sets it.
	Records *Records
}

// JetStream is what the relay needs of a JetStream context.
type JetStream interface {
	PublishMsgAsync(msg *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error)
	PublishMsg(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error)
}

// Relay publishes the outbox to JetStream. Every instance runs one; the
// shards are shared out among the live instances by leases (SET NX PX with a
// random token, renewed by compare-and-expire, released by
// compare-and-delete), so each shard is relayed by one instance at a time and
// a dead instance's shards are taken over once its leases expire.
//
// Per lane, the relay reads the head of the outbox (XREAD from the last
// entry it deleted, or from the start once a read found nothing), publishes up to Window entries with PublishMsgAsync
// (Nats-Msg-Id = event ID, Nats-Expected-Stream = the lane's stream), waits
// for the acks in order, and deletes the acknowledged prefix (an exact XTRIM MINID)
// fenced by the lease token (a Lua script deletes only while the token is
// still ours). It publishes only before the lease's local deadline
// (heldShard.until), so a relay paused past its lease publishes nothing
// more when it wakes. On a transient error it keeps the failed entry and everything
// after it and retries from there after a backoff; entries after it that
// were stored already are dropped by the stream's duplicate window. An entry
// JetStream refuses for good (too large, wrong stream), and a click that
// fails the rule of validity every reader applies (events.ReadClick: subject
// and payload disagree, implausible time, unknown version), is parked on
// DEAD_LETTER as dead.outbox.<reason> and deleted, so it cannot block its
// shard and no reader ever sees it.
type Relay struct {
	rdb    redis.UniversalClient
	js     JetStream
	ready  func() bool
	layout Layout
	cfg    RelayConfig
	log    *slog.Logger
	m      *Metrics

	// epoch is the origin of the monotonic clock of lease deadlines (since).
	epoch time.Time

	// untrimmed holds, per shard and lane (Lanes' order), the batch
	// JetStream acknowledged whose trim Redis did not answer, or found the
	// lease lost: the shard's loop trims it before it reads the lane
	// again, also when this relay takes the shard again after a Redis
	// outage let its lease lapse (whether balance or the retried trim
	// found the lease lost), unless its record in NATS carries it
	// (forgetRecorded).
	// Reading the lane instead would publish the batch anew, and after an
	// outage longer than the stream's duplicate window (2 minutes)
	// JetStream would store every click of it twice. (Another instance
	// that takes the shard knows nothing of it, and does.) Only the
	// goroutine relaying the shard touches its row: balance starts one
	// only after the last has ended. For that other instance the relay
	// also writes a record of the batch to NATS (RelayConfig.Records),
	// which the instance reads when it takes the shard, and which
	// becomes its untrimmed batch of the lane.
	untrimmed [][]*acked
	// seen holds, per shard and lane, the revision of the lane's record
	// as this relay last saw it (read, written or deleted; 0: none): a
	// record is written only over that (recordUntrimmed). Touched, like
	// untrimmed, only by the goroutine relaying the shard.
	seen [][]uint64
	// noBucketLogged: the records' bucket was found missing, and said so
	// (once: readRecords).
	noBucketLogged atomic.Bool

	// afterAcks, if set (tests), runs after a batch's acks and before its
	// fenced delete; returning an error abandons the batch as a crash would.
	afterAcks func(shard int, lane Lane, ids []string) error
	// beforeBatch, if set (tests), runs when a batch has been read, before
	// anything of it is published.
	beforeBatch func(shard int, lane Lane)
}

// NewRelay returns a relay. ready reports whether NATS is connected and the
// topology applied; the relay does not publish before (the client would
// only buffer, and a publish to a stream that is being created could fail
// while the next one succeeds, which would break order).
func NewRelay(rdb redis.UniversalClient, js JetStream, ready func() bool, layout Layout, cfg RelayConfig, log *slog.Logger, m *Metrics) *Relay {
	if cfg.Window < 1 {
		cfg.Window = 1
	}
	if cfg.Block < time.Millisecond {
		cfg.Block = time.Second
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 5 * time.Second
	}
	untrimmed := make([][]*acked, layout.Shards)
	seen := make([][]uint64, layout.Shards)
	for s := range untrimmed {
		untrimmed[s] = make([]*acked, len(Lanes))
		seen[s] = make([]uint64, len(Lanes))
	}
	return &Relay{rdb: rdb, js: js, ready: ready, layout: layout, cfg: cfg, log: log, m: m, epoch: time.Now(), untrimmed: untrimmed, seen: seen}
}

// since is the time since r.epoch on the monotonic clock, which a wall
// clock step does not move.
func (r *Relay) since() time.Duration { return time.Since(r.epoch) }

// renewScript extends a lease if the caller still holds it.
var renewScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0`)

// releaseScript deletes a lease if the caller still holds it.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0`)

// fencedTrimScript deletes the head of an outbox lane, the entries a batch
// relayed, only while the caller holds the shard's lease: KEYS[1] lease,
// KEYS[2] outbox, ARGV[1] token, ARGV[2] the first ID to keep (the one right
// after the batch's last), ARGV[3] the event ID of the batch's first entry,
// ARGV[4] the batch's last ID, ARGV[5] its event ID, ARGV[6] the entry
// field holding the event ID (fieldID). It returns {-1} when
// the lease is not the caller's, {n, 0} after trimming n entries, and
// {0, 1} when it deleted nothing because the lane is not as the batch read
// it.
//
// What a batch deletes is normally the lane's head: the relay reads the
// lane in ID order from its first entry (or from the last one it deleted),
// and deletes the prefix of what it read that was acknowledged, parked or
// late, up to the first entry it must retry; and XADD only ever appends,
// with an ID above every ID the lane has held. An exact XTRIM MINID drops
// that head by whole listpack nodes, where an XDEL of the same IDs looked
// each one up and marked it deleted: about 1 µs of Redis CPU an entry less
// (docs/benchmarks.md, "Redirect").
//
// But a Redis failover (or a restart from older data) can lose the tail of
// what the relay read, and the new master then appends at IDs below the
// batch's last (its clock behind: the very IDs of the lost entries, the
// sequence counting on from its last one). So the script trims only while
// the lane's first entry is the batch's first and the entry at the batch's
// last ID is the batch's last, both by event ID: a master that holds the
// batch's last entry holds everything written before it, and gives every
// later entry a higher ID, so the head up to it is the batch. Otherwise the
// relay reads the lane again from its head and sends what it finds (the
// stream's duplicate window drops what was stored already).
var fencedTrimScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {-1}
end
local function eventID(r)
  local e = r[1]
  if not e then return nil end
  local f = e[2]
  for i = 1, #f, 2 do
    if f[i] == ARGV[6] then return f[i+1] end
  end
  return ''
end
if eventID(redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', 1)) ~= ARGV[3]
  or eventID(redis.call('XRANGE', KEYS[2], ARGV[4], ARGV[4])) ~= ARGV[5] then
  return {0, 1}
end
return {redis.call('XTRIM', KEYS[2], 'MINID', '=', ARGV[2]), 0}`)

var errLeaseLost = errors.New("shard lease lost")

// errLeaseLapsed stops a batch once the shard's lease may have expired in
// Redis: its last renewal (or its acquisition) began more than the lease's
// life ago (heldShard.until). Another instance may hold the shard by now.
var errLeaseLapsed = errors.New("shard lease not renewed within its life")

// errReconnected stops a batch whose NATS connection reconnected while it
// was being sent (RelayConfig.Reconnects).
var errReconnected = errors.New("nats connection reconnected during the batch")

// errLaneRewritten reports a batch left undeleted because its lane was no
// longer as the batch read it (fencedTrimScript: a failover): the lane is
// read again from its head, where entries added below the batch may lie.
var errLaneRewritten = errors.New("outbox lane changed below the relayed batch (a failover?)")

// errInvalidClick marks a click entry that fails events.ReadClick: the relay
// parks it on dead.outbox.<reason> (the reason every reader would park it
// under) instead of publishing it.
var errInvalidClick = errors.New("invalid click")

type heldShard struct {
	token  string
	cancel context.CancelFunc
	done   chan struct{}
	// until is when the lease may expire in Redis, as Relay.since counts:
	// the start of its last successful renewal (or of its acquisition) plus
	// the lease's life. Redis set the expiry after that start, so the lease
	// lives at least until then. The shard publishes only before it.
	until atomic.Int64
	// lost: a fenced trim found the lease another's (trim). It stays lost:
	// a renewal Redis answered before, whose deadline balance stores only
	// now, must not make it valid again, for the shard's loop ends and, as
	// it ends, records its batch over a record that may be the new
	// holder's only while the lease is valid (recordUntrimmed).
	lost atomic.Bool
}

// valid reports whether the lease is surely still the shard's.
func (h *heldShard) valid(r *Relay) bool {
	return !h.lost.Load() && int64(r.since()) < h.until.Load()
}

// Run relays until ctx ends, then stops its shards and releases their leases
// so other instances take over at once.
func (r *Relay) Run(ctx context.Context) error {
	held := map[int]*heldShard{}
	defer func() {
		for s, h := range held {
			h.cancel()
			<-h.done
			r.release(s, h.token)
		}
		r.m.LeasesHeld.Set(0)
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = r.rdb.ZRem(cctx, RelaysKey, r.cfg.Instance).Err()
	}()
	tick := time.NewTicker(balanceEvery(r.cfg.LeaseTTL))
	defer tick.Stop()
	for {
		r.balance(ctx, held)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// balanceEvery is how often an instance heartbeats, renews its leases and
// looks for free shards: often enough that a dead instance's shards are
// taken over within a tenth of LeaseTTL of their leases expiring.
func balanceEvery(ttl time.Duration) time.Duration { return max(ttl/10, 10*time.Millisecond) }

// leaseLife is how long a lease, and a heartbeat, lives without renewal:
// LeaseTTL less one balance tick, so that expiry plus the tick it takes a
// survivor to notice stays within LeaseTTL. It is renewed nine times in
// that span.
func leaseLife(ttl time.Duration) time.Duration { return ttl - balanceEvery(ttl) }

// balance renews held leases, drops lost ones, and moves toward this
// instance's fair share of shards: ceil(shards / live instances).
//
// An instance counts as live for leaseLife after its last heartbeat, the
// same time its leases live: when a killed instance's leases expire, it has
// stopped counting toward the survivors' share too, so they take all its
// shards at once (were it counted longer, they would take only their old
// share and leave the rest waiting).
func (r *Relay) balance(ctx context.Context, held map[int]*heldShard) {
	now := time.Now()
	live := 1
	pipe := r.rdb.Pipeline()
	pipe.ZAdd(ctx, RelaysKey, redis.Z{Score: float64(now.Add(leaseLife(r.cfg.LeaseTTL)).UnixMilli()), Member: r.cfg.Instance})
	pipe.ZRemRangeByScore(ctx, RelaysKey, "-inf", strconv.FormatInt(now.UnixMilli(), 10))
	card := pipe.ZCard(ctx, RelaysKey)
	if _, err := pipe.Exec(ctx); err != nil {
		if ctx.Err() == nil {
			r.log.Warn("relay heartbeat", "err", err)
			r.m.PublishErrors.WithLabelValues("", "redis").Inc()
		}
	} else if n := int(card.Val()); n > 0 {
		live = n
	}
	r.m.RelayInstances.Set(float64(live))
	share := int(math.Ceil(float64(r.layout.Shards) / float64(live)))

	// Renew every held lease in one round trip.
	renewals := map[int]*redis.Cmd{}
	renewStart := r.since()
	if len(held) > 0 {
		rp := r.rdb.Pipeline()
		for s, h := range held {
			select {
			case <-h.done:
			default:
				renewals[s] = renewScript.Eval(ctx, rp, []string{r.layout.LeaseKey(s)}, h.token, leaseLife(r.cfg.LeaseTTL).Milliseconds())
			}
		}
		_, _ = rp.Exec(ctx) // errors are read per command below
	}
	for s, h := range held {
		lost := false
		if cmd, ok := renewals[s]; ok {
			n, err := cmd.Int()
			if err != nil {
				// Unknown: keep the shard, the lease may still be ours. It
				// publishes only until the lease's deadline (heldShard.until)
				// unless a renewal succeeds, and the fenced delete protects
				// the outbox.
				continue
			}
			lost = n == 0
			if !lost {
				h.until.Store(int64(renewStart + leaseLife(r.cfg.LeaseTTL)))
			}
		} else {
			lost = true // the shard loop found the lease gone (the fenced delete)
		}
		if lost {
			h.cancel()
			<-h.done
			delete(held, s)
			r.m.LeasesLost.Inc()
			r.log.Warn("relay lease lost", "shard", s)
		}
	}
	for s, h := range held {
		if len(held) <= share {
			break
		}
		h.cancel()
		<-h.done
		r.release(s, h.token)
		delete(held, s)
	}
	if len(held) < share && ctx.Err() == nil {
		start := mrand.IntN(r.layout.Shards)
		for i := 0; i < r.layout.Shards && len(held) < share; i++ {
			s := (start + i) % r.layout.Shards
			if _, ok := held[s]; ok {
				continue
			}
			token := r.cfg.Instance + "/" + randomToken()
			start := r.since()
			ok, err := r.rdb.SetNX(ctx, r.layout.LeaseKey(s), token, leaseLife(r.cfg.LeaseTTL)).Result()
			if err != nil || !ok {
				continue
			}
			sctx, cancel := context.WithCancel(ctx)
			h := &heldShard{token: token, cancel: cancel, done: make(chan struct{})}
			h.until.Store(int64(start + leaseLife(r.cfg.LeaseTTL)))
			held[s] = h
			r.log.Info("relay lease acquired", "shard", s)
			go func() {
				defer close(h.done)
				r.runShard(sctx, s, h)
			}()
		}
	}
	r.m.LeasesHeld.Set(float64(len(held)))
}

func (r *Relay) release(shard int, token string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := releaseScript.Run(ctx, r.rdb, []string{r.layout.LeaseKey(shard)}, token).Err(); err != nil {
		r.log.Warn("relay release lease", "shard", shard, "err", err)
	}
}

func randomToken() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// laneState is one lane's position and backoff within a shard loop.
type laneState struct {
	last    string // stream ID of the last entry deleted; "0-0" reads from the head
	retryAt time.Time
	backoff time.Duration
	// probing: after an error the lane publishes one entry at a time until
	// one succeeds, so a retry never races later entries of its window.
	probing bool
	// recordRead: the lane's record of an untrimmed batch was read since
	// the shard was taken (readRecords); the lane is not read before.
	recordRead bool
}

// runShard relays one shard while ctx lasts and the lease is ours.
func (r *Relay) runShard(ctx context.Context, shard int, lease *heldShard) {
	defer r.forgetRecorded(shard)
	lanes := make([]laneState, len(Lanes))
	for i := range lanes {
		lanes[i].last = "0-0"
	}
	keys := make([]string, len(Lanes))
	for i, l := range Lanes {
		keys[i] = r.layout.OutboxKey(shard, l)
	}
	streams := make([]string, 0, 2*len(Lanes))
	order := make([]int, 0, len(Lanes))
	for ctx.Err() == nil {
		if !r.ready() {
			sleep(ctx, 50*time.Millisecond)
			continue
		}
		if !r.readRecords(ctx, shard, lease, lanes) {
			return
		}
		if !r.trimUntrimmed(ctx, shard, lease, lanes) {
			return
		}
		now := time.Now()
		block := r.cfg.Block
		streams, order = streams[:0], order[:0]
		for i := range lanes {
			if wait := lanes[i].retryAt.Sub(now); wait > 0 {
				block = min(block, wait)
				continue
			}
			if !lanes[i].recordRead {
				continue // not before its record is read (readRecords, next round)
			}
			order = append(order, i)
		}
		if len(order) == 0 {
			sleep(ctx, block)
			continue
		}
		for _, i := range order {
			streams = append(streams, keys[i])
		}
		for _, i := range order {
			streams = append(streams, lanes[i].last)
		}
		count := int64(r.cfg.Window)
		for _, i := range order {
			if lanes[i].probing {
				count = 1 // XREAD's COUNT is per stream; one probing lane slows the shard's read, not its order
			}
		}
		res, err := r.rdb.XRead(ctx, &redis.XReadArgs{Streams: streams, Count: count, Block: max(block, time.Millisecond)}).Result()
		if errors.Is(err, redis.Nil) {
			// Nothing after any lane's position for a whole Block: read the
			// lanes from their heads next. Normally the same entries (all
			// before a position were deleted), but a Redis failover can
			// bring a master that lacks what the relay read and deleted
			// and, its clock behind, appends below the position, where no
			// read from it would look.
			for _, i := range order {
				lanes[i].last = "0-0"
			}
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			r.m.PublishErrors.WithLabelValues("", "redis").Inc()
			r.log.Warn("relay read outbox", "shard", shard, "err", err)
			sleep(ctx, time.Second)
			continue
		}
		short := true
		for _, st := range res {
			if len(st.Messages) >= int(count) {
				short = false
			}
			li := -1
			for i, k := range keys {
				if k == st.Stream {
					li = i
				}
			}
			if li < 0 || len(st.Messages) == 0 {
				continue
			}
			ls := &lanes[li]
			n, err := r.relayBatch(ctx, shard, lease, li, st.Messages)
			switch {
			case errors.Is(err, errLeaseLost):
				r.m.PublishErrors.WithLabelValues(Lanes[li].Name, "lease").Inc()
				return
			case errors.Is(err, errLeaseLapsed):
				// Not a publish error: wait for the next renewal, or for
				// balance to find the lease lost and stop the shard.
				r.m.PublishErrors.WithLabelValues(Lanes[li].Name, "lease").Inc()
				if ctx.Err() != nil {
					return
				}
				ls.last = "0-0"
				ls.retryAt = time.Now().Add(balanceEvery(r.cfg.LeaseTTL))
				r.log.Warn("relay batch stopped: lease not renewed in time", "shard", shard, "lane", Lanes[li].Name, "published", n)
			case errors.Is(err, errLaneRewritten):
				ls.last = "0-0" // entries may lie below the batch's last
				ls.backoff = 0
				ls.probing = false
				r.log.Warn("relay batch not deleted: the lane changed below it, read again from its head", "shard", shard, "lane", Lanes[li].Name, "published", n)
			case err != nil:
				if ctx.Err() != nil {
					return
				}
				ls.last = "0-0" // retry from the head: the first entry not deleted
				ls.probing = true
				ls.backoff = min(max(2*ls.backoff, 100*time.Millisecond), r.cfg.MaxBackoff)
				ls.retryAt = time.Now().Add(ls.backoff)
				r.log.Warn("relay batch", "shard", shard, "lane", Lanes[li].Name, "published", n, "retry_in", ls.backoff, "err", err)
			default:
				ls.last = st.Messages[len(st.Messages)-1].ID
				ls.backoff = 0
				ls.probing = false
			}
		}
		if short && r.cfg.Linger > 0 {
			sleep(ctx, r.cfg.Linger)
		}
	}
}

// forgetRecorded drops, once the shard's loop has ended (its lease lost or
// given up, or shutdown), each lane's untrimmed batch that its record in
// NATS names (acked.rev): the record carries it to whoever takes the
// shard, this relay included (readRecords), and is replaced only by one
// that holds the batch or finds it stale (recordUntrimmed). A batch its
// record does not name (NATS refused it, or another's record holds it) is
// kept, as is one with a shorter batch set aside beside it (acked.other,
// which no record names): this relay trims them should it take the shard
// again. So a relay keeps per shard and lane one batch and the shorter ones
// set aside behind it (a chain through acked.other, one link for each
// record of another relay it met: longest, own, shorter at most in the
// cases the tests make), their IDs and counts, never entries, and none
// alone whose record is written.
func (r *Relay) forgetRecorded(shard int) {
	for li, a := range r.untrimmed[shard] {
		if a != nil && a.recorded && a.rev != 0 && a.other == nil {
			r.untrimmed[shard][li] = nil
		}
	}
}

// trimUntrimmed trims each lane's batch whose trim Redis did not answer
// (Relay.untrimmed), once the lane's backoff has passed; a trim that fails
// again backs the lane off, so it is not read meanwhile. A batch found
// stale gives way to the lane's other batch, if the relay held two
// (laterBatch), which is tried at once. It returns false when the shard
// must stop: the lease is lost, or ctx ended.
func (r *Relay) trimUntrimmed(ctx context.Context, shard int, lease *heldShard, lanes []laneState) bool {
	now := time.Now()
	for li := range r.untrimmed[shard] {
		ls := &lanes[li]
		lane := Lanes[li]
		for {
			a := r.untrimmed[shard][li]
			if a == nil || ls.retryAt.After(now) {
				break
			}
			n, err := r.trim(ctx, shard, lease, li, a)
			switch {
			case errors.Is(err, errLeaseLost):
				// The batch is kept: this relay trims it should it take the
				// shard again (its record, if written, stays for another
				// holder). Dropped, a batch whose record NATS refused would be
				// published again by this very relay once it retook the shard.
				// A holder that trims it meanwhile leaves it stale: its trim
				// then deletes nothing.
				r.m.PublishErrors.WithLabelValues(lane.Name, "lease").Inc()
				return false
			case errors.Is(err, errLaneRewritten):
				if a.read {
					// A stale record: its batch was trimmed by the relay that
					// wrote it (which could not delete the record), or the lane
					// is not as it was (a failover).
					r.m.UntrimmedRecords.WithLabelValues(lane.Name, "stale").Inc()
					r.log.Info("relay dropped a record of an untrimmed batch that no longer heads its lane; nothing trimmed", "shard", shard, "lane", lane.Name,
						"recorded_by", a.from, "first_event", a.firstEvent, "last", a.last)
				} else {
					r.log.Warn("relay batch not deleted: the lane changed below it, read again from its head", "shard", shard, "lane", lane.Name)
				}
				if o := a.other; o != nil {
					// A failover that lost the lane's tail can leave the
					// shorter batch whole at its head: it was acknowledged,
					// and reading the lane would publish it again. It takes
					// the lane's record over (recorded only if the record
					// still names it), and is deleted with it once trimmed.
					a.other = nil
					o.recorded = a.rev != 0 && o.rev == a.rev
					o.rev = a.rev
					r.untrimmed[shard][li] = o
					r.log.Info("relay tries the lane's other untrimmed batch, reaching less far", "shard", shard, "lane", lane.Name,
						"first_event", o.firstEvent, "last", o.last)
					continue
				}
				r.untrimmed[shard][li] = nil
				ls.last = "0-0"
				r.dropRecord(ctx, shard, li, a.rev)
			case err != nil:
				if ctx.Err() != nil {
					return false
				}
				ls.backoff = min(max(2*ls.backoff, 100*time.Millisecond), r.cfg.MaxBackoff)
				ls.retryAt = time.Now().Add(ls.backoff)
				r.log.Warn("relay trim of an acknowledged batch", "shard", shard, "lane", lane.Name, "retry_in", ls.backoff, "err", err)
				if !a.recorded {
					r.untrimmed[shard][li] = r.recordUntrimmed(ctx, shard, li, lease, a, err) // its last write failed
				}
			default:
				// The lane goes on from its head, probing still if the batch
				// stopped at a publish error.
				r.untrimmed[shard][li] = nil
				ls.last = "0-0"
				if a.read {
					r.m.UntrimmedRecords.WithLabelValues(lane.Name, "applied").Inc()
					r.log.Info("relay trimmed a batch recorded as acknowledged but not trimmed; it is not published again", "shard", shard, "lane", lane.Name,
						"recorded_by", a.from, "entries", n, "first_event", a.firstEvent, "last", a.last)
				}
				r.dropRecord(ctx, shard, li, a.rev)
			}
		}
	}
	return true
}

// relayBatch publishes msgs in order and deletes the acknowledged prefix. It
// returns how many entries it deleted, and the error that stopped it early.
// It publishes (and parks) only while the lease is surely its own
// (heldShard.valid): a relay paused between its read and its publishes, past
// its lease, would otherwise publish a window per lane after another
// instance took the shard over, which the streams drop as duplicates only
// within their duplicate window. (The delete is fenced in Redis itself.)
func (r *Relay) relayBatch(ctx context.Context, shard int, lease *heldShard, li int, msgs []redis.XMessage) (int, error) {
	lane := Lanes[li]
	if r.beforeBatch != nil {
		r.beforeBatch(shard, lane)
	}
	type sent struct {
		e      Entry
		f      jetstream.PubAckFuture
		err    error // synchronous publish error
		parked bool  // malformed: park without publishing
		late   bool  // stored after its validity: delete without publishing (Late)
	}
	batch := make([]sent, 0, len(msgs))
	var click events.Click // the validity check's scratch; nothing of it is kept
	// No retries inside the client: it would resend a refused message
	// after later ones of the window were stored. The relay retries.
	// (Built once a batch: every option is a closure, allocated a call.)
	pubOpts := []jetstream.PublishOpt{jetstream.WithExpectStream(lane.Stream), jetstream.WithRetryAttempts(0)}
	var conn uint64 // the connection the batch is sent on (Reconnects)
	if r.cfg.Reconnects != nil {
		conn = r.cfg.Reconnects()
	}
	for _, m := range msgs {
		e, err := parseEntry(m)
		if err != nil {
			batch = append(batch, sent{e: e, err: err, parked: true})
			continue
		}
		if e.late() {
			batch = append(batch, sent{e: e, late: true})
			continue
		}
		data := []byte(e.Data) // the message's own copy, never written again
		if lane.Stream == events.ClicksStream {
			// The rule of validity every reader applies: a click they
			// would all park is parked here instead, never published.
			if err := events.ReadClickShared(&click, data, e.Subject, 0, time.Now()); err != nil {
				batch = append(batch, sent{e: e, err: fmt.Errorf("%w: %w", errInvalidClick, err), parked: true})
				continue
			}
		}
		if !lease.valid(r) {
			batch = append(batch, sent{e: e, err: errLeaseLapsed})
			break
		}
		if r.cfg.Reconnects != nil && r.cfg.Reconnects() != conn {
			// What went out before may be lost with the old connection:
			// nothing after it goes out before it is retried.
			batch = append(batch, sent{e: e, err: errReconnected})
			break
		}
		msg := &nats.Msg{Subject: e.Subject, Data: data, Header: nats.Header{events.HeaderMsgID: []string{e.ID}}}
		f, err := r.js.PublishMsgAsync(msg, pubOpts...)
		batch = append(batch, sent{e: e, f: f, err: err})
		if err != nil && !permanent(err) {
			break // nothing after a transient failure is worth sending now
		}
	}
	// ids are the stream IDs of the batch's first len(ids) entries: each
	// entry is added to them or stops them.
	ids := make([]string, 0, len(batch))
	published, late := 0, 0 // of ids; the rest were parked
	var parked []string     // the reasons of those parked, counted once deleted
	var stop error
	for _, b := range batch {
		err := b.err
		if err == nil && b.f != nil {
			select {
			case <-b.f.Ok():
			case err = <-b.f.Err():
			case <-ctx.Done():
				err = ctx.Err()
			}
		}
		if stop != nil {
			continue // drain the remaining futures; they are retried anyway
		}
		switch {
		case err == nil:
			ids = append(ids, b.e.StreamID)
			if b.late {
				late++
			} else {
				published++
			}
		case errors.Is(err, errLeaseLapsed):
			stop = err
		case b.parked || permanent(err):
			if !lease.valid(r) {
				stop = errLeaseLapsed
				continue
			}
			why, perr := r.park(ctx, shard, lane, b.e, err)
			if perr != nil {
				stop = perr
				continue
			}
			parked = append(parked, why)
			ids = append(ids, b.e.StreamID)
		default:
			r.m.PublishErrors.WithLabelValues(lane.Name, "publish").Inc()
			stop = fmt.Errorf("publish %s to %s: %w", b.e.ID, b.e.Subject, err)
		}
	}
	if len(ids) == 0 {
		return 0, stop
	}
	if r.afterAcks != nil {
		if err := r.afterAcks(shard, lane, ids); err != nil {
			return 0, err
		}
	}
	keep, err := nextStreamID(ids[len(ids)-1])
	if err != nil {
		return 0, fmt.Errorf("delete relayed entries: %w", err)
	}
	a := &acked{
		n: len(ids), keep: keep, firstEvent: batch[0].e.ID, last: ids[len(ids)-1], lastEvent: batch[len(ids)-1].e.ID,
		published: published, late: late, parked: parked,
	}
	n, err := r.trim(ctx, shard, lease, li, a)
	if err != nil {
		if !errors.Is(err, errLaneRewritten) {
			// Redis did not answer, or the lease is another's (it lapsed
			// in a stall, or a failover lost it): the batch is kept, and
			// trimmed before the lane is read again, by this relay should
			// it hold the shard again, rather than published anew; and it
			// is recorded in NATS for an instance that takes the shard
			// first. That instance may publish only after the duplicate
			// window (a holder stalled itself, or one that takes the shard
			// after a long outage): without the record it would publish the
			// batch again, stored twice. (Should the lane's record name a
			// batch from the same head reaching further, that batch is kept
			// in its place, this one beside it: recordUntrimmed.)
			r.untrimmed[shard][li] = r.recordUntrimmed(ctx, shard, li, lease, a, err)
		}
		return 0, err
	}
	return n, stop
}

// acked is the head of a lane a batch relayed (JetStream acknowledged it,
// or it was parked or late), to be deleted by the fenced trim.
type acked struct {
	n          int    // entries
	keep       string // the first stream ID to keep: the one after last
	firstEvent string // the event ID of the batch's first entry
	last       string // the stream ID of its last entry
	lastEvent  string // and its event ID
	// counted once deleted
	published, late int
	parked          []string
	// rev is the revision of the lane's record in RelayConfig.Records
	// (0: none written or read), deleted once the batch is trimmed.
	rev uint64
	// recorded: the record at rev names this batch (written or read), or
	// another relay's record is there that this one must not overwrite
	// (rev 0: superseded, recordUntrimmed); otherwise it is written again
	// with each failed trim.
	recorded bool
	// read: the batch came from a record (readRecords), written by the
	// relay from.
	read bool
	from string
	// other is the lane's other untrimmed batch, reaching less far, that
	// laterBatch or recordUntrimmed set aside for this one (a record
	// adopted): tried should this one be stale.
	other *acked
}

// trim deletes a's entries with the fenced trim and counts them. It
// returns errLeaseLost (nothing deleted: the lease is another's),
// errLaneRewritten (nothing deleted: the lane is not as the batch read it),
// or Redis's error (a may or may not be deleted; trimming it again is safe,
// since the script checks the lane's head by event ID).
func (r *Relay) trim(ctx context.Context, shard int, lease *heldShard, li int, a *acked) (int, error) {
	lane := Lanes[li]
	// A fresh context: entries JetStream acknowledged are deleted even when
	// shutdown has begun, so the next holder does not publish them again.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	res, err := fencedTrimScript.Run(dctx, r.rdb, []string{r.layout.LeaseKey(shard), r.layout.OutboxKey(shard, lane)},
		lease.token, a.keep, a.firstEvent, a.last, a.lastEvent, fieldID).Int64Slice()
	if err == nil && len(res) == 0 {
		err = errors.New("empty reply")
	}
	if err != nil {
		r.m.PublishErrors.WithLabelValues(lane.Name, "redis").Inc()
		return 0, fmt.Errorf("delete relayed entries: %w", err)
	}
	if res[0] < 0 {
		lease.lost.Store(true) // surely not its own: it publishes nothing more, and overwrites no record as the holder (recordUntrimmed)
		return 0, errLeaseLost
	}
	if len(res) > 1 && res[1] == 1 {
		// Nothing deleted: the entries are sent again from the lane's
		// head, and counted when they are deleted.
		return 0, errLaneRewritten
	}
	// Counted once deleted: a batch that fails before its delete parks (and
	// publishes) its entries again when the lane is retried.
	r.m.Published.WithLabelValues(lane.Name).Add(float64(a.published))
	r.m.Late.WithLabelValues(lane.Name).Add(float64(a.late))
	for _, why := range a.parked {
		r.m.Parked.WithLabelValues(lane.Name, why).Inc()
	}
	return a.n, nil
}

// nextStreamID returns the Redis stream ID right after id ("ms-seq"): the
// first ID an exact XTRIM MINID keeps when id is the last entry deleted.
func nextStreamID(id string) (string, error) {
	sid, ok := parseStreamID(id)
	if !ok {
		return "", fmt.Errorf("stream entry ID %q: not ms-seq", id)
	}
	if sid.seq == math.MaxUint64 {
		return streamID{sid.ms + 1, 0}.String(), nil
	}
	return streamID{sid.ms, sid.seq + 1}.String(), nil
}

// classify is the relay's side of the failure contract (package failure):
// a publish error JetStream will repeat however often the entry is sent is
// permanent, and the entry is parked under its reason, or it would block the
// shard forever; any other error is retryable: the shard backs off and sends
// the entry again.
func classify(err error) failure.Decision {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, errInvalidClick):
		return failure.Classify(failure.Permanent(events.Reason(err), err))
	case errors.Is(err, errMalformedEntry):
		return failure.Classify(failure.Permanent("malformed", err))
	case errors.Is(err, nats.ErrMaxPayload):
		return failure.Classify(failure.Permanent("too_large", err))
	case errors.Is(err, nats.ErrBadSubject):
		return failure.Classify(failure.Permanent("rejected", err))
	case errors.As(err, &apiErr):
		switch apiErr.ErrorCode {
		case jetstream.JSErrCodeStreamMessageExceedsMaximum:
			return failure.Classify(failure.Permanent("too_large", err))
		case 10060: // expected stream does not match
			return failure.Classify(failure.Permanent("wrong_stream", err))
		case jetstream.JSErrCodeBadRequest:
			return failure.Classify(failure.Permanent("rejected", err))
		}
	}
	return failure.Classify(failure.Retryable(failure.ReasonUnclassified, err))
}

// permanent reports whether JetStream will refuse the message however often
// it is sent.
func permanent(err error) bool { return classify(err).Kind == failure.Park }

// park puts an entry JetStream refused for good on DEAD_LETTER (through
// package deadletter, like every other dead letter: dead.outbox.<reason>,
// the Snip-Dead-* headers, and the outbox entry's ID in place of a stream
// sequence, so a retried park is stored once and snipctl dlq redrive can send
// it on), or, if DEAD_LETTER refuses it too, into the shard's Redis dead
// stream. It returns the reason it was parked under (relayBatch counts it
// once the entry is deleted). An error means neither worked now
// (transient); the entry stays in the outbox.
func (r *Relay) park(ctx context.Context, shard int, lane Lane, e Entry, cause error) (string, error) {
	why := classify(cause).Reason
	r.m.PublishErrors.WithLabelValues(lane.Name, "permanent").Inc()
	r.log.Error("relay parks an entry JetStream refused", "shard", shard, "lane", lane.Name, "id", e.ID, "subject", e.Subject, "reason", why, "err", cause)
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := deadletter.Publish(pctx, r.js, deadletter.Parcel{
		Source:   deadletter.OutboxSource,
		Reason:   why,
		Stream:   lane.Stream,
		Subject:  e.Subject,
		Position: e.StreamID,
		Attempts: 1,
		Error:    cause.Error(),
		Consumer: deadletter.OutboxSource,
		Data:     []byte(e.Data),
	})
	if err == nil {
		return why, nil
	}
	if !permanent(err) && !errors.Is(err, deadletter.ErrInvalid) {
		return "", fmt.Errorf("park %s on %s: %w", e.ID, events.DeadLetterStream, err)
	}
	if err := r.rdb.XAdd(ctx, &redis.XAddArgs{Stream: r.layout.DeadKey(shard), ID: "*", Values: []any{
		fieldID, e.ID, fieldSubject, e.Subject, fieldData, e.Data, "lane", lane.Name, "reason", why, "error", truncate(cause.Error(), 512),
	}}).Err(); err != nil {
		return "", fmt.Errorf("park %s in redis: %w", e.ID, err)
	}
	return why, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
