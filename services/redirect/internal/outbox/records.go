package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/topology"
)

// Records keeps, in the JetStream KV bucket topology.OutboxUntrimmedBucket,
// the batch of each shard and lane that JetStream acknowledged and whose
// fenced trim Redis did not answer (decision 0177). The relay that holds the
// batch trims it once Redis is back (Relay.untrimmed); the record is for an
// instance that takes the shard over first, which would otherwise know
// nothing of the batch and publish it again from the lane's head: stored
// twice once the streams' duplicate window (2 minutes) has passed. The
// relay writes a record only when a trim fails, and reads a lane's record
// once, when it takes the shard, before it reads the lane: nothing of it is
// on the path of a batch whose trim succeeds.
type Records struct {
	b *topology.Bucket
}

// KeyValues is what Records needs of a JetStream context
// (jetstream.JetStream has it).
type KeyValues = topology.KeyValues

// NewRecords returns the records in js's bucket, looked up when first used
// (NATS may be away when the service starts).
func NewRecords(js KeyValues) *Records {
	return &Records{b: topology.NewBucket(js, topology.OutboxUntrimmedBucket)}
}

// recordTimeout bounds each read, write and delete of a record.
const recordTimeout = 2 * time.Second

// errNoBucket is the bucket missing: the topology was not applied since it
// was added (snipctl topology apply). No record can be there to read, and
// none can be written.
var errNoBucket = errors.New("bucket " + topology.OutboxUntrimmedBucket + " does not exist: apply the topology (snipctl topology apply)")

// bucket is the bucket, looked up until it is found once (again after a
// failed read, write or delete: the bucket may have been deleted, and
// created again or not).
func (rs *Records) bucket(ctx context.Context) (jetstream.KeyValue, error) {
	kv, err := rs.b.Get(ctx)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, errNoBucket
	}
	return kv, err
}

// recordKey is the key of a shard's lane: <shard>.<lane>.
func recordKey(shard int, lane Lane) string { return strconv.Itoa(shard) + "." + lane.Name }

// record is a batch as the bucket keeps it: what the fenced trim takes
// (fencedTrimScript), and what the relay counts once it is trimmed.
type record struct {
	V          int            `json:"v"`
	Instance   string         `json:"instance"`    // the relay that wrote it
	Written    time.Time      `json:"written"`     // when (its clock)
	Entries    int            `json:"entries"`     // entries in the batch
	Keep       string         `json:"keep"`        // the first stream ID to keep
	FirstEvent string         `json:"first_event"` // the event ID of the batch's first entry
	Last       string         `json:"last"`        // the stream ID of its last entry
	LastEvent  string         `json:"last_event"`  // and its event ID
	Published  int            `json:"published"`
	Late       int            `json:"late"`
	Parked     map[string]int `json:"parked,omitempty"` // by reason
}

const recordVersion = 1

func newRecord(instance string, a *acked) record {
	rec := record{
		V: recordVersion, Instance: instance, Written: time.Now().UTC(),
		Entries: a.n, Keep: a.keep, FirstEvent: a.firstEvent, Last: a.last, LastEvent: a.lastEvent,
		Published: a.published, Late: a.late,
	}
	for _, why := range a.parked {
		if rec.Parked == nil {
			rec.Parked = map[string]int{}
		}
		rec.Parked[why]++
	}
	return rec
}

