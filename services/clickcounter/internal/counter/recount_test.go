package counter_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/clickcounter/internal/counter"
)

func TestRecountRebuildsInANewGenerationAndSwitchesAtTheEnd(t *testing.T) {
	t.Parallel()
	double := func(*events.Click) int64 { return 2 }
	e := newEnv(t, withHooks(counter.Hooks{Weight: double}))
	fixed := e.newCounter(t, nil)
	const p = 1
	code, quiet := codeIn(t, p, 10), codeIn(t, p, 11)
	now := time.Now().UTC()
	var s seqs
	var batches [][]reader.Event
	for range 5 {
		var cs []events.Click
		for range 4 {
			cs = append(cs, click("acme", code, now))
		}
		cs = append(cs, click("acme", quiet, now))
		batches = append(batches, s.events(p, cs...))
	}
	for _, b := range batches {
		mustHandle(t, e.c, p, b)
	}
	// A verdict on the buggy generation (it moves one click of the two the
	// bug counted); the recount must keep it.
	if _, err := e.c.ApplyVerdict(t.Context(), verdict(batches[0][0], true), 1); err != nil {
		t.Fatal(err)
	}
	before := stats(t, fixed, "acme", code).Totals
	if d := cmp.Diff(counter.Pair{Human: 39, Bot: 1}, before); d != "" {
		t.Fatalf("buggy counts (-want +got):\n%s", d)
	}
	e.first.Store(batches[0][0].Seq)
	info := reader.RewindInfo{ID: events.NewID(), From: batches[0][0].Seq, Until: s.n, Requested: now, MovesBack: true}
	if err := fixed.OnRewind(t.Context(), p, info); err != nil {
		t.Fatal(err)
	}
	// The same replay reaching the member again (after a crash) starts nothing new.
	if err := fixed.OnRewind(t.Context(), p, info); err != nil {
		t.Fatal(err)
	}
	want := counter.Pair{Human: 19, Bot: 1}
	for i, b := range batches {
		mustHandle(t, fixed, p, b)
		got := stats(t, fixed, "acme", code)
		last := i == len(batches)-1
		switch {
		case !last && got.Totals != before:
			t.Fatalf("after batch %d of the recount: totals %+v, want the old %+v until the end", i, got.Totals, before)
		case !last && (got.AsOf.Recount == nil || got.AsOf.Recount.Generation != 2 || got.AsOf.Recount.Until != s.n):
			t.Fatalf("after batch %d: as_of = %+v, want a recount of generation 2 until %d", i, got.AsOf, s.n)
		case last && got.Totals != want:
			t.Fatalf("after the recount: totals %+v, want %+v", got.Totals, want)
		case last && (got.AsOf.Recount != nil || got.AsOf.Generation != 2):
			t.Fatalf("after the recount: as_of = %+v, want generation 2 and no recount", got.AsOf)
		}
	}
	if got := stats(t, fixed, "acme", quiet).Totals; got != (counter.Pair{Human: 5}) {
		t.Errorf("other link after the recount: %+v, want 5 human", got)
	}
	n, err := fixed.DropOldGenerations(t.Context(), p)
	if err != nil || n != 1 {
		t.Fatalf("DropOldGenerations = %d, %v; want 1 dropped", n, err)
	}
	if keys, _ := e.rdb.Keys(t.Context(), "cc:{p1}:g1:*").Result(); len(keys) != 0 {
		t.Fatalf("generation 1 keys left: %v", keys)
	}
	// Redelivery after the switch is still absorbed by the new watermark.
	mustHandle(t, fixed, p, batches[4])
	if got := stats(t, fixed, "acme", code).Totals; got != want {
		t.Fatalf("after a redelivery: %+v, want %+v", got, want)
	}
}

