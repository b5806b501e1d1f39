package outbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// TestATakeoverAfterTheDuplicateWindowTrimsTheBatchTheDeadRelayRecorded:
// relay A publishes a batch, JetStream acknowledges it, A's Redis stops
// answering before the trim, and A dies (it trims and releases nothing).
// A recorded the batch in NATS. Relay B takes the shard once the stream's
// duplicate window (made short here; 2 minutes in production) has passed
// since the acks: it reads the record before the lane, trims the batch with
// the fenced script, and publishes only the rest, so CLICKS holds each click
// once. Without the record B publishes the batch again from the lane's head
// and, past the window, CLICKS stores it twice.
func TestATakeoverAfterTheDuplicateWindowTrimsTheBatchTheDeadRelayRecorded(t *testing.T) {
	testenv.Parallel(t)
	e := newEnv(t, 1)
	shortDuplicateWindow(t, e)
	ids := e.addClicks(t, "abc", 40)

	acked := make(chan int, 1)
	a, _ := e.killedAfterAcks(t, "a", nil, func(batch []string) { acked <- len(batch) })
	ra := start(a)
	n := <-acked
	testenv.WaitFor(t, 10*time.Second, "a to record its untrimmed batch", func() bool {
		return recordsCounted(a, "written") == 1
	})
	ra.stop() // a dies: nothing it sends reaches Redis, so it trims and releases nothing
	if got := e.outboxLen(t); got != 40 {
		t.Fatalf("outbox holds %d entries after a died, want all 40", got)
	}
	probe := passDuplicateWindow(t, e)

	b := takeOver(t, e, "b", ids, probe, counted{"applied": 1})
	// The batch's clicks count where they are trimmed: b counts them with
	// its own, a (which trimmed nothing) none.
	if pa, pb := counterValue(a.m.Published.WithLabelValues(LaneClicks.Name)), counterValue(b.m.Published.WithLabelValues(LaneClicks.Name)); pa != 0 || pb != 40 {
		t.Fatalf("relay_published_total: a %v, b %v; want 0 and 40 (the %d of a's batch counted by b)", pa, pb, n)
	}
}

// TestAStaleRecordTrimsNothingAndIsDropped: a record whose batch no longer
// heads its lane (the relay that wrote it trimmed the batch and could not
// delete the record; here the lane's first entry is gone) trims nothing:
// the entries it names that are still in the lane are published, each once,
// and the record is deleted.
func TestAStaleRecordTrimsNothingAndIsDropped(t *testing.T) {
	testenv.Parallel(t)
	e := newEnv(t, 1)
	ids := e.addClicks(t, "abc", 10)
	msgs := e.laneEntries(t)
	putRecord(t, e, 0, LaneClicks, "gone", headBatch(t, msgs[:5]))
	if err := e.rdb.XDel(t.Context(), e.layout.OutboxKey(0, LaneClicks), msgs[0].ID).Err(); err != nil {
		t.Fatal(err)
	}

	takeOver(t, e, "r", ids[1:], "", counted{"stale": 1, "applied": 0})
}

// TestARecordNATSRefusesIsLoggedCountedAndWrittenWithTheNextTrim: NATS
// refuses the record of an untrimmed batch (here its bucket is gone): the
// relay logs and counts the failure, and writes the record when it tries
// the trim again and NATS takes it. Once Redis answers, the relay trims
// the batch and deletes its record; every click is in CLICKS once.
func TestARecordNATSRefusesIsLoggedCountedAndWrittenWithTheNextTrim(t *testing.T) {
	testenv.Parallel(t)
	e := newEnv(t, 1)
	ids := e.addClicks(t, "abc", 40)
	r, down := e.killedAfterAcks(t, "r", nil, func([]string) {
		if err := e.js.DeleteKeyValue(context.Background(), topology.OutboxUntrimmedBucket); err != nil {
			t.Error(err)
		}
	})
	logs := &syncBuffer{}
	r.log = slog.New(slog.NewTextHandler(logs, nil))
	rr := start(r)
	defer rr.stop()
	testenv.WaitFor(t, 10*time.Second, "the refused write counted", func() bool { return recordsCounted(r, "write_failed") >= 1 })
	if s := logs.String(); !strings.Contains(s, "level=ERROR msg=\"relay could not record a batch") || !strings.Contains(s, "first_event="+ids[0]) {
		t.Fatalf("no ERROR naming the batch in the relay's log:\n%s", s)
	}
	if _, err := e.js.CreateKeyValue(t.Context(), topology.OutboxUntrimmedBucketConfig(topology.Defaults())); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the record written with a retried trim", func() bool { return recordsCounted(r, "written") >= 1 })
	if s := logs.String(); !strings.Contains(s, "level=WARN msg=\"relay recorded a batch") {
		t.Fatalf("no WARN of the record in the relay's log:\n%s", s)
	}
	if a, _, err := NewRecords(e.js).get(t.Context(), 0, LaneClicks); err != nil || a == nil || a.firstEvent != ids[0] || a.n != 16 {
		t.Fatalf("the record: %+v, %v; want the batch of the first 16 clicks", a, err)
	}

	down.dead.Store(false) // Redis answers again
	relayedOnce(t, e, "r", ids, "")
	noRecord(t, e, 0, LaneClicks)
}

