package fraud_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/fraud/internal/fraud"
	"github.com/snipdev/snip/services/fraud/internal/traffic"
)

// shortMemory is the default rules with every window at 100 ms, so Memory
// (what a rebuild reads back from CLICKS, by storage time) is half a second
// while the alert period stays an hour: a test publishes the first clicks,
// lets their storage time fall out of Memory, and a rebuild no longer sees
// them.
func shortMemory() fraud.Rules {
	r := fraud.Defaults()
	r.VisitorWindow, r.FloodWindow, r.FloodHalfLife, r.PairWindow = 100*time.Millisecond, 100*time.Millisecond, 100*time.Millisecond, 100*time.Millisecond
	r.FloodAdoptAfter = time.Second
	return r
}

// agentClicks returns n clicks on code with user agent ua, step apart from
// at, each by another visitor (no burst): curl hitting a link.
func agentClicks(at time.Time, n int, step time.Duration, code, ua string) []traffic.Click {
	out := make([]traffic.Click, n)
	for i := range out {
		out[i] = traffic.Click{Click: events.Click{
			V: events.ClickVersion, ID: events.NewID(), Time: at.Add(time.Duration(i) * step).UTC(),
			Code: code, Owner: "acme", Target: "https://example.com/" + code, IPPrefix: fmt.Sprintf("203.0.%d.0/24", i%250),
			Visitor: fmt.Sprintf("%s-%d-%d", ua, at.UnixNano(), i), UserAgent: ua,
		}}
	}
	return out
}

// publishAged publishes clicks and waits until their storage time is more
// than Memory old: a rebuild after that reads none of them back.
func (w *world) publishAged(t *testing.T, d time.Duration, clicks []traffic.Click) {
	t.Helper()
	if err := traffic.Publish(t.Context(), w.js, clicks, 64); err != nil {
		t.Fatal(err)
	}
	p := events.Partition(clicks[0].Code, parts)
	evs := w.events(t, p, 1)
	stored := evs[len(evs)-1].Stored
	testenv.WaitFor(t, 10*time.Second, "the clicks to age out of the rebuild's Memory", func() bool {
		return time.Since(stored) > 2*d
	})
}

// uninterrupted returns the alert IDs one member judging evs from the start
// raises.
func uninterrupted(t *testing.T, r fraud.Rules, evs []reader.Event) []string {
	t.Helper()
	d, err := fraud.NewDetector(r)
	if err != nil {
		t.Fatal(err)
	}
	p := d.NewPartition()
	var ids []string
	for _, ev := range evs {
		j, _ := p.Judge(ev)
		for _, a := range j.Alerts {
			ids = append(ids, a.ID)
		}
	}
	slices.Sort(ids)
	return ids
}

// handle runs the reader on a batch.
func handle(t *testing.T, r *fraud.Reader, p int, batch []reader.Event) {
	t.Helper()
	if err := r.Handle(t.Context(), p, batch); err != nil {
		t.Fatal(err)
	}
}

