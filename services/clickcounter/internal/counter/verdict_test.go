package counter_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/services/clickcounter/internal/counter"
)

// verdict returns a verdict about the event, as the fraud service builds it.
func verdict(ev reader.Event, bot bool) *events.FraudVerdict {
	c := ev.Click
	return &events.FraudVerdict{V: events.FraudVersion, ID: "v:" + c.ID, Partition: ev.Partition,
		FraudVerdictLabel: events.FraudVerdictLabel{ClickID: c.ID, ClickSeq: ev.Seq, Code: c.Code, Owner: c.Owner, Rule: "visitor_burst", Bot: bot, SourceBot: c.Bot, ClickTime: c.Time, Country: c.Country, Referrer: c.Referrer, Time: c.Time.Add(time.Second)}}
}

// view is what a verdict test compares: every place a click is counted.
type view struct {
	Total, Country, Referrer, Day, Hour counter.Pair
}

func viewOf(tb testing.TB, c *counter.Counter, owner, code string, at time.Time) view {
	tb.Helper()
	s := stats(tb, c, owner, code)
	var v view
	v.Total = s.Totals
	for _, d := range s.TopCountries {
		if d.Name == "DE" {
			v.Country = d.Pair
		}
	}
	for _, d := range s.TopReferrers {
		if d.Name == "news.example.org" {
			v.Referrer = d.Pair
		}
	}
	for _, d := range s.Daily {
		if d.Day == counter.DayOf(at).String() {
			v.Day = d.Pair
		}
	}
	for _, h := range s.Hourly {
		if h.Hour.Equal(at.UTC().Truncate(time.Hour)) {
			v.Hour = h.Pair
		}
	}
	return v
}

func all(p counter.Pair) view { return view{p, p, p, p, p} }

func TestVerdictsMoveClicksOnce(t *testing.T) {
	t.Parallel()
	type step struct {
		// verdict: apply a verdict about click 0 with this label and FRAUD
		// sequence; count: hand the clicks to the counter now.
		bot    bool
		fseq   uint64
		count  bool
		status counter.CorrectionStatus
	}
	tests := []struct {
		name  string
		steps []step
		want  counter.Pair
	}{
		{
			name:  "bot_verdict_moves_a_human_click",
			steps: []step{{count: true}, {bot: true, fseq: 1, status: counter.Relabelled}},
			want:  counter.Pair{Human: 2, Bot: 1},
		},
		{
			name: "the_same_verdict_redelivered_moves_nothing",
			steps: []step{{count: true}, {bot: true, fseq: 1, status: counter.Relabelled},
				{bot: true, fseq: 1, status: counter.Stale}},
			want: counter.Pair{Human: 2, Bot: 1},
		},
		{
			name: "the_same_verdict_published_twice_moves_once",
			steps: []step{{count: true}, {bot: true, fseq: 1, status: counter.Relabelled},
				{bot: true, fseq: 2, status: counter.Unchanged}},
			want: counter.Pair{Human: 2, Bot: 1},
		},
		{
			name: "a_human_verdict_moves_it_back_once",
			steps: []step{{count: true}, {bot: true, fseq: 1, status: counter.Relabelled},
				{bot: false, fseq: 5, status: counter.Relabelled}, {bot: false, fseq: 5, status: counter.Stale},
				{bot: false, fseq: 6, status: counter.Unchanged}},
			want: counter.Pair{Human: 3},
		},
		{
			name: "an_older_verdict_after_a_newer_one_is_stale",
			steps: []step{{count: true}, {bot: false, fseq: 9, status: counter.Unchanged},
				{bot: true, fseq: 4, status: counter.Stale}},
			want: counter.Pair{Human: 3},
		},
		{
			name:  "a_verdict_before_its_click_is_applied_when_the_click_is_counted",
			steps: []step{{bot: true, fseq: 1, status: counter.Relabelled}, {count: true}},
			want:  counter.Pair{Human: 2, Bot: 1},
		},
		{
			name: "verdicts_flipping_before_the_click_leave_the_last_label",
			steps: []step{{bot: true, fseq: 1, status: counter.Relabelled}, {bot: false, fseq: 2, status: counter.Relabelled},
				{bot: true, fseq: 3, status: counter.Relabelled}, {count: true}},
			want: counter.Pair{Human: 2, Bot: 1},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			code := codeIn(t, 2, 3)
			now := time.Now().UTC()
			var s seqs
			batch := s.events(2, click("acme", code, now), click("acme", code, now), click("acme", code, now))
			for i, st := range tc.steps {
				if st.count {
					mustHandle(t, e.c, 2, batch)
					continue
				}
				got, err := e.c.ApplyVerdict(t.Context(), verdict(batch[0], st.bot), st.fseq)
				if err != nil {
					t.Fatalf("step %d: ApplyVerdict: %v", i, err)
				}
				if got != st.status {
					t.Errorf("step %d: status = %d, want %d", i, got, st.status)
				}
			}
			if d := cmp.Diff(all(tc.want), viewOf(t, e.c, "acme", code, now)); d != "" {
				t.Errorf("counts (-want +got):\n%s", d)
			}
		})
	}
}

func TestVerdictForAClickPastRetentionIsRefused(t *testing.T) {
	t.Parallel()
	later := time.Now().Add(9 * 24 * time.Hour)
	e := newEnv(t, withNow(func() time.Time { return later }))
	code := codeIn(t, 1, 3)
	var s seqs
	ev := s.event(1, click("acme", code, time.Now()))
	got, err := e.c.ApplyVerdict(t.Context(), verdict(ev, true), 1)
	if err != nil {
		t.Fatal(err)
	}
	if got != counter.Expired {
		t.Fatalf("status = %d, want Expired", got)
	}
	if n, _ := e.rdb.Keys(t.Context(), "cc:*").Result(); len(n) != 0 {
		t.Fatalf("an expired verdict wrote %v", n)
	}
}

// Labels are kept by click ID for as long as CLICKS retains the click, so
// nothing outlives its use: the label hash of a day expires.
func TestVerdictLabelsExpire(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	code := codeIn(t, 1, 4)
	var s seqs
	ev := s.event(1, click("acme", code, time.Now()))
	if _, err := e.c.ApplyVerdict(t.Context(), verdict(ev, true), 1); err != nil {
		t.Fatal(err)
	}
	keys, err := e.rdb.Keys(t.Context(), "cc:{p1}:v:*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("label keys = %v (%v), want one", keys, err)
	}
	ttl, err := e.rdb.TTL(t.Context(), keys[0]).Result()
	if err != nil {
		t.Fatal(err)
	}
	if ttl <= 7*24*time.Hour || ttl > 10*24*time.Hour {
		t.Fatalf("label TTL = %s, want past CLICKS retention (7 days) and within 10 days", ttl)
	}
}
