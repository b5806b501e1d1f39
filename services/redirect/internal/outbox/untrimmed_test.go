package outbox

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// TestRelayDoesNotPublishABatchAgainAfterARedisOutageLongerThanTheDuplicateWindow:
// JetStream acknowledges a batch, and Redis stops answering before the
// relay's trim; it answers again only once the stream's duplicate window has
// passed since the acks (here the window is made short; in production it is
// 2 minutes, and Redis restarts or fails over slower than that). The relay
// retries the trim of the batch it knows was acknowledged instead of reading
// the lane again and publishing the batch anew, which the stream would
// store twice: every click is in CLICKS once, in order, and counted once.
// The window (1 s) is longer than the relay's lease lives (540 ms), so the
// lease has lapsed in Redis by the time it answers again: the relay loses
// the shard and takes it again, and trims the batch then.
func TestRelayDoesNotPublishABatchAgainAfterARedisOutageLongerThanTheDuplicateWindow(t *testing.T) {
	testenv.Parallel(t)
	e := newEnv(t, 1)
	shortDuplicateWindow(t, e)
	ids := e.addClicks(t, "abc", 40)

	acked := make(chan struct{})
	r, down := e.killedAfterAcks(t, "r", nil, func([]string) { close(acked) })
	rr := start(r)
	defer rr.stop()
	<-acked

	// A probe published after the batch's acks: once the stream stores it
	// again, the window has passed for the batch too.
	probe := passDuplicateWindow(t, e)
	down.dead.Store(false) // Redis answers again

	relayedOnce(t, e, "r", ids, probe)
	if n := counterValue(r.m.Published.WithLabelValues(LaneClicks.Name)); n != 40 {
		t.Fatalf("relay_published_total = %v, want 40", n)
	}
	if n := testutilLeasesLost(r); n < 1 {
		t.Fatalf("relay_leases_lost_total = %v: the outage did not let the lease lapse", n)
	}
}

// TestARelayWhoseRetriedTrimFindsTheLeaseLostKeepsItsUnrecordedBatch:
// JetStream acknowledges a batch, Redis stops answering before the trim,
// and NATS refuses the batch's record too (its bucket is gone). When Redis
// answers again, past the duplicate window, the lease has lapsed there, and
// the relay's retried trim is the first to find it lost (its renewals still
// fail). The relay keeps the batch it knows was acknowledged, takes the
// shard again and trims it, rather than forget it and publish it anew:
// every click is in CLICKS once. Before, trimUntrimmed dropped the batch
// on the lost lease, and the 16 clicks of it were stored twice.
func TestARelayWhoseRetriedTrimFindsTheLeaseLostKeepsItsUnrecordedBatch(t *testing.T) {
	testenv.Parallel(t)
	e := newEnv(t, 1)
	shortDuplicateWindow(t, e)
	ids := e.addClicks(t, "abc", 40)

	renewals := &pipelinesFail{} // balance's heartbeat and renewals are pipelines; the trim is not
	r, down := e.killedAfterAcks(t, "r", nil, func([]string) {
		renewals.failing.Store(true)
		if err := e.js.DeleteKeyValue(context.Background(), topology.OutboxUntrimmedBucket); err != nil {
			t.Error(err)
		}
	})
	r.rdb.AddHook(renewals)
	rr := start(r)
	defer rr.stop()
	testenv.WaitFor(t, 10*time.Second, "the record refused", func() bool { return recordsCounted(r, "write_failed") >= 1 })
	probe := passDuplicateWindow(t, e) // longer than the lease lives: it has lapsed in Redis

	down.dead.Store(false) // Redis answers again, but for the renewals
	testenv.WaitFor(t, 10*time.Second, "the retried trim to find the lease lost", func() bool {
		return counterValue(r.m.PublishErrors.WithLabelValues(LaneClicks.Name, "lease")) >= 1
	})
	renewals.failing.Store(false)
	relayedOnce(t, e, "r", ids, probe)
	if n := counterValue(r.m.Published.WithLabelValues(LaneClicks.Name)); n != 40 {
		t.Fatalf("relay_published_total = %v, want 40", n)
	}
}

// pipelinesFail is a Redis client hook that, while failing, fails every
// pipeline and lets single commands through.
type pipelinesFail struct{ failing atomic.Bool }

func (p *pipelinesFail) DialHook(next redis.DialHook) redis.DialHook { return next }

func (p *pipelinesFail) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (p *pipelinesFail) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if p.failing.Load() {
			for _, c := range cmds {
				c.SetErr(errKilled)
			}
			return errKilled
		}
		return next(ctx, cmds)
	}
}

