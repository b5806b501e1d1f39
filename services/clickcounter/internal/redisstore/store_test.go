package redisstore_test

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/clickcounter/internal/benchmix"
	"github.com/snipdev/snip/services/clickcounter/internal/counter"
	"github.com/snipdev/snip/services/clickcounter/internal/redisstore"
)

var servers *testenv.Servers

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, &servers, testenv.WithRedis(), testenv.WithRedisCluster()))
}

// TestOnRedisCluster runs the store's tests on a Redis Cluster.
func TestOnRedisCluster(t *testing.T) {
	servers.RunOnRedisCluster(t,
		TestDropGenerationDeletesOnlyItsKeys,
		TestPipelinedScriptsSurviveAScriptFlush,
		TestApplyReportsLabelsAnywhereInALargeBatch,
		TestKeysGetTheirExpiryAgainAfterRedisLostThem,
		TestReplicatedWaitsForTheReplicas,
		TestPartitionKeysWrittenByNameStayInTheSlot,
	)
}

// BenchmarkApply measures one batch write of 2,000 clicks (the service's
// default batch): the Redis side of counting, without NATS. In the spread
// mix the clicks are on the benchmix's 10,000 links; in the hot mix all on
// one link.
func BenchmarkApply(b *testing.B) {
	for _, mix := range []string{"spread", "hot"} {
		b.Run(mix, func(b *testing.B) { benchApply(b, mix == "hot") })
	}
}

func benchApply(b *testing.B, hot bool) {
	rdb := servers.RedisClient(b)
	_ = rdb.ConfigResetStat(b.Context()).Err()
	n := applyBatches(b, rdb, hot, 2000, 0)
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "events/s")
	if os.Getenv("CLICKCOUNTER_BENCH_STATS") != "" {
		info, _ := rdb.Info(b.Context(), "commandstats").Result()
		b.Log(info)
	}
}

// BenchmarkApplyLive measures counting as a reader that keeps up does it:
// small batches of a partition receiving a steady rate, so the events' ID
// times advance with the rate rather than with the benchmark's own speed
// (BenchmarkApply's batches are as fast as Redis takes them). The
// recent-ID record's bucket a batch appends to then holds what the
// partition received in that bucket's span of ID time, which the batch's
// duplicate check reads: one partition of a viral link at 50,000 events/s
// (half of 100,000/s) read 250 at a time, and a spread partition at 12,500/s
// (100,000/s over 8) read 100 at a time.
func BenchmarkApplyLive(b *testing.B) {
	for _, c := range []struct {
		mix          string
		rate, events int
	}{{"hot", 50_000, 250}, {"spread", 12_500, 100}} {
		b.Run(fmt.Sprintf("%s/%d-per-s/batch-%d", c.mix, c.rate, c.events), func(b *testing.B) {
			benchApplyLive(b, c.mix == "hot", c.rate, c.events)
		})
	}
}

func benchApplyLive(b *testing.B, hot bool, rate, batch int) {
	applyBatches(b, servers.RedisClient(b), hot, batch, rate)
}

// applyBatches applies b.N batches of the benchmix mix (hot: one link) and
// reports Redis's CPU per click; it returns the clicks applied. With rate
// 0 the events' IDs carry the time they are made at; with a rate, ID times
// advance at that many events a second from the start.
func applyBatches(b *testing.B, rdb redis.UniversalClient, hot bool, batch, rate int) int {
	s := redisstore.New(rdb)
	mix := benchmix.New()
	if hot {
		mix = benchmix.NewHot()
	}
	start := time.Now().UTC()
	var wm uint64
	b.ReportAllocs()
	cpu0 := redisCPU(b)
	for b.Loop() {
		w := &counter.Write{Partition: 0, Expect: counter.State{Read: 1, Write: 1, WM: wm}, Delta: counter.NewDelta(), DedupTTL: time.Minute}
		for i := range batch {
			at := start
			if rate > 0 {
				at = start.Add(time.Duration(wm+uint64(i)) * time.Second / time.Duration(rate))
			}
			c := mix.Click("acme", at)
			if rate > 0 {
				c.ID = idAt(c.ID, at)
			}
			w.Delta.Add(&c, counter.LabelOf(c.Bot), 1)
			m, _ := counter.ParseID(c.ID)
			w.Marks = append(w.Marks, counter.Mark{ID: c.ID, IDMark: m})
			w.Counted++
		}
		w.LastSeq, w.LastStored = wm+uint64(batch), start
		res, err := s.Apply(b.Context(), w)
		if err != nil || res.Status != counter.Applied {
			b.Fatalf("apply: %+v, %v", res, err)
		}
		wm += uint64(batch)
	}
	b.ReportMetric(float64((redisCPU(b)-cpu0).Microseconds())/float64(b.N*batch), "redis_cpu_us/click")
	return b.N * batch
}