// TestALaneWhoseRecordCannotBeReadIsNotRelayed: a relay that takes a shard
// and cannot read a lane's record (NATS does not answer for the bucket)
// publishes nothing of the lane, since the record may name a batch
// JetStream holds already; the clicks wait in the outbox and are relayed,
// once, when the record can be read. (In the service the records and the
// publishes share the relay's connection, and a relay publishes nothing
// while it is down anyway; here the bucket is on a second server, which is
// stopped, as a bucket whose stream has no leader in a cluster.)
func TestALaneWhoseRecordCannotBeReadIsNotRelayed(t *testing.T) {
	testenv.Parallel(t)
	e := newEnv(t, 1)
	other := testenv.StartNATS(t)
	ojs := other.JetStream(t)
	if _, err := ojs.CreateKeyValue(t.Context(), topology.OutboxUntrimmedBucketConfig(topology.Defaults())); err != nil {
		t.Fatal(err)
	}
	other.Stop()
	ids := e.addClicks(t, "abc", 10)

	r := e.relayWith(e.rdb, "r", NewRecords(ojs))
	rr := start(r)
	defer rr.stop()
	testenv.WaitFor(t, 20*time.Second, "two failed reads of the record", func() bool { return recordsCounted(r, "read_failed") >= 2 })
	if n := count(e.js, events.ClicksStream); n != 0 {
		t.Fatalf("CLICKS holds %d clicks while the lane's record could not be read, want 0", n)
	}
	if got := e.outboxLen(t); got != 10 {
		t.Fatalf("outbox holds %d entries, want 10", got)
	}
	other.Start()
	testenv.WaitFor(t, 20*time.Second, "the outbox to empty", func() bool { return e.outboxLen(t) == 0 })
	sameSequence(t, "CLICKS", ids, storedIDs(t, e.js, events.ClicksStream))
}

// TestARelayWithoutTheRecordsBucketSaysSoOnce: with the bucket missing
// (the topology not applied since it was added) a relay reads no record
// and relays every shard, and says once, as an ERROR, that its batches are
// recorded nowhere: an operator learns that records are off.
func TestARelayWithoutTheRecordsBucketSaysSoOnce(t *testing.T) {
	testenv.Parallel(t)
	e := newEnv(t, 2)
	if err := e.js.DeleteKeyValue(t.Context(), topology.OutboxUntrimmedBucket); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, code := range []string{"abc", "xyz", "k1", "k2"} {
		ids = append(ids, e.addClicks(t, code, 5)...)
	}
	r := e.relay("r")
	logs := &syncBuffer{}
	r.log = slog.New(slog.NewTextHandler(logs, nil))
	rr := start(r)
	defer rr.stop()
	testenv.WaitFor(t, 10*time.Second, "the outbox to empty", func() bool { return e.outboxLen(t) == 0 })
	if n := count(e.js, events.ClicksStream); n != len(ids) {
		t.Fatalf("CLICKS holds %d clicks, want %d", n, len(ids))
	}
	if n := strings.Count(logs.String(), `level=ERROR msg="relay records no untrimmed batch: its bucket is missing`); n != 1 {
		t.Fatalf("the missing bucket said %d times, want once:\n%s", n, logs.String())
	}
	if n := recordsCounted(r, "read_failed"); n != 0 {
		t.Fatalf("read_failed %v, want 0: a missing bucket holds no record", n)
	}
}

