package outbox

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
)

// ownAndAnother sets up, over a CLICKS whose duplicate window is 1 s, a
// relay a that holds its own untrimmed batch of the clicks lane (its first
// 16 of 40 clicks, acknowledged; its Redis stopped answering before the
// trim, and NATS refused its record, so a keeps the batch when its shard
// loop ends) while the lane's record names another relay's batch of the
// lane's first recorded clicks, as an instance b that took the shard
// meanwhile (it found no record) and failed its own trim would have left
// it. When b's batch reaches past a's, the clicks beyond a's were
// published by b. a's shard loop has ended (the lease lapsed); its Redis
// and NATS answer again, and the duplicate window has passed for
// everything published. It returns a (not running; a.rdb is its Redis
// client) and the event IDs.
func ownAndAnother(t *testing.T, e *env, recorded int) (*Relay, []string) {
	t.Helper()
	shortDuplicateWindow(t, e)
	ids := e.addClicks(t, "abc", 40)

	a, ra, down, aKV := e.refusedAfterAcks(t, "a")
	ra.stop() // the shard loop ends with the batch still a's own
	aKV.refusing.Store(false)
	if own := a.untrimmed[0][0]; own == nil || own.n != 16 {
		t.Fatalf("a's own untrimmed batch: %+v, want its first 16 clicks", own)
	}

	msgs := e.laneEntries(t)
	publishEntries(t, e, msgs[min(16, recorded):recorded]) // what b published beyond a's batch
	putRecord(t, e, 0, LaneClicks, "b", headBatch(t, msgs[:recorded]))
	passDuplicateWindow(t, e)
	down.dead.Store(false)
	return a, ids
}

// TestARelayHoldingALongerBatchThanTheLanesRecordTrimsItsOwn: a relay that
// takes a shard again holding its own untrimmed batch (16 clicks) and finds
// another's record of a batch reaching less far (8) trims its own, which
// holds the other's: every click is in CLICKS once (none published again
// past the duplicate window, none lost), the outbox is empty, no record is
// left, and the 40 clicks are counted once.
func TestARelayHoldingALongerBatchThanTheLanesRecordTrimsItsOwn(t *testing.T) {
	testenv.Parallel(t)
	e := newEnv(t, 1)
	a, ids := ownAndAnother(t, e, 8)
	ra := start(a)
	defer ra.stop()
	relayedOnce(t, e, "a", ids, duplicateWindowProbe)
	if n := counterValue(a.m.Published.WithLabelValues(LaneClicks.Name)); n != 40 {
		t.Fatalf("relay_published_total = %v, want 40", n)
	}
	testenv.WaitFor(t, 5*time.Second, "the record deleted", func() bool { return !hasRecord(t, e, 0, LaneClicks) })
}

// TestARelayHoldingAShorterBatchThanTheLanesRecordTrimsTheRecorded: the
// same, with the record reaching further (24 clicks, the 8 beyond the
// relay's own batch published by the relay that wrote it): the relay trims
// the recorded batch (applied), which holds its own, and publishes only the
// 16 after it.
func TestARelayHoldingAShorterBatchThanTheLanesRecordTrimsTheRecorded(t *testing.T) {
	testenv.Parallel(t)
	e := newEnv(t, 1)
	a, ids := ownAndAnother(t, e, 24)
	ra := start(a)
	defer ra.stop()
	relayedOnce(t, e, "a", ids, duplicateWindowProbe)
	if n := recordsCounted(a, "applied"); n != 1 {
		t.Fatalf("a applied %v records, want 1", n)
	}
	if n := counterValue(a.m.Published.WithLabelValues(LaneClicks.Name)); n != 40 {
		t.Fatalf("relay_published_total = %v, want 40 (the record's 24 and the 16 after)", n)
	}
	testenv.WaitFor(t, 5*time.Second, "the record deleted", func() bool { return !hasRecord(t, e, 0, LaneClicks) })
}