// acked is the batch the record describes, to be trimmed by the relay that
// read it; rev is the record's revision, so that trimming it deletes this
// record and never a newer one.
func (rec record) acked(rev uint64) (*acked, error) {
	if rec.V != recordVersion {
		return nil, fmt.Errorf("version %d, want %d", rec.V, recordVersion)
	}
	if rec.Entries < 1 || rec.FirstEvent == "" || rec.LastEvent == "" {
		return nil, errors.New("no entries, or no event IDs")
	}
	if keep, err := nextStreamID(rec.Last); err != nil || keep != rec.Keep {
		return nil, fmt.Errorf("last %q and keep %q do not follow each other", rec.Last, rec.Keep)
	}
	a := &acked{
		n: rec.Entries, keep: rec.Keep, firstEvent: rec.FirstEvent, last: rec.Last, lastEvent: rec.LastEvent,
		published: rec.Published, late: rec.Late, rev: rev, recorded: true, read: true, from: rec.Instance,
	}
	for why, n := range rec.Parked {
		for range n {
			a.parked = append(a.parked, why)
		}
	}
	return a, nil
}

// put records a's batch for shard's lane and returns the record's
// revision, only if the key is as the relay last saw it: no record (seen
// 0: a create, which also takes the place of a deleted record) or the
// record at revision seen. Otherwise it writes nothing and returns
// errNewerRecord: a record was written, or deleted, since.
func (rs *Records) put(ctx context.Context, shard int, lane Lane, instance string, a *acked, seen uint64) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, recordTimeout)
	defer cancel()
	kv, err := rs.bucket(ctx)
	if err != nil {
		return 0, err
	}
	b, err := json.Marshal(newRecord(instance, a))
	if err != nil {
		return 0, err
	}
	var rev uint64
	if seen == 0 {
		rev, err = kv.Create(ctx, recordKey(shard, lane), b)
	} else {
		rev, err = kv.Update(ctx, recordKey(shard, lane), b, seen)
	}
	if revisionConflict(err) {
		return 0, errNewerRecord
	}
	if err != nil {
		rs.b.Forget()
	}
	return rev, err
}

// revisionConflict reports whether err is JetStream refusing a write or
// delete because the key's last revision is not the one expected.
func revisionConflict(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) &&
		(apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// errMalformedRecord is a record the relay cannot apply.
var errMalformedRecord = errors.New("malformed record")

// get reads the record of shard's lane: nil when there is none,
// errNoBucket when there is no bucket (none can have been written: the
// relay reads it as no record, and says once that records are off),
// errMalformedRecord (with the record's revision, to delete it) when it
// cannot be applied.
func (rs *Records) get(ctx context.Context, shard int, lane Lane) (*acked, uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, recordTimeout)
	defer cancel()
	kv, err := rs.bucket(ctx)
	if err != nil {
		return nil, 0, err
	}
	e, err := kv.Get(ctx, recordKey(shard, lane))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		rs.b.Forget()
		return nil, 0, err
	}
	var rec record
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return nil, e.Revision(), fmt.Errorf("%w: %w", errMalformedRecord, err)
	}
	a, err := rec.acked(e.Revision())
	if err != nil {
		return nil, e.Revision(), fmt.Errorf("%w: %w", errMalformedRecord, err)
	}
	return a, e.Revision(), nil
}

// errNewerRecord is a write or delete refused because the key is not as
// the relay last saw it (a record written, or deleted, since): it is kept.
var errNewerRecord = errors.New("a newer record is there")

// del deletes the record of shard's lane at revision rev: a newer one, a
// batch recorded since, is kept (errNewerRecord).
func (rs *Records) del(ctx context.Context, shard int, lane Lane, rev uint64) error {
	ctx, cancel := context.WithTimeout(ctx, recordTimeout)
	defer cancel()
	kv, err := rs.bucket(ctx)
	if err != nil {
		return err
	}
	err = kv.Delete(ctx, recordKey(shard, lane), jetstream.LastRevision(rev))
	if revisionConflict(err) {
		return errNewerRecord
	}
	if err != nil {
		rs.b.Forget()
	}
	return err
}

