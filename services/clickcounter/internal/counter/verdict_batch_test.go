package counter_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/services/clickcounter/internal/counter"
)

// Verdicts applied in batches, shuffled, concurrently, with duplicates,
// older verdicts after newer ones, and verdicts before their clicks, leave
// the counts as if each click had been counted once under its last label
// (the verdict with the highest FRAUD sequence, or its own Bot flag).
func TestVerdictBatchesLeaveEachClickUnderItsLastLabel(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := rand.New(rand.NewPCG(7, 11))
	now := time.Now().UTC()
	var s seqs
	type link struct {
		p    int
		code string
		evs  []reader.Event
	}
	var links []*link
	for p := range partitions {
		for i := range 2 {
			links = append(links, &link{p: p, code: codeIn(t, p, 100+i)})
		}
	}
	// 20 clicks of each link are counted before the verdicts, 10 more after
	// (CLICKS order: per partition, increasing sequences).
	for _, n := range []int{20, 10} {
		for _, l := range links {
			for range n {
				c := click("acme", l.code, now)
				c.Bot = r.IntN(5) == 0
				l.evs = append(l.evs, s.event(l.p, c))
			}
		}
	}
	for _, l := range links {
		mustHandle(t, e.c, l.p, l.evs[:20])
	}
	last := map[string]struct {
		seq uint64
		bot bool
	}{}
	var vs []counter.Verdict
	fseq := uint64(0)
	for _, l := range links {
		for _, ev := range l.evs {
			for range r.IntN(4) { // 0 to 3 verdicts a click
				fseq++
				v := counter.Verdict{V: verdict(ev, r.IntN(2) == 0), Seq: fseq}
				vs = append(vs, v)
				if r.IntN(4) == 0 { // published twice, or redelivered
					vs = append(vs, v)
				}
				last[ev.Click.ID] = struct {
					seq uint64
					bot bool
				}{fseq, v.V.Bot}
			}
		}
	}
	r.Shuffle(len(vs), func(i, j int) { vs[i], vs[j] = vs[j], vs[i] })
	// Two appliers at once, in batches of varied sizes, as the feed's
	// workers (or two counter instances) would.
	var wg sync.WaitGroup
	for w := range 2 {
		var mine []counter.Verdict
		for i := w; i < len(vs); i += 2 {
			mine = append(mine, vs[i])
		}
		var sizes []int // drawn here: r is not safe for concurrent use
		for left := len(mine); left > 0; {
			n := min(left, 1+r.IntN(40))
			sizes = append(sizes, n)
			left -= n
		}
		wg.Go(func() {
			for _, n := range sizes {
				for i, res := range e.c.ApplyVerdicts(t.Context(), mine[:n]) {
					if res.Err != nil {
						t.Errorf("verdict %s: %v", mine[i].V.ID, res.Err)
					}
				}
				mine = mine[n:]
			}
		})
	}
	wg.Wait()
	for _, l := range links {
		mustHandle(t, e.c, l.p, l.evs[20:])
	}
	for _, l := range links {
		var want counter.Pair
		for _, ev := range l.evs {
			bot := ev.Click.Bot
			if v, ok := last[ev.Click.ID]; ok {
				bot = v.bot
			}
			want.Add(counter.LabelOf(bot), 1)
		}
		if d := cmp.Diff(all(want), viewOf(t, e.c, "acme", l.code, now)); d != "" {
			t.Errorf("link %s (-want +got):\n%s", l.code, d)
		}
	}
}

