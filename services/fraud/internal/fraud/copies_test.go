package fraud_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/fraud/internal/fraud"
	"github.com/snipdev/snip/services/fraud/internal/traffic"
)

// storeCopy stores c in CLICKS again under another Nats-Msg-Id, as a
// redrive does (and as the relay's retry later than the duplicate window
// does, with the same one): the same event at a new sequence.
func (w *world) storeCopy(t *testing.T, c traffic.Click) {
	t.Helper()
	data, err := json.Marshal(c.Click)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.js.Publish(t.Context(), events.ClickSubject(c.Owner, c.Code), data, jetstream.WithMsgID(c.ID+":redrive")); err != nil {
		t.Fatal(err)
	}
}

// publish stores clicks in CLICKS, each with its event ID as Nats-Msg-Id.
func (w *world) publish(t *testing.T, clicks ...traffic.Click) {
	t.Helper()
	if err := traffic.Publish(t.Context(), w.js, clicks, 64); err != nil {
		t.Fatal(err)
	}
}

// waitLate waits until c's click time is more than fraud.CopyLateness
// past, so that a copy stored from now on is stored late, as every copy is.
func waitLate(t *testing.T, c traffic.Click) {
	t.Helper()
	testenv.WaitFor(t, 10*time.Second, "the click to be late", func() bool {
		return time.Since(c.Time) > fraud.CopyLateness+100*time.Millisecond
	})
}

// nothingRaised fails unless FRAUD, FRAUD_VERDICTS and Redis hold no alert
// and no label.
func (w *world) nothingRaised(t *testing.T) {
	t.Helper()
	if got := w.fraudMsgs(t, "fraud.alerts.>"); len(got) != 0 {
		t.Fatalf("alerts on FRAUD = %v, want none", got)
	}
	if got, err := w.store.RecentAlerts(t.Context(), "acme", 10); err != nil || len(got) != 0 {
		t.Fatalf("alerts in Redis = %+v, %v; want none", got, err)
	}
}

// TestACopyOfAClickIsCountedOnce: a click stored in CLICKS a second time
// under a new sequence (a redrive, or the relay's retry later than the
// duplicate window) is the same event, and fraud detection counts it once.
// A visitor clicks a link 20 times in 20 seconds (the burst threshold:
// one more click within the minute fires it) and curl clicks it 10 times
// (bot_agent labels each; an eleventh in the hour raises its alert); one
// of the visitor's clicks and one of curl's, stored on time, are stored
// again a second later. Also on the link: a distinct click with the same
// click time as one of the visitor's (another event ID), and a click
// stored five minutes after its click time with no copy (a late original,
// as an outbox backlog relayed after an outage gives). Both are counted.
// Taken as clicks, the copies made the burst fire (21 labels and an
// alert), raised bot_agent, labelled curl's click twice and counted 34
// clicks.
func TestACopyOfAClickIsCountedOnce(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := t.Context()
	p := events.Partition("cp", parts)
	person := traffic.Burst(time.Now().Add(-25*time.Second), 20, time.Second, "cp", "acme", "v")
	late := traffic.Burst(time.Now().Add(-5*time.Minute), 1, 0, "cp", "acme", "late")[0]
	sameTime := traffic.Burst(person[7].Time, 1, 0, "cp", "acme", "w")[0]
	curl := agentClicks(time.Now(), 10, 10*time.Millisecond, "cp", "curl/8.5.0")
	w.publish(t, person...)
	w.publish(t, late, sameTime)
	w.publish(t, curl...) // on time
	waitLate(t, curl[3])
	w.storeCopy(t, person[4])
	w.storeCopy(t, curl[3])

	reg := prometheus.NewRegistry()
	r := w.reader(t, fraud.Defaults(), fraud.NewMetrics(reg))
	if err := r.OnAssign(ctx, p, 1); err != nil {
		t.Fatal(err)
	}
	evs := w.events(t, p, 1)
	if len(evs) != 34 {
		t.Fatalf("%d events in CLICKS, want 34", len(evs))
	}
	handle(t, r, p, evs)

	st, err := w.store.LinkStats(ctx, "cp")
	if err != nil || st.Total != 32 || st.Flagged != 10 || st.ByRule[fraud.RuleBotAgent] != 10 || len(st.ByRule) != 1 {
		t.Fatalf("stats = %+v, %v; want 32 clicks, 10 flagged by bot_agent", st, err)
	}
	w.nothingRaised(t)
	labels, _ := w.verdictLabels(t)
	for i, c := range curl {
		if labels[c.ID] != 1 {
			t.Fatalf("curl's click %d: %d labels, want 1", i, labels[c.ID])
		}
	}
	if len(labels) != len(curl) {
		t.Fatalf("%d clicks labelled, want curl's %d", len(labels), len(curl))
	}
	if got := counter(t, reg, "snip_fraud_copies_skipped_total"); got != 2 {
		t.Fatalf("snip_fraud_copies_skipped_total = %v, want 2", got)
	}
	if got := counter(t, reg, "snip_fraud_events_judged_total"); got != 32 {
		t.Fatalf("snip_fraud_events_judged_total = %v, want 32", got)
	}
}