// recordUntrimmed records a, the batch of shard's lane JetStream
// acknowledged and Redis did not trim (cause), for an instance that takes
// the shard before this relay trims it, and returns the lane's untrimmed
// batch from now on: a, or the batch of a record it adopts. NATS has just
// acknowledged the batch, so it most likely takes the write too; when it
// does not, the failure is counted and logged, and the write is tried
// again with the trim (trimUntrimmed).
//
// The write is conditional on the key being as this relay last saw it
// (Relay.seen): a relay whose lease lapsed while Redis did not answer, and
// whose write is retried only now, must not overwrite the record of an
// instance that took the shard meanwhile, whose batch reaches as far or
// further. When the key changed, the record there is read: one naming this
// batch is this relay's own write whose reply was lost. None (deleted
// since), or one reaching less far into the lane than this batch, is
// overwritten: a record's trim deletes only what its batch relayed
// (fencedTrimScript), so this batch's record loses nothing, and the one
// there is stale or holds nothing this batch does not (two batches at the
// lane's head start with the same entry). So is one starting elsewhere while
// the lease is surely still this relay's (no other instance can hold the
// shard: the record is stale). One from the same head reaching as far or
// further, whose trim deletes this batch with its own, is adopted, as
// laterBatch adopts one it reads: it becomes the batch this relay trims,
// with a set beside it (acked.other) should it be stale. Trimming a alone
// would leave that record stale with the rest of its batch, which
// JetStream acknowledged, at the lane's head: published again past the
// duplicate window, by this relay or the next. Otherwise (one that may be
// a newer holder's) the batch is left unrecorded (superseded). The relay
// still trims it should it take the shard again; nothing else changes.
func (r *Relay) recordUntrimmed(ctx context.Context, shard, li int, lease *heldShard, a *acked, cause error) *acked {
	if r.cfg.Records == nil {
		return a
	}
	lane := Lanes[li]
	ctx = context.WithoutCancel(ctx) // also at shutdown: the next holder is who needs it
	rev, err := r.cfg.Records.put(ctx, shard, lane, r.cfg.Instance, a, r.seen[shard][li])
	if errors.Is(err, errNewerRecord) {
		cur, curRev, gerr := r.cfg.Records.get(ctx, shard, lane)
		switch {
		case gerr != nil && !errors.Is(gerr, errMalformedRecord):
			err = fmt.Errorf("%w; reading it: %w", err, gerr) // tried again with the trim
		case cur != nil && cur.sameBatch(a):
			rev, err = curRev, nil // an earlier write of this batch whose reply was lost
		case cur == nil || a.reachesFurther(cur) || (cur.firstEvent != a.firstEvent && lease.valid(r)):
			r.seen[shard][li] = curRev
			rev, err = r.cfg.Records.put(ctx, shard, lane, r.cfg.Instance, a, curRev)
		case cur.firstEvent == a.firstEvent:
			// From the same head, reaching as far or further: its trim
			// deletes a's batch with the rest of its own.
			r.seen[shard][li] = curRev
			a.rev, a.recorded = 0, false // no record names it: tried should cur be stale
			cur.other = a
			r.m.UntrimmedRecords.WithLabelValues(lane.Name, "adopted").Inc()
			r.log.Warn("relay adopted the lane's record of a batch from the same head reaching as far as its untrimmed one, or further; it trims that batch, which holds its own",
				"shard", shard, "lane", lane.Name, "entries", a.n, "first_event", a.firstEvent, "last", a.last, "recorded_by", cur.from, "recorded_last", cur.last,
				"revision", curRev, "trim_err", cause)
			return cur
		default:
			a.rev, a.recorded = 0, true // no more writes, and its trim deletes no record: it is another's
			r.m.UntrimmedRecords.WithLabelValues(lane.Name, "superseded").Inc()
			r.log.Warn("relay did not record its untrimmed batch: the lane's record changed since it looked, and may be a new holder's",
				"shard", shard, "lane", lane.Name, "entries", a.n, "first_event", a.firstEvent, "last", a.last, "revision_seen", r.seen[shard][li],
				"revision", curRev, "trim_err", cause)
			return a
		}
	}
	if err != nil {
		r.m.UntrimmedRecords.WithLabelValues(lane.Name, "write_failed").Inc()
		r.log.Error("relay could not record a batch JetStream acknowledged and Redis did not trim: an instance that takes the shard before this one trims it publishes it again",
			"shard", shard, "lane", lane.Name, "entries", a.n, "first_event", a.firstEvent, "last", a.last, "err", err, "trim_err", cause)
		return a
	}
	a.rev, a.recorded = rev, true
	r.seen[shard][li] = rev
	r.m.UntrimmedRecords.WithLabelValues(lane.Name, "written").Inc()
	r.log.Warn("relay recorded a batch JetStream acknowledged and Redis did not trim; it trims it when Redis answers, or the instance that takes the shard does",
		"shard", shard, "lane", lane.Name, "entries", a.n, "first_event", a.firstEvent, "last", a.last, "revision", rev, "trim_err", cause)
	return a
}

