package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
)

// The committer skips XLEN while its estimate of a shard's depth is below
// half the bound; the bound still holds exactly for its own writes, and
// holds for entries another writer put there (another instance) once the
// depth is measured: by the monitor's sample, by an XLEN when the estimate
// reaches half the bound, and at least every second.
func TestCommitterBoundHoldsWithTheDepthEstimate(t *testing.T) {
	testenv.Parallel(t)
	e := newEnv(t, 2)
	c := NewCommitter(e.rdb, e.layout, CommitterConfig{MaxBatch: 8, Workers: 2, MaxEntries: 100, Timeout: time.Second, Cooldown: time.Second},
		NewMetrics(prometheus.NewRegistry()))
	c.Start()
	defer c.Close()
	appendUntilFull := func(shard, tries int) (ok int) {
		for range tries {
			err := c.Append(t.Context(), shard, []byte(events.NewID()), []byte("clicks.acme.abc"), []byte("{}"))
			switch {
			case err == nil:
				ok++
			case !errors.Is(err, ErrFull):
				t.Fatalf("append: %v", err)
			}
		}
		return ok
	}
	if ok := appendUntilFull(0, 150); ok != 100 {
		t.Fatalf("%d appends accepted on shard 0, want the bound, 100", ok)
	}
	if n := e.rdb.XLen(t.Context(), e.layout.OutboxKey(0, LaneClicks)).Val(); n != 100 {
		t.Fatalf("shard 0 holds %d, want 100", n)
	}

	// Another writer (another instance) fills shard 1 to 80 after this
	// committer measured it: the monitor's sample, which every instance
	// takes each SNIP_OUTBOX_SAMPLE_INTERVAL, brings them into the
	// estimate, and only 20 more go in.
	if appendUntilFull(1, 1) != 1 {
		t.Fatal("first append to shard 1 refused")
	}
	pipe := e.rdb.Pipeline()
	for i := range 79 {
		Add(t.Context(), pipe, e.layout.OutboxKey(1, LaneClicks), fmt.Sprintf("other-%d", i), "clicks.acme.other", []byte("{}"))
	}
	if _, err := pipe.Exec(t.Context()); err != nil {
		t.Fatal(err)
	}
	mo := NewMonitor(e.rdb, e.layout, c, NewMetrics(prometheus.NewRegistry()), slog.New(slog.DiscardHandler))
	if _, err := mo.Sample(t.Context()); err != nil {
		t.Fatal(err)
	}
	if ok := appendUntilFull(1, 100); ok != 20 {
		t.Fatalf("%d appends accepted on shard 1 holding 80, want 20", ok)
	}
	if n := e.rdb.XLen(context.Background(), e.layout.OutboxKey(1, LaneClicks)).Val(); n != 100 {
		t.Fatalf("shard 1 holds %d, want the bound, 100", n)
	}
}

// BenchmarkCommitDepth compares, in one run, the group commit measuring
// every written shard's depth (XLEN) on every commit, as it did before, with
// the estimate that skips it below half the bound: concurrent appends over
// 16 shards into a real Redis.
//
//	go test -run '^$' -bench CommitDepth -benchtime 200000x ./services/redirect/internal/outbox
func BenchmarkCommitDepth(b *testing.B) {
	for _, always := range []bool{true, false} {
		name := map[bool]string{true: "xlen-every-commit", false: "estimate"}[always]
		b.Run(name, func(b *testing.B) {
			rdb, _ := servers.Redis.NewDB(b)
			l := NewLayout(16)
			c := NewCommitter(rdb, l, CommitterConfig{MaxBatch: 256, Workers: 2, MaxEntries: 1 << 40, Timeout: time.Second, Cooldown: time.Second},
				NewMetrics(prometheus.NewRegistry()))
			c.alwaysLen = always
			c.Start()
			defer c.Close()
			data := []byte(`{"v":1,"id":"0193a5f0-0000-7000-8000-000000000000","code":"abc1234","owner":"acme","target":"https://example.com/landing","ua":"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36"}`)
			b.SetParallelism(32)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				id := []byte(events.NewID())
				for i := 0; pb.Next(); i++ {
					if err := c.Append(context.Background(), i%16, id, []byte("clicks.acme.abc1234"), data); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