func TestReplayOfAnEmptyPartitionSwitchesAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.first.Store(0)
	if err := e.c.OnRewind(t.Context(), 3, reader.RewindInfo{ID: events.NewID(), From: 1, Until: 0}); err != nil {
		t.Fatal(err)
	}
	st, err := e.store.State(t.Context(), 3)
	if err != nil {
		t.Fatal(err)
	}
	if st.Read != 2 || st.Write != 2 || st.Recounting() {
		t.Fatalf("state = %+v, want generation 2 read and written", st)
	}
}

// A partition that counted clicks, all of them since gone from CLICKS
// (retention): a replay finds nothing there (From past Until, whether it
// asked for a time or for sequence 1), and must not start a recount, which
// would switch at once to an empty generation and lose every count.
func TestReplayOfAPartitionCLICKSRetainsNothingOfKeepsItsCounts(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const p = 2
	code := codeIn(t, p, 13)
	var s seqs
	mustHandle(t, e.c, p, s.events(p, click("acme", code, time.Now()), click("acme", code, time.Now())))
	e.first.Store(0) // aged out
	if err := e.c.OnRewind(t.Context(), p, reader.RewindInfo{ID: events.NewID(), From: 1, Until: 0}); err != nil {
		t.Fatal(err)
	}
	st, err := e.store.State(t.Context(), p)
	if err != nil {
		t.Fatal(err)
	}
	if st.Read != 1 || st.Recounting() {
		t.Errorf("state = %+v, want generation 1 and no recount", st)
	}
	if got := stats(t, e.c, "acme", code).Totals.Human; got != 2 {
		t.Errorf("human total = %d, want 2", got)
	}
	if got := metric(t, e.reg, "snip_clickcounter_recounts_total", map[string]string{"result": "nothing_retained"}); got != 1 {
		t.Errorf("recounts_total{result=nothing_retained} = %v, want 1", got)
	}
}

func TestReplayFromLaterThanTheOldestEventRecountsNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const p = 0
	code := codeIn(t, p, 12)
	now := time.Now()
	var s seqs
	batch := s.events(p, click("acme", code, now), click("acme", code, now), click("acme", code, now))
	mustHandle(t, e.c, p, batch)
	e.first.Store(batch[0].Seq)
	if err := e.c.OnRewind(t.Context(), p, reader.RewindInfo{ID: events.NewID(), From: batch[1].Seq, Until: s.n, MovesBack: true}); err != nil {
		t.Fatal(err)
	}
	mustHandle(t, e.c, p, batch[1:]) // the replayed events
	st, err := e.store.State(t.Context(), p)
	if err != nil {
		t.Fatal(err)
	}
	if st.Read != 1 || st.Recounting() {
		t.Errorf("state = %+v, want generation 1 and no recount", st)
	}
	if got := stats(t, e.c, "acme", code).Totals.Human; got != 3 {
		t.Errorf("human total = %d, want 3", got)
	}
	if got := metric(t, e.reg, "snip_clickcounter_recounts_total", map[string]string{"result": "partial_ignored"}); got != 1 {
		t.Errorf("recounts_total{result=partial_ignored} = %v, want 1", got)
	}
}

// A second replay while a recount runs abandons the unfinished generation
// and starts another; the reads stay on the last complete one throughout.
func TestReplayDuringARecountStartsOver(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const p = 2
	code := codeIn(t, p, 13)
	now := time.Now()
	var s seqs
	b1 := s.events(p, click("acme", code, now), click("acme", code, now))
	b2 := s.events(p, click("acme", code, now))
	mustHandle(t, e.c, p, b1)
	mustHandle(t, e.c, p, b2)
	e.first.Store(b1[0].Seq)
	if err := e.c.OnRewind(t.Context(), p, reader.RewindInfo{ID: events.NewID(), From: b1[0].Seq, Until: s.n, MovesBack: true}); err != nil {
		t.Fatal(err)
	}
	mustHandle(t, e.c, p, b1)
	if err := e.c.OnRewind(t.Context(), p, reader.RewindInfo{ID: events.NewID(), From: b1[0].Seq, Until: s.n, MovesBack: true}); err != nil {
		t.Fatal(err)
	}
	if n, err := e.c.DropOldGenerations(t.Context(), p); err != nil || n != 1 {
		t.Fatalf("DropOldGenerations = %d, %v; want the abandoned generation dropped", n, err)
	}
	if got := stats(t, e.c, "acme", code); got.Totals.Human != 3 || got.AsOf.Generation != 1 || got.AsOf.Recount.Generation != 3 {
		t.Fatalf("during the second recount: %+v as of %+v, want 3 human from generation 1, recounting 3", got.Totals, got.AsOf)
	}
	mustHandle(t, e.c, p, b1)
	mustHandle(t, e.c, p, b2)
	if got := stats(t, e.c, "acme", code); got.Totals.Human != 3 || got.AsOf.Generation != 3 || got.AsOf.Recount != nil {
		t.Fatalf("after: %+v as of %+v, want 3 human from generation 3", got.Totals, got.AsOf)
	}
}