// sameBatch reports whether a and b name the same head of a lane.
func (a *acked) sameBatch(b *acked) bool {
	return a.firstEvent == b.firstEvent && a.last == b.last && a.lastEvent == b.lastEvent
}

// reachesFurther reports whether a's last entry lies beyond b's in the
// lane (by stream ID).
func (a *acked) reachesFurther(b *acked) bool {
	al, ok := parseStreamID(a.last)
	if !ok {
		return false
	}
	bl, ok := parseStreamID(b.last)
	return ok && bl.less(al)
}

// readRecords reads each lane's record once after the shard is taken,
// before the lane is read, and makes the batch it names the lane's
// untrimmed batch, which trimUntrimmed trims with the fenced script (a stale
// record, or a lane a failover rewrote, trims nothing) and then deletes at
// the revision read. A lane whose record cannot be read (NATS away) is not
// read either: it is asked again after a backoff, and its entries wait in
// the outbox meanwhile. It returns false when ctx ended.
func (r *Relay) readRecords(ctx context.Context, shard int, lease *heldShard, lanes []laneState) bool {
	now := time.Now()
	for li := range lanes {
		ls := &lanes[li]
		if ls.recordRead || ls.retryAt.After(now) {
			continue
		}
		if r.cfg.Records == nil {
			ls.recordRead = true
			continue
		}
		lane := Lanes[li]
		a, rev, err := r.cfg.Records.get(ctx, shard, lane)
		switch {
		case errors.Is(err, errNoBucket):
			// No record can have been written: none to apply. Said once,
			// so an operator knows a batch whose trim fails is recorded
			// nowhere until the topology is applied.
			ls.recordRead = true
			ls.backoff = 0
			if !r.noBucketLogged.Swap(true) {
				r.log.Error("relay records no untrimmed batch: its bucket is missing; a batch acknowledged whose trim fails is published again by an instance that takes the shard over",
					"err", err)
			}
		case errors.Is(err, errMalformedRecord):
			// Nothing can be trimmed by it: drop it rather than hold the
			// lane for ever.
			ls.recordRead = true
			r.seen[shard][li] = rev
			r.m.UntrimmedRecords.WithLabelValues(lane.Name, "malformed").Inc()
			r.log.Error("relay dropped a record of an untrimmed batch it cannot apply", "shard", shard, "lane", lane.Name, "revision", rev, "err", err)
			r.dropRecord(ctx, shard, li, rev)
		case err != nil:
			if ctx.Err() != nil {
				return false
			}
			r.m.UntrimmedRecords.WithLabelValues(lane.Name, "read_failed").Inc()
			ls.backoff = min(max(2*ls.backoff, 100*time.Millisecond), r.cfg.MaxBackoff)
			ls.retryAt = time.Now().Add(ls.backoff)
			r.log.Warn("relay could not read the lane's record of an untrimmed batch; the lane waits in the outbox until it can", "shard", shard, "lane", lane.Name,
				"retry_in", ls.backoff, "err", err)
		case a == nil:
			ls.recordRead = true
			ls.backoff = 0
			r.seen[shard][li] = 0
			if own := r.untrimmed[shard][li]; own != nil && own.recorded {
				// Its record was deleted by a holder since: written again
				// should its trim fail.
				own.rev, own.recorded = 0, false
			}
			r.noBucketLogged.Store(false) // said again should it go missing
		default:
			ls.recordRead = true
			ls.backoff = 0
			r.seen[shard][li] = rev
			r.noBucketLogged.Store(false)
			r.untrimmed[shard][li] = r.laterBatch(ctx, shard, li, lease, r.untrimmed[shard][li], a)
		}
	}
	return true
}