// TestLabelCountsOlderThanMemorySurviveARebuild is the "after 10 an hour"
// alert across a rebuild. curl clicks a link 8 times between 10:00 and
// 10:07, people click it until 10:29, the partition is rebuilt at 10:31
// (taken over by another member, or rewound to 10:19), and curl clicks 5
// more times. The rebuild reads back only Memory of the
// log, which holds none of the first 8 (storage time, like event time, is
// long past them): the counter comes from Redis, as of the mark. The
// rebuilt member raises bot_agent once, with the ID an uninterrupted member
// raises.
func TestLabelCountsOlderThanMemorySurviveARebuild(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"takeover", "rewind"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			ctx := t.Context()
			rules := shortMemory()
			d, _ := fraud.NewDetector(rules)
			code := "curled"
			p := events.Partition(code, parts)
			ten := time.Now().Add(-3 * time.Hour).Truncate(time.Hour)

			// Each group of clicks is stored more than Memory after the one
			// before: a rebuild at the second half of the people's clicks
			// (the rewind's start) or after them (the takeover) reads back
			// none of curl's first 8.
			w.publishAged(t, d.Memory(), agentClicks(ten, 8, time.Minute, code, "curl/8.5.0"))
			people := traffic.Burst(ten.Add(8*time.Minute), 22, time.Minute, code, "acme", "")
			for i := range people {
				people[i].Visitor = fmt.Sprintf("person%d", i)
			}
			w.publishAged(t, d.Memory(), people[:11])
			if err := traffic.Publish(ctx, w.js, people[11:], 64); err != nil {
				t.Fatal(err)
			}
			first := w.reader(t, rules, nil)
			if err := first.OnAssign(ctx, p, 1); err != nil {
				t.Fatal(err)
			}
			all := w.events(t, p, 1)
			handle(t, first, p, all[:8])
			handle(t, first, p, all[8:19])
			handle(t, first, p, all[19:])
			rewindFrom, resume := all[19].Seq, all[len(all)-1].Seq+1

			if err := traffic.Publish(ctx, w.js, agentClicks(ten.Add(31*time.Minute), 5, time.Minute, code, "curl/8.5.0"), 64); err != nil {
				t.Fatal(err)
			}
			r := first
			switch how {
			case "takeover":
				first.OnRevoke(p)
				r = w.reader(t, rules, nil)
				if err := r.OnAssign(ctx, p, resume); err != nil {
					t.Fatal(err)
				}
			case "rewind":
				if err := r.OnRewind(ctx, p, reader.RewindInfo{ID: "r1", From: rewindFrom, Until: resume - 1, MovesBack: true}); err != nil {
					t.Fatal(err)
				}
				handle(t, r, p, all[19:]) // the replay of the people's last clicks
			}
			handle(t, r, p, w.events(t, p, resume))

			want := uninterrupted(t, rules, w.events(t, p, 1))
			if len(want) != 1 || want[0] != fraud.AlertID(fraud.RuleBotAgent, code, "curl", ten) {
				t.Fatalf("the uninterrupted member raises %v, want one bot_agent alert", want)
			}
			got := w.fraudMsgs(t, "fraud.alerts.>")
			if len(got) != 1 || got[want[0]] != 1 {
				t.Fatalf("alerts on FRAUD = %v, want %v", got, want)
			}
			st, err := w.store.LinkStats(ctx, code)
			if err != nil || st.Total != 35 || st.Flagged != 13 || st.ByRule[fraud.RuleBotAgent] != 13 {
				t.Fatalf("stats = %+v, %v; want 13 of 35 flagged by bot_agent", st, err)
			}
		})
	}
}

// TestTakeoverAfterAStoredButUnackedBatch: the owner published and stored a
// batch and stopped before acking it, so the next owner is told to resume
// at that batch, which the runtime hands again. The store's mark is ahead
// of the resume point: the next owner feeds the state up to the mark
// instead of judging those events again (their decisions are on FRAUD and
// in Redis; judged again they would be published again, the batch being cut
// differently). It judges only what follows, exactly as an uninterrupted
// member: 6 + 3 + 1 curl clicks are 10 in the hour, not
// more than 10, so no alert; nothing is published twice, nothing counted
// twice, and the skipped events are not "behind".
func TestTakeoverAfterAStoredButUnackedBatch(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := t.Context()
	rules := shortMemory()
	d, _ := fraud.NewDetector(rules)
	code := "curled"
	p := events.Partition(code, parts)
	ten := time.Now().Add(-3 * time.Hour).Truncate(time.Hour)

	w.publishAged(t, d.Memory(), agentClicks(ten, 6, time.Minute, code, "curl/8.5.0"))
	if err := traffic.Publish(ctx, w.js, agentClicks(ten.Add(10*time.Minute), 3, time.Minute, code, "curl/8.5.0"), 64); err != nil {
		t.Fatal(err)
	}
	first := w.reader(t, rules, nil)
	if err := first.OnAssign(ctx, p, 1); err != nil {
		t.Fatal(err)
	}
	handle(t, first, p, w.events(t, p, 1)[:6])
	unacked := w.events(t, p, 1)[6:]
	handle(t, first, p, unacked) // stored; the member dies before the ack
	first.OnRevoke(p)

	if err := traffic.Publish(ctx, w.js, agentClicks(ten.Add(20*time.Minute), 1, time.Minute, code, "curl/8.5.0"), 64); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	next := w.reader(t, rules, fraud.NewMetrics(reg))
	if err := next.OnAssign(ctx, p, unacked[0].Seq); err != nil {
		t.Fatal(err)
	}
	handle(t, next, p, w.events(t, p, unacked[0].Seq))

	if want := uninterrupted(t, rules, w.events(t, p, 1)); len(want) != 0 {
		t.Fatalf("the uninterrupted member raises %v, want none", want)
	}
	if got := w.fraudMsgs(t, "fraud.alerts.>"); len(got) != 0 {
		t.Fatalf("alerts on FRAUD = %v, want none", got)
	}
	if got := counter(t, reg, "snip_fraud_events_judged_total"); got != 1 {
		t.Fatalf("the next owner judged %v events, want 1 (the one after the stored batch)", got)
	}
	if got := counter(t, reg, "snip_fraud_publish_duplicates_total"); got != 0 {
		t.Fatalf("%v duplicates published, want 0", got)
	}
	if got := counter(t, reg, "snip_fraud_events_behind_total"); got != 0 {
		t.Fatalf("snip_fraud_events_behind_total = %v, want 0", got)
	}
	v, _ := w.verdictLabels(t)
	if len(v) != 10 {
		t.Fatalf("%d clicks labelled, want 10", len(v))
	}
	for id, n := range v {
		if n != 1 {
			t.Fatalf("click %s labelled %d times, want 1", id, n)
		}
	}
	st, err := w.store.LinkStats(ctx, code)
	if err != nil || st.Total != 10 || st.Flagged != 10 {
		t.Fatalf("stats = %+v, %v; want 10 of 10 flagged", st, err)
	}
}