// snip_clickcounter_generation is reported by the partition's owner only: a
// member that gave the partition up drops its series, which would otherwise
// stay at whatever it last saw (a recount that never seems to end).
func TestGenerationGaugeLeavesWithThePartition(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const p = 5
	if err := e.c.OnAssign(t.Context(), p, 1); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"partition": "5", "role": "read"}
	if got, ok := series(t, e.reg, "snip_clickcounter_generation", labels); !ok || got != 1 {
		t.Fatalf("generation{partition=5,role=read} while owned = %v (series present %v), want 1", got, ok)
	}
	e.c.OnRevoke(p)
	if got, ok := series(t, e.reg, "snip_clickcounter_generation", labels); ok {
		t.Errorf("generation{partition=5,role=read} after OnRevoke = %v, want no series", got)
	}
}

// parked returns the event the reader runtime would park at the next
// sequence of partition p (its payload does not matter: the counter never
// sees it).
func (s *seqs) parked(p int) reader.Event {
	s.n += 3
	return reader.Event{Partition: p, Seq: s.n, Stored: time.Now().UTC()}
}

// A recount whose last events (through Until) were parked by the runtime
// (malformed, say), with no valid click after them: the runtime tells the
// counter it passed them (OnPassed), and the recount switches then, once,
// with the right counts. Told again (the batch handed again after a crash,
// to this member or the next), it changes nothing.
func TestRecountWhoseLastEventsWereParkedSwitchesWhenTheyArePassed(t *testing.T) {
	t.Parallel()
	double := func(*events.Click) int64 { return 2 }
	e := newEnv(t, withHooks(counter.Hooks{Weight: double}))
	reg := prometheus.NewRegistry()
	fixed := e.newCounter(t, reg)
	const p = 2
	code := codeIn(t, p, 30)
	now := time.Now().UTC()
	var s seqs
	counted := s.events(p, click("acme", code, now), click("acme", code, now), click("acme", code, now))
	mid, last := s.parked(p), s.parked(p)
	mustHandle(t, e.c, p, counted)
	e.first.Store(counted[0].Seq)
	info := reader.RewindInfo{ID: events.NewID(), From: counted[0].Seq, Until: last.Seq, Requested: now, MovesBack: true}
	if err := fixed.OnRewind(t.Context(), p, info); err != nil {
		t.Fatal(err)
	}
	mustHandle(t, fixed, p, counted)
	old, want := counter.Pair{Human: 6}, counter.Pair{Human: 3}
	// Passing the first parked event moves the new generation's
	// watermark, short of Until: still recounting.
	if err := fixed.OnPassed(t.Context(), p, reader.PassedInfo{First: mid.Seq, Last: mid.Seq, Stored: mid.Stored}); err != nil {
		t.Fatal(err)
	}
	if got := stats(t, fixed, "acme", code); got.Totals != old || got.AsOf.Recount == nil || got.AsOf.Recount.Seq != mid.Seq {
		t.Fatalf("past the first parked event: totals %+v as of %+v, want the old %+v and a recount at %d", got.Totals, got.AsOf, old, mid.Seq)
	}
	// Passing Until switches.
	if err := fixed.OnPassed(t.Context(), p, reader.PassedInfo{First: last.Seq, Last: last.Seq, Stored: last.Stored}); err != nil {
		t.Fatal(err)
	}
	got := stats(t, fixed, "acme", code)
	if got.Totals != want || got.AsOf.Generation != 2 || got.AsOf.Recount != nil || got.AsOf.Seq != last.Seq {
		t.Fatalf("past Until: totals %+v as of %+v, want %+v in generation 2 at %d, no recount", got.Totals, got.AsOf, want, last.Seq)
	}
	passed, err := e.store.State(t.Context(), p)
	if err != nil {
		t.Fatal(err)
	}
	// Again, on this member and on another that loads the state afresh.
	again := e.newCounter(t, nil)
	if err := again.OnAssign(t.Context(), p, mid.Seq); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*counter.Counter{fixed, again} {
		if err := c.OnPassed(t.Context(), p, reader.PassedInfo{First: mid.Seq, Last: last.Seq, Stored: last.Stored}); err != nil {
			t.Fatal(err)
		}
	}
	st, err := e.store.State(t.Context(), p)
	if err != nil {
		t.Fatal(err)
	}
	// The same token: no write moved the watermark again.
	if d := cmp.Diff(counter.State{Read: 2, Write: 2, Replay: info.ID, WM: last.Seq, Token: passed.Token}, st); d != "" {
		t.Errorf("state after passing Until again (-want +got):\n%s", d)
	}
	if got := stats(t, again, "acme", code).Totals; got != want {
		t.Errorf("totals after passing Until again: %+v, want %+v", got, want)
	}
	if n := metric(t, reg, "snip_clickcounter_recounts_total", map[string]string{"result": "finished"}); n != 1 {
		t.Errorf("recounts_total{result=finished} = %v, want 1", n)
	}
}

