package outbox

import (
	"context"
	"sync"
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
// everything published. It returns a (not running), its Redis hook, and
// the event IDs.
func ownAndAnother(t *testing.T, e *env, recorded int) (*Relay, redis.UniversalClient, []string) {
	t.Helper()
	shortDuplicateWindow(t, e)
	ids := e.addClicks(t, "abc", 40)

	aRDB := testenv.AnotherClient(t, e.rdb)
	down := &killed{}
	aRDB.AddHook(down)
	aKV := &refusingKV{js: e.js}
	a := e.relayWith(aRDB, "a", NewRecords(aKV))
	var once sync.Once
	a.afterAcks = func(int, Lane, []string) error {
		once.Do(func() { down.kill(); aKV.refusing.Store(true) })
		return nil
	}
	ra := start(a)
	testenv.WaitFor(t, 10*time.Second, "a's record refused", func() bool { return recordsCounted(a, "write_failed") >= 1 })
	ra.stop() // the shard loop ends with the batch still a's own
	aKV.refusing.Store(false)
	if own := a.untrimmed[0][0]; own == nil || own.n != 16 {
		t.Fatalf("a's own untrimmed batch: %+v, want its first 16 clicks", own)
	}

	key := e.layout.OutboxKey(0, LaneClicks)
	msgs, err := e.rdb.XRange(t.Context(), key, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs[min(16, recorded):recorded] { // what b published beyond a's batch
		en, err := parseEntry(m)
		if err != nil {
			t.Fatal(err)
		}
		msg := &nats.Msg{Subject: en.Subject, Data: []byte(en.Data), Header: nats.Header{events.HeaderMsgID: []string{en.ID}}}
		if _, err := e.js.PublishMsg(t.Context(), msg); err != nil {
			t.Fatal(err)
		}
	}
	keep, err := nextStreamID(msgs[recorded-1].ID)
	if err != nil {
		t.Fatal(err)
	}
	b := &acked{n: recorded, keep: keep, firstEvent: ids[0], last: msgs[recorded-1].ID, lastEvent: ids[recorded-1], published: recorded}
	putRecord(t, e, 0, LaneClicks, "b", b)
	passDuplicateWindow(t, e)
	down.dead.Store(false)
	return a, aRDB, ids
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
	a, _, ids := ownAndAnother(t, e, 8)
	ra := start(a)
	defer ra.stop()
	testenv.WaitFor(t, 10*time.Second, "a to relay the shard", func() bool { return e.outboxLen(t) == 0 })
	sameSequence(t, "CLICKS", ids, storedIDsBut(t, e, "probe-duplicate-window"))
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
	a, _, ids := ownAndAnother(t, e, 24)
	ra := start(a)
	defer ra.stop()
	testenv.WaitFor(t, 10*time.Second, "a to relay the shard", func() bool { return e.outboxLen(t) == 0 })
	sameSequence(t, "CLICKS", ids, storedIDsBut(t, e, "probe-duplicate-window"))
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
	a, aRDB, ids := ownAndAnother(t, e, 8)
	trims := &trimKiller{}
	trims.armed.Store(true)
	aRDB.AddHook(trims)
	ra := start(a)
	testenv.WaitFor(t, 10*time.Second, "a's trim to fail again", func() bool { return trims.failed.Load() })
	ra.stop() // a dies: its Redis answers nothing more
	passDuplicateWindow(t, e)

	c := e.relay("c")
	rc := start(c)
	defer rc.stop()
	testenv.WaitFor(t, 10*time.Second, "c to relay the shard", func() bool { return e.outboxLen(t) == 0 })
	sameSequence(t, "CLICKS", ids, storedIDsBut(t, e, "probe-duplicate-window"))
	if n := recordsCounted(c, "applied"); n != 1 {
		t.Fatalf("c applied %v records, want 1", n)
	}
	noRecord(t, e, 0, LaneClicks)
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
	a, _, ids := ownAndAnother(t, e, 24)
	key := e.layout.OutboxKey(0, LaneClicks)
	msgs, err := e.rdb.XRange(t.Context(), key, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	var lost []string
	for _, m := range msgs[16:] {
		lost = append(lost, m.ID)
	}
	if err := e.rdb.XDel(t.Context(), key, lost...).Err(); err != nil {
		t.Fatal(err)
	}
	later := e.addClicks(t, "xyz", 5)

	ra := start(a)
	defer ra.stop()
	testenv.WaitFor(t, 10*time.Second, "a to relay the shard", func() bool { return e.outboxLen(t) == 0 })
	want := append(append([]string{}, ids[:24]...), later...) // the last 16 were lost before anyone published them
	sameSequence(t, "CLICKS", want, storedIDsBut(t, e, "probe-duplicate-window"))
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
