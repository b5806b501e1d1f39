package counter_test

import (
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
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

// A catch-up (a recount, a backlog after an outage) counts hours of
// clicks in minutes, so its batches touch a 20 ms bucket of ID time for
// almost every click of a quiet link. The record keeps only what a copy
// still stored within the window can need: a bucket goes once the
// partition's position (the stored time of the events counted) has passed
// its events by the window, not DEDUP_WINDOW of wall time after the batch,
// which held every bucket of the last ten minutes of catch-up (the keys
// grew with the catch-up's speed, not with the window). A copy stored
// within the window of its first copy is still caught.
func TestRecentIDRecordOfACatchUpFollowsThePartitionsPosition(t *testing.T) {
	t.Parallel()
	const window = time.Minute
	e := newEnv(t, withWindow(window))
	const p = 3
	code := codeIn(t, p, 21)
	// Ten minutes of a quiet link, one click a second, an hour ago: each
	// click in its own bucket.
	start := time.Now().Add(-time.Hour).Truncate(time.Second)
	const n, batch = 600, 20
	var s seqs
	var all []reader.Event
	var copied events.Click
	for i := range n {
		at := start.Add(time.Duration(i) * time.Second)
		c := click("acme", code, at)
		c.ID = idAt(t, at)[:19] + events.NewID()[19:] // the time of at, a random tail
		all = append(all, s.event(p, c))
		if i == 100 {
			copied = c
		}
		if i == 130 { // the relay stored a copy 30 s later: within the window
			all = append(all, s.event(p, copied))
			all[len(all)-1].Stored = at
		}
	}
	for i := 0; i < len(all); i += batch {
		mustHandle(t, e.c, p, all[i:min(i+batch, len(all))])
	}
	keys, err := e.rdb.Keys(t.Context(), "cc:{p3}:g1:id:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	// The buckets of the last window of positions (60 clicks), and those
	// of the batch that reaches into it.
	if limit := int(window/time.Second) + batch; len(keys) > limit {
		t.Errorf("%d recent-ID keys after catching up %d clicks a second apart, want at most %d (the last %s of positions)",
			len(keys), n, limit, window)
	}
	members, err := e.rdb.ZCard(t.Context(), "cc:{p3}:g1:idx").Result()
	if err != nil || members != int64(len(keys)) {
		t.Errorf("the index holds %d keys (%v), want the %d recent-ID keys", members, err, len(keys))
	}
	if mem, err := e.rdb.MemoryUsage(t.Context(), "cc:{p3}:g1:idx").Result(); err == nil && members > 0 {
		t.Logf("%d recent-ID keys; the index: %d bytes, %.0f a key", len(keys), mem, float64(mem)/float64(members))
	}
	if got := stats(t, e.c, "acme", code).Totals; got != (counter.Pair{Human: n}) {
		t.Errorf("totals %+v, want %d human clicks (the copy counted once)", got, n)
	}
}
