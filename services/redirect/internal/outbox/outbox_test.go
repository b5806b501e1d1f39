package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/deadletter"
	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

var servers *testenv.Servers

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, &servers, testenv.WithRedis(), testenv.WithRedisCluster()))
}

// TestOnRedisCluster runs the outbox's tests on a Redis Cluster: the shards'
// keys spread over its masters, and each shard's lease and lanes move
// together.
func TestOnRedisCluster(t *testing.T) {
	servers.RunOnRedisCluster(t,
		TestGuarantee_RelayStoppedBetweenPublishAndDeleteThenRestarted,
		TestRelayParksPermanentRejections,
		TestGuarantee_RelayLeaseTakeoverAfterCrashIsFenced,
		TestGuarantee_RelayPausedPastItsLeasePublishesNothing,
		TestGuarantee_RelayTakesOverAKilledInstancesShardsWithinTheLeaseTTL,
		TestRelaySharesShardsAmongInstances,
		TestRelayDeletesOnlyTheHeadItRelayed,
		TestRelayDeletesNoEntryAppendedBelowItsBatchAfterAFailover,
		TestRelayDoesNotPublishABatchAgainAfterARedisOutageLongerThanTheDuplicateWindow,
		TestATakeoverAfterTheDuplicateWindowTrimsTheBatchTheDeadRelayRecorded,
		TestAStaleRecordTrimsNothingAndIsDropped,
		TestARecordNATSRefusesIsLoggedCountedAndWrittenWithTheNextTrim,
		TestALaneWhoseRecordCannotBeReadIsNotRelayed,
		TestARelayHoldingALongerBatchThanTheLanesRecordTrimsItsOwn,
		TestARelayHoldingAShorterBatchThanTheLanesRecordTrimsTheRecorded,
		TestARelayKeepingItsLongerBatchRecordsItForTheNextHolder,
		TestARelayTriesTheShorterBatchWhenTheFurtherOneIsStale,
		TestAHolderWhoseRecordMeetsALongerOneFromTheSameHeadTrimsThatOne,
		TestARelayWhoseRetriedTrimFindsTheLeaseLostKeepsItsUnrecordedBatch,
		TestARelayWhoseFirstTrimFindsTheLeaseLostRecordsItsBatch,
		TestARelayThatLosesTheShardKeepsNoBatchItsRecordCarries,
		TestARenewalAnsweredBeforeTheTrimFoundTheLeaseLostDoesNotMakeItValid,
		TestARecordCreatedOverOneDeletedSinceTrimsNothing,
		TestARecordCreatedOverOneDeletedSinceDoesNotSupersedeTheHoldersBatch,
		TestARelayWhoseLeaseLapsedDoesNotOverwriteANewerHoldersRecord,
		TestRelayFindsEntriesAppendedBelowItsPositionAfterAFailover,
		TestCommitterRefusesWhenFull,
		TestCheckShardsRefusesAChange,
		TestRelayParksClicksEveryReaderWouldPark,
		TestGuarantee_RelayTakesOverADeadInstancesShardAfterTTL,
		TestRelayParkedClickIsRedrivenIntoItsPartition,
		TestRelayCountsAParkedEntryOnceWhenItsDeleteIsRetried,
		TestCommitterSubmitByAndWaitByEndAtTheDeadline,
		TestCommitterBoundHoldsWithTheDepthEstimate,
		TestCommitterLingersOnlyWhileClicksAreDense,
		// Not TestCommitterWaitOnARedisWithoutReplicas: it needs a Redis without replicas.
		// Not TestARelayWithoutTheRecordsBucketSaysSoOnce nor
		// TestARecordsBucketDeletedWhileInUseIsLookedUpAgain: a missing bucket
		// is NATS's side alone; Redis plays no part in what they check.
		// Not TestRedisMasterKilledUnderCommitLoad, TestShardsSpreadOverTheClusterMasters
		// nor TestCommitterWaitsForReplicasOnEachMaster: they run on a cluster already.
	)
}

// env is one test's Redis database, NATS server with the topology, and
// layout.
type env struct {
	rdb    redis.UniversalClient
	nats   *testenv.NATS
	nc     *nats.Conn
	js     jetstream.JetStream
	layout Layout
}

func newEnv(tb testing.TB, shards int) *env {
	tb.Helper()
	rdb := servers.RedisClient(tb)
	n := testenv.StartNATS(tb)
	nc := n.Connect(tb)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(2*time.Second))
	if err != nil {
		tb.Fatal(err)
	}
	o := topology.Defaults()
	o.Partitions = 3
	if err := topology.Apply(tb.Context(), js, o); err != nil {
		tb.Fatal(err)
	}
	return &env{rdb: rdb, nats: n, nc: nc, js: js, layout: NewLayout(shards)}
}

func (e *env) relay(instance string) *Relay { return e.relayOn(e.rdb, instance) }

// relayOn is a relay on the Redis client rdb (one a test can kill), which
// records its untrimmed batches in the env's NATS.
func (e *env) relayOn(rdb redis.UniversalClient, instance string) *Relay {
	return e.relayWith(rdb, instance, NewRecords(e.js))
}