// TestARelayKeepingItsLongerBatchRecordsItForTheNextHolder: the relay that
// keeps its own batch over the lane's shorter record fails that batch's
// trim again and dies. The instance that takes the shard past the
// duplicate window finds the relay's batch recorded, not the shorter one:
// it trims all 16 and publishes none of them again.
func TestARelayKeepingItsLongerBatchRecordsItForTheNextHolder(t *testing.T) {
	testenv.Parallel(t)
	e := newEnv(t, 1)
	a, ids := ownAndAnother(t, e, 8)
	trims := &trimKiller{}
	trims.armed.Store(true)
	a.rdb.AddHook(trims)
	ra := start(a)
	testenv.WaitFor(t, 10*time.Second, "a's trim to fail again", func() bool { return trims.failed.Load() })
	ra.stop() // a dies: its Redis answers nothing more
	probe := passDuplicateWindow(t, e)

	takeOver(t, e, "c", ids, probe, counted{"applied": 1})
}

// TestARelayTriesTheShorterBatchWhenTheFurtherOneIsStale: the relay holds
// its own untrimmed batch (16 clicks) and the lane's record names one
// reaching further (24), but a Redis failover lost the lane's tail from
// the 17th entry on: the recorded batch's last entry is gone, so it is
// stale, while the relay's own still heads the lane. The relay trims its
// own instead of reading the lane from its head: the 16 are not published
// again past the duplicate window, and the clicks written after the
// failover are. Before, both batches were dropped, and the 16 were stored
// twice.
func TestARelayTriesTheShorterBatchWhenTheFurtherOneIsStale(t *testing.T) {
	testenv.Parallel(t)
	e := newEnv(t, 1)
	a, ids := ownAndAnother(t, e, 24)
	var lost []string
	for _, m := range e.laneEntries(t)[16:] {
		lost = append(lost, m.ID)
	}
	if err := e.rdb.XDel(t.Context(), e.layout.OutboxKey(0, LaneClicks), lost...).Err(); err != nil {
		t.Fatal(err)
	}
	later := e.addClicks(t, "xyz", 5)

	ra := start(a)
	defer ra.stop()
	want := append(append([]string{}, ids[:24]...), later...) // the last 16 were lost before anyone published them
	relayedOnce(t, e, "a", want, duplicateWindowProbe)
	if s, ap := recordsCounted(a, "stale"), recordsCounted(a, "applied"); s != 1 || ap != 0 {
		t.Fatalf("records stale %v, applied %v; want 1 and 0", s, ap)
	}
	if n := counterValue(a.m.Published.WithLabelValues(LaneClicks.Name)); n != 21 {
		t.Fatalf("relay_published_total = %v, want 21 (its own 16 and the 5 after the failover)", n)
	}
	testenv.WaitFor(t, 5*time.Second, "the record deleted", func() bool { return !hasRecord(t, e, 0, LaneClicks) })
}

// hasRecord reports whether the bucket holds a record of shard's lane.
func hasRecord(t *testing.T, e *env, shard int, lane Lane) bool {
	t.Helper()
	a, _, err := NewRecords(e.js).get(t.Context(), shard, lane)
	if err != nil {
		t.Fatal(err)
	}
	return a != nil
}

// trimKiller is a Redis client hook that, while armed, fails the relay's
// fenced trim and every command after it: the relay dies at its trim.
type trimKiller struct {
	armed, failed atomic.Bool
}

func (k *trimKiller) DialHook(next redis.DialHook) redis.DialHook { return next }

func (k *trimKiller) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, c redis.Cmder) error {
		if args := c.Args(); k.armed.Load() && len(args) > 1 && c.Name() == "evalsha" && args[1] == fencedTrimScript.Hash() {
			k.failed.Store(true)
		}
		if k.failed.Load() {
			c.SetErr(errKilled)
			return errKilled
		}
		return next(ctx, c)
	}
}

func (k *trimKiller) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if k.failed.Load() {
			for _, c := range cmds {
				c.SetErr(errKilled)
			}
			return errKilled
		}
		return next(ctx, cmds)
	}
}

