package redisstore_test

import (
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/fraud/internal/fraud"
	"github.com/snipdev/snip/services/fraud/internal/redisstore"
)

var servers *testenv.Servers

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, &servers, testenv.WithRedis(), testenv.WithRedisCluster()))
}

// TestOnRedisCluster runs the store's tests on a Redis Cluster.
func TestOnRedisCluster(t *testing.T) {
	servers.RunOnRedisCluster(t,
		TestApplyIsIdempotentByHighWaterMark,
		TestUnknownLink,
		TestAlertsAreKeptOncePerIDNewestFirstAndCapped,
		TestAlertCapDropsTheOldest,
		TestAlertCapTrimsThousandsAtOnce,
		TestApplyWaitsForReplicas,
		TestLabelCountersAreStoredAsOfTheMark,
		TestApplyRefusesABatchWhenTheMarkWentBack,
	)
}

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func newStore(t *testing.T, alertsCap int) *redisstore.Store {
	t.Helper()
	rdb := servers.RedisClient(t)
	return redisstore.New(rdb, 4, alertsCap)
}

// judgements returns one judgement per sequence from..to on link code; every
// third is a source bot, every fifth labelled by visitor_burst.
func judgements(code, owner string, from, to uint64) []fraud.Judgement {
	var js []fraud.Judgement
	for s := from; s <= to; s++ {
		j := fraud.Judgement{Seq: s, Code: code, Owner: owner, SourceBot: s%3 == 0, At: t0.Add(time.Duration(s) * time.Second)}
		if s%5 == 0 {
			j.Labels = []fraud.Label{{Seq: s, Rule: fraud.RuleVisitorBurst}}
		}
		js = append(js, j)
	}
	return js
}

func alert(id, owner string, at time.Time) events.FraudAlert {
	return events.FraudAlert{V: events.FraudVersion, ID: id, Rule: fraud.RuleVisitorBurst, Code: "abc", Owner: owner,
		WindowStart: at.Add(-time.Minute), WindowEnd: at, Count: 21, Threshold: 20, Time: at}
}

func TestApplyIsIdempotentByHighWaterMark(t *testing.T) {
	testenv.Parallel(t)
	s := newStore(t, 100)
	ctx := t.Context()
	p := events.Partition("abc", 4)
	all := judgements("abc", "acme", 1, 30)
	steps := []struct {
		name string
		js   []fraud.Judgement
	}{
		{"first_batch", all[0:10]},
		{"redelivered_batch_changes_nothing", all[0:10]},
		{"batch_cut_differently_overlapping_the_mark", all[5:20]},
		{"rest", all[20:30]},
		{"replay_of_everything_changes_nothing", all},
	}
	for _, st := range steps {
		if err := s.Apply(ctx, p, fraud.Batch{Judgements: st.js}); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
	}
	got, err := s.LinkStats(ctx, "abc")
	if err != nil {
		t.Fatal(err)
	}
	want := fraud.LinkStats{Code: "abc", Owner: "acme", Total: 30, Flagged: 10 + 6, Share: 16.0 / 30,
		ByRule: map[string]int64{fraud.RuleSourceBot: 10, fraud.RuleVisitorBurst: 6}}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("stats (-want +got):\n%s", d)
	}
	if hwm, _ := s.HighWater(ctx, p); hwm != 30 {
		t.Fatalf("high-water mark = %d, want 30", hwm)
	}
}