// TestARelayWhoseFirstTrimFindsTheLeaseLostRecordsItsBatch: JetStream
// acknowledges a batch, and the relay's first trim of it finds the lease
// another's (its lease lapsed in a stall, or a Redis failover lost it, and
// another instance took the shard). That holder relays nothing for longer
// than the duplicate window (it stalls itself: its NATS away, a paused VM),
// and the relay dies meanwhile. The relay recorded the batch, so the
// instance that relays the shard at last trims it and publishes only the
// rest: every click is in CLICKS once. Before, the relay dropped the batch
// on the lost lease, unrecorded, and its 16 clicks were stored twice.
func TestARelayWhoseFirstTrimFindsTheLeaseLostRecordsItsBatch(t *testing.T) {
	testenv.Parallel(t)
	e := newEnv(t, 1)
	shortDuplicateWindow(t, e)
	ids := e.addClicks(t, "abc", 40)

	a := e.relay("a")
	var once sync.Once
	a.afterAcks = func(int, Lane, []string) error {
		once.Do(func() {
			if err := e.rdb.Set(context.Background(), e.layout.LeaseKey(0), "x/stalled", 0).Err(); err != nil {
				t.Error(err)
			}
		})
		return nil
	}
	ra := start(a)
	testenv.WaitFor(t, 10*time.Second, "a's trim to find the lease lost", func() bool { return testutilLeasesLost(a) >= 1 })
	ra.stop() // a dies
	if got := e.outboxLen(t); got != 40 {
		t.Fatalf("outbox holds %d entries, want all 40: a's trim found the lease lost", got)
	}
	if n := recordsCounted(a, "written"); n != 1 {
		t.Fatalf("a wrote %v records, want 1", n)
	}
	probe := passDuplicateWindow(t, e)
	if err := e.rdb.Del(t.Context(), e.layout.LeaseKey(0)).Err(); err != nil { // the stalled holder dies
		t.Fatal(err)
	}

	takeOver(t, e, "b", ids, probe, counted{"applied": 1})
}

// TestARelayThatLosesTheShardKeepsNoBatchItsRecordCarries: a relay whose
// untrimmed batch is recorded in NATS loses the shard (its Redis answers
// again after its lease lapsed, and another instance holds it now): it
// keeps nothing of the lane in memory, since the record carries the batch
// to whoever takes the shard, itself included. (A batch whose record NATS
// refused is kept: TestARelayWhoseRetriedTrimFindsTheLeaseLostKeepsItsUnrecordedBatch,
// and ownAndAnother.) When the relay takes the shard again, past the
// duplicate window, it trims the batch from its record: every click once.
// Before, the batch stayed in memory until the relay exited, one per shard
// and lane, for shards it might never hold again.
func TestARelayThatLosesTheShardKeepsNoBatchItsRecordCarries(t *testing.T) {
	testenv.Parallel(t)
	e := newEnv(t, 1)
	shortDuplicateWindow(t, e)
	ids := e.addClicks(t, "abc", 40)

	a, down := e.killedAfterAcks(t, "a", nil, nil)
	ra := start(a)
	defer ra.stop()
	testenv.WaitFor(t, 10*time.Second, "a to record its untrimmed batch", func() bool { return recordsCounted(a, "written") == 1 })
	testenv.WaitFor(t, 10*time.Second, "a's lease to lapse", func() bool { return e.rdb.Exists(t.Context(), e.layout.LeaseKey(0)).Val() == 0 })
	if err := e.rdb.Set(t.Context(), e.layout.LeaseKey(0), "x/other", 0).Err(); err != nil {
		t.Fatal(err)
	}
	down.dead.Store(false) // Redis answers a again
	testenv.WaitFor(t, 10*time.Second, "a to lose the shard", func() bool { return testutilLeasesLost(a) >= 1 })
	if own := a.untrimmed[0][0]; own != nil {
		t.Fatalf("a keeps its batch of %d after losing the shard, though its record carries it", own.n)
	}

	probe := passDuplicateWindow(t, e)
	if err := e.rdb.Del(t.Context(), e.layout.LeaseKey(0)).Err(); err != nil { // the other instance dies
		t.Fatal(err)
	}
	relayedOnce(t, e, "a", ids, probe) // a takes the shard again
	if n := recordsCounted(a, "applied"); n != 1 {
		t.Fatalf("a applied %v records, want its own", n)
	}
	if n := counterValue(a.m.Published.WithLabelValues(LaneClicks.Name)); n != 40 {
		t.Fatalf("relay_published_total = %v, want 40", n)
	}
	noRecord(t, e, 0, LaneClicks)
}