// The store lost writes the counter had acked, and the next thing the
// counter hears of is parked events: moving the watermark past them would
// skip the lost events for ever, so OnPassed asks for them again first.
func TestPassingParkedEventsAfterTheStoreLostWritesAsksForTheLostEvents(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const p = 1
	code := codeIn(t, p, 31)
	now := time.Now().UTC()
	var s seqs
	b1 := s.events(p, click("acme", code, now))
	b2 := s.events(p, click("acme", code, now), click("acme", code, now))
	bad := s.parked(p)
	e.clicks.store(b1...)
	e.clicks.store(b2...)
	e.clicks.store(bad)
	mustHandle(t, e.c, p, b1)
	e.handleAndLose(t, e.c, p, b2)
	c := e.newCounter(t, nil) // the next owner
	if err := c.OnAssign(t.Context(), p, bad.Seq); err != nil {
		t.Fatal(err)
	}
	err := c.OnPassed(t.Context(), p, reader.PassedInfo{First: bad.Seq, Last: bad.Seq, Stored: bad.Stored})
	var re *reader.ReplayError
	if !errors.As(err, &re) || re.From != b2[0].Seq {
		t.Fatalf("OnPassed = %v, want a reader.Replay from %d", err, b2[0].Seq)
	}
	// The runtime hands the events again; the parked one ends the batch.
	mustHandle(t, c, p, b2)
	if err := c.OnPassed(t.Context(), p, reader.PassedInfo{First: bad.Seq, Last: bad.Seq, Stored: bad.Stored}); err != nil {
		t.Fatal(err)
	}
	if got := stats(t, c, "acme", code); got.Totals != (counter.Pair{Human: 3}) || got.AsOf.Seq != bad.Seq {
		t.Errorf("totals %+v as of %+v, want 3 human as of %d", got.Totals, got.AsOf, bad.Seq)
	}
}

// answerLost is a store whose answer to one Apply, once armed, is lost: the
// script runs in Redis, and the counter gets a timeout, as when the
// connection drops between the two.
type answerLost struct {
	counter.Store
	armed atomic.Bool
}