// TestARecordsBucketDeletedWhileInUseIsLookedUpAgain: relays of one
// instance share its Records, which keep the bucket once found. The bucket
// is deleted (an operator's mistake, a topology torn down and applied
// again); a relay taking the shards then fails to read the lanes' records
// once, looks the bucket up again, finds it missing, says so, and relays:
// as a relay does that started without the bucket. Before, the Records kept
// the deleted bucket's handle, every read failed, and the lanes were never
// relayed again (the outbox did not empty).
func TestARecordsBucketDeletedWhileInUseIsLookedUpAgain(t *testing.T) {
	testenv.Parallel(t)
	e := newEnv(t, 2)
	records := NewRecords(e.js)
	first := e.addClicks(t, "abc", 5)
	a := start(e.relayWith(e.rdb, "a", records))
	testenv.WaitFor(t, 10*time.Second, "the first clicks relayed", func() bool { return e.outboxLen(t) == 0 })
	a.stop()
	if err := e.js.DeleteKeyValue(t.Context(), topology.OutboxUntrimmedBucket); err != nil {
		t.Fatal(err)
	}
	var later []string
	for _, code := range []string{"abc", "xyz", "k1", "k2"} {
		later = append(later, e.addClicks(t, code, 5)...)
	}
	b := e.relayWith(e.rdb, "b", records)
	logs := &syncBuffer{}
	b.log = slog.New(slog.NewTextHandler(logs, nil))
	rb := start(b)
	defer rb.stop()
	testenv.WaitFor(t, 15*time.Second, "the outbox to empty with the bucket deleted", func() bool { return e.outboxLen(t) == 0 })
	if n, want := count(e.js, events.ClicksStream), len(first)+len(later); n != want {
		t.Fatalf("CLICKS holds %d clicks, want %d", n, want)
	}
	if n := strings.Count(logs.String(), `level=ERROR msg="relay records no untrimmed batch: its bucket is missing`); n != 1 {
		t.Fatalf("the missing bucket said %d times, want once:\n%s", n, logs.String())
	}
}

// relayWith is a relay on rdb with records (nil: none).
func (e *env) relayWith(rdb redis.UniversalClient, instance string, records *Records) *Relay {
	return NewRelay(rdb, e.js, e.nc.IsConnected, e.layout, RelayConfig{
		Instance: instance, Window: 16, LeaseTTL: 600 * time.Millisecond, Block: 100 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
		Records: records,
	}, slog.New(slog.DiscardHandler), NewMetrics(prometheus.NewRegistry()))
}

// killedAfterAcks is relay instance on a Redis client of its own that stops
// answering once JetStream has acknowledged the relay's first batch, before
// its trim (what a relay killed there sends); then, if not nil, runs at that
// moment too, with the batch's event IDs. The relay records its untrimmed
// batches in kv (nil: the env's NATS). It returns the relay, not started,
// and its Redis's hook: after down.dead.Store(false) Redis answers again.
func (e *env) killedAfterAcks(t *testing.T, instance string, kv KeyValues, then func(batch []string)) (r *Relay, down *killed) {
	t.Helper()
	rdb := testenv.AnotherClient(t, e.rdb)
	down = &killed{}
	rdb.AddHook(down)
	if kv == nil {
		kv = e.js
	}
	r = e.relayWith(rdb, instance, NewRecords(kv))
	var once sync.Once
	r.afterAcks = func(_ int, _ Lane, batch []string) error {
		once.Do(func() {
			down.kill()
			if then != nil {
				then(batch)
			}
		})
		return nil
	}
	return r, down
}

// refusedAfterAcks starts relay instance, killed after its first batch's
// acks (killedAfterAcks), whose record NATS refuses from that moment too,
// and waits until the relay has counted the refusal: it holds its batch
// untrimmed and unrecorded. It returns the relay, running until it is
// stopped or the test ends, its Redis's hook, and its records' NATS: after
// kv.refusing.Store(false) NATS takes its writes again.
func (e *env) refusedAfterAcks(t *testing.T, instance string) (*Relay, *running, *killed, *refusingKV) {
	t.Helper()
	kv := &refusingKV{js: e.js}
	r, down := e.killedAfterAcks(t, instance, kv, func([]string) { kv.refusing.Store(true) })
	rr := start(r)
	t.Cleanup(rr.stop)
	testenv.WaitFor(t, 10*time.Second, instance+"'s record refused", func() bool { return recordsCounted(r, "write_failed") >= 1 })
	return r, rr, down, kv
}

// pauseAfterAcks makes r, once JetStream has acknowledged its first batch,
// run then and wait there, before its trim, until the test calls resume:
// paused is closed when it waits.
func pauseAfterAcks(r *Relay, then func()) (paused <-chan struct{}, resume func()) {
	var once sync.Once
	acked, done := make(chan struct{}), make(chan struct{})
	r.afterAcks = func(int, Lane, []string) error {
		once.Do(func() {
			then()
			close(acked)
			<-done
		})
		return nil
	}
	return acked, func() { close(done) }
}

