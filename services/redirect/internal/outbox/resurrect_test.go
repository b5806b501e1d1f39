package outbox

import (
	"sync"
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/testenv"
)

// lapsedAfterAnApplied sets up a record created over one deleted since:
// relay a's Redis stops answering after a batch's acks (the lane's first
// 16 clicks of 40) and NATS refuses its record, so a saw no record. Its
// lease lapses. An instance x took the shard meanwhile, published the
// first 32 again (the 16 beyond a's batch for the first time), failed its
// trim, recorded its batch and died; relay b takes the shard, applies x's
// record (the 32 trimmed) and deletes it, and b's own batch (the last 8)
// is in hand (b's own afterAcks, if any, has run after its acks). Then a's
// retried write reaches NATS: a create where a saw no record, which lands
// on the deleted one. a dies. It returns a and b (b running), and the
// event IDs.
func lapsedAfterAnApplied(t *testing.T, e *env, b *Relay) (*Relay, *running, []string) {
	t.Helper()
	ids := e.addClicks(t, "abc", 40)
	a, ra, _, aKV := e.refusedAfterAcks(t, "a")
	testenv.WaitFor(t, 10*time.Second, "a's lease to lapse", func() bool { return e.rdb.Exists(t.Context(), e.layout.LeaseKey(0)).Val() == 0 })

	msgs := e.laneEntries(t)
	publishEntries(t, e, msgs[16:32]) // what x published beyond a's batch
	putRecord(t, e, 0, LaneClicks, "x", headBatch(t, msgs[:32]))

	var bOnce sync.Once
	bAcked := make(chan struct{})
	bAfterAcks := b.afterAcks // b's own, if any, runs first
	b.afterAcks = func(shard int, lane Lane, batch []string) error {
		var err error
		if bAfterAcks != nil {
			err = bAfterAcks(shard, lane, batch)
		}
		bOnce.Do(func() { close(bAcked) })
		return err
	}
	rb := start(b)
	<-bAcked
	if n := recordsCounted(b, "applied"); n != 1 {
		t.Fatalf("b applied %v records, want x's", n)
	}
	noRecord(t, e, 0, LaneClicks)

	aKV.refusing.Store(false)
	testenv.WaitFor(t, 10*time.Second, "a's retried write to land", func() bool { return recordsCounted(a, "written") >= 1 })
	ra.stop() // a dies
	if rec, _, err := NewRecords(e.js).get(t.Context(), 0, LaneClicks); err != nil || rec == nil || rec.from != "a" || rec.n != 16 {
		t.Fatalf("the lane's record: %+v, %v; want a's batch of 16, created over x's deleted one", rec, err)
	}
	return a, rb, ids
}

// TestARecordCreatedOverOneDeletedSinceTrimsNothing: the record a relay
// whose lease lapsed creates over one a newer holder applied and deleted
// names a batch that no longer heads the lane. The instance that reads it
// next trims nothing (stale) and publishes every entry still in the lane:
// no click is lost and none is stored twice. (The fenced trim deletes only
// while the lane's first entry and the entry at the batch's last ID are
// the batch's, so a record can delete only what its batch relayed.)
func TestARecordCreatedOverOneDeletedSinceTrimsNothing(t *testing.T) {
	testenv.Parallel(t)
	e := newEnv(t, 1)
	_, rb, ids := lapsedAfterAnApplied(t, e, e.relay("b"))
	testenv.WaitFor(t, 10*time.Second, "b to relay the lane", func() bool { return e.outboxLen(t) == 0 })
	more := e.addClicks(t, "abc", 5)
	rb.stop()

	takeOver(t, e, "c", append(ids, more...), "", counted{"stale": 1, "applied": 0})
}

// TestARecordCreatedOverOneDeletedSinceDoesNotSupersedeTheHoldersBatch:
// as above, and b's trim of its own batch (the last 8 clicks) fails, NATS
// refuses its record, and b's lease lapses before its write is retried:
// then the lane's record is a's, created since b looked. b's batch reaches
// further into the lane than a's, which can only be stale or held by b's,
// so b writes over it. b dies; the instance that takes the shard past the
// duplicate window trims b's batch: every click once. Before, b left its
// batch unrecorded (superseded), as if a's record were a newer holder's,
// and the 8 were stored twice.
func TestARecordCreatedOverOneDeletedSinceDoesNotSupersedeTheHoldersBatch(t *testing.T) {
	testenv.Parallel(t)
	e := newEnv(t, 1)
	shortDuplicateWindow(t, e)
	bKV := &refusingKV{js: e.js}
	b, _ := e.killedAfterAcks(t, "b", bKV, func([]string) { bKV.refusing.Store(true) })
	_, rb, ids := lapsedAfterAnApplied(t, e, b)
	testenv.WaitFor(t, 10*time.Second, "b's record refused", func() bool { return recordsCounted(b, "write_failed") >= 1 })
	testenv.WaitFor(t, 10*time.Second, "b's lease to lapse", func() bool { return e.rdb.Exists(t.Context(), e.layout.LeaseKey(0)).Val() == 0 })
	bKV.refusing.Store(false)
	testenv.WaitFor(t, 10*time.Second, "b's retried write to be answered", func() bool {
		return recordsCounted(b, "written") >= 1 || recordsCounted(b, "superseded") >= 1
	})
	rb.stop() // b dies
	if n := recordsCounted(b, "superseded"); n != 0 {
		t.Fatalf("b counted %v records superseded, want 0", n)
	}

	probe := passDuplicateWindow(t, e)
	takeOver(t, e, "c", ids, probe, counted{"applied": 1}) // b's record
}
