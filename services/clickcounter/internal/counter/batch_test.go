package counter_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/clickcounter/internal/counter"
	"github.com/snipdev/snip/services/clickcounter/internal/redisstore"
)

func TestBatchIsAggregatedIntoEveryDimension(t *testing.T) {
	t.Parallel()
	// The counter's clock stands still at the clicks' time: its series end
	// with the day and hour the clicks are in, even when the test runs
	// across midnight or the hour.
	now := time.Now().UTC()
	e := newEnv(t, withNow(func() time.Time { return now }))
	code := codeIn(t, 1, 0)
	var s seqs
	var cs []events.Click
	for i := range 5 {
		c := click("acme", code, now)
		c.Country = "de"
		if i == 4 {
			c.Country = ""
			c.Referrer = ""
		}
		cs = append(cs, c)
	}
	bot := click("acme", code, now)
	bot.Bot, bot.Country, bot.Referrer = true, "US", "https://www.Crawler.example:8443/x"
	cs = append(cs, bot)
	old := click("acme", code, now.Add(-26*time.Hour))
	old.Visitor = cs[0].Visitor // same visitor, another day: unique on each day
	cs = append(cs, old)
	mustHandle(t, e.c, 1, s.events(1, cs...))

	got := stats(t, e.c, "acme", code)
	if d := cmp.Diff(counter.Pair{Human: 6, Bot: 1}, got.Totals); d != "" {
		t.Errorf("totals (-want +got):\n%s", d)
	}
	wantCountries := []counter.Dimension{
		{Name: "DE", Pair: counter.Pair{Human: 5}},
		{Name: counter.UnknownCountry, Pair: counter.Pair{Human: 1}},
		{Name: "US", Pair: counter.Pair{Bot: 1}},
	}
	if d := cmp.Diff(wantCountries, got.TopCountries); d != "" {
		t.Errorf("countries (-want +got):\n%s", d)
	}
	wantRefs := []counter.Dimension{
		{Name: "news.example.org", Pair: counter.Pair{Human: 5}},
		{Name: counter.DirectReferrer, Pair: counter.Pair{Human: 1}},
		{Name: "crawler.example", Pair: counter.Pair{Bot: 1}},
	}
	if d := cmp.Diff(wantRefs, got.TopReferrers); d != "" {
		t.Errorf("referrers (-want +got):\n%s", d)
	}
	// A smaller top keeps the largest, in the same order.
	r := counter.DefaultRange()
	r.Top = 2
	top2, err := e.c.LinkStats(t.Context(), "acme", code, r)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(wantCountries[:2], top2.TopCountries); d != "" {
		t.Errorf("top 2 countries (-want +got):\n%s", d)
	}
	if d := cmp.Diff(wantRefs[:2], top2.TopReferrers); d != "" {
		t.Errorf("top 2 referrers (-want +got):\n%s", d)
	}
	today, yesterday := got.Daily[len(got.Daily)-1], got.Daily[len(got.Daily)-2]
	if oldDay := counter.DayOf(old.Time).String(); oldDay != yesterday.Day {
		yesterday = got.Daily[len(got.Daily)-3] // 26 hours ago can be two days back
	}
	if d := cmp.Diff(counter.DayStat{Day: counter.DayOf(now).String(), Pair: counter.Pair{Human: 5, Bot: 1}, Uniques: 5}, today); d != "" {
		t.Errorf("today (-want +got):\n%s", d)
	}
	if d := cmp.Diff(counter.DayStat{Day: counter.DayOf(old.Time).String(), Pair: counter.Pair{Human: 1}, Uniques: 1}, yesterday); d != "" {
		t.Errorf("day of the old click (-want +got):\n%s", d)
	}
	hours := map[time.Time]counter.Pair{}
	for _, h := range got.Hourly {
		hours[h.Hour] = h.Pair
	}
	if d := cmp.Diff(counter.Pair{Human: 5, Bot: 1}, hours[now.Truncate(time.Hour)]); d != "" {
		t.Errorf("this hour (-want +got):\n%s", d)
	}
	if d := cmp.Diff(counter.Pair{Human: 1}, hours[old.Time.Truncate(time.Hour)]); d != "" {
		t.Errorf("hour of the old click (-want +got):\n%s", d)
	}
	if len(got.Hourly) != counter.MaxHours || len(got.Daily) != counter.MaxDays {
		t.Errorf("series lengths = %d hours, %d days; want %d, %d", len(got.Hourly), len(got.Daily), counter.MaxHours, counter.MaxDays)
	}
	if got.AsOf.Seq != s.n || got.AsOf.Partition != 1 || got.AsOf.Generation != 1 || got.AsOf.Recount != nil {
		t.Errorf("as_of = %+v, want seq %d in partition 1, generation 1, no recount", got.AsOf, s.n)
	}
}

