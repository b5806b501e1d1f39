package fraud

import (
	"hash/maphash"
	"slices"
	"time"

	"github.com/snipdev/snip/pkg/reader"
)

// A click can be stored in CLICKS twice, under two sequences: the outbox
// relay retries a publish whose ack it lost later than the stream's
// 2-minute duplicate window (decision 0010), or an operator redrives a click
// another reader parked (a fresh Nats-Msg-Id, the same event). Skipping by
// sequence does not see it; the state judged it as another click, and the
// statistics, the windows and the label counters counted it twice.
//
// The partition's state therefore keeps a fingerprint of every event ID it
// judged or fed within its Memory of event time (ten minutes by default,
// the span a rebuild reads back from the log, so a rebuilt state holds the
// same record as an uninterrupted one), in buckets of CopyBucket of its
// click time (Click.Time, unclamped: see copyOf). Only an event stored more
// than CopyLateness after its own click time can be a copy, or one whose
// click time is ahead of its storage by more (a redirect whose clock runs
// ahead): the record is looked up for those only, in the bucket of the
// click time, where every copy of an event falls (same click time). An
// event found there is a copy: it changes nothing in the state and is
// counted in snip_fraud_copies_skipped_total. An on-time click costs a hash
// and an append.

const (
	// CopyLateness: an event stored more than this after its click time
	// (or before it) is looked up in the record of event IDs. A click is stored milliseconds
	// after the redirect served it; a relay's late retry at least the
	// duplicate window (2 minutes) after the first copy, and a redrive
	// after the first copy was judged and parked.
	CopyLateness = time.Second
	// CopyBucket is the span of event time of one bucket of the record: at
	// 50,000 events/s on one partition a late event scans 1,000
	// fingerprints (the click counter keys its record the same way,
	// decision 0173).
	CopyBucket = 20 * time.Millisecond
)

// idSeed keys the fingerprints. The record lives in one process's memory
// only (a rebuild fills it again from the log), so a seed per process is
// enough.
var idSeed = maphash.MakeSeed()

// fingerprint is 64 bits of a keyed hash of an event ID: two distinct IDs
// in one bucket share it with probability n/2^64 per lookup.
func fingerprint(id string) uint64 { return maphash.String(idSeed, id) }

// idRecord is the fingerprints of the event IDs a partition's state saw
// within its Memory, by bucket of event time. 8 bytes per event, plus a
// bucket's map entry and slice per CopyBucket that saw an event.
type idRecord struct {
	buckets map[int64]*idBucket
	order   []int64 // bucket indices, ascending, for expiry
	last    int64   // index of lastB, the bucket of the latest add
	lastB   *idBucket
	n       int // fingerprints held
}

type idBucket struct{ fps []uint64 }

func newIDRecord() idRecord { return idRecord{buckets: make(map[int64]*idBucket)} }

func bucketOf(t int64) int64 {
	b := t / int64(CopyBucket)
	if t < 0 && t%int64(CopyBucket) != 0 {
		b--
	}
	return b
}

// add records fp for an event at time t.
func (r *idRecord) add(t int64, fp uint64) {
	i := bucketOf(t)
	b := r.lastB
	if b == nil || i != r.last {
		b = r.buckets[i]
		if b == nil {
			// Sized as the bucket before: at a steady rate one
			// allocation a bucket, not one per doubling.
			n := 8
			if r.lastB != nil {
				n = max(n, len(r.lastB.fps))
			}
			b = &idBucket{fps: make([]uint64, 0, n)}
			r.buckets[i] = b
			if n := len(r.order); n == 0 || r.order[n-1] < i {
				r.order = append(r.order, i)
			} else {
				// A late event in a bucket not seen yet: keep the order.
				at, _ := slices.BinarySearch(r.order, i)
				r.order = slices.Insert(r.order, at, i)
			}
		}
		r.last, r.lastB = i, b
	}
	b.fps = append(b.fps, fp)
	r.n++
}

// has reports whether fp was recorded for an event at time t.
func (r *idRecord) has(t int64, fp uint64) bool {
	b := r.buckets[bucketOf(t)]
	return b != nil && slices.Contains(b.fps, fp)
}

// expire drops the buckets wholly before cutoff.
func (r *idRecord) expire(cutoff int64) {
	n := 0
	for n < len(r.order) && (r.order[n]+1)*int64(CopyBucket) <= cutoff {
		i := r.order[n]
		r.n -= len(r.buckets[i].fps)
		delete(r.buckets, i)
		if i == r.last {
			r.lastB = nil
		}
		n++
	}
	switch {
	case n == len(r.order):
		r.order = r.order[:0]
	case n > 0:
		r.order = r.order[n:]
	}
}

// copyOf reports whether ev is a copy of an event the state judged or fed
// within its Memory, and records its ID otherwise. t is its event time.
//
// The record is kept by the click's own time (Click.Time), which every copy
// of an event carries, not by the event time t: t is clamped to
// MaxClockSkew after each copy's own storage time, so the copies of a click
// from a redirect whose clock runs ahead have different event times, and a
// copy looked up under its own missed the original's bucket. For the same
// reason a click whose time is ahead of its storage by more than
// CopyLateness is looked up too: a copy of it may be stored before its click
// time. A click time more than Memory ahead of the partition's clock is
// beyond the record, as one more than Memory behind it is: the record spans
// at most twice Memory of event time.
func (p *Partition) copyOf(ev reader.Event, t int64) bool {
	at := ev.Click.Time.UnixNano()
	if now := max(p.clock, t); at < now-p.d.memory || at > now+p.d.memory {
		return false // beyond the record: judged as a click
	}
	fp := fingerprint(ev.Click.ID)
	if !ev.Stored.IsZero() {
		if off := ev.Stored.Sub(ev.Click.Time); (off > CopyLateness || off < -CopyLateness) && p.ids.has(at, fp) {
			return true
		}
	}
	p.ids.add(at, fp)
	return false
}
