package counter_test

import (
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/clickcounter/internal/counter"
)

// The recent-ID record is what keeps memory bounded at any rate: it holds 8
// bytes per event counted within the dedup window, and nothing older.
func TestRecentIDRecordIsBoundedByTheWindow(t *testing.T) {
	t.Parallel()
	const window = 2 * time.Second
	e := newEnv(t, withWindow(window))
	const p = 3
	code := codeIn(t, p, 20)
	now := time.Now()
	var s seqs
	const n = 2000
	for range n / 500 {
		var cs []events.Click
		for range 500 {
			cs = append(cs, click("acme", code, now))
		}
		mustHandle(t, e.c, p, s.events(p, cs...))
	}
	keys, err := e.rdb.Keys(t.Context(), "cc:{p3}:g1:id:*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("recent-ID keys = %v, %v; want some", keys, err)
	}
	var bytes, mem int64
	for _, k := range keys {
		ttl, err := e.rdb.PTTL(t.Context(), k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ttl <= 0 || ttl > window {
			t.Errorf("%s: TTL %s, want within (0, %s]", k, ttl, window)
		}
		l, err := e.rdb.StrLen(t.Context(), k).Result()
		if err != nil {
			t.Fatal(err)
		}
		bytes += l
		m, err := e.rdb.MemoryUsage(t.Context(), k).Result()
		if err != nil {
			t.Fatal(err)
		}
		mem += m
	}
	// 8 bytes per event, and each key's 20-byte header (the first
	// sequence it vouches for).
	if want := int64(n*counter.FingerprintLen + 20*len(keys)); bytes != want {
		t.Errorf("record holds %d bytes, want %d (8 per event, 20 per key)", bytes, want)
	}
	// Redis's own accounting: APPEND grows a string by doubling (up to 1 MB
	// at a time) and the allocator rounds up to its size class (up to 25%),
	// so at most 2.5 times the payload, plus a small per-key overhead.
	if limit := 5*bytes/2 + int64(len(keys))*256; mem > limit {
		t.Errorf("MEMORY USAGE of %d keys = %d bytes, want at most %d", len(keys), mem, limit)
	}
	t.Logf("%d events: %d keys, %d payload bytes, %d bytes in Redis (%.1f per event)", n, len(keys), bytes, mem, float64(mem)/n)
	testenv.WaitFor(t, 30*time.Second, "the recent-ID record to expire", func() bool {
		left, err := e.rdb.Keys(t.Context(), "cc:{p3}:g1:id:*").Result()
		return err == nil && len(left) == 0
	})
}