// running is a relay running in a goroutine.
type running struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func start(r *Relay) *running {
	ctx, cancel := context.WithCancel(context.Background())
	rr := &running{cancel: cancel, done: make(chan struct{})}
	go func() { defer close(rr.done); _ = r.Run(ctx) }()
	return rr
}

func (rr *running) stop() { rr.cancel(); <-rr.done }

// addClicks puts n click entries for code into the outbox, as the committer
// would, and returns their event IDs in order.
func (e *env) addClicks(tb testing.TB, code string, n int) []string {
	tb.Helper()
	var ids []string
	pipe := e.rdb.Pipeline()
	for i := range n {
		c := testClick("acme", code, i)
		ids = append(ids, c.ID)
		data, _ := json.Marshal(c)
		Add(tb.Context(), pipe, e.layout.OutboxKey(e.layout.Shard(code), LaneClicks), c.ID, events.ClickSubject("acme", code), data)
	}
	if _, err := pipe.Exec(tb.Context()); err != nil {
		tb.Fatal(err)
	}
	return ids
}

// testClick is the i-th valid click of owner's code, as the handler writes it.
func testClick(owner, code string, i int) events.Click {
	return events.Click{V: events.ClickVersion, ID: events.NewID(), Time: time.Now().UTC(), Code: code, Owner: owner,
		Target: "https://example.com/", Visitor: "v", RequestID: fmt.Sprint(i)}
}

// storedIDs reads the Nats-Msg-Id of every message in stream, in order.
func storedIDs(tb testing.TB, js jetstream.JetStream, stream string) []string {
	tb.Helper()
	s, err := js.Stream(tb.Context(), stream)
	if err != nil {
		tb.Fatal(err)
	}
	info, err := s.Info(tb.Context())
	if err != nil {
		tb.Fatal(err)
	}
	var ids []string
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(tb.Context(), seq)
		if err != nil {
			tb.Fatalf("get %s seq %d: %v", stream, seq, err)
		}
		ids = append(ids, m.Header.Get(events.HeaderMsgID))
	}
	return ids
}

func count(js jetstream.JetStream, stream string) int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return -1
	}
	info, err := s.Info(ctx)
	if err != nil {
		return -1
	}
	return int(info.State.Msgs)
}

func (e *env) outboxLen(tb testing.TB) int64 {
	var n int64
	for s := range e.layout.Shards {
		for _, l := range Lanes {
			n += e.rdb.XLen(context.Background(), e.layout.OutboxKey(s, l)).Val()
		}
	}
	return n
}

// sameSequence fails unless got is want, in order, each once.
func sameSequence(tb testing.TB, what string, want, got []string) {
	tb.Helper()
	if len(got) != len(want) {
		tb.Fatalf("%s: %d messages, want %d", what, len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			tb.Fatalf("%s: message %d is %s, want %s", what, i, got[i], want[i])
		}
	}
}

var errCrash = errors.New("simulated crash between publish and delete")

// TestGuarantee_RelayStoppedBetweenPublishAndDeleteThenRestarted: the relay
// publishes a batch, JetStream acknowledges it, and the relay dies before
// its XDEL. A new relay publishes the same entries again from the outbox;
// the stream's duplicate window (Nats-Msg-Id = event ID) drops them, so each
// event is in the stream once, in order.
func TestGuarantee_RelayStoppedBetweenPublishAndDeleteThenRestarted(t *testing.T) {
	testenv.Parallel(t)
	e := newEnv(t, 1)
	ids := e.addClicks(t, "abc", 40)

	first := e.relay("first")
	var crashed atomic.Bool
	crashedCh := make(chan struct{})
	first.afterAcks = func(int, Lane, []string) error {
		if crashed.CompareAndSwap(false, true) {
			close(crashedCh)
		}
		return errCrash
	}
	r1 := start(first)
	<-crashedCh
	testenv.WaitFor(t, 10*time.Second, "the first batch in CLICKS", func() bool { return count(e.js, events.ClicksStream) >= 16 })
	r1.stop()
	if got := e.outboxLen(t); got != 40 {
		t.Fatalf("outbox holds %d entries after the crash, want all 40 (none deleted)", got)
	}

	r2 := start(e.relay("second"))
	defer r2.stop()
	testenv.WaitFor(t, 10*time.Second, "the outbox to empty", func() bool { return e.outboxLen(t) == 0 })
	sameSequence(t, "CLICKS", ids, storedIDs(t, e.js, events.ClicksStream))
}

