package counter_test

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

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

// handleReplaying hands c the batch as the reader runtime does, and when c
// answers reader.Replay, checks it asks from want and hands the
// partition's events again from there through the batch, as the runtime
// does once it has moved the consumer back.
func (e *env) handleReplaying(tb testing.TB, c *counter.Counter, p int, batch []reader.Event, want uint64) {
	tb.Helper()
	err := c.HandleBatch(tb.Context(), p, batch)
	var re *reader.ReplayError
	if !errors.As(err, &re) || !errors.Is(err, counter.ErrStoreBehind) {
		tb.Fatalf("HandleBatch = %v, want a reader.Replay (ErrStoreBehind)", err)
	}
	if re.From != want {
		tb.Fatalf("replay from %d, want %d", re.From, want)
	}
	mustHandle(tb, c, p, e.clicks.from(p, re.From, batch[len(batch)-1].Seq))
}

// The store loses batches the counter wrote and acked (a Redis master died
// before its replica had them; or Redis lost everything). The next batch
// is not counted: the counter asks the runtime for the partition's events
// again from the first it lost, whether it finds out by a conflict on its
// next write or a new owner loads the partition, and counts them from
// there: every click exactly once.
func TestEventsTheStoreLostAreHandedAgain(t *testing.T) {
	t.Parallel()
	for _, lost := range []string{"last batch, found by a conflict", "last batch, found on assignment", "everything, found by a conflict"} {
		t.Run(lost, func(t *testing.T) {
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
			e.clicks.store(b1...)
			e.clicks.store(b2...)
			e.clicks.store(noise...)
			e.clicks.store(b3...)

			empty := testenv.SnapshotRedis(t, e.rdb)
			mustHandle(t, e.c, p, b1)
			e.handleAndLose(t, e.c, p, b2)
			c, from, missed := e.c, b2[0].Seq, 3.0
			switch lost {
			case "last batch, found on assignment":
				c = e.newCounter(t, nil)
				if err := c.OnAssign(t.Context(), p, b3[0].Seq); err != nil {
					t.Fatal(err)
				}
			case "everything, found by a conflict":
				empty.Restore(t, e.rdb)
				from, missed = b1[0].Seq, 5
			}
			e.handleReplaying(t, c, p, b3, from)
			if got := stats(t, c, "acme", code).Totals; got != (counter.Pair{Human: 3, Bot: 1}) {
				t.Errorf("%s: totals %+v, want 3 human and 1 bot (the lost clicks handed again)", code, got)
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
			if c == e.c {
				if got := metric(t, e.reg, "snip_clickcounter_missed_events_total", map[string]string{"result": "read"}); got != missed {
					t.Errorf("missed_events_total{result=read} = %v, want %v", got, missed)
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
		e.clicks.store(b...)
		mustHandle(t, e.c, p, b)
	}
	if got := e.clicks.reads.Load(); got != 1 {
		t.Errorf("CLICKS read %d times for 10 batches, want once (the first load)", got)
	}
	if err := e.c.OnAssign(t.Context(), p, s.n+1); err != nil {
		t.Fatal(err)
	}
	b := s.events(p, click("acme", code, now))
	e.clicks.store(b...)
	mustHandle(t, e.c, p, b)
	if got := e.clicks.reads.Load(); got != 2 {
		t.Errorf("CLICKS read %d times after a reassignment, want 2", got)
	}
	if got := stats(t, e.c, "acme", code).Totals.Human; got != 21 {
		t.Errorf("human total = %d, want 21", got)
	}
}

// An event the runtime parked (it never reaches the handler, so the store's
// watermark stops short of it) looks, after a reload, like one the store
// lost: the counter asks for it again once, the runtime parks it again, and
// the batch after it is counted with no second replay.
func TestAParkedEventBeforeAReloadCostsOneReplay(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const p = 3
	code := codeIn(t, p, 24)
	now := time.Now().UTC()
	var s seqs
	b1 := s.events(p, click("acme", code, now))
	parked := s.events(p, click("acme", code, now))
	b2 := s.events(p, click("acme", code, now))
	e.clicks.store(b1...)
	e.clicks.store(parked...)
	e.clicks.store(b2...)
	mustHandle(t, e.c, p, b1)
	if err := e.c.OnAssign(t.Context(), p, b2[0].Seq); err != nil {
		t.Fatal(err)
	}
	err := e.c.HandleBatch(t.Context(), p, b2)
	var re *reader.ReplayError
	if !errors.As(err, &re) || re.From != parked[0].Seq {
		t.Fatalf("HandleBatch = %v, want a replay from the parked event's sequence %d", err, parked[0].Seq)
	}
	mustHandle(t, e.c, p, b2) // what the runtime hands after parking it again
	if got := stats(t, e.c, "acme", code).Totals.Human; got != 2 {
		t.Errorf("human total = %d, want 2", got)
	}
}

// The member loses the partition during the catch-up the counter asked for
// (its lease ran out on a loaded machine) and takes it back: the runtime
// calls OnRevoke, then OnAssign, and hands the partition's events again
// from its ack floor, somewhere among the lost events, where the store's
// watermark is too. The metric still counts each lost event once: those
// counted after the hand-over too, and not those of a batch written before
// it and handed again (not acked).
func TestMissedEventsAreCountedOnceAcrossAHandOver(t *testing.T) {
	t.Parallel()
	for _, at := range []struct {
		name string
		// done is how many of the lost events were counted before the
		// hand-over, acked the first acked of them.
		done, acked int
	}{
		{"before the first replayed batch", 0, 0},
		{"after a replayed batch, acked", 1, 1},
		{"after a replayed batch, not acked", 2, 0},
	} {
		t.Run(at.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			const p = 1
			code := codeIn(t, p, 25)
			now := time.Now().UTC()
			_, lost, b3 := e.lostInTheStore(t, p, code, now, 1)
			if at.done > 0 {
				mustHandle(t, e.c, p, lost[:at.done])
			}
			e.c.OnRevoke(p)
			resume := lost[at.acked].Seq
			if err := e.c.OnAssign(t.Context(), p, resume); err != nil {
				t.Fatal(err)
			}
			mustHandle(t, e.c, p, e.clicks.from(p, resume, b3[len(b3)-1].Seq))

			if got := stats(t, e.c, "acme", code).Totals; got != (counter.Pair{Human: 5}) {
				t.Errorf("totals %+v, want 5 human", got)
			}
			if got := metric(t, e.reg, "snip_clickcounter_missed_events_total", map[string]string{"result": "read"}); got != float64(len(lost)) {
				t.Errorf("missed_events_total{result=read} = %v, want %d (the lost events, each once)", got, len(lost))
			}
		})
	}
}

// Another member takes the partition over during the catch-up the counter
// asked for (this one's lease ran out, or it stopped): the runtime hands the
// new owner the partition's events from its ack floor, somewhere among the
// lost events. The store's watermark does not tell it those events were
// lost, but the store keeps the lost stretch, so the new owner counts in
// the metric the lost events it writes, and the two members' metrics
// together count each lost event once.
func TestMissedEventsAreCountedOnceWhenAnotherMemberTakesOver(t *testing.T) {
	t.Parallel()
	for _, at := range []struct {
		name string
		// done is how many of the lost events the first member counted
		// before the hand-over, acked the first acked of them.
		done, acked int
	}{
		{"before the first replayed batch", 0, 0},
		{"after a replayed batch, acked", 1, 1},
		{"after a replayed batch, not acked", 2, 0},
	} {
		t.Run(at.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			const p = 1
			code := codeIn(t, p, 28)
			now := time.Now().UTC()
			_, lost, b3 := e.lostInTheStore(t, p, code, now, 1)
			if at.done > 0 {
				mustHandle(t, e.c, p, lost[:at.done])
			}
			e.c.OnRevoke(p)
			regB := prometheus.NewRegistry()
			b := e.newCounter(t, regB)
			resume := lost[at.acked].Seq
			if err := b.OnAssign(t.Context(), p, resume); err != nil {
				t.Fatal(err)
			}
			mustHandle(t, b, p, e.clicks.from(p, resume, b3[len(b3)-1].Seq))

			if got := stats(t, b, "acme", code).Totals; got != (counter.Pair{Human: 5}) {
				t.Errorf("totals %+v, want 5 human", got)
			}
			read := map[string]string{"result": "read"}
			first, second := metric(t, e.reg, "snip_clickcounter_missed_events_total", read), metric(t, regB, "snip_clickcounter_missed_events_total", read)
			if first+second != float64(len(lost)) {
				t.Errorf("missed_events_total{result=read}: %v on the first member, %v on the one that took over; want %d together (the lost events, each once)",
					first, second, len(lost))
			}

			// The catch-up is over: the next member counts nothing missed.
			b.OnRevoke(p)
			regC := prometheus.NewRegistry()
			c := e.newCounter(t, regC)
			if err := c.OnAssign(t.Context(), p, b3[len(b3)-1].Seq+1); err != nil {
				t.Fatal(err)
			}
			next := (&seqs{n: b3[len(b3)-1].Seq}).events(p, click("acme", code, now))
			e.clicks.store(next...)
			mustHandle(t, c, p, next)
			if got := metric(t, regC, "snip_clickcounter_missed_events_total", read); got != 0 {
				t.Errorf("missed_events_total{result=read} = %v on a member that took over after the catch-up, want 0", got)
			}
		})
	}
}

// A recount (a replay from the oldest event) reaches the partition during
// the catch-up the counter asked for, after the member lost the partition
// and took it back: the new generation counts every event again, and the
// metric counts among them only those the store had lost, not the ones
// before them, which it never lost.
func TestARecountDuringTheCatchUpCountsOnlyTheLostEventsAsMissed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const p = 2
	code := codeIn(t, p, 26)
	now := time.Now().UTC()
	b1, lost, b3 := e.lostInTheStore(t, p, code, now, 2)
	e.c.OnRevoke(p)
	if err := e.c.OnAssign(t.Context(), p, lost[0].Seq); err != nil {
		t.Fatal(err)
	}
	last := b3[len(b3)-1].Seq
	if err := e.c.OnRewind(t.Context(), p, reader.RewindInfo{ID: events.NewID(), From: b1[0].Seq, Until: last, Requested: now, MovesBack: true}); err != nil {
		t.Fatal(err)
	}
	mustHandle(t, e.c, p, e.clicks.from(p, b1[0].Seq, last))

	if got := stats(t, e.c, "acme", code).Totals; got != (counter.Pair{Human: 6}) {
		t.Errorf("totals %+v, want 6 human", got)
	}
	if got := metric(t, e.reg, "snip_clickcounter_missed_events_total", map[string]string{"result": "read"}); got != float64(len(lost)) {
		t.Errorf("missed_events_total{result=read} = %v, want %d (the lost events only)", got, len(lost))
	}
}

// What the store holds when the member takes the partition back says how
// much of the catch-up it asked for is still to come: the events at or
// below the store's watermark were counted (by this member, or by another
// that held the partition meanwhile), and a recount that hands them all
// again later does not count them as missed.
func TestARecountAfterTheCatchUpWasTakenOverCountsNothingMissedTwice(t *testing.T) {
	t.Parallel()
	for _, by := range []string{"this member, in part", "another member, all of it"} {
		t.Run(by, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			const p = 3
			code := codeIn(t, p, 27)
			now := time.Now().UTC()
			b1, lost, b3 := e.lostInTheStore(t, p, code, now, 1)
			last := b3[len(b3)-1].Seq
			want := 0.0
			if by == "this member, in part" {
				mustHandle(t, e.c, p, lost[:1])
				want = 3 // 1 before the hand-over, 2 in the recount
			}
			e.c.OnRevoke(p)
			if by == "another member, all of it" {
				other := e.newCounter(t, nil)
				if err := other.OnAssign(t.Context(), p, lost[0].Seq); err != nil {
					t.Fatal(err)
				}
				mustHandle(t, other, p, e.clicks.from(p, lost[0].Seq, last))
				other.OnRevoke(p)
			}
			st, err := e.store.State(t.Context(), p)
			if err != nil {
				t.Fatal(err)
			}
			if err := e.c.OnAssign(t.Context(), p, st.WM+1); err != nil {
				t.Fatal(err)
			}
			if err := e.c.OnRewind(t.Context(), p, reader.RewindInfo{ID: events.NewID(), From: b1[0].Seq, Until: last, Requested: now, MovesBack: true}); err != nil {
				t.Fatal(err)
			}
			mustHandle(t, e.c, p, e.clicks.from(p, b1[0].Seq, last))

			if got := stats(t, e.c, "acme", code).Totals; got != (counter.Pair{Human: 5}) {
				t.Errorf("totals %+v, want 5 human", got)
			}
			if got := metric(t, e.reg, "snip_clickcounter_missed_events_total", map[string]string{"result": "read"}); got != want {
				t.Errorf("missed_events_total{result=read} = %v, want %v", got, want)
			}
		})
	}
}

// lostInTheStore sets partition p of one link up as the counter's catch-up
// begins: b1 (nb1 clicks of code) counted, lost (three) counted and then
// lost by the store, and b3 (one), which the counter answers with a replay
// from lost's first event. CLICKS holds them all, from b1 on.
func (e *env) lostInTheStore(t *testing.T, p int, code string, now time.Time, nb1 int) (b1, lost, b3 []reader.Event) {
	t.Helper()
	var s seqs
	for range nb1 {
		b1 = append(b1, s.event(p, click("acme", code, now)))
	}
	lost = s.events(p, click("acme", code, now), click("acme", code, now), click("acme", code, now))
	b3 = s.events(p, click("acme", code, now))
	e.first.Store(b1[0].Seq)
	e.clicks.store(b1...)
	e.clicks.store(lost...)
	e.clicks.store(b3...)
	mustHandle(t, e.c, p, b1)
	e.handleAndLose(t, e.c, p, lost)
	err := e.c.HandleBatch(t.Context(), p, b3)
	var re *reader.ReplayError
	if !errors.As(err, &re) || re.From != lost[0].Seq {
		t.Fatalf("HandleBatch = %v, want a replay from %d", err, lost[0].Seq)
	}
	return b1, lost, b3
}

// Another member starts a recount of the partition while this one still
// holds a batch of it (a stale owner during a hand-over): its write
// conflicts, it reads the new generation, which has counted nothing before
// the batch, and asks for the partition's events from the oldest again so
// that the recount misses none. Those events are the recount's to count,
// not events Redis lost: neither this member's metric nor the store's
// record of a lost stretch (which the next owner would count from) may
// take them for lost.
func TestARecountStartedUnderAStaleOwnerIsNotCountedAsMissed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const p = 2
	code := codeIn(t, p, 43)
	now := time.Now().UTC()
	var s seqs
	b1 := s.events(p, click("acme", code, now), click("acme", code, now))
	b2 := s.events(p, click("acme", code, now))
	e.first.Store(b1[0].Seq)
	e.clicks.store(b1...)
	e.clicks.store(b2...)
	mustHandle(t, e.c, p, b1)

	owner := e.newCounter(t, nil)
	if err := owner.OnAssign(t.Context(), p, b2[0].Seq); err != nil {
		t.Fatal(err)
	}
	if err := owner.OnRewind(t.Context(), p, reader.RewindInfo{ID: events.NewID(), From: b1[0].Seq, Until: b2[0].Seq, Requested: now, MovesBack: true}); err != nil {
		t.Fatal(err)
	}
	e.handleReplaying(t, e.c, p, b2, b1[0].Seq) // the stale owner's batch, fetched before the rewind

	if got := stats(t, owner, "acme", code); got.Totals != (counter.Pair{Human: 3}) || got.AsOf.Generation != 2 {
		t.Errorf("totals %+v as of %+v, want 3 human in generation 2", got.Totals, got.AsOf)
	}
	if got := metric(t, e.reg, "snip_clickcounter_missed_events_total", map[string]string{"result": "read"}); got != 0 {
		t.Errorf("missed_events_total{result=read} = %v, want 0: Redis lost nothing", got)
	}
	st, err := e.store.State(t.Context(), p)
	if err != nil {
		t.Fatal(err)
	}
	if st.LostUntil != 0 {
		t.Errorf("the store records events %d to %d as lost, want none", st.LostFrom, st.LostUntil)
	}
}
