package counter_test

import (
	"errors"
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/clickcounter/internal/counter"
)

// handleAndLose has c count the batch (so the runtime would ack it), then
// makes the store lose the write: Redis as a replica promoted before the
// write reached it.
func (e *env) handleAndLose(tb testing.TB, c *counter.Counter, p int, batch []reader.Event) {
	tb.Helper()
	before := testenv.SnapshotRedis(tb, e.rdb)
	mustHandle(tb, c, p, batch)
	before.Restore(tb, e.rdb)
}

// The store loses the last batch the counter wrote and acked (a Redis
// master died before its replica had it). The next batch is counted only
// after the lost one, read again from CLICKS, whether the counter finds out
// by a conflict on its next write or a new owner loads the partition: every
// click is counted exactly once.
func TestEventsTheStoreLostAreReadAgainFromClicks(t *testing.T) {
	t.Parallel()
	for _, by := range []string{"conflict", "assignment"} {
		t.Run(by, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			const p = 1
			code, other := codeIn(t, p, 20), codeIn(t, p, 21)
			elsewhere := codeIn(t, 2, 22)
			now := time.Now().UTC()
			var s seqs
			b1 := s.events(p, click("acme", code, now), click("acme", other, now))
			b2 := s.events(p, click("acme", code, now), click("acme", code, now), click("acme", other, now))
			b2[1].Click.Bot = true
			noise := s.events(2, click("acme", elsewhere, now)) // another partition's event in between
			b3 := s.events(p, click("acme", code, now))
			e.clicks.store(t, b1...)
			e.clicks.store(t, b2...)
			e.clicks.store(t, noise...)
			e.clicks.store(t, b3...)

			mustHandle(t, e.c, p, b1)
			e.handleAndLose(t, e.c, p, b2)
			c := e.c
			if by == "assignment" {
				c = e.newCounter(t, nil)
				if err := c.OnAssign(t.Context(), p, b3[0].Seq); err != nil {
					t.Fatal(err)
				}
			}
			mustHandle(t, c, p, b3)
			if got := stats(t, c, "acme", code).Totals; got != (counter.Pair{Human: 3, Bot: 1}) {
				t.Errorf("%s: totals %+v, want 3 human and 1 bot (b2's two clicks read again)", code, got)
			}
			if got := stats(t, c, "acme", other).Totals; got != (counter.Pair{Human: 2}) {
				t.Errorf("%s: totals %+v, want 2 human", other, got)
			}
			// Everything delivered again changes nothing.
			for _, b := range [][]reader.Event{b1, b2, b3} {
				mustHandle(t, c, p, b)
			}
			if got := stats(t, c, "acme", code).Totals; got != (counter.Pair{Human: 3, Bot: 1}) {
				t.Errorf("%s after redeliveries: totals %+v, want 3 human and 1 bot", code, got)
			}
			if by == "conflict" {
				if got := metric(t, e.reg, "snip_clickcounter_missed_events_total", map[string]string{"result": "read"}); got != 3 {
					t.Errorf("missed_events_total{result=read} = %v, want 3", got)
				}
			}
		})
	}
}

// In the steady state the check costs one lookup when the partition's state
// is loaded, not one per batch.
func TestTheStreamIsAskedOncePerLoad(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const p = 0
	code := codeIn(t, p, 23)
	now := time.Now()
	var s seqs
	for range 10 {
		b := s.events(p, click("acme", code, now), click("acme", code, now))
		e.clicks.store(t, b...)
		mustHandle(t, e.c, p, b)
	}
	if got := e.clicks.reads.Load(); got != 1 {
		t.Errorf("CLICKS read %d times for 10 batches, want once (the first load)", got)
	}
	if err := e.c.OnAssign(t.Context(), p, s.n+1); err != nil {
		t.Fatal(err)
	}
	b := s.events(p, click("acme", code, now))
	e.clicks.store(t, b...)
	mustHandle(t, e.c, p, b)
	if got := e.clicks.reads.Load(); got != 2 {
		t.Errorf("CLICKS read %d times after a reassignment, want 2", got)
	}
	if got := stats(t, e.c, "acme", code).Totals.Human; got != 21 {
		t.Errorf("human total = %d, want 21", got)
	}
}

// Events in the lost stretch that every reader parks (a code stored in a
// partition it does not hash to, a payload that is not a click) are skipped
// there too, and do not stop the catch-up.
func TestInvalidEventsTheStoreLostAreSkipped(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const p = 3
	code := codeIn(t, p, 24)
	now := time.Now().UTC()
	var s seqs
	b1 := s.events(p, click("acme", code, now))
	b2 := s.events(p, click("acme", code, now), click("acme", code, now))
	b3 := s.events(p, click("acme", code, now))
	e.clicks.store(t, b1...)
	e.clicks.store(t, b2...)
	e.clicks.store(t, b3...)
	wrong := click("acme", codeIn(t, 0, 25), now)
	e.clicks.log = append(e.clicks.log,
		counter.StoredClick{Seq: b2[0].Seq + 1, Subject: "3.clicks.acme." + wrong.Code, Data: mustJSON(t, wrong), Stored: now},
		counter.StoredClick{Seq: b2[1].Seq + 1, Subject: "3.clicks.acme." + code, Data: []byte(`{"v":1,"id":`), Stored: now},
	)
	mustHandle(t, e.c, p, b1)
	e.handleAndLose(t, e.c, p, b2)
	mustHandle(t, e.c, p, b3)
	if got := stats(t, e.c, "acme", code).Totals.Human; got != 4 {
		t.Errorf("human total = %d, want 4", got)
	}
	for result, want := range map[string]float64{"read": 2, "invalid": 2} {
		if got := metric(t, e.reg, "snip_clickcounter_missed_events_total", map[string]string{"result": result}); got != want {
			t.Errorf("missed_events_total{result=%s} = %v, want %v", result, got, want)
		}
	}
}

// A long lost stretch (a store that lost everything, say) is counted a
// bounded slice per handler call, so the call ends within its ack wait; the
// runtime calls again and the next slice goes on from where the last ended.
func TestALongLostStretchIsCountedInSlices(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const p = 2
	code := codeIn(t, p, 26)
	now := time.Now().UTC()
	var s seqs
	first := s.events(p, click("acme", code, now))
	e.clicks.store(t, first...)
	mustHandle(t, e.c, p, first)
	afterFirst := testenv.SnapshotRedis(t, e.rdb)
	lost := make([]events.Click, counter.MaxGapPerCall+counter.GapChunk/2)
	for i := range lost {
		lost[i] = click("acme", code, now)
	}
	stretch := s.events(p, lost...)
	e.clicks.store(t, stretch...)
	for i := 0; i < len(stretch); i += 1000 {
		mustHandle(t, e.c, p, stretch[i:min(i+1000, len(stretch))])
	}
	afterFirst.Restore(t, e.rdb)
	next := s.events(p, click("acme", code, now))
	e.clicks.store(t, next...)
	err := e.c.HandleBatch(t.Context(), p, next)
	if !errors.Is(err, counter.ErrCatchingUp) {
		t.Fatalf("first call: %v, want ErrCatchingUp", err)
	}
	if got := stats(t, e.c, "acme", code).Totals.Human; got != int64(1+counter.MaxGapPerCall) {
		t.Fatalf("after the first call: human total = %d, want %d", got, 1+counter.MaxGapPerCall)
	}
	mustHandle(t, e.c, p, next)
	if got, want := stats(t, e.c, "acme", code).Totals.Human, int64(1+len(stretch)+1); got != want {
		t.Fatalf("after the second call: human total = %d, want %d", got, want)
	}
}