// TestLabelCountersAreStoredAsOfTheMark: a batch's label counters are
// written with its statistics, a hash per alert period that expires two
// periods after its last write, set (not added) and tagged with the mark
// they are as of; a redelivered batch changes none of them; LabelCounts
// reads them back with the mark.
func TestLabelCountersAreStoredAsOfTheMark(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	s := redisstore.New(rdb, 4, 100)
	ctx := t.Context()
	p := events.Partition("abc", 4)
	prev, cur := t0.Add(-time.Hour), t0
	at := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
	apply := func(js []fraud.Judgement, cs ...fraud.Count) {
		t.Helper()
		if err := s.Apply(ctx, p, fraud.Batch{Judgements: js, Counts: cs, Period: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	apply(judgements("abc", "acme", 1, 10),
		fraud.Count{Period: prev, Key: "aa", N: 12, LastAt: at(-1)},
		fraud.Count{Period: cur, Key: "bb", N: 3, LastAt: at(1)})
	apply(judgements("abc", "acme", 1, 10), fraud.Count{Period: cur, Key: "bb", N: 99, LastAt: at(9)}) // redelivered
	apply(judgements("abc", "acme", 11, 20), fraud.Count{Period: cur, Key: "bb", N: 5, LastAt: at(2)})

	mark, got, err := s.LabelCounts(ctx, p, time.Hour, []time.Time{prev, cur, t0.Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	want := []fraud.Count{
		{Period: prev, Key: "aa", N: 12, LastAt: at(-1), Mark: 10},
		{Period: cur, Key: "bb", N: 5, LastAt: at(2), Mark: 20},
	}
	if d := cmp.Diff(want, got); mark != 20 || d != "" {
		t.Fatalf("mark %d (want 20), counters (-want +got):\n%s", mark, d)
	}
	keys := testenv.Keys(t, rdb, "fraud:*:labels:*")
	if len(keys) != 2 {
		t.Fatalf("counter hashes %v, want one per period", keys)
	}
	for _, k := range keys {
		ttl, err := rdb.PTTL(ctx, k).Result()
		if err != nil || ttl <= time.Hour || ttl > 2*time.Hour {
			t.Fatalf("%s expires in %v (%v), want about two periods", k, ttl, err)
		}
	}
}

// TestApplyRefusesABatchWhenTheMarkWentBack: Redis lost the last batch (its
// database put back to a snapshot from before it, as a promoted replica
// leaves it); the next batch, which says the caller applied up to 20,
// writes nothing and reports the mark it found, so the caller can have the
// lost events handed again. Once they are, everything counts once.
func TestApplyRefusesABatchWhenTheMarkWentBack(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	s := redisstore.New(rdb, 4, 100)
	ctx := t.Context()
	p := events.Partition("abc", 4)
	all := judgements("abc", "acme", 1, 30)
	apply := func(js []fraud.Judgement, after uint64) error {
		return s.Apply(ctx, p, fraud.Batch{Judgements: js, After: after})
	}
	if err := apply(all[:10], 0); err != nil {
		t.Fatal(err)
	}
	// What the lost batch wrote, undone: the mark and the link's counts.
	before, err := rdb.HGetAll(ctx, "fraud:{p"+fmt.Sprint(p)+"}:link:abc").Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := apply(all[10:20], 10); err != nil {
		t.Fatal(err)
	}
	lose := rdb.TxPipeline()
	lose.Set(ctx, "fraud:{p"+fmt.Sprint(p)+"}:hwm", 10, 0)
	lose.HSet(ctx, "fraud:{p"+fmt.Sprint(p)+"}:link:abc", before)
	if _, err := lose.Exec(ctx); err != nil {
		t.Fatal(err)
	}

	err = apply(all[20:30], 20)
	var behind *fraud.StoreBehindError
	if !errors.As(err, &behind) || behind.Mark != 10 || behind.After != 20 || !errors.Is(err, fraud.ErrStoreBehind) {
		t.Fatalf("apply after the loss: %v, want the store behind at 10", err)
	}
	if hwm, _ := s.HighWater(ctx, p); hwm != 10 {
		t.Fatalf("mark = %d after a refused batch, want 10", hwm)
	}
	if err := apply(all[10:30], 10); err != nil { // handed again from 11
		t.Fatal(err)
	}
	got, err := s.LinkStats(ctx, "abc")
	if err != nil || got.Total != 30 || got.Flagged != 16 {
		t.Fatalf("stats = %+v, %v; want 16 of 30", got, err)
	}
}

func TestUnknownLink(t *testing.T) {
	testenv.Parallel(t)
	s := newStore(t, 100)
	if _, err := s.LinkStats(t.Context(), "nope"); !errors.Is(err, fraud.ErrUnknownLink) {
		t.Fatalf("err = %v, want ErrUnknownLink", err)
	}
}

func TestAlertsAreKeptOncePerIDNewestFirstAndCapped(t *testing.T) {
	testenv.Parallel(t)
	s := newStore(t, 3)
	ctx := t.Context()
	seq := uint64(0)
	apply := func(code string, alerts ...events.FraudAlert) {
		t.Helper()
		seq++
		if err := s.Apply(ctx, events.Partition(code, 4), fraud.Batch{Judgements: []fraud.Judgement{{Seq: seq, Code: code, Owner: "acme", Alerts: alerts}}}); err != nil {
			t.Fatal(err)
		}
	}
	// Alerts on links in different partitions, one raised twice (a replay).
	codes := []string{"a", "b", "c", "d", "e"}
	for i, code := range codes {
		a := alert(fmt.Sprintf("visitor_burst:%s:x:%d", code, i), "acme", t0.Add(time.Duration(i)*time.Minute))
		a.Code = code
		apply(code, a)
		apply(code, a)
	}
	apply("a", alert("other-owner", "globex", t0))

	got, err := s.RecentAlerts(ctx, "acme", 10)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, a := range got {
		ids = append(ids, a.ID)
	}
	// a..e are in partitions 0, 1, 2, 3, 0: the cap of 3 per partition
	// drops none. Across partitions the newest come first, no ID twice.
	want := []string{"visitor_burst:e:x:4", "visitor_burst:d:x:3", "visitor_burst:c:x:2", "visitor_burst:b:x:1", "visitor_burst:a:x:0"}
	if d := cmp.Diff(want, ids); d != "" {
		t.Fatalf("alerts (-want +got):\n%s", d)
	}
	got, _ = s.RecentAlerts(ctx, "acme", 2)
	if len(got) != 2 || got[0].ID != want[0] {
		t.Fatalf("limit 2: %+v", got)
	}
	if got, _ := s.RecentAlerts(ctx, "globex", 10); len(got) != 1 || got[0].Owner != "globex" {
		t.Fatalf("other owner: %+v", got)
	}
}

func TestAlertCapDropsTheOldest(t *testing.T) {
	testenv.Parallel(t)
	s := newStore(t, 3)
	ctx := t.Context()
	p := events.Partition("abc", 4)
	for i := range 5 {
		a := alert(fmt.Sprintf("id%d", i), "acme", t0.Add(time.Duration(i)*time.Hour))
		if err := s.Apply(ctx, p, fraud.Batch{Judgements: []fraud.Judgement{{Seq: uint64(i + 1), Code: "abc", Owner: "acme", Alerts: []events.FraudAlert{a}}}}); err != nil {
			t.Fatal(err)
		}
	}
	got, _ := s.RecentAlerts(ctx, "acme", 10)
	var ids []string
	for _, a := range got {
		ids = append(ids, a.ID)
	}
	if d := cmp.Diff([]string{"id4", "id3", "id2"}, ids); d != "" {
		t.Fatalf("alerts (-want +got):\n%s", d)
	}
}

// TestAlertCapTrimsThousandsAtOnce: FRAUD_ALERTS_PER_OWNER lowered from
// 10,000 to 1,000 under an owner holding 9,600 alerts in one partition. The
// next alert trims 8,601 at once, more than Lua's unpack takes in one
// call: the script must trim them all, not fail after counting the batch
// (Redis keeps a failing script's earlier writes, and without a mark every
// retry counted it again).
func TestAlertCapTrimsThousandsAtOnce(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	ctx := t.Context()
	code := "abc"
	p := events.Partition(code, 4)
	const held, capped = 9600, 1000
	many := make([]events.FraudAlert, held)
	for i := range many {
		many[i] = alert(fmt.Sprintf("id%05d", i), "acme", t0.Add(time.Duration(i)*time.Second))
	}
	before := redisstore.New(rdb, 4, 10000)
	if err := before.Apply(ctx, p, fraud.Batch{Judgements: []fraud.Judgement{{Seq: 1, Code: code, Owner: "acme", Alerts: many}}}); err != nil {
		t.Fatal(err)
	}
	after := redisstore.New(rdb, 4, capped)
	last := alert("id-last", "acme", t0.Add(held*time.Second))
	if err := after.Apply(ctx, p, fraud.Batch{Judgements: []fraud.Judgement{{Seq: 2, Code: code, Owner: "acme", Alerts: []events.FraudAlert{last}}}}); err != nil {
		t.Fatalf("apply with %d alerts over the cap: %v", held+1-capped, err)
	}
	got, err := after.RecentAlerts(ctx, "acme", capped)
	if err != nil {
		t.Fatal(err)
	}
	// The newest 1,000: id-last and id08601..id09599.
	if len(got) != capped || got[0].ID != "id-last" || got[1].ID != "id09599" || got[capped-1].ID != fmt.Sprintf("id%05d", held+1-capped) {
		t.Fatalf("%d alerts, newest %s, oldest %s; want %d, id-last to id%05d", len(got), got[0].ID, got[len(got)-1].ID, capped, held+1-capped)
	}
	set, bodies := fmt.Sprintf("fraud:{p%d}:alerts:acme", p), fmt.Sprintf("fraud:{p%d}:alertbody:acme", p)
	if n, m := rdb.ZCard(ctx, set).Val(), rdb.HLen(ctx, bodies).Val(); n != capped || m != capped {
		t.Fatalf("%s holds %d alerts and %s %d bodies, want %d each", set, n, bodies, m, capped)
	}
	if st, err := after.LinkStats(ctx, code); err != nil || st.Total != 2 {
		t.Fatalf("link stats %+v, %v; want 2 clicks counted once", st, err)
	}
}