// TestARenewalAnsweredBeforeTheTrimFoundTheLeaseLostDoesNotMakeItValid:
// relay r's balance renews the lease (Redis answers: still r's), and
// before it stores the renewed deadline, a Redis failover loses the lease
// and an instance x takes the shard: it publishes the whole lane (r's 16
// within the duplicate window), trims its first 32, fails the trim of the
// last 8, records that batch and dies. r's trim of its batch finds the
// lease x's and marks it lost; then balance stores the renewal's deadline.
// r's record write meets x's record, which starts at another entry: r must
// leave it (superseded), since x may hold the shard; a lease marked lost
// stays lost whatever a renewal answered before. c, taking the shard past
// the duplicate window, applies x's record: every click once. (r publishes
// nothing more either way: its shard loop ends on the lost lease.) Before,
// the late deadline made r's lease look valid again, r wrote its batch over
// x's record, c found it stale, and published x's 8 again.
func TestARenewalAnsweredBeforeTheTrimFoundTheLeaseLostDoesNotMakeItValid(t *testing.T) {
	testenv.Parallel(t)
	e := newEnv(t, 1)
	shortDuplicateWindow(t, e)
	ids := e.addClicks(t, "abc", 40)
	msgs := e.laneEntries(t)

	rdb := testenv.AnotherClient(t, e.rdb)
	gate := &renewalGate{renewed: make(chan struct{}), release: make(chan struct{})}
	rdb.AddHook(gate)
	kv := &beforeWriteKV{js: e.js}
	r := e.relayWith(rdb, "r", NewRecords(kv))
	r.cfg.LeaseTTL = 3 * time.Second // the renewed deadline lies well ahead
	kv.before = func() {
		// r's trim found the lease lost: let balance store the renewal's
		// deadline, and write once it has (its next heartbeat is sent).
		beats := gate.beats.Load()
		close(gate.release)
		for deadline := time.Now().Add(10 * time.Second); gate.beats.Load() == beats; {
			if time.Now().After(deadline) {
				t.Error("balance sent no heartbeat after the renewal was answered")
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	acked, xDone := pauseAfterAcks(r, func() {
		gate.armed.Store(true)
		<-gate.renewed
	})
	rr := start(r)
	defer rr.stop()
	<-acked
	// A failover lost r's lease, and x took the shard.
	if err := e.rdb.Set(t.Context(), e.layout.LeaseKey(0), "x/after-a-failover", 0).Err(); err != nil {
		t.Fatal(err)
	}
	publishEntries(t, e, msgs[16:]) // x relays the lane
	keep, err := nextStreamID(msgs[31].ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.XTrimMinID(t.Context(), e.layout.OutboxKey(0, LaneClicks), keep).Err(); err != nil { // x trims its first 32
		t.Fatal(err)
	}
	putRecord(t, e, 0, LaneClicks, "x", headBatch(t, msgs[32:])) // and records its last 8
	xDone()
	testenv.WaitFor(t, 10*time.Second, "r to lose the shard", func() bool { return testutilLeasesLost(r) >= 1 })
	rr.stop()
	if w, s := recordsCounted(r, "written"), recordsCounted(r, "superseded"); w != 0 || s != 1 {
		t.Fatalf("r counted %v records written and %v superseded, want 0 and 1: x's record kept", w, s)
	}

	probe := passDuplicateWindow(t, e)
	if err := e.rdb.Del(t.Context(), e.layout.LeaseKey(0)).Err(); err != nil { // x is dead
		t.Fatal(err)
	}
	takeOver(t, e, "c", ids, probe, counted{"applied": 1}) // x's record
}

// renewalGate is a Redis client hook that counts the heartbeats balance
// sends (a pipeline starting with ZADD) and, once armed, holds the answer
// of the next lease renewal (a pipeline of scripts) that Redis answered:
// it closes renewed, and returns the answer once release is closed.
type renewalGate struct {
	armed            atomic.Bool
	beats            atomic.Int64
	renewed, release chan struct{}
}

func (g *renewalGate) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *renewalGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (g *renewalGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && cmds[0].Name() == "zadd" {
			g.beats.Add(1)
		}
		err := next(ctx, cmds)
		if len(cmds) > 0 && (cmds[0].Name() == "eval" || cmds[0].Name() == "evalsha") && err == nil && g.armed.CompareAndSwap(true, false) {
			close(g.renewed)
			<-g.release
		}
		return err
	}
}

// beforeWriteKV is a JetStream context whose buckets call before (once)
// ahead of the first record write.
type beforeWriteKV struct {
	js     KeyValues
	before func()
	once   sync.Once
}

func (k *beforeWriteKV) KeyValue(ctx context.Context, bucket string) (jetstream.KeyValue, error) {
	kv, err := k.js.KeyValue(ctx, bucket)
	if err != nil {
		return nil, err
	}
	return beforeWriteBucket{KeyValue: kv, k: k}, nil
}

type beforeWriteBucket struct {
	jetstream.KeyValue
	k *beforeWriteKV
}

func (b beforeWriteBucket) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	b.k.once.Do(b.k.before)
	return b.KeyValue.Create(ctx, key, value, opts...)
}

func (b beforeWriteBucket) Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error) {
	b.k.once.Do(b.k.before)
	return b.KeyValue.Update(ctx, key, value, revision)
}
