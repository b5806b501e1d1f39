package redisstore_test

import (
	"os"
	"slices"
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/clickcounter/internal/benchmix"
	"github.com/snipdev/snip/services/clickcounter/internal/counter"
	"github.com/snipdev/snip/services/clickcounter/internal/redisstore"
)

var servers *testenv.Servers

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &servers, testenv.WithRedis())) }

// BenchmarkApply measures one batch write of 500 clicks of the benchmix
// mix: the Redis side of counting, without NATS.
func BenchmarkApply(b *testing.B) {
	rdb, _ := servers.Redis.NewDB(b)
	s := redisstore.New(rdb)
	mix := benchmix.New()
	now := time.Now().UTC()
	var wm uint64
	_ = rdb.ConfigResetStat(b.Context()).Err()
	b.ReportAllocs()
	for b.Loop() {
		w := &counter.Write{Partition: 0, Expect: counter.State{Read: 1, Write: 1, WM: wm}, Delta: counter.NewDelta(), DedupTTL: time.Minute}
		for range 500 {
			c := mix.Click("acme", now)
			w.Delta.Add(&c, counter.LabelOf(c.Bot), 1)
			m, _ := counter.ParseID(c.ID)
			w.Marks = append(w.Marks, counter.Mark{ID: c.ID, IDMark: m})
			w.Counted++
		}
		w.LastSeq, w.LastStored = wm+1000, now
		res, err := s.Apply(b.Context(), w)
		if err != nil || res.Status != counter.Applied {
			b.Fatalf("apply: %+v, %v", res, err)
		}
		wm += 1000
	}
	b.ReportMetric(float64(b.N*500)/b.Elapsed().Seconds(), "events/s")
	if os.Getenv("CLICKCOUNTER_BENCH_STATS") != "" {
		info, _ := rdb.Info(b.Context(), "commandstats").Result()
		b.Log(info)
	}
}

// Dropping a generation deletes its keys and nothing else, on the
// partition's keys only.
func TestDropGenerationDeletesOnlyItsKeys(t *testing.T) {
	t.Parallel()
	rdb, _ := servers.Redis.NewDB(t)
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
	left, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(left)
	want := []string{"cc:{p10}:g1:pos", "cc:{p1}:g12:pos", "cc:{p1}:g2:pos", "cc:{p1}:meta"}
	if !slices.Equal(left, want) {
		t.Fatalf("keys left = %v, want %v", left, want)
	}
}