// TestAStoreMarkFromAnotherStreamIsReported: fraud detection's Redis holds a
// partition's mark from another CLICKS stream (deleted and created again,
// its sequences started over), far ahead of the new stream. The store
// answers every batch at or below that mark as applied before, so the
// partition's statistics are not stored; nothing in the service can tell
// whose statistics those are, so it must say so: an error log and
// snip_fraud_store_foreign_mark_total, which the runbook turns into "delete
// the partition's keys". Before, a warning said the mark was ignored,
// which it was not.
func TestAStoreMarkFromAnotherStreamIsReported(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := t.Context()
	rules := shortMemory()
	code := "restarted"
	p := events.Partition(code, parts)
	start := time.Now().Add(-time.Hour).Truncate(time.Minute)
	if err := traffic.Publish(ctx, w.js, agentClicks(start, 3, time.Minute, code, "curl/8.5.0"), 64); err != nil {
		t.Fatal(err)
	}
	if err := w.rdb.Set(ctx, fmt.Sprintf("fraud:{p%d}:hwm", p), 1_000_000, 0).Err(); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	r := w.reader(t, rules, fraud.NewMetrics(reg))
	if err := r.OnAssign(ctx, p, 1); err != nil {
		t.Fatal(err)
	}
	handle(t, r, p, w.events(t, p, 1))
	if got := counter(t, reg, "snip_fraud_store_foreign_mark_total"); got != 1 {
		t.Errorf("snip_fraud_store_foreign_mark_total = %v, want 1", got)
	}
	// What the metric warns of: the batch was taken for applied before.
	if st, err := w.store.LinkStats(ctx, code); !errors.Is(err, fraud.ErrUnknownLink) {
		t.Errorf("stats = %+v, %v; want nothing stored under the other stream's mark (ErrUnknownLink)", st, err)
	}
}

// TestAStoreMarkFromAnotherStreamIsReportedOnceWhenItsRebuildIsRetried: the
// same mark from another stream, found by a rebuild that then fails: NATS
// refuses the member the consumer it reads the log with. The runtime tries
// OnAssign again, or the batch again (a runtime without the hook rebuilds
// in Handle), until the rebuild succeeds: one takeover with a foreign
// mark, counted once in snip_fraud_store_foreign_mark_total, not once a
// try.
func TestAStoreMarkFromAnotherStreamIsReportedOnceWhenItsRebuildIsRetried(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"on_assign", "with_the_batch"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			w, refuse := newRefusingWorld(t)
			code := "restarted"
			p := events.Partition(code, parts)
			if err := traffic.Publish(ctx, w.js, agentClicks(time.Now().Add(-time.Minute), 3, time.Second, code, "curl/8.5.0"), 64); err != nil {
				t.Fatal(err)
			}
			if err := w.rdb.Set(ctx, fmt.Sprintf("fraud:{p%d}:hwm", p), 1_000_000, 0).Err(); err != nil {
				t.Fatal(err)
			}
			reg := prometheus.NewRegistry()
			r := w.memberReader(t, fraud.NewMetrics(reg))
			batch := w.events(t, p, 3) // the rebuild reads 1-2 from the log

			refuse("$JS.API.CONSUMER.CREATE." + events.ClicksStream + ".>")
			fctx, cancel := context.WithTimeout(ctx, 5*time.Second) // a refused request is not answered
			defer cancel()
			if how == "on_assign" {
				if err := r.OnAssign(fctx, p, 3); err == nil {
					t.Fatal("OnAssign succeeded without reading the log")
				}
			} else if err := r.Handle(fctx, p, batch); err == nil {
				t.Fatal("the batch succeeded without reading the log")
			}
			refuse()
			if how == "on_assign" {
				if err := r.OnAssign(ctx, p, 3); err != nil { // the runtime's retry
					t.Fatal(err)
				}
			}
			handle(t, r, p, batch)
			if got := counter(t, reg, "snip_fraud_store_foreign_mark_total"); got != 1 {
				t.Errorf("snip_fraud_store_foreign_mark_total = %v, want 1", got)
			}
		})
	}
}