func recordsCounted(r *Relay, outcome string) float64 {
	return counterValue(r.m.UntrimmedRecords.WithLabelValues(LaneClicks.Name, outcome))
}

// putRecord writes a record of a's batch for shard's lane as instance,
// over whatever the key holds.
func putRecord(t *testing.T, e *env, shard int, lane Lane, instance string, a *acked) {
	t.Helper()
	kv, err := e.js.KeyValue(t.Context(), topology.OutboxUntrimmedBucket)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(newRecord(instance, a))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(t.Context(), recordKey(shard, lane), b); err != nil {
		t.Fatal(err)
	}
}

// noRecord fails unless the bucket holds no record of shard's lane.
func noRecord(t *testing.T, e *env, shard int, lane Lane) {
	t.Helper()
	kv, err := e.js.KeyValue(t.Context(), topology.OutboxUntrimmedBucket)
	if err != nil {
		t.Fatal(err)
	}
	if en, err := kv.Get(t.Context(), recordKey(shard, lane)); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("record of shard %d's %s lane: %v, %v; want none (deleted once applied)", shard, lane.Name, en, err)
	}
}

// shortDuplicateWindow makes CLICKS' duplicate window 1 s. It changes the
// window twice: the server wakes its purge of old message IDs at once on a
// change, but sets the new window only later in the same update, so a purge
// that runs in between still uses the old window (2 minutes) and sleeps for
// most of it; then no ID passes the 1 s window for two minutes (CI saw a
// probe still refused after 10 s). The second change wakes the purge with
// the first change's window already set.
func shortDuplicateWindow(t *testing.T, e *env) {
	t.Helper()
	for _, window := range []time.Duration{1100 * time.Millisecond, time.Second} {
		s, err := e.js.Stream(t.Context(), events.ClicksStream)
		if err != nil {
			t.Fatal(err)
		}
		cfg := s.CachedInfo().Config
		cfg.Duplicates = window
		if _, err := e.js.UpdateStream(t.Context(), cfg); err != nil {
			t.Fatal(err)
		}
	}
}

// passDuplicateWindow waits until CLICKS' duplicate window has passed for
// everything published so far: a probe published now is stored again once
// it has passed for the probe. It returns the probe's ID.
func passDuplicateWindow(t *testing.T, e *env) string {
	t.Helper()
	pub := func() *jetstream.PubAck {
		msg := &nats.Msg{Subject: events.ClickSubject("acme", "probe"), Data: []byte("{}"), Header: nats.Header{events.HeaderMsgID: []string{duplicateWindowProbe}}}
		ack, err := e.js.PublishMsg(t.Context(), msg)
		if err != nil {
			t.Fatal(err)
		}
		return ack
	}
	pub()
	testenv.WaitFor(t, 10*time.Second, "the duplicate window to pass", func() bool { return !pub().Duplicate })
	return duplicateWindowProbe
}

// duplicateWindowProbe is the message ID of passDuplicateWindow's probe.
const duplicateWindowProbe = "probe-duplicate-window"

// storedIDsBut is CLICKS' message IDs without but's.
func storedIDsBut(t *testing.T, e *env, but string) []string {
	t.Helper()
	var out []string
	for _, id := range storedIDs(t, e.js, events.ClicksStream) {
		if id != but {
			out = append(out, id)
		}
	}
	return out
}