// TestRelayParksPermanentRejections: an entry JetStream refuses for good
// (larger than CLICKS' 16 KiB message limit; an entry without an ID) is
// parked on DEAD_LETTER as dead.outbox.<reason> with the Snip-Dead headers
// and deleted, and the entries behind it are published: one bad entry does
// not block its shard.
func TestRelayParksPermanentRejections(t *testing.T) {
	testenv.Parallel(t)
	e := newEnv(t, 1)
	key := e.layout.OutboxKey(0, LaneClicks)
	before := e.addClicks(t, "abc", 3)
	big := testClick("acme", "abc", 99)
	big.Target = "https://example.com/" + strings.Repeat("x", 20<<10)
	bigID := big.ID
	bigData, _ := json.Marshal(big)
	Add(t.Context(), e.rdb, key, bigID, events.ClickSubject("acme", "abc"), bigData)
	e.rdb.XAdd(t.Context(), &redis.XAddArgs{Stream: key, Values: []any{"subject", "clicks.acme.abc", "data", "{}"}}) // no id
	after := e.addClicks(t, "abc", 3)

	r := e.relay("one")
	rr := start(r)
	defer rr.stop()
	testenv.WaitFor(t, 10*time.Second, "the outbox to empty", func() bool { return e.outboxLen(t) == 0 })
	sameSequence(t, "CLICKS", append(before, after...), storedIDs(t, e.js, events.ClicksStream))

	s, err := e.js.Stream(t.Context(), events.DeadLetterStream)
	if err != nil {
		t.Fatal(err)
	}
	parked, err := s.GetLastMsgForSubject(t.Context(), events.DeadLetterSubject("outbox", "too_large"))
	if err != nil {
		t.Fatalf("dead.outbox.too_large: %v", err)
	}
	// Package deadletter's ID scheme: the event ID, who parked it, and the
	// outbox entry's position in place of a stream sequence.
	if !strings.HasPrefix(parked.Header.Get(events.HeaderMsgID), bigID+":dead:outbox:") || parked.Header.Get(events.HeaderDeadSource) != events.ClicksStream ||
		parked.Header.Get(events.HeaderDeadSubject) != "clicks.acme.abc" || parked.Header.Get(events.HeaderDeadError) == "" ||
		parked.Header.Get(events.HeaderDeadGroup) != "outbox" || parked.Header.Get(events.HeaderDeadAttempts) != "1" {
		t.Fatalf("parked message headers: %v", parked.Header)
	}
	if _, err := s.GetLastMsgForSubject(t.Context(), events.DeadLetterSubject("outbox", "malformed")); err != nil {
		t.Fatalf("dead.outbox.malformed: %v", err)
	}
	// The metrics tell the two apart: the parked entries were deleted, not
	// published.
	published := counterValue(r.m.Published.WithLabelValues(LaneClicks.Name))
	parkedN := counterValue(r.m.Parked.WithLabelValues(LaneClicks.Name, "too_large")) + counterValue(r.m.Parked.WithLabelValues(LaneClicks.Name, "malformed"))
	if published != 6 || parkedN != 2 {
		t.Fatalf("relay_published_total = %v, relay_parked_total = %v; want 6 and 2", published, parkedN)
	}
}

// TestRelayParksClicksEveryReaderWouldPark: the relay applies the readers'
// rule of validity (events.ReadClick) before publishing: a click whose
// payload code or owner differs from its subject's, or dated 1999, is parked
// on dead.outbox.<reason> and never reaches CLICKS; the valid ones around it
// are published in order.
func TestRelayParksClicksEveryReaderWouldPark(t *testing.T) {
	testenv.Parallel(t)
	e := newEnv(t, 1)
	key := e.layout.OutboxKey(0, LaneClicks)
	before := e.addClicks(t, "abc", 2)
	add := func(subject string, c events.Click) {
		data, _ := json.Marshal(c)
		Add(t.Context(), e.rdb, key, c.ID, subject, data)
	}
	add(events.ClickSubject("acme", "abc"), testClick("acme", "other", 0))  // code mismatch
	add(events.ClickSubject("mallory", "abc"), testClick("acme", "abc", 1)) // owner mismatch
	old := testClick("acme", "abc", 2)
	old.Time = time.Date(1999, 6, 1, 0, 0, 0, 0, time.UTC)
	add(events.ClickSubject("acme", "abc"), old)
	after := e.addClicks(t, "abc", 2)

	rr := start(e.relay("one"))
	defer rr.stop()
	testenv.WaitFor(t, 10*time.Second, "the outbox to empty", func() bool { return e.outboxLen(t) == 0 })
	sameSequence(t, "CLICKS", append(before, after...), storedIDs(t, e.js, events.ClicksStream))
	s, err := e.js.Stream(t.Context(), events.DeadLetterStream)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		if m, err := s.GetMsg(t.Context(), seq); err == nil {
			got[m.Subject]++
		}
	}
	want := map[string]int{
		events.DeadLetterSubject("outbox", events.ReasonSubjectMismatch): 2,
		events.DeadLetterSubject("outbox", events.ReasonImplausibleTime): 1,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("dead letters = %v, want %v", got, want)
	}
}