// Within one batch, verdicts take effect in FRAUD order, whatever their
// order in the batch; each gets its own result.
func TestVerdictBatchResults(t *testing.T) {
	t.Parallel()
	type item struct {
		click int // index of the click (of 2)
		bot   bool
		fseq  uint64
		// badID: the verdict names a click ID that is not a UUID; old: a click
		// from past CLICKS retention.
		badID, old bool
	}
	tests := []struct {
		name  string
		batch []item
		want  []counter.CorrectionStatus // -2: a permanent error
		total counter.Pair
	}{
		{
			name:  "a_later_verdict_earlier_in_the_batch_still_wins",
			batch: []item{{bot: true, fseq: 5}, {bot: false, fseq: 3}},
			want:  []counter.CorrectionStatus{counter.Relabelled, counter.Unchanged},
			total: counter.Pair{Human: 1, Bot: 1},
		},
		{
			name:  "a_flip_and_back_in_one_batch_moves_twice",
			batch: []item{{bot: false, fseq: 8}, {bot: true, fseq: 7}},
			want:  []counter.CorrectionStatus{counter.Relabelled, counter.Relabelled},
			total: counter.Pair{Human: 2},
		},
		{
			name:  "the_same_verdict_twice_in_a_batch_moves_once",
			batch: []item{{bot: true, fseq: 4}, {bot: true, fseq: 4}, {click: 1, bot: true, fseq: 6}},
			want:  []counter.CorrectionStatus{counter.Relabelled, counter.Stale, counter.Relabelled},
			total: counter.Pair{Bot: 2},
		},
		{
			name:  "a_malformed_or_expired_verdict_leaves_the_rest_applied",
			batch: []item{{badID: true, bot: true, fseq: 1}, {old: true, bot: true, fseq: 2}, {click: 1, bot: true, fseq: 3}},
			want:  []counter.CorrectionStatus{-2, counter.Expired, counter.Relabelled},
			total: counter.Pair{Human: 1, Bot: 1},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			code := codeIn(t, 3, 5)
			now := time.Now().UTC()
			var s seqs
			evs := s.events(3, click("acme", code, now), click("acme", code, now))
			mustHandle(t, e.c, 3, evs)
			var vs []counter.Verdict
			for _, it := range tc.batch {
				v := verdict(evs[it.click], it.bot)
				switch {
				case it.badID:
					v.ClickID = "not-a-uuid"
				case it.old:
					v.ClickID = idAt(t, now.Add(-10*24*time.Hour))
				}
				vs = append(vs, counter.Verdict{V: v, Seq: it.fseq})
			}
			var got []counter.CorrectionStatus
			for _, r := range e.c.ApplyVerdicts(t.Context(), vs) {
				switch {
				case errors.Is(r.Err, events.ErrMalformed):
					got = append(got, -2)
				case r.Err != nil:
					t.Fatalf("unexpected error: %v", r.Err)
				default:
					got = append(got, r.Status)
				}
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("statuses (-want +got):\n%s", d)
			}
			if d := cmp.Diff(all(tc.total), viewOf(t, e.c, "acme", code, now)); d != "" {
				t.Errorf("counts (-want +got):\n%s", d)
			}
		})
	}
}

// idAt returns a UUIDv7 whose time is t.
func idAt(tb testing.TB, t time.Time) string {
	tb.Helper()
	ms := uint64(t.UnixMilli())
	id := fmt.Sprintf("%08x-%04x-7abc-8def-0123456789ab", ms>>16, ms&0xffff)
	if m, err := counter.ParseID(id); err != nil || !m.Time.Equal(t.Truncate(time.Millisecond)) {
		tb.Fatalf("idAt(%s) = %s: %v, %v", t, id, m.Time, err)
	}
	return id
}

// A verdict that would add a field to a link already at its cap moves the
// click to the "(other)" referrer of its new label, as counting does, and
// moving it back finds it there.
func TestVerdictIntoAFullLinkGoesToOther(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	code := codeIn(t, 0, 9)
	now := time.Now().UTC()
	var s seqs
	var evs []reader.Event
	for i := range counter.MaxCombosPerLink {
		c := click("acme", code, now)
		c.Referrer = "https://site" + itoa(i) + ".example/"
		evs = append(evs, s.event(0, c))
	}
	for i := 0; i < len(evs); i += 200 {
		mustHandle(t, e.c, 0, evs[i:min(i+200, len(evs))])
	}
	key := "cc:{p0}:g1:l:acme:" + code
	fields := func() map[string]string {
		m, err := e.rdb.HGetAll(t.Context(), key).Result()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, f := range []string{"h|DE|site0.example", "b|DE|site0.example", "h|DE|(other)", "b|DE|(other)"} {
			if v, ok := m[f]; ok {
				out[f] = v
			}
		}
		if len(m) > counter.MaxCombosPerLink+2 {
			t.Errorf("link hash has %d fields, want at most %d", len(m), counter.MaxCombosPerLink+2)
		}
		return out
	}
	// To bot: "b|DE|site0.example" would be the 513th field.
	if st, err := e.c.ApplyVerdict(t.Context(), verdict(evs[0], true), 1); err != nil || st != counter.Relabelled {
		t.Fatalf("bot verdict: %v, %v", st, err)
	}
	if d := cmp.Diff(map[string]string{"h|DE|site0.example": "0", "b|DE|(other)": "1"}, fields()); d != "" {
		t.Errorf("after the bot verdict (-want +got):\n%s", d)
	}
	// Back to human: it leaves "(other)". Its referrer's field is empty and
	// the link over its cap, so it is counted under the human "(other)", as
	// a click counted now would be.
	if st, err := e.c.ApplyVerdict(t.Context(), verdict(evs[0], false), 2); err != nil || st != counter.Relabelled {
		t.Fatalf("human verdict: %v, %v", st, err)
	}
	if d := cmp.Diff(map[string]string{"b|DE|(other)": "0", "h|DE|(other)": "1"}, fields()); d != "" {
		t.Errorf("after the human verdict (-want +got):\n%s", d)
	}
	st := stats(t, e.c, "acme", code)
	if st.Totals != (counter.Pair{Human: int64(len(evs))}) {
		t.Errorf("totals %+v, want %d human", st.Totals, len(evs))
	}
}