// A click's country is one part of the "<label>|<country>|<referrer>" field
// its link is counted under. A country that is not two ASCII letters ("a|"
// passes a length check) is counted as unknown, so it can neither show up as
// a country of its own nor shift the separator into the referrer when the
// field is read back.
func TestACountryWithASeparatorIsCountedAsUnknown(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	code := codeIn(t, 1, 0)
	var s seqs
	c := click("acme", code, time.Now().UTC())
	c.Country = "a|"
	mustHandle(t, e.c, 1, s.events(1, c))

	got := stats(t, e.c, "acme", code)
	if d := cmp.Diff([]counter.Dimension{{Name: counter.UnknownCountry, Pair: counter.Pair{Human: 1}}}, got.TopCountries); d != "" {
		t.Errorf("countries (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]counter.Dimension{{Name: "news.example.org", Pair: counter.Pair{Human: 1}}}, got.TopReferrers); d != "" {
		t.Errorf("referrers (-want +got):\n%s", d)
	}
}

// A batch of one hot link is folded before it is written: one link, one
// (country, referrer) combo, one hour make a handful of increments in
// Redis, not one per click. Counted with INFO commandstats, which is
// server-wide: the test has a redis-server of its own.
func TestHotLinkIsOneIncrementPerBatch(t *testing.T) {
	t.Parallel()
	rdb, _ := testenv.StartRedis(t).NewDB(t)
	e := &env{rdb: rdb, store: redisstore.New(rdb), reg: prometheus.NewRegistry()}
	e.first.Store(1)
	e.clicks = &fakeClicks{first: &e.first}
	e.c = e.newCounter(t, e.reg)
	code := codeIn(t, 0, 1)
	now := time.Now()
	var s seqs
	batch := make([]events.Click, 500)
	for i := range batch {
		batch[i] = click("acme", code, now)
	}
	before := commandCalls(t, rdb)
	mustHandle(t, e.c, 0, s.events(0, batch...))
	after := commandCalls(t, rdb)
	if got := stats(t, e.c, "acme", code).Totals; got.Human != 500 {
		t.Fatalf("human total = %d, want 500", got.Human)
	}
	// The link's combo, its day's total and hour, the partition's events:
	// a few HINCRBYs; the 500 visitors one PFADD.
	incr, pfadd := after["hincrby"]-before["hincrby"], after["pfadd"]-before["pfadd"]
	t.Logf("one batch of 500 clicks on one link: %d HINCRBY, %d PFADD", incr, pfadd)
	if incr == 0 || incr > 10 || pfadd != 1 {
		t.Errorf("one batch of 500 clicks on one link made %d HINCRBY and %d PFADD calls, want at most 10 and 1", incr, pfadd)
	}
}

// commandCalls returns the calls of each command the server has run, from
// INFO commandstats (commands run by scripts included).
func commandCalls(t *testing.T, rdb *redis.Client) map[string]int64 {
	t.Helper()
	info, err := rdb.Info(t.Context(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for line := range strings.SplitSeq(info, "\r\n") {
		name, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":calls=")
		if !ok || !strings.HasPrefix(line, "cmdstat_") {
			continue
		}
		n, err := strconv.ParseInt(rest[:strings.IndexByte(rest+",", ',')], 10, 64)
		if err != nil {
			t.Fatalf("commandstats line %q: %v", line, err)
		}
		out[name] = n
	}
	if len(out) == 0 {
		t.Fatalf("no commandstats in %q", info)
	}
	return out
}

func TestEachEventIsCountedOnce(t *testing.T) {
	t.Parallel()
	now := time.Now()
	tests := []struct {
		name string
		// batches builds the batches handed to the counter from the events
		// of one partition.
		batches  func(ev []reader.Event, s *seqs) [][]reader.Event
		want     int64
		wantKind string
	}{
		{
			name:     "redelivered_batch_is_skipped_by_watermark",
			batches:  func(ev []reader.Event, _ *seqs) [][]reader.Event { return [][]reader.Event{ev, ev} },
			want:     10,
			wantKind: "watermark",
		},
		{
			name: "replay_overlap_counts_only_the_new_events",
			batches: func(ev []reader.Event, _ *seqs) [][]reader.Event {
				return [][]reader.Event{ev[:6], ev[3:]}
			},
			want:     10,
			wantKind: "watermark",
		},
		{
			name: "event_stored_twice_under_two_sequences_is_counted_once",
			batches: func(ev []reader.Event, s *seqs) [][]reader.Event {
				again := s.event(ev[0].Partition, ev[2].Click) // the relay's second copy
				return [][]reader.Event{ev, {again}}
			},
			want:     10,
			wantKind: "event_id",
		},
		{
			name: "both_copies_in_one_batch_count_once",
			batches: func(ev []reader.Event, s *seqs) [][]reader.Event {
				return [][]reader.Event{append(ev, s.event(ev[0].Partition, ev[7].Click))}
			},
			want:     10,
			wantKind: "event_id",
		},
		{
			name: "second_copy_after_many_batches_is_caught",
			batches: func(ev []reader.Event, s *seqs) [][]reader.Event {
				var out [][]reader.Event
				for _, e := range ev {
					out = append(out, []reader.Event{e})
				}
				return append(out, []reader.Event{s.event(ev[0].Partition, ev[0].Click)})
			},
			want:     10,
			wantKind: "event_id",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			code := codeIn(t, 2, 0)
			var s seqs
			var cs []events.Click
			for range 10 {
				cs = append(cs, click("acme", code, now))
			}
			for _, b := range tc.batches(s.events(2, cs...), &s) {
				mustHandle(t, e.c, 2, b)
			}
			if got := stats(t, e.c, "acme", code).Totals.Human; got != tc.want {
				t.Errorf("human total = %d, want %d", got, tc.want)
			}
			if got := metric(t, e.reg, "snip_clickcounter_duplicates_total", map[string]string{"kind": tc.wantKind}); got < 1 {
				t.Errorf("duplicates_total{kind=%q} = %v, want >= 1", tc.wantKind, got)
			}
			if got := metric(t, e.reg, "snip_clickcounter_counted_total", map[string]string{"label": "human"}); got != float64(tc.want) {
				t.Errorf("counted_total{label=human} = %v, want %d", got, tc.want)
			}
		})
	}
}

// Two members that both believe they own a partition (a handover in
// progress) handle the same batches at once: the watermark's
// compare-and-set lets exactly one write each batch.
func TestConcurrentOwnersCountOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	other := e.newCounter(t, nil)
	code := codeIn(t, 3, 0)
	now := time.Now()
	var s seqs
	var batches [][]reader.Event
	for range 20 {
		var cs []events.Click
		for range 25 {
			cs = append(cs, click("acme", code, now))
		}
		batches = append(batches, s.events(3, cs...))
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for _, c := range []*counter.Counter{e.c, other} {
		wg.Go(func() {
			for _, b := range batches {
				if err := c.HandleBatch(context.Background(), 3, b); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("HandleBatch: %v", err)
	}
	if got := stats(t, e.c, "acme", code).Totals.Human; got != 500 {
		t.Fatalf("human total = %d, want 500", got)
	}
}

// The watermark's compare-and-set is what keeps a member that still thinks
// it owns a partition from counting a batch the new owner counted: the
// recent-ID record catches it only within the dedup window, and a member
// paused longer than that (kill -STOP, a long GC pause) resumes with the
// batch in hand and its old watermark cached. (TestConcurrentOwnersCountOnce
// passes without the compare-and-set: the record catches every copy there.)
func TestAStaleOwnerPastTheDedupWindowCountsNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, withWindow(time.Second))
	stale := e.newCounter(t, nil, withWindow(time.Second))
	const p = 3
	code := codeIn(t, p, 1)
	now := time.Now()
	var s seqs
	b := s.events(p, click("acme", code, now), click("acme", code, now), click("acme", code, now))
	if err := stale.OnAssign(t.Context(), p, 1); err != nil {
		t.Fatal(err)
	}
	// The partition moves on without the paused member: the new owner
	// counts the batch, and the record of its IDs expires.
	if err := e.c.OnAssign(t.Context(), p, 1); err != nil {
		t.Fatal(err)
	}
	mustHandle(t, e.c, p, b)
	deadline := time.Now().Add(5 * time.Second)
	for {
		keys, err := e.rdb.Keys(t.Context(), "cc:{p3}:g1:id:*").Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the recent-ID record %v did not expire within 5s of a 1s window", keys)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The paused member resumes with the same batch and its old watermark.
	mustHandle(t, stale, p, b)
	if got := stats(t, e.c, "acme", code).Totals; got != (counter.Pair{Human: 3}) {
		t.Fatalf("totals %+v, want 3 human: the stale owner counted the batch again", got)
	}
}

func TestWrongPartitionIsParkedAsPoison(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	good, bad := codeIn(t, 1, 0), codeIn(t, 2, 0)
	now := time.Now()
	var s seqs
	batch := s.events(1, click("acme", good, now), click("acme", good, now), click("acme", bad, now), click("acme", good, now))
	err := e.c.HandleBatch(t.Context(), 1, batch)
	var pe *reader.PoisonError
	if !errors.As(err, &pe) {
		t.Fatalf("HandleBatch error = %v, want a *reader.PoisonError", err)
	}
	if pe.Index != 2 || pe.Reason != counter.ReasonWrongPartition || !errors.Is(err, counter.ErrWrongPartition) {
		t.Fatalf("poison = index %d reason %q (%v), want index 2 reason %q", pe.Index, pe.Reason, err, counter.ReasonWrongPartition)
	}
	// The runtime acks what came before the poison and hands the rest again.
	if got := stats(t, e.c, "acme", good).Totals.Human; got != 2 {
		t.Fatalf("events before the poison: human total = %d, want 2", got)
	}
	mustHandle(t, e.c, 1, batch[3:])
	if got := stats(t, e.c, "acme", good).Totals.Human; got != 3 {
		t.Fatalf("after the rest: human total = %d, want 3", got)
	}
}

func TestCombosPerLinkAreCapped(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	code := codeIn(t, 0, 7)
	now := time.Now()
	var s seqs
	var cs []events.Click
	for i := range counter.MaxCombosPerLink + 40 {
		c := click("acme", code, now)
		c.Referrer = "https://site" + itoa(i) + ".example/"
		cs = append(cs, c)
	}
	for i := 0; i < len(cs); i += 100 { // several batches, so the cap is met across writes too
		mustHandle(t, e.c, 0, s.events(0, cs[i:min(i+100, len(cs))]...))
	}
	got, err := e.c.LinkStats(t.Context(), "acme", code, counter.Range{Hours: 1, Days: 1, Top: counter.MaxTop})
	if err != nil {
		t.Fatal(err)
	}
	fields, err := e.rdb.HLen(t.Context(), "cc:{p0}:g1:l:acme:"+code).Result()
	if err != nil {
		t.Fatal(err)
	}
	if fields > counter.MaxCombosPerLink+1 {
		t.Errorf("link hash has %d fields, want at most %d", fields, counter.MaxCombosPerLink+1)
	}
	var other int64
	for _, d := range got.TopReferrers {
		if d.Name == counter.OtherReferrer {
			other = d.Human
		}
	}
	if other != 40 {
		t.Errorf("%q referrer = %d clicks, want the 40 beyond the cap", counter.OtherReferrer, other)
	}
	// Totals and countries stay exact: only referrers are folded.
	if got.Totals.Human != int64(len(cs)) || got.TopCountries[0].Human != int64(len(cs)) {
		t.Errorf("total = %d, top country %+v; want %d each", got.Totals.Human, got.TopCountries[0], len(cs))
	}
}

// A field at 0 (its clicks moved to the other label by verdicts) is not
// new when a click comes back to it: a link one field under its cap with
// two such fields takes them and one new referrer in one batch without
// folding any into "(other)". (A script that counted a hash's fields from
// one read instead of reading them for each new-looking field would count
// the two as new and fold the third.)
func TestFieldsAtZeroDoNotFillTheCap(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	code := codeIn(t, 0, 8)
	key := "cc:{p0}:g1:l:acme:" + code
	var fill []any
	for i := range counter.MaxCombosPerLink - 1 {
		n := "1"
		if i < 2 {
			n = "0"
		}
		fill = append(fill, "h|DE|site"+itoa(i)+".example", n)
	}
	if err := e.rdb.HSet(t.Context(), key, fill...).Err(); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	var s seqs
	var cs []events.Click
	for _, i := range []int{0, 1, counter.MaxCombosPerLink} { // the two at 0, and one new
		c := click("acme", code, now)
		c.Referrer = "https://site" + itoa(i) + ".example/"
		cs = append(cs, c)
	}
	mustHandle(t, e.c, 0, s.events(0, cs...))
	got, err := e.rdb.HGetAll(t.Context(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != counter.MaxCombosPerLink {
		t.Errorf("link hash has %d fields, want %d (at the cap, none folded)", len(got), counter.MaxCombosPerLink)
	}
	for _, i := range []int{0, 1, counter.MaxCombosPerLink} {
		if f := "h|DE|site" + itoa(i) + ".example"; got[f] != "1" {
			t.Errorf("%s = %q, want 1", f, got[f])
		}
	}
	if v, ok := got["h|DE|"+counter.OtherReferrer]; ok {
		t.Errorf("%q = %s, want no field: nothing was over the cap", counter.OtherReferrer, v)
	}
}

// A batch far larger than Lua's unpack limit (about 8,000 values) on one
// link and day is written whole: its visitors and verdict-label lookups are
// split into several commands.
func TestHugeBatchOfOneLinkIsWrittenWhole(t *testing.T) {
	t.Parallel()
	now := time.Now()
	e := newEnv(t, withNow(func() time.Time { return now })) // today's series is the clicks' day
	code := codeIn(t, 1, 40)
	var s seqs
	cs := make([]events.Click, 10_000)
	for i := range cs {
		cs[i] = click("acme", code, now)
	}
	mustHandle(t, e.c, 1, s.events(1, cs...))
	got := stats(t, e.c, "acme", code)
	if got.Totals.Human != int64(len(cs)) {
		t.Fatalf("human total = %d, want %d", got.Totals.Human, len(cs))
	}
	if u := got.Daily[len(got.Daily)-1].Uniques; u < 9_800 || u > 10_200 {
		t.Fatalf("uniques = %d, want about 10,000 (HyperLogLog, ±0.81%%)", u)
	}
}