// TestGuarantee_RelayLeaseTakeoverAfterCrashIsFenced: relay A holds the
// shard and "pauses" (a GC pause, a frozen VM) between publishing a batch
// and deleting it, past its lease. Relay B takes the shard over and relays
// everything. When A wakes up its XDEL is refused by the lease token (the
// fence), A lets the shard go, and every event is in CLICKS once, in order.
func TestGuarantee_RelayLeaseTakeoverAfterCrashIsFenced(t *testing.T) {
	testenv.Parallel(t)
	e := newEnv(t, 1)
	ids := e.addClicks(t, "abc", 50)

	a := e.relay("a")
	paused := make(chan struct{})
	resume := make(chan struct{})
	var once sync.Once
	a.afterAcks = func(int, Lane, []string) error {
		once.Do(func() { close(paused); <-resume })
		return nil
	}
	ra := start(a)
	defer ra.stop()
	<-paused
	// A is frozen mid-batch; its lease lapses (deleted here as expiry
	// would), so B can take the shard.
	e.rdb.Del(t.Context(), e.layout.LeaseKey(0))
	rb := start(e.relay("b"))
	defer rb.stop()
	testenv.WaitFor(t, 10*time.Second, "b to relay everything", func() bool { return count(e.js, events.ClicksStream) >= 50 && e.outboxLen(t) == 0 })
	close(resume)
	testenv.WaitFor(t, 10*time.Second, "a to lose the lease", func() bool {
		return testutilLeasesLost(a) >= 1
	})
	if got := counterValue(a.m.PublishErrors.WithLabelValues(LaneClicks.Name, "lease")); got != 1 {
		t.Fatalf("a's fenced XDEL refusals = %v, want 1", got)
	}
	sameSequence(t, "CLICKS", ids, storedIDs(t, e.js, events.ClicksStream))
	// A lives on: once B stops (and releases), A picks the shard up again.
	more := e.addClicks(t, "abc", 5)
	rb.stop()
	testenv.WaitFor(t, 10*time.Second, "a to relay new entries", func() bool { return count(e.js, events.ClicksStream) >= 55 })
	sameSequence(t, "CLICKS", append(ids, more...), storedIDs(t, e.js, events.ClicksStream))
}

// TestGuarantee_RelayPausedPastItsLeasePublishesNothing: relay A reads a
// batch and "pauses" (a GC pause, a frozen VM) before publishing it, past
// its lease: its renewals fail from then on (the lease is deleted here, as
// expiry would), and relay B takes the shard over and relays everything.
// When A wakes up it publishes nothing of the batch it read: the lease's
// deadline on A's own monotonic clock (the start of its last successful
// renewal plus the lease's life) has passed. What it would publish, the
// streams drop as duplicates only within their duplicate window.
func TestGuarantee_RelayPausedPastItsLeasePublishesNothing(t *testing.T) {
	testenv.Parallel(t)
	e := newEnv(t, 1)
	ids := e.addClicks(t, "abc", 50)

	a := e.relay("a")
	js := &countingJS{JetStream: a.js}
	a.js = js
	paused := make(chan struct{})
	resume := make(chan struct{})
	var once sync.Once
	a.beforeBatch = func(int, Lane) { once.Do(func() { close(paused); <-resume }) }
	ra := start(a)
	defer ra.stop()
	<-paused
	lapsed := time.Now()
	e.rdb.Del(t.Context(), e.layout.LeaseKey(0))
	rb := start(e.relay("b"))
	defer rb.stop()
	testenv.WaitFor(t, 10*time.Second, "b to relay everything", func() bool { return count(e.js, events.ClicksStream) >= 50 && e.outboxLen(t) == 0 })
	testenv.WaitFor(t, 10*time.Second, "a's lease deadline to pass", func() bool { return time.Since(lapsed) > leaseLife(a.cfg.LeaseTTL) })
	close(resume)
	testenv.WaitFor(t, 10*time.Second, "a to lose the lease", func() bool { return testutilLeasesLost(a) >= 1 })
	if n := js.published.Load(); n != 0 {
		t.Fatalf("a published %d entries of the batch it read before its pause, want none", n)
	}
	sameSequence(t, "CLICKS", ids, storedIDs(t, e.js, events.ClicksStream))
}

// countingJS counts a relay's publishes.
type countingJS struct {
	JetStream
	published atomic.Int64
}

func (c *countingJS) PublishMsgAsync(msg *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	c.published.Add(1)
	return c.JetStream.PublishMsgAsync(msg, opts...)
}