// During a recount a verdict moves its click in both generations that
// counted it. A member whose cached generations are out of date (another
// member started the recount) meets the store's compare-and-set, reloads
// them and applies the batch once.
func TestVerdictsDuringARecountMoveEveryGenerationThatCountedTheClick(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	fixer := e.newCounter(t, nil)
	const p = 2
	code, other := codeIn(t, p, 20), codeIn(t, p, 21)
	now := time.Now().UTC()
	var s seqs
	evs := s.events(p, click("acme", code, now), click("acme", code, now), click("acme", code, now), click("acme", code, now))
	warm := s.event(p, click("acme", other, now))
	mustHandle(t, e.c, p, append(evs, warm))
	// e.c caches the generations (1, 1) with a first verdict.
	if _, err := e.c.ApplyVerdict(t.Context(), verdict(warm, true), 1); err != nil {
		t.Fatal(err)
	}
	e.first.Store(evs[0].Seq)
	if err := fixer.OnRewind(t.Context(), p, reader.RewindInfo{ID: events.NewID(), From: evs[0].Seq, Until: s.n, MovesBack: true}); err != nil {
		t.Fatal(err)
	}
	mustHandle(t, fixer, p, evs[:2]) // the recount has counted clicks 0 and 1
	res := e.c.ApplyVerdicts(t.Context(), []counter.Verdict{{V: verdict(evs[0], true), Seq: 2}, {V: verdict(evs[3], true), Seq: 3}})
	for i, r := range res {
		if r.Err != nil || r.Status != counter.Relabelled {
			t.Fatalf("verdict %d: %+v", i, r)
		}
	}
	if got := metric(t, e.reg, "snip_clickcounter_write_retries_total", map[string]string{"reason": "verdict_conflict"}); got != 1 {
		t.Errorf("verdict conflicts = %v, want 1", got)
	}
	want := counter.Pair{Human: 2, Bot: 2}
	if got := stats(t, fixer, "acme", code).Totals; got != want {
		t.Errorf("old generation during the recount: %+v, want %+v", got, want)
	}
	mustHandle(t, fixer, p, append(evs[2:], warm)) // the rest: the recount switches
	st := stats(t, fixer, "acme", code)
	if st.AsOf.Generation != 2 || st.Totals != want {
		t.Errorf("after the recount: generation %d, totals %+v; want 2 and %+v", st.AsOf.Generation, st.Totals, want)
	}
}

// A batch of LINKS events is applied in one round trip, each event only if
// it is newer than what is recorded for its code.
func TestLinkEventsInABatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ev := func(kind events.LinkEventKind, code string) *events.LinkEvent {
		return &events.LinkEvent{V: events.LinkVersion, ID: events.NewID(), Kind: kind, Time: time.Now(), Code: code, Owner: "acme"}
	}
	err := e.c.ApplyLinkEvents(t.Context(), []counter.LinkEvent{
		{E: ev(events.LinkDeleted, "gone"), Seq: 5},
		{E: ev(events.LinkCreated, "gone"), Seq: 4}, // older: ignored
		{E: ev(events.LinkCreated, "kept"), Seq: 3},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.LinkStats(t.Context(), "acme", "gone", counter.DefaultRange()); !errors.Is(err, counter.ErrLinkNotFound) {
		t.Errorf("deleted link: err = %v, want ErrLinkNotFound", err)
	}
	if st := stats(t, e.c, "acme", "kept"); st.Totals != (counter.Pair{}) {
		t.Errorf("created link: totals %+v, want zeros", st.Totals)
	}
	for result, want := range map[string]float64{"applied": 2, "stale": 1} {
		if got := metric(t, e.reg, "snip_clickcounter_link_events_total", map[string]string{"result": result}); got != want {
			t.Errorf("link events %s = %v, want %v", result, got, want)
		}
	}
}
