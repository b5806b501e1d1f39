package redisstore_test

import (
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/clickcounter/internal/counter"
	"github.com/snipdev/snip/services/clickcounter/internal/redisstore"
)

// hotWrite is a batch of n clicks of one link at now, applied over wm.
func hotWrite(p int, wm uint64, n int, code string, now time.Time) *counter.Write {
	w := &counter.Write{Partition: p, Expect: counter.State{Read: 1, Write: 1, WM: wm}, Delta: counter.NewDelta(),
		DedupTTL: time.Minute, LastSeq: wm + uint64(n), LastStored: now}
	for i := range n {
		c := events.Click{V: events.ClickVersion, ID: events.NewID(), Time: now, Code: code, Owner: "acme",
			Visitor: fmt.Sprintf("v%d", i), Country: "DE"}
		w.Delta.Add(&c, counter.Human, 1)
		m, _ := counter.ParseID(c.ID)
		w.Marks = append(w.Marks, counter.Mark{ID: c.ID, IDMark: m})
		w.Counted++
	}
	return w
}

// The click IDs of a batch go to the script packed; where a verdict label
// is recorded, the script unpacks them and looks them up, in commands of
// 1,000: a label that differs from the one assumed is reported for the
// right click, however far into the batch, and so is an assumed label no
// verdict recorded. With the labels assumed right, the batch is written.
func TestApplyReportsLabelsAnywhereInALargeBatch(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	s := redisstore.New(rdb)
	ctx := t.Context()
	now := time.Now().UTC()
	w := hotWrite(3, 0, 2500, "hot", now)
	labelled, assumed := 1500, 2200
	m := w.Marks[labelled]
	if err := rdb.HSet(ctx, "cc:{p3}:v:"+m.LabelDay().Key(), m.ID, "b:7").Err(); err != nil {
		t.Fatal(err)
	}
	w.Marks[assumed].Assumed = counter.Bot
	res, err := s.Apply(ctx, w)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int]counter.Label{labelled: counter.Bot, assumed: 0}
	if res.Status != counter.Recheck || len(res.Duplicates) != 0 || !maps.Equal(res.Labels, want) {
		t.Fatalf("Apply = %+v, want recheck with labels %v", res, want)
	}
	w.Marks[labelled].Assumed, w.Marks[assumed].Assumed = counter.Bot, 0
	if res, err := s.Apply(ctx, w); err != nil || res.Status != counter.Applied {
		t.Fatalf("Apply with the labels assumed = %+v, %v; want applied", res, err)
	}
	if n, err := rdb.HGet(ctx, "cc:{p3}:g1:l:acme:hot", "h|DE|(direct)").Int(); err != nil || n != 2500 {
		t.Fatalf("count = %d, %v; want 2500", n, err)
	}
	// The 2,500 visitors go to the script in one run and it adds them in
	// PFADDs of 1,000 (Lua's unpack fails beyond about 8,000): every run
	// reaches the day's HyperLogLog (its error is under 1% at this size).
	uv := "cc:{p3}:g1:u:acme:hot:" + now.Format("20060102")
	if n, err := rdb.PFCount(ctx, uv).Result(); err != nil || n < 2450 || n > 2550 {
		t.Fatalf("visitors = %d, %v; want about 2500", n, err)
	}
}

// The store sets a day or visitor key's expiry once (the day's end plus
// counter.DayKeep) and leaves the EXPIREAT out of later batches. If Redis
// loses data (here: the keys and the watermark), the next write conflicts,
// the state is read again, and the keys, created anew, get their expiry
// again.
func TestKeysGetTheirExpiryAgainAfterRedisLostThem(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	s := redisstore.New(rdb)
	ctx := t.Context()
	now := time.Now().UTC()
	day := counter.DayOf(now).Key()
	keys := []string{"cc:{p5}:g1:d:acme:exp:" + day, "cc:{p5}:g1:u:acme:exp:" + day}
	expiring := func(when string) {
		t.Helper()
		for _, k := range keys {
			ttl, err := rdb.TTL(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			// TTL counts whole seconds; the day ends within 24 hours.
			if ttl < counter.DayKeep-time.Second || ttl > counter.DayKeep+24*time.Hour {
				t.Fatalf("%s: TTL(%s) = %v, want the day's end plus %v", when, k, ttl, counter.DayKeep)
			}
		}
	}
	if _, err := s.State(ctx, 5); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if res, err := s.Apply(ctx, hotWrite(5, uint64(i*100), 100, "exp", now)); err != nil || res.Status != counter.Applied {
			t.Fatalf("batch %d: %+v, %v", i, res, err)
		}
		expiring(fmt.Sprintf("after batch %d", i))
	}
	// Redis loses the keys and the watermark.
	if err := rdb.Del(ctx, append(keys, "cc:{p5}:g1:pos")...).Err(); err != nil {
		t.Fatal(err)
	}
	if res, err := s.Apply(ctx, hotWrite(5, 300, 100, "exp", now)); err != nil || res.Status != counter.Conflict {
		t.Fatalf("write over the lost watermark = %+v, %v; want a conflict", res, err)
	}
	st, err := s.State(ctx, 5)
	if err != nil || st.WM != 0 {
		t.Fatalf("State = %+v, %v; want the watermark at 0", st, err)
	}
	if res, err := s.Apply(ctx, hotWrite(5, 0, 100, "exp", now)); err != nil || res.Status != counter.Applied {
		t.Fatalf("write after the reload = %+v, %v", res, err)
	}
	expiring("after the keys were lost")
}