// TestGuarantee_RelayTakesOverADeadInstancesShardAfterTTL: an instance that
// dies holding leases (no release) leaves its shards until the leases
// expire: the surviving instance takes none of them while they live, then
// takes them all and publishes their backlog.
func TestGuarantee_RelayTakesOverADeadInstancesShardAfterTTL(t *testing.T) {
	testenv.Parallel(t)
	e := newEnv(t, 4)
	// The dead instance's leases, as a SIGKILLed process leaves them, with
	// time left to outlive the survivor's first rounds of balancing.
	for s := range 4 {
		if err := e.rdb.Set(t.Context(), e.layout.LeaseKey(s), "dead/instance", 8*time.Second).Err(); err != nil {
			t.Fatal(err)
		}
	}
	var want []string
	for _, code := range []string{"a1", "b2", "c3", "d4", "e5", "f6"} {
		want = append(want, e.addClicks(t, code, 5)...)
	}
	survivor := e.relay("survivor")
	rr := start(survivor)
	defer rr.stop()
	// A second heartbeat means the survivor's first balance, which looks
	// for free shards, is done.
	var beat float64
	testenv.WaitFor(t, 10*time.Second, "two heartbeats of the survivor", func() bool {
		score, err := e.rdb.ZScore(t.Context(), RelaysKey, "survivor").Result()
		if err != nil || beat == 0 {
			beat = score
			return false
		}
		return score > beat
	})
	for s := range 4 {
		if v, err := e.rdb.Get(t.Context(), e.layout.LeaseKey(s)).Result(); err != nil || v != "dead/instance" {
			t.Fatalf("lease of shard %d = %q, %v; want the dead instance's, still live for seconds", s, v, err)
		}
	}
	if held, n := gaugeValue(survivor.m.LeasesHeld), count(e.js, events.ClicksStream); held != 0 || n != 0 {
		t.Fatalf("while the dead instance's leases live, the survivor holds %v shards and relayed %d clicks; want none", held, n)
	}
	testenv.WaitFor(t, 20*time.Second, "the survivor to relay the dead instance's shards", func() bool {
		return count(e.js, events.ClicksStream) == len(want) && e.outboxLen(t) == 0
	})
}

// TestGuarantee_RelayTakesOverAKilledInstancesShardsWithinTheLeaseTTL: of
// two instances sharing 8 shards, one is killed (kill -9: its leases and
// its heartbeat stay behind). The survivor takes all 8 within LeaseTTL: the
// dead instance stops counting toward the survivor's
// fair share when its heartbeat lapses, which is when its leases do (were
// it counted longer, the survivor would take its old 4 and leave 4 waiting
// for the heartbeat to expire). Everything written after the kill is relayed.
func TestGuarantee_RelayTakesOverAKilledInstancesShardsWithinTheLeaseTTL(t *testing.T) {
	testenv.Parallel(t)
	e := newEnv(t, 8)
	const ttl = 2 * time.Second
	cfg := RelayConfig{Window: 16, LeaseTTL: ttl, Block: 100 * time.Millisecond, MaxBackoff: 200 * time.Millisecond}
	doomedRDB := testenv.AnotherClient(t, e.rdb)
	dead := &killed{}
	doomedRDB.AddHook(dead)
	cfg.Instance = "doomed"
	doomed := NewRelay(doomedRDB, e.js, e.nc.IsConnected, e.layout, cfg, slog.New(slog.DiscardHandler), NewMetrics(prometheus.NewRegistry()))
	cfg.Instance = "survivor"
	survivor := NewRelay(e.rdb, e.js, e.nc.IsConnected, e.layout, cfg, slog.New(slog.DiscardHandler), NewMetrics(prometheus.NewRegistry()))
	rd, rs := start(doomed), start(survivor)
	defer rs.stop()
	testenv.WaitFor(t, 20*time.Second, "4 shards each", func() bool {
		return gaugeValue(doomed.m.LeasesHeld) == 4 && gaugeValue(survivor.m.LeasesHeld) == 4
	})

	// kill -9: nothing the relay sends from now on reaches Redis, so
	// nothing is released. (Closing the client alone is not a kill on a
	// cluster: a closed cluster client retries each release until its
	// 2-second deadline, so the relay's stop outlasts its heartbeat.)
	dead.kill()
	_ = doomedRDB.Close()
	killed := time.Now()
	rd.stop()
	if n := e.rdb.ZCard(t.Context(), RelaysKey).Val(); n != 2 {
		t.Fatalf("%d relays in the heartbeat set after the kill, want the dead one still there (2)", n)
	}
	var n int
	for i := range 24 {
		n += len(e.addClicks(t, fmt.Sprintf("k%d", i), 2))
	}
	testenv.WaitFor(t, 4*ttl, "the survivor to hold all 8 shards", func() bool { return gaugeValue(survivor.m.LeasesHeld) == 8 })
	took := time.Since(killed)
	t.Logf("all 8 shards taken over %s after the kill (lease TTL %s)", took.Round(10*time.Millisecond), ttl)
	if bound := ttl + 300*time.Millisecond; took > bound { // 300 ms of scheduling slack on a loaded machine
		t.Errorf("takeover took %s, want within the lease TTL (%s with slack)", took, bound)
	}
	testenv.WaitFor(t, 15*time.Second, "everything written after the kill relayed", func() bool {
		return count(e.js, events.ClicksStream) == n && e.outboxLen(t) == 0
	})
}

// killed is a Redis client hook that, once kill is called, fails every
// command before it is sent: what a process killed with kill -9 sends.
type killed struct{ dead atomic.Bool }

var errKilled = errors.New("the relay's process was killed")

func (k *killed) kill() { k.dead.Store(true) }

func (k *killed) DialHook(next redis.DialHook) redis.DialHook { return next }