// TestAHolderWhoseRecordMeetsALongerOneFromTheSameHeadTrimsThatOne: relay
// b takes the shard, reads no record, relays the lane's first 16 clicks,
// and Redis does not answer its trim. Meanwhile the record of a batch from
// the same head reaching further lands on the lane: the lane's first 32,
// from a relay x whose lease lapsed before b took the shard, whose own
// trim and record had failed, and whose retried write NATS took only now
// (x published the 16 beyond b's). b's own write meets it. Its trim
// deletes b's batch with its own, so b adopts it, as it does a longer
// record it reads when it takes the shard (laterBatch): when Redis answers
// b again, past the duplicate window and its lease still its own, b trims
// the 32 and publishes only the 8 after them: every click once, and the
// record deleted. Before, b left the record and trimmed its own 16 when
// Redis answered, so the record went stale, and b read the 16 beyond from
// the lane's head and published them again: stored twice.
func TestAHolderWhoseRecordMeetsALongerOneFromTheSameHeadTrimsThatOne(t *testing.T) {
	testenv.Parallel(t)
	e := newEnv(t, 1)
	shortDuplicateWindow(t, e)
	ids := e.addClicks(t, "abc", 40)
	msgs := e.laneEntries(t)

	bRDB := testenv.AnotherClient(t, e.rdb)
	trims := &trimsFail{}
	bRDB.AddHook(trims)
	b := e.relayOn(bRDB, "b")
	b.cfg.LeaseTTL = 3 * time.Second // b's lease outlives the duplicate window (its renewals succeed)
	acked, xDone := pauseAfterAcks(b, func() { trims.failing.Store(true) })
	rb := start(b)
	defer rb.stop()
	<-acked
	publishEntries(t, e, msgs[16:32]) // what x published beyond b's batch
	putRecord(t, e, 0, LaneClicks, "x", headBatch(t, msgs[:32]))
	xDone()
	testenv.WaitFor(t, 10*time.Second, "b's write to meet x's record", func() bool {
		return recordsCounted(b, "adopted")+recordsCounted(b, "superseded") >= 1
	})
	if rec, _, err := NewRecords(e.js).get(t.Context(), 0, LaneClicks); err != nil || rec == nil || rec.from != "x" || rec.n != 32 {
		t.Fatalf("the lane's record: %+v, %v; want x's batch of 32, kept", rec, err)
	}

	probe := passDuplicateWindow(t, e)
	trims.failing.Store(false) // Redis answers b's trims again
	relayedOnce(t, e, "b", ids, probe)
	if n := testutilLeasesLost(b); n != 0 {
		t.Fatalf("b lost its lease %v times; the test needs it held throughout", n)
	}
	if ad, ap := recordsCounted(b, "adopted"), recordsCounted(b, "applied"); ad != 1 || ap != 1 {
		t.Fatalf("b: records adopted %v, applied %v; want 1 and 1", ad, ap)
	}
	if n := counterValue(b.m.Published.WithLabelValues(LaneClicks.Name)); n != 40 {
		t.Fatalf("relay_published_total = %v, want 40 (the record's 32 and the 8 after)", n)
	}
	noRecord(t, e, 0, LaneClicks)
}

// publishEntries publishes the outbox entries msgs to their streams, as
// another relay would have (Nats-Msg-Id = event ID).
func publishEntries(t *testing.T, e *env, msgs []redis.XMessage) {
	t.Helper()
	for _, m := range msgs {
		en, err := parseEntry(m)
		if err != nil {
			t.Fatal(err)
		}
		msg := &nats.Msg{Subject: en.Subject, Data: []byte(en.Data), Header: nats.Header{events.HeaderMsgID: []string{en.ID}}}
		if _, err := e.js.PublishMsg(t.Context(), msg); err != nil {
			t.Fatal(err)
		}
	}
}

// headBatch is the batch of the lane entries msgs, all published, as a
// relay that relayed them would record it.
func headBatch(t *testing.T, msgs []redis.XMessage) *acked {
	t.Helper()
	first, err := parseEntry(msgs[0])
	if err != nil {
		t.Fatal(err)
	}
	last, err := parseEntry(msgs[len(msgs)-1])
	if err != nil {
		t.Fatal(err)
	}
	keep, err := nextStreamID(last.StreamID)
	if err != nil {
		t.Fatal(err)
	}
	return &acked{n: len(msgs), keep: keep, firstEvent: first.ID, last: last.StreamID, lastEvent: last.ID, published: len(msgs)}
}

// trimsFail is a Redis client hook that, while failing, fails the relay's
// fenced trim and lets every other command through (its renewals among
// them): Redis not answering the trim of a batch.
type trimsFail struct{ failing atomic.Bool }

func (k *trimsFail) DialHook(next redis.DialHook) redis.DialHook { return next }

func (k *trimsFail) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, c redis.Cmder) error {
		if args := c.Args(); k.failing.Load() && len(args) > 1 && c.Name() == "evalsha" && args[1] == fencedTrimScript.Hash() {
			c.SetErr(errKilled)
			return errKilled
		}
		return next(ctx, c)
	}
}

func (k *trimsFail) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