// laterBatch is the batch to trim of a lane for which this relay holds own,
// its own untrimmed batch from an earlier hold of the shard, and read a
// record rec: own with the record's revision when they are the same batch
// (its trim deletes the record); otherwise, the one reaching further into
// the lane. Two batches both still at the lane's head start with the same
// entry (the other relay began where this one had not trimmed), so
// trimming the longer one leaves nothing of the other. The shorter one is
// kept beside it (acked.other) and trimmed should the longer be stale: a
// failover that lost the lane's tail may have taken the longer one's last
// entry and left the shorter one whole. When the longer is own, the record is
// written anew with own's batch: until own is trimmed, the bucket must name
// the batch this relay trims, or an instance that takes the shard after
// another failed trim would trim only the shorter batch and publish the
// rest of own's again. Should NATS refuse the write, own keeps the record's
// revision (its trim deletes the shorter record, which then trims
// nothing) and the write is tried again with the trim; should a record
// from the same head reaching further than own have landed since, that one
// is adopted in turn (recordUntrimmed).
func (r *Relay) laterBatch(ctx context.Context, shard, li int, lease *heldShard, own, rec *acked) *acked {
	if own == nil {
		return rec
	}
	lane := Lanes[li]
	if own.sameBatch(rec) {
		own.rev, own.recorded = rec.rev, true
		return own
	}
	keep := rec
	if own.reachesFurther(rec) {
		keep = own
	}
	r.log.Warn("relay holds an untrimmed batch of the lane and found another's record; it trims the one reaching further", "shard", shard, "lane", lane.Name,
		"own_last", own.last, "recorded_last", rec.last, "recorded_by", rec.from, "trimming_last", keep.last)
	if keep == rec {
		rec.other = own
		return rec
	}
	own.other = rec
	own.rev, own.recorded = rec.rev, false
	return r.recordUntrimmed(ctx, shard, li, lease, own, errShorterRecord)
}

// errShorterRecord is why a relay records its own untrimmed batch again:
// the lane's record named a batch reaching less far (laterBatch).
var errShorterRecord = errors.New("the lane's record names a batch reaching less far than this relay's untrimmed one")

// dropRecord deletes the record of shard's lane at revision rev (0: none),
// once its batch is trimmed or known stale. A newer record (a batch recorded
// since) is kept; a delete that fails leaves a stale record, which the next
// relay to take the shard drops, or the bucket's TTL.
func (r *Relay) dropRecord(ctx context.Context, shard, li int, rev uint64) {
	if r.cfg.Records == nil || rev == 0 {
		return
	}
	lane := Lanes[li]
	err := r.cfg.Records.del(context.WithoutCancel(ctx), shard, lane, rev)
	switch {
	case err == nil:
		if r.seen[shard][li] == rev {
			r.seen[shard][li] = 0
		}
	case errors.Is(err, errNewerRecord):
		r.log.Info("relay kept a newer record of an untrimmed batch", "shard", shard, "lane", lane.Name, "revision_read", rev)
	default:
		r.log.Warn("relay could not delete the record of a trimmed batch; it trims nothing, and the next relay to take the shard drops it", "shard", shard, "lane", lane.Name,
			"revision", rev, "err", err)
	}
}