// TestACopyInTheRebuiltRangeIsSkippedAfterATakeover: the member that owned
// the partition judged 19 of a visitor's clicks and a copy of the third;
// the member taking it over rebuilds its state from the log, where both
// the original and the copy are, then gets a copy of the sixth and the
// visitor's 20th click. Twenty clicks within a minute is the threshold,
// not a burst: the copies fed or judged as clicks made the new owner see
// 22 and fire.
func TestACopyInTheRebuiltRangeIsSkippedAfterATakeover(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := t.Context()
	p := events.Partition("cp", parts)
	person := traffic.Burst(time.Now().Add(-25*time.Second), 20, time.Second, "cp", "acme", "v")
	w.publish(t, person[:19]...)
	w.storeCopy(t, person[2])
	old := w.reader(t, fraud.Defaults(), nil)
	if err := old.OnAssign(ctx, p, 1); err != nil {
		t.Fatal(err)
	}
	handle(t, old, p, w.events(t, p, 1))
	old.OnRevoke(p)

	resume := w.events(t, p, 1)
	next := resume[len(resume)-1].Seq + 1
	w.storeCopy(t, person[5])
	w.publish(t, person[19])
	reg := prometheus.NewRegistry()
	r := w.reader(t, fraud.Defaults(), fraud.NewMetrics(reg))
	if err := r.OnAssign(ctx, p, next); err != nil {
		t.Fatal(err)
	}
	handle(t, r, p, w.events(t, p, next))

	st, err := w.store.LinkStats(ctx, "cp")
	if err != nil || st.Total != 20 || st.Flagged != 0 {
		t.Fatalf("stats = %+v, %v; want 20 clicks, none flagged", st, err)
	}
	w.nothingRaised(t)
	if labels, _ := w.verdictLabels(t); len(labels) != 0 {
		t.Fatalf("labels = %v, want none", labels)
	}
	if got := counter(t, reg, "snip_fraud_copies_skipped_total"); got != 1 {
		t.Fatalf("the new owner's snip_fraud_copies_skipped_total = %v, want 1 (the copy it judged; the one it fed is not counted)", got)
	}
}

// TestACopyBeyondTheRecordIsLabelledOnceInItsVerdictMessage: after an
// outage longer than the state's Memory, the outbox relays a backlog
// (clicks 20 minutes old, among live ones), and its retry later than the
// duplicate window stores one of them again. Both copies are more than
// Memory behind the partition's clock, so the record of event IDs cannot
// tell them apart and both are judged (decision 0151); curl's click is
// labelled bot_agent as each. Its two labels in one verdict message made
// the message malformed to the click counter (a click ID labelled twice,
// events.FraudVerdictBatch.Validate), which parks it with every other
// label in it.
func TestACopyBeyondTheRecordIsLabelledOnceInItsVerdictMessage(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := t.Context()
	p := events.Partition("bk", parts)
	live := traffic.Burst(time.Now(), 1, 0, "bk", "acme", "v")[0]
	backlog := agentClicks(time.Now().Add(-20*time.Minute), 3, time.Second, "bk", "curl/8.5.0")
	w.publish(t, live)
	w.publish(t, backlog...)
	w.storeCopy(t, backlog[1])

	r := w.reader(t, fraud.Defaults(), nil)
	if err := r.OnAssign(ctx, p, 1); err != nil {
		t.Fatal(err)
	}
	evs := w.events(t, p, 1)
	if len(evs) != 5 {
		t.Fatalf("%d events in CLICKS, want 5", len(evs))
	}
	handle(t, r, p, evs)

	labels, msgs := w.verdictLabels(t) // decodes and validates each message, as the counter does
	if msgs != 1 {
		t.Fatalf("%d verdict messages, want 1", msgs)
	}
	for i, c := range backlog {
		if labels[c.ID] != 1 {
			t.Fatalf("curl's click %d: %d labels, want 1", i, labels[c.ID])
		}
	}
}

// TestACopyOfAClickFromAClockAheadIsCountedOnce: a redirect whose clock runs
// ahead of NATS by more than MaxClockSkew stamps a click three minutes after
// it is stored; its event time is clamped to storage + MaxClockSkew. The
// click is stored again later under another sequence: 2.5 minutes later (the
// relay's retry after the duplicate window: its click time still ahead of
// its storage) and five minutes later (a redrive: stored after its click
// time). Each copy's clamped time differs from the original's, but every copy
// carries the same click time, by which the record is kept: both are copies.
func TestACopyOfAClickFromAClockAheadIsCountedOnce(t *testing.T) {
	t.Parallel()
	d, err := fraud.NewDetector(fraud.Defaults())
	if err != nil {
		t.Fatal(err)
	}
	stored := time.Date(2026, 3, 2, 12, 0, 0, 0, time.UTC)
	click := events.Click{
		V: events.ClickVersion, ID: events.NewID(), Time: stored.Add(3 * time.Minute), Code: "abc", Owner: "acme",
		Target: "https://example.com/", IPPrefix: "10.0.0.0/24", Visitor: "v", UserAgent: "Mozilla/5.0",
	}
	for _, after := range []time.Duration{150 * time.Second, 5 * time.Minute} {
		p := d.NewPartition()
		if j, _ := p.Judge(reader.Event{Seq: 1, Stored: stored, Click: click}); j.Copy {
			t.Fatal("the original judged a copy")
		}
		j, ok := p.Judge(reader.Event{Seq: 2, Stored: stored.Add(after), Click: click})
		if !ok || !j.Copy {
			t.Errorf("copy stored %s after the original: Copy = %v (ok %v), want a copy", after, j.Copy, ok)
		}
	}
}