// idAt returns the UUIDv7 id with its millisecond timestamp set to t.
func idAt(id string, t time.Time) string {
	ts := fmt.Sprintf("%012x", t.UnixMilli())
	return ts[:8] + "-" + ts[8:] + id[13:]
}

// redisCPU reads the package redis-server's user+system CPU time from
// /proc/<pid>/stat (fields 14 and 15, in ticks of 1/100 s).
func redisCPU(b *testing.B) time.Duration {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", servers.Redis.PID()))
	if err != nil {
		b.Fatalf("redis-server CPU time: %v", err)
	}
	f := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+2:])) // f[0] is field 3
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("redis-server CPU time: parse %q", data)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// BenchmarkCorrect measures one partition's batch of 500 verdicts, each
// moving a click of the benchmix mix that was counted just before (the
// counting is not timed): the Redis side of the verdict path, without NATS.
// In the flood mix every click is on one link; in the spread mix they are
// on the mix's 10,000 links.
func BenchmarkCorrect(b *testing.B) {
	for _, mix := range []string{"flood", "spread"} {
		b.Run(mix, func(b *testing.B) { benchCorrect(b, mix == "flood") })
	}
}

func benchCorrect(b *testing.B, flood bool) {
	rdb := servers.RedisClient(b)
	s := redisstore.New(rdb)
	mix := benchmix.New()
	now := time.Now().UTC()
	var seq uint64
	var spent, cpu time.Duration
	_ = rdb.ConfigResetStat(b.Context()).Err()
	for b.Loop() {
		w := &counter.Write{Partition: 0, Expect: counter.State{Read: 1, Write: 1, WM: seq}, Delta: counter.NewDelta(), DedupTTL: time.Minute}
		batch := &counter.Corrections{Partition: 0, Expect: counter.State{Read: 1, Write: 1}}
		for range 500 {
			c := mix.Click("acme", now)
			if flood {
				c.Code = "flooded"
			}
			w.Delta.Add(&c, counter.LabelOf(c.Bot), 1)
			m, _ := counter.ParseID(c.ID)
			w.Marks = append(w.Marks, counter.Mark{ID: c.ID, IDMark: m})
			w.Counted++
			seq++
			batch.Items = append(batch.Items, counter.Correction{
				ClickID: c.ID, Mark: m, LabelDay: m.LabelDay(), FraudSeq: seq, To: counter.LabelOf(!c.Bot), Source: counter.LabelOf(c.Bot),
				ClickSeq: seq, Link: counter.LinkRef{Owner: c.Owner, Code: c.Code}, Day: counter.DayOf(now), Hour: now.Hour(),
				Country: counter.CountryOf(c.Country), Referrer: counter.ReferrerHost(c.Referrer), LabelExpiry: now.Add(time.Hour),
			})
		}
		w.LastSeq, w.LastStored = seq, now
		if res, err := s.Apply(b.Context(), w); err != nil || res.Status != counter.Applied {
			b.Fatalf("apply: %+v, %v", res, err)
		}
		start, cpu0 := time.Now(), redisCPU(b)
		res := s.Correct(b.Context(), []*counter.Corrections{batch})
		spent += time.Since(start)
		cpu += redisCPU(b) - cpu0
		if res[0].Err != nil || res[0].Conflict || len(res[0].Items) != 500 || res[0].Items[0].Status != counter.Relabelled {
			b.Fatalf("correct: %+v", res[0])
		}
	}
	b.ReportMetric(float64(b.N*500)/spent.Seconds(), "verdicts/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N*500), "redis_cpu_us/verdict")
	if os.Getenv("CLICKCOUNTER_BENCH_STATS") != "" {
		info, _ := rdb.Info(b.Context(), "commandstats").Result()
		b.Log(info)
	}
}

// Dropping a generation deletes its keys and nothing else, on the
// partition's keys only.
func TestDropGenerationDeletesOnlyItsKeys(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	s := redisstore.New(rdb)
	ctx := t.Context()
	for _, k := range []string{"cc:{p1}:g1:pos", "cc:{p1}:g1:l:a:b", "cc:{p1}:g12:pos", "cc:{p1}:g2:pos", "cc:{p10}:g1:pos", "cc:{p1}:meta"} {
		if err := rdb.Set(ctx, k, "x", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	gens, err := s.Generations(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(gens) != 3 || gens[0] != 1 || gens[1] != 2 || gens[2] != 12 {
		t.Fatalf("Generations(1) = %v, want [1 2 12]", gens)
	}
	if err := s.DropGeneration(ctx, 1, 1); err != nil {
		t.Fatal(err)
	}
	left := testenv.Keys(t, rdb, "*")
	slices.Sort(left)
	want := []string{"cc:{p10}:g1:pos", "cc:{p1}:g12:pos", "cc:{p1}:g2:pos", "cc:{p1}:meta"}
	if !slices.Equal(left, want) {
		t.Fatalf("keys left = %v, want %v", left, want)
	}
}

// The batched calls go out as EVALSHA in a pipeline; on a server that does
// not have the scripts (a new one, or after SCRIPT FLUSH) they are run
// again with the source, and nothing is applied twice.
func TestPipelinedScriptsSurviveAScriptFlush(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	s := redisstore.New(rdb)
	ctx := t.Context()
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	ev := func(code string) counter.LinkEvent {
		return counter.LinkEvent{E: &events.LinkEvent{V: events.LinkVersion, ID: events.NewID(), Kind: events.LinkCreated,
			Time: time.Now(), Code: code, Owner: "acme"}, Seq: 1}
	}
	applied, err := s.ApplyLinkEvents(ctx, []counter.LinkEvent{ev("a"), ev("b")})
	if err != nil || !slices.Equal(applied, []bool{true, true}) {
		t.Fatalf("ApplyLinkEvents after SCRIPT FLUSH = %v, %v; want both applied", applied, err)
	}
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	id := events.NewID()
	m, _ := counter.ParseID(id)
	batch := func(p int) *counter.Corrections {
		return &counter.Corrections{Partition: p, Expect: counter.State{Read: 1, Write: 1}, Items: []counter.Correction{{
			ClickID: id, LabelDay: m.LabelDay(), FraudSeq: 1, To: counter.Bot, Source: counter.Human, ClickSeq: 1,
			Link: counter.LinkRef{Owner: "acme", Code: "a"}, Day: counter.DayOf(now), Hour: now.Hour(),
			Country: "DE", Referrer: "(direct)", LabelExpiry: now.Add(time.Hour),
		}}}
	}
	for _, res := range s.Correct(ctx, []*counter.Corrections{batch(0), batch(1)}) {
		if res.Err != nil || res.Conflict || len(res.Items) != 1 || res.Items[0].Status != counter.Relabelled {
			t.Fatalf("Correct after SCRIPT FLUSH = %+v; want relabelled", res)
		}
	}
	for _, res := range s.Correct(ctx, []*counter.Corrections{batch(0)}) {
		if res.Err != nil || res.Items[0].Status != counter.Stale {
			t.Fatalf("Correct again = %+v; want stale", res)
		}
	}
}

// Two scripts write keys of the partition they are not handed in KEYS
// (they are in its slot): the recount's start writes the new generation's
// pos (its "first"), and the batch script deletes the recent-ID keys the
// partition's position has left a window behind, through the index. Both
// work on a cluster as on one server.
func TestPartitionKeysWrittenByNameStayInTheSlot(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	s := redisstore.New(rdb)
	ctx := t.Context()
	const p = 5
	st, started, err := s.StartGeneration(ctx, p, events.NewID(), "", 40, 100)
	if err != nil || !started || st.Write != 2 {
		t.Fatalf("StartGeneration = %+v, %v, %v; want generation 2 started", st, started, err)
	}
	if first, err := rdb.HGet(ctx, "cc:{p5}:g2:pos", "first").Result(); err != nil || first != "40" {
		t.Fatalf("the new generation's first = %q (%v), want 40", first, err)
	}
	start := time.Now().Add(-time.Hour).UTC()
	for i := range 3 { // three batches ten minutes of positions apart, window one minute
		at := start.Add(time.Duration(i) * 10 * time.Minute)
		c := events.Click{V: events.ClickVersion, ID: events.NewID(), Time: at, Code: "c", Owner: "acme"}
		c.ID = idAt(c.ID, at)
		m, _ := counter.ParseID(c.ID)
		w := &counter.Write{Partition: p, Expect: st, FirstSeq: st.WM + 1, LastSeq: st.WM + 1, LastStored: at,
			Delta: counter.NewDelta(), DedupTTL: time.Minute, Counted: 1, Marks: []counter.Mark{{ID: c.ID, IDMark: m}}}
		w.Delta.Add(&c, counter.Human, 1)
		if res, err := s.Apply(ctx, w); err != nil || res.Status != counter.Applied {
			t.Fatalf("Apply %d: %+v, %v", i, res, err)
		}
		st.WM++
	}
	if keys := testenv.Keys(t, rdb, "cc:{p5}:g2:id:*"); len(keys) != 1 {
		t.Errorf("recent-ID keys %v, want the last batch's alone", keys)
	}
}
