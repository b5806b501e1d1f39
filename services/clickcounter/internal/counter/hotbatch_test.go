package counter_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/services/clickcounter/internal/counter"
)

// A viral link's clicks come in large batches of that one link: each batch
// is folded into a few increments, and batches that straddle the watermark
// (a replay overlap) or come again whole (a redelivery) add only the clicks
// not counted before. Every day and visitor key the batches create keeps
// its expiry, although the store sets it only once.
func TestHotLinkBatchesStraddlingTheMarkCountOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	code := codeIn(t, 1, 7)
	now := time.Now().UTC()
	var s seqs
	cs := make([]events.Click, 2500)
	for i := range cs {
		cs[i] = click("acme", code, now)
		cs[i].Bot = i%10 == 0
	}
	ev := s.events(1, cs...)
	mustHandle(t, e.c, 1, ev[:1500]) // the first 1,500
	mustHandle(t, e.c, 1, ev[1000:]) // straddles the mark: 500 counted before, 1,000 new
	mustHandle(t, e.c, 1, ev[1000:]) // redelivered whole
	mustHandle(t, e.c, 1, ev)        // a replay of everything
	mustHandle(t, e.c, 1, ev[2400:]) // the tail again
	got := stats(t, e.c, "acme", code)
	if got.Totals.Human != 2250 || got.Totals.Bot != 250 {
		t.Fatalf("totals = %+v, want 2250 human and 250 bot", got.Totals)
	}
	if w := metric(t, e.reg, "snip_clickcounter_duplicates_total", map[string]string{"kind": "watermark"}); w != 500+1500+2500+100 {
		t.Errorf("duplicates_total{kind=watermark} = %v, want %d", w, 500+1500+2500+100)
	}
	if c := metric(t, e.reg, "snip_clickcounter_counted_total", map[string]string{"label": "human"}); c != 2250 {
		t.Errorf("counted_total{label=human} = %v, want 2250", c)
	}
	for _, kind := range []string{"d", "u"} {
		key := fmt.Sprintf("cc:{p1}:g1:%s:acme:%s:%s", kind, code, now.Format("20060102"))
		ttl, err := e.rdb.TTL(t.Context(), key).Result()
		if err != nil {
			t.Fatal(err)
		}
		// TTL counts whole seconds; the day ends within 24 hours.
		if ttl < counter.DayKeep-time.Second || ttl > counter.DayKeep+24*time.Hour {
			t.Errorf("TTL(%s) = %v, want the day's end plus %v", key, ttl, counter.DayKeep)
		}
	}
}