func (s *answerLost) Apply(ctx context.Context, w *counter.Write) (counter.ApplyResult, error) {
	res, err := s.Store.Apply(ctx, w)
	if err == nil && s.armed.CompareAndSwap(true, false) {
		return counter.ApplyResult{}, fmt.Errorf("apply batch: %w", context.DeadlineExceeded)
	}
	return res, err
}

// The write that ends a recount switches the reads to the new generation;
// if its answer is lost (a timeout), the batch comes again, meets a
// conflict (the watermark moved), and the counter reads the state again:
// the switch is there, made by its own write, and the generation it read
// before is unused. The janitor must be asked to drop it then, as after a
// switch the counter saw: nothing else asks until the partition is next
// assigned, and a member that keeps it keeps two copies of its counts.
func TestARecountWhoseSwitchWasNotAnsweredDropsTheOldGeneration(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	lossy := &answerLost{Store: e.store}
	// The member that counts the recount: its janitor has no other request
	// (it loads the partition on first use, not through OnAssign).
	c := e.newCounter(t, nil, withStore(lossy))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); c.RunJanitor(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	const p = 2
	code := codeIn(t, p, 31)
	now := time.Now().UTC()
	var s seqs
	b := s.events(p, click("acme", code, now), click("acme", code, now))
	e.clicks.store(b...)
	mustHandle(t, e.c, p, b)
	e.first.Store(b[0].Seq)
	if err := e.c.OnRewind(t.Context(), p, reader.RewindInfo{ID: events.NewID(), From: b[0].Seq, Until: s.n, Requested: now, MovesBack: true}); err != nil {
		t.Fatal(err)
	}

	lossy.armed.Store(true)
	if err := c.HandleBatch(t.Context(), p, b); err == nil {
		t.Fatal("HandleBatch with its answer lost: nil error, want the timeout")
	}
	mustHandle(t, c, p, b) // handed again by the runtime
	st, err := e.store.State(t.Context(), p)
	if err != nil {
		t.Fatal(err)
	}
	if st.Read != 2 || st.Write != 2 {
		t.Fatalf("state %+v, want the recount switched to generation 2", st)
	}
	if got := stats(t, c, "acme", code).Totals; got != (counter.Pair{Human: 2}) {
		t.Fatalf("totals %+v, want 2 human", got)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		keys, err := e.rdb.Keys(t.Context(), "cc:{p2}:g1:*").Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("generation 1 still holds %d keys 5s after the switch (%v): the janitor was never asked to drop it", len(keys), keys)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The store loses a recount's start (a failover to a replica that had not
// received it), before the recount counted anything or after it counted
// some batches: the member counting it finds the old generation on its
// next write, starts the recount again under the same replay, and counts
// the replayed events into it (asking again for those of the lost
// generation), so the recount asked for happens, with the right counts,
// and says so (recounts_total{result="restarted"}). Before, the replayed
// events fell below the old generation's watermark and nothing was
// recounted, silently.
func TestARecountWhoseStartTheStoreLostIsStartedAgain(t *testing.T) {
	t.Parallel()
	for _, lost := range []int{0, 2} { // batches of the recount the store lost with its start
		t.Run(fmt.Sprintf("with %d batches counted", lost), func(t *testing.T) {
			t.Parallel()
			double := func(*events.Click) int64 { return 2 }
			e := newEnv(t, withHooks(counter.Hooks{Weight: double}))
			reg := prometheus.NewRegistry()
			fixed := e.newCounter(t, reg)
			const p = 3
			code := codeIn(t, p, 40)
			now := time.Now().UTC()
			var s seqs
			var batches [][]reader.Event
			for range 4 {
				b := s.events(p, click("acme", code, now), click("acme", code, now))
				e.clicks.store(b...)
				batches = append(batches, b)
				mustHandle(t, e.c, p, b)
			}
			e.first.Store(batches[0][0].Seq)
			before := testenv.SnapshotRedis(t, e.rdb)
			info := reader.RewindInfo{ID: events.NewID(), From: batches[0][0].Seq, Until: s.n, Requested: now, MovesBack: true}
			if err := fixed.OnRewind(t.Context(), p, info); err != nil {
				t.Fatal(err)
			}
			for _, b := range batches[:lost] {
				mustHandle(t, fixed, p, b)
			}
			before.Restore(t, e.rdb) // the failover: the start and what followed are gone

			if lost == 0 {
				for _, b := range batches {
					mustHandle(t, fixed, p, b)
				}
			} else {
				e.handleReplaying(t, fixed, p, batches[lost], batches[0][0].Seq)
				for _, b := range batches[lost+1:] {
					mustHandle(t, fixed, p, b)
				}
			}
			got := stats(t, fixed, "acme", code)
			if got.Totals != (counter.Pair{Human: 8}) || got.AsOf.Generation != 2 || got.AsOf.Recount != nil {
				t.Fatalf("after the replay: totals %+v as of %+v, want 8 human (recounted) in generation 2, no recount running", got.Totals, got.AsOf)
			}
			for result, want := range map[string]float64{"started": 1, "restarted": 1, "finished": 1} {
				if n := metric(t, reg, "snip_clickcounter_recounts_total", map[string]string{"result": result}); n != want {
					t.Errorf("recounts_total{result=%s} = %v, want %v", result, n, want)
				}
			}
		})
	}
}

// startAnswerLost is a store whose answer to one StartGeneration, once
// armed, is lost: the script runs in Redis, and the counter gets a timeout.
type startAnswerLost struct {
	counter.Store
	armed atomic.Bool
}

func (s *startAnswerLost) StartGeneration(ctx context.Context, p int, id, token string, from, until uint64) (counter.State, bool, error) {
	st, started, err := s.Store.StartGeneration(ctx, p, id, token, from, until)
	if err == nil && s.armed.CompareAndSwap(true, false) {
		return counter.State{}, false, fmt.Errorf("start generation: %w", context.DeadlineExceeded)
	}
	return st, started, err
}

// A replay during a recount whose start's answer is lost: the runtime calls
// OnRewind again, and the start it finds made is this member's own. It is
// counted as started, and the generation it abandoned is dropped, as for a
// start that was answered; before, the retry took it for another member's
// start and did neither.
func TestARecountStartWhoseAnswerWasLostIsCountedAndCleanedUp(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	lossy := &startAnswerLost{Store: e.store}
	reg := prometheus.NewRegistry()
	c := e.newCounter(t, reg, withStore(lossy))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); c.RunJanitor(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	const p = 1
	code := codeIn(t, p, 41)
	now := time.Now().UTC()
	var s seqs
	b := s.events(p, click("acme", code, now), click("acme", code, now))
	mustHandle(t, e.c, p, b)
	e.first.Store(b[0].Seq)
	if err := e.c.OnRewind(t.Context(), p, reader.RewindInfo{ID: events.NewID(), From: b[0].Seq, Until: s.n, Requested: now, MovesBack: true}); err != nil {
		t.Fatal(err)
	}
	mustHandle(t, e.c, p, b[:1]) // generation 2, half recounted

	second := reader.RewindInfo{ID: events.NewID(), From: b[0].Seq, Until: s.n, Requested: now, MovesBack: true}
	lossy.armed.Store(true)
	if err := c.OnRewind(t.Context(), p, second); err == nil {
		t.Fatal("OnRewind with its answer lost: nil error, want the timeout")
	}
	if err := c.OnRewind(t.Context(), p, second); err != nil { // the runtime's retry
		t.Fatal(err)
	}
	if n := metric(t, reg, "snip_clickcounter_recounts_total", map[string]string{"result": "started"}); n != 1 {
		t.Errorf("recounts_total{result=started} = %v, want 1: the start whose answer was lost", n)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		keys, err := e.rdb.Keys(t.Context(), "cc:{p1}:g2:*").Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the abandoned generation 2 still holds %d keys 5s after the start (%v): the janitor was never asked to drop it", len(keys), keys)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A later call for the same replay (a new owner's, or the runtime's
	// again) is not this start: counted once.
	if err := c.OnRewind(t.Context(), p, second); err != nil {
		t.Fatal(err)
	}
	if n := metric(t, reg, "snip_clickcounter_recounts_total", map[string]string{"result": "started"}); n != 1 {
		t.Errorf("recounts_total{result=started} after the same replay again = %v, want 1", n)
	}
}

// With the replica wait on, a recount's start waits for the replicas
// before the consumer moves back; on a Redis without replicas the wait
// falls short, which is counted, and the recount starts all the same.
func TestARecountStartWaitsForTheReplicas(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.store.WaitForReplicas(1, 20*time.Millisecond)
	const p = 0
	code := codeIn(t, p, 42)
	var s seqs
	b := s.events(p, click("acme", code, time.Now().UTC()))
	mustHandle(t, e.c, p, b)
	e.first.Store(b[0].Seq)
	if err := e.c.OnRewind(t.Context(), p, reader.RewindInfo{ID: events.NewID(), From: b[0].Seq, Until: s.n, MovesBack: true}); err != nil {
		t.Fatal(err)
	}
	if n := metric(t, e.reg, "snip_clickcounter_replica_wait_short_total", map[string]string{"feed": "recount"}); n != 1 {
		t.Errorf("replica_wait_short_total{feed=recount} = %v, want 1 (no replica confirmed the start)", n)
	}
	if n := metric(t, e.reg, "snip_clickcounter_recounts_total", map[string]string{"result": "started"}); n != 1 {
		t.Errorf("recounts_total{result=started} = %v, want 1", n)
	}
}

// A replay the runtime does not move the partition back for
// (RewindInfo.MovesBack false) hands nothing again: the partition goes on
// after the last event it handled. A recount started then would count only
// what comes after that, and lose what the partition counted before: most
// plainly when the partition held nothing when the replay was asked for
// (Until 0: a recount that takes over the reads at once) or nothing from
// its position (From past Until) and its owner handled new clicks before it
// carried the replay out, which CLICKS retains. Before, OnRewind went by
// From alone, started the recount, and the handled clicks were gone from
// the counts. Now the counts stay, and recounts_total{result="not_replayed"}
// says so.
func TestAReplayThatDoesNotMoveBackKeepsTheCounts(t *testing.T) {
	t.Parallel()
	for _, when := range []string{"the partition was empty", "its events had aged out"} {
		t.Run(when, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			const p = 1
			code := codeIn(t, p, 60)
			now := time.Now().UTC()
			var s seqs
			var until uint64 // the partition's last event when the replay was asked
			if when == "its events had aged out" {
				mustHandle(t, e.c, p, s.events(p, click("acme", code, now)))
				until = s.n
			}
			// Stored and handled after the request, before the owner carries it out.
			b := s.events(p, click("acme", code, now), click("acme", code, now))
			e.clicks.store(b...)
			mustHandle(t, e.c, p, b)
			e.first.Store(b[0].Seq) // CLICKS retains these, not what came before
			info := reader.RewindInfo{ID: events.NewID(), From: until + 1, Until: until, Requested: now, MovesBack: false}
			if err := e.c.OnRewind(t.Context(), p, info); err != nil {
				t.Fatal(err)
			}
			after := s.events(p, click("acme", code, now)) // the partition goes on after b
			e.clicks.store(after...)
			mustHandle(t, e.c, p, after)

			want := int64(3)
			if until != 0 {
				want = 4
			}
			if got := stats(t, e.c, "acme", code); got.Totals.Human != want || got.AsOf.Generation != 1 || got.AsOf.Recount != nil {
				t.Errorf("totals %+v as of %+v, want %d human in generation 1, no recount", got.Totals, got.AsOf, want)
			}
			if n := metric(t, e.reg, "snip_clickcounter_recounts_total", map[string]string{"result": "not_replayed"}); n != 1 {
				t.Errorf("recounts_total{result=not_replayed} = %v, want 1", n)
			}
		})
	}
}