// laneEntries is the entries of shard 0's clicks lane, in order.
func (e *env) laneEntries(t *testing.T) []redis.XMessage {
	t.Helper()
	msgs, err := e.rdb.XRange(t.Context(), e.layout.OutboxKey(0, LaneClicks), "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	return msgs
}

// relayedOnce waits until who has relayed the shard (the outbox is empty)
// and fails unless CLICKS holds want, each once, in order, besides probe
// (passDuplicateWindow's; "": none was published).
func relayedOnce(t *testing.T, e *env, who string, want []string, probe string) {
	t.Helper()
	testenv.WaitFor(t, 10*time.Second, who+" to relay the shard", func() bool { return e.outboxLen(t) == 0 })
	var got []string
	if probe == "" {
		got = storedIDs(t, e.js, events.ClicksStream)
	} else {
		got = storedIDsBut(t, e, probe)
	}
	sameSequence(t, "CLICKS", want, got)
}

// counted is how many records a relay counted under each outcome (applied,
// stale, written, ...).
type counted map[string]float64

// takeOver is how a story ends: relay instance takes the shard (its holders
// gone) and relays it, so that CLICKS holds want, each once, in order
// (relayedOnce); it counted its records as records says, and no record of
// the lane is left. It returns the relay, running until the test ends.
func takeOver(t *testing.T, e *env, instance string, want []string, probe string, records counted) *Relay {
	t.Helper()
	r := e.relay(instance)
	rr := start(r)
	t.Cleanup(rr.stop)
	relayedOnce(t, e, instance, want, probe)
	got := counted{}
	for outcome := range records {
		got[outcome] = recordsCounted(r, outcome)
	}
	if !maps.Equal(got, records) {
		t.Fatalf("%s counted records %v, want %v", instance, got, records)
	}
	noRecord(t, e, 0, LaneClicks)
	return r
}

// syncBuffer is a log's destination that the test reads while the relay
// writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestARelayWhoseLeaseLapsedDoesNotOverwriteANewerHoldersRecord: relay a's
// Redis stops answering after a batch's acks, and NATS refuses its record
// for a while. Its lease lapses; b takes the shard, reads no record,
// relays a window of 32 from the lane's head (a's 16 again, within the
// duplicate window, and 16 more), fails its own trim, records its batch,
// and dies. Then a's retried write reaches NATS: it must not overwrite
// b's record with a's shorter batch (the key changed since a looked), and
// adopts it instead (b's batch, from the same head, holds a's). c, taking
// the shard past the duplicate window,
// trims b's 32 and publishes only the rest: every click once. Before, a's
// write overwrote b's record, and c published 16 of b's batch again.
func TestARelayWhoseLeaseLapsedDoesNotOverwriteANewerHoldersRecord(t *testing.T) {
	testenv.Parallel(t)
	e := newEnv(t, 1)
	ids := e.addClicks(t, "abc", 40)

	a, ra, _, aKV := e.refusedAfterAcks(t, "a")

	b, _ := e.killedAfterAcks(t, "b", nil, nil)
	b.cfg.Window = 32
	rb := start(b)
	testenv.WaitFor(t, 10*time.Second, "b to record its batch", func() bool { return recordsCounted(b, "written") == 1 })
	rb.stop() // b dies

	aKV.refusing.Store(false)
	testenv.WaitFor(t, 10*time.Second, "a's retried write to be answered", func() bool {
		return recordsCounted(a, "written")+recordsCounted(a, "superseded")+recordsCounted(a, "adopted") >= 1
	})
	ra.stop() // a dies too
	rec, _, err := NewRecords(e.js).get(t.Context(), 0, LaneClicks)
	if err != nil || rec == nil || rec.from != "b" || rec.n != 32 {
		t.Fatalf("the lane's record: %+v, %v; want b's batch of 32", rec, err)
	}
	if w, ad := recordsCounted(a, "written"), recordsCounted(a, "adopted"); w != 0 || ad != 1 {
		t.Fatalf("a counted %v records written and %v adopted, want 0 and 1", w, ad)
	}

	shortDuplicateWindow(t, e)
	probe := passDuplicateWindow(t, e)
	takeOver(t, e, "c", ids, probe, counted{"applied": 1})
}

// refusingKV is a JetStream context whose buckets refuse every write while
// refusing is set (NATS refusing a relay's record), and answer reads.
type refusingKV struct {
	js       KeyValues
	refusing atomic.Bool
}

var errRefused = errors.New("nats refused the write")

func (k *refusingKV) KeyValue(ctx context.Context, bucket string) (jetstream.KeyValue, error) {
	kv, err := k.js.KeyValue(ctx, bucket)
	if err != nil {
		return nil, err
	}
	return refusingBucket{KeyValue: kv, k: k}, nil
}

type refusingBucket struct {
	jetstream.KeyValue
	k *refusingKV
}

func (b refusingBucket) Put(ctx context.Context, key string, value []byte) (uint64, error) {
	if b.k.refusing.Load() {
		return 0, errRefused
	}
	return b.KeyValue.Put(ctx, key, value)
}

func (b refusingBucket) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	if b.k.refusing.Load() {
		return 0, errRefused
	}
	return b.KeyValue.Create(ctx, key, value, opts...)
}

func (b refusingBucket) Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error) {
	if b.k.refusing.Load() {
		return 0, errRefused
	}
	return b.KeyValue.Update(ctx, key, value, revision)
}