func (k *killed) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, c redis.Cmder) error {
		if k.dead.Load() {
			c.SetErr(errKilled)
			return errKilled
		}
		return next(ctx, c)
	}
}

func (k *killed) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if k.dead.Load() {
			for _, c := range cmds {
				c.SetErr(errKilled)
			}
			return errKilled
		}
		return next(ctx, cmds)
	}
}

// TestRelaySharesShardsAmongInstances: two live relays split the shards
// (each holds its fair share), and together relay everything.
func TestRelaySharesShardsAmongInstances(t *testing.T) {
	testenv.Parallel(t)
	e := newEnv(t, 8)
	a, b := e.relay("a"), e.relay("b")
	ra, rb := start(a), start(b)
	defer ra.stop()
	defer rb.stop()
	testenv.WaitFor(t, 15*time.Second, "4 shards each", func() bool {
		return gaugeValue(a.m.LeasesHeld) == 4 && gaugeValue(b.m.LeasesHeld) == 4
	})
	var n int
	for i := range 20 {
		n += len(e.addClicks(t, fmt.Sprintf("code%d", i), 3))
	}
	testenv.WaitFor(t, 15*time.Second, "everything relayed", func() bool { return count(e.js, events.ClicksStream) == n })
}

// TestCommitterRefusesWhenFull: at the configured depth the committer
// refuses with ErrFull without writing, and writes again once the depth
// drops.
func TestCommitterRefusesWhenFull(t *testing.T) {
	testenv.Parallel(t)
	e := newEnv(t, 1)
	m := NewMetrics(prometheus.NewRegistry())
	c := NewCommitter(e.rdb, e.layout, CommitterConfig{MaxBatch: 8, Workers: 1, MaxEntries: 3, Timeout: time.Second, Cooldown: time.Second}, m)
	c.Start()
	defer c.Close()
	for i := range 3 {
		if err := c.Append(t.Context(), 0, []byte(events.NewID()), []byte("clicks.acme.abc"), []byte("{}")); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
	}
	if err := c.Append(t.Context(), 0, []byte(events.NewID()), []byte("clicks.acme.abc"), []byte("{}")); !errors.Is(err, ErrFull) {
		t.Fatalf("append to a full shard: %v, want ErrFull", err)
	}
	if n := e.rdb.XLen(t.Context(), e.layout.OutboxKey(0, LaneClicks)).Val(); n != 3 {
		t.Fatalf("outbox holds %d, want 3", n)
	}
	mo := NewMonitor(e.rdb, e.layout, c, m, slog.New(slog.DiscardHandler))
	e.rdb.Del(t.Context(), e.layout.OutboxKey(0, LaneClicks)) // the relay caught up
	if _, err := mo.Sample(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := c.Append(t.Context(), 0, []byte(events.NewID()), []byte("clicks.acme.abc"), []byte("{}")); err != nil {
		t.Fatalf("append after the outbox drained: %v", err)
	}
}

// TestCheckShardsRefusesAChange: the shard count is fixed at first start.
func TestCheckShardsRefusesAChange(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	if err := CheckShards(t.Context(), rdb, NewLayout(16)); err != nil {
		t.Fatal(err)
	}
	if err := CheckShards(t.Context(), rdb, NewLayout(16)); err != nil {
		t.Fatalf("same count again: %v", err)
	}
	if err := CheckShards(t.Context(), rdb, NewLayout(8)); !errors.Is(err, ErrShardsChanged) {
		t.Fatalf("another count: %v, want ErrShardsChanged", err)
	}
}

// TestRelayParkedClickIsRedrivenIntoItsPartition: a click the relay parked
// before publishing it (larger than CLICKS allowed) is a dead letter like any
// other: once the cause is fixed (CLICKS takes larger messages), a redrive,
// which is what snipctl dlq redrive does, publishes it on
// clicks.<owner>.<code> and CLICKS stores it in the partition its code
// hashes to, with its payload unchanged; the dead letter is gone.
func TestRelayParkedClickIsRedrivenIntoItsPartition(t *testing.T) {
	testenv.Parallel(t)
	e := newEnv(t, 1)
	big := testClick("acme", "abc", 0)
	big.Target = "https://example.com/" + strings.Repeat("x", 20<<10)
	data, _ := json.Marshal(big)
	Add(t.Context(), e.rdb, e.layout.OutboxKey(0, LaneClicks), big.ID, events.ClickSubject("acme", "abc"), data)

	rr := start(e.relay("one"))
	defer rr.stop()
	testenv.WaitFor(t, 10*time.Second, "the outbox to empty", func() bool { return e.outboxLen(t) == 0 })
	if n := count(e.js, events.ClicksStream); n != 0 {
		t.Fatalf("CLICKS holds %d messages before the redrive, want 0", n)
	}
	var letter deadletter.Letter
	if err := deadletter.Each(t.Context(), e.js, deadletter.Filter("outbox", "too_large"), func(l deadletter.Letter) error {
		letter = l
		return nil
	}); err != nil || letter.Seq == 0 {
		t.Fatalf("dead.outbox.too_large: %v, letter %+v", err, letter)
	}

	// The fix: CLICKS takes the larger click.
	s, err := e.js.Stream(t.Context(), events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.MaxMsgSize = 64 << 10
	if _, err := e.js.UpdateStream(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	r, err := deadletter.Redrive(t.Context(), e.js, letter.Seq)
	if err != nil {
		t.Fatalf("redrive: %v", err)
	}
	if r.Subject != events.ClickSubject("acme", "abc") || r.Stream != events.ClicksStream {
		t.Fatalf("redriven to %s on %s, want %s on %s", r.Subject, r.Stream, events.ClickSubject("acme", "abc"), events.ClicksStream)
	}
	stored, err := s.GetMsg(t.Context(), r.Seq)
	if err != nil {
		t.Fatal(err)
	}
	if want := events.PartitionedClickSubject(3, "acme", "abc"); stored.Subject != want {
		t.Errorf("stored subject %q, want %q", stored.Subject, want)
	}
	if _, err := events.ReadClick(stored.Data, stored.Subject, 3, stored.Time); err != nil {
		t.Errorf("the redriven click fails the readers' rule of validity: %v", err)
	}
	if string(stored.Data) != string(data) {
		t.Error("the redriven payload differs from the parked one")
	}
	if _, err := deadletter.Get(t.Context(), e.js, letter.Seq); !errors.Is(err, deadletter.ErrNotFound) {
		t.Errorf("dead letter after the redrive: %v, want ErrNotFound", err)
	}
}

// TestRelayDeletesOnlyTheHeadItRelayed: a batch's delete (an exact XTRIM
// MINID past its last entry) removes what the batch relayed and nothing
// else: not the entries read after it in the same millisecond (the first
// batch is 16 of 40 entries added in one pipeline, so most share its last
// entry's millisecond), nor the entries appended while it was published.
// Every entry reaches CLICKS once, in order.
func TestRelayDeletesOnlyTheHeadItRelayed(t *testing.T) {
	testenv.Parallel(t)
	e := newEnv(t, 1)
	ids := e.addClicks(t, "abc", 40)
	r := e.relay("r")
	var once sync.Once
	var added []string
	r.afterAcks = func(_ int, _ Lane, relayed []string) error {
		once.Do(func() {
			if len(relayed) != 16 {
				t.Errorf("the first batch relayed %d entries, want the window, 16", len(relayed))
			}
			added = e.addClicks(t, "abc", 5) // appended between the publish and the delete
		})
		return nil
	}
	rr := start(r)
	defer rr.stop()
	// The 5 are added before the first batch's delete: the outbox is
	// empty only once the relay has had them all.
	testenv.WaitFor(t, 10*time.Second, "the outbox to empty", func() bool { return e.outboxLen(t) == 0 })
	sameSequence(t, "CLICKS", append(ids, added...), storedIDs(t, e.js, events.ClicksStream))
}

func TestNextStreamID(t *testing.T) {
	for in, want := range map[string]string{
		"1733400000000-0":                    "1733400000000-1",
		"1733400000000-41":                   "1733400000000-42",
		"1733400000000-18446744073709551615": "1733400000001-0",
	} {
		if got, err := nextStreamID(in); err != nil || got != want {
			t.Errorf("nextStreamID(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "1733400000000", "x-1", "1-x"} {
		if got, err := nextStreamID(bad); err == nil {
			t.Errorf("nextStreamID(%q) = %q, want an error", bad, got)
		}
	}
}

// TestRelayDeletesNoEntryAppendedBelowItsBatchAfterAFailover: a Redis
// failover (or a restart from older data) can leave the lane without the
// tail of a batch the relay has read and published, and the new master
// gives its next entries IDs at or below the batch's last one (its clock a
// little behind, or the same millisecond: here the very IDs of the lost
// entries). The batch's delete must not take those entries with it, and
// the relay must still find them: every click reaches CLICKS once, in
// order.
func TestRelayDeletesNoEntryAppendedBelowItsBatchAfterAFailover(t *testing.T) {
	testenv.Parallel(t)
	e := newEnv(t, 1)
	ids := e.addClicks(t, "abc", 16)
	key := e.layout.OutboxKey(0, LaneClicks)
	r := e.relay("r")
	var once sync.Once
	var added []string
	r.afterAcks = func(_ int, _ Lane, relayed []string) error {
		once.Do(func() {
			if len(relayed) != 16 {
				t.Errorf("the first batch relayed %d entries, want 16", len(relayed))
				return
			}
			// The new master has the batch up to its 10th entry only.
			ctx := t.Context()
			kept, err := e.rdb.XRange(ctx, key, "-", relayed[9]).Result()
			if err != nil {
				t.Error(err)
			}
			pipe := e.rdb.TxPipeline()
			pipe.Del(ctx, key)
			for _, m := range kept {
				pipe.XAdd(ctx, &redis.XAddArgs{Stream: key, ID: m.ID, Values: m.Values})
			}
			if _, err := pipe.Exec(ctx); err != nil {
				t.Error(err)
			}
			// Its next clicks take the IDs of the entries it lost.
			for i, sid := range relayed[10:13] {
				c := testClick("acme", "abc", 100+i)
				data, _ := json.Marshal(c)
				err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: key, ID: sid, Values: []any{fieldID, c.ID, fieldSubject, events.ClickSubject("acme", "abc"), fieldData, data}}).Err()
				if err != nil {
					t.Error(err)
				}
				added = append(added, c.ID)
			}
		})
		return nil
	}
	rr := start(r)
	defer rr.stop()
	testenv.WaitFor(t, 10*time.Second, "the outbox to empty", func() bool { return e.outboxLen(t) == 0 })
	// The relay deletes only what JetStream acknowledged: CLICKS has it all.
	sameSequence(t, "CLICKS", append(ids, added...), storedIDs(t, e.js, events.ClicksStream))
}

// TestRelayCountsAParkedEntryOnceWhenItsDeleteIsRetried: the batch that
// parked an entry fails before its delete (a Redis error, a crash, a lost
// lease), so the entry is parked again when the lane is retried (stored
// once on DEAD_LETTER: its dead-letter ID is the same). relay_parked_total
// counts it once, like relay_published_total counts what the relay deleted.
func TestRelayCountsAParkedEntryOnceWhenItsDeleteIsRetried(t *testing.T) {
	testenv.Parallel(t)
	e := newEnv(t, 1)
	key := e.layout.OutboxKey(0, LaneClicks)
	e.rdb.XAdd(t.Context(), &redis.XAddArgs{Stream: key, Values: []any{"subject", "clicks.acme.abc", "data", "{}"}}) // no id
	ids := e.addClicks(t, "abc", 2)
	r := e.relay("one")
	var failed atomic.Bool
	r.afterAcks = func(int, Lane, []string) error {
		if failed.CompareAndSwap(false, true) {
			return errCrash
		}
		return nil
	}
	rr := start(r)
	defer rr.stop()
	testenv.WaitFor(t, 10*time.Second, "the outbox to empty", func() bool { return e.outboxLen(t) == 0 })
	sameSequence(t, "CLICKS", ids, storedIDs(t, e.js, events.ClicksStream))
	if n := count(e.js, events.DeadLetterStream); n != 1 {
		t.Fatalf("DEAD_LETTER holds %d messages, want 1", n)
	}
	published := counterValue(r.m.Published.WithLabelValues(LaneClicks.Name))
	parked := counterValue(r.m.Parked.WithLabelValues(LaneClicks.Name, "malformed"))
	if published != 2 || parked != 1 {
		t.Fatalf("relay_published_total = %v, relay_parked_total = %v; want 2 and 1", published, parked)
	}
}

// TestRelayFindsEntriesAppendedBelowItsPositionAfterAFailover: the relay
// has relayed and deleted a batch; Redis fails over to a master that has
// none of it (nor its delete) and whose clock is behind, so its new
// entries take IDs below the last one the relay deleted, where its next
// read (from that ID) would not look (go-redis retries a read the
// failover broke, so the relay need not see an error). Once a read finds
// nothing for a whole Block, the next starts from the lane's head, and the
// new clicks reach CLICKS without waiting for an entry above that ID.
func TestRelayFindsEntriesAppendedBelowItsPositionAfterAFailover(t *testing.T) {
	testenv.Parallel(t)
	e := newEnv(t, 1)
	key := e.layout.OutboxKey(0, LaneClicks)
	ids := e.addClicks(t, "abc", 4)
	var relayed []string
	var mu sync.Mutex
	r := e.relay("r")
	r.afterAcks = func(_ int, _ Lane, batch []string) error {
		mu.Lock()
		defer mu.Unlock()
		relayed = append(relayed, batch...)
		return nil
	}
	rr := start(r)
	defer rr.stop()
	testenv.WaitFor(t, 10*time.Second, "the outbox to empty", func() bool { return e.outboxLen(t) == 0 })
	mu.Lock()
	first := relayed[0]
	mu.Unlock()

	// The new master: the lane as it was before the relay read it, less
	// every entry, its next clicks at IDs from the batch's first on.
	ms, _, _ := strings.Cut(first, "-")
	if err := e.rdb.Del(t.Context(), key).Err(); err != nil {
		t.Fatal(err)
	}
	var added []string
	for i := range 3 {
		c := testClick("acme", "abc", 100+i)
		data, _ := json.Marshal(c)
		err := e.rdb.XAdd(t.Context(), &redis.XAddArgs{Stream: key, ID: fmt.Sprintf("%s-%d", ms, i), Values: []any{fieldID, c.ID, fieldSubject, events.ClickSubject("acme", "abc"), fieldData, data}}).Err()
		if err != nil {
			t.Fatal(err)
		}
		added = append(added, c.ID)
	}
	testenv.WaitFor(t, 10*time.Second, "the outbox to empty again", func() bool { return e.outboxLen(t) == 0 })
	sameSequence(t, "CLICKS", append(ids, added...), storedIDs(t, e.js, events.ClicksStream))
}
