package counter_test

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/services/clickcounter/internal/counter"
)

// sibling returns an event ID with the same UUIDv7 time as id (so the same
// recent-ID bucket) and other random bits.
func sibling(id, tail string) string { return id[:24] + tail }

// A click stored in a partition its code does not hash to is parked, not
// counted; a verdict naming it (with that partition and its sequence there)
// must move nothing, even though the code's own partition has counted past
// that sequence.
func TestVerdictAboutAClickStoredInAnotherPartitionMovesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	code := codeIn(t, 2, 7) // hashes to partition 2
	now := time.Now().UTC()
	var s seqs
	stray := s.event(1, click("acme", code, now)) // stored in partition 1
	good := s.events(2, click("acme", code, now), click("acme", code, now), click("acme", code, now))
	mustHandle(t, e.c, 2, good) // partition 2's watermark is now past stray.Seq

	var pe *reader.PoisonError
	if err := e.c.HandleBatch(t.Context(), 1, []reader.Event{stray}); !errors.As(err, &pe) || pe.Reason != counter.ReasonWrongPartition {
		t.Fatalf("HandleBatch(stray) = %v, want Poison(%q)", err, counter.ReasonWrongPartition)
	}
	got, err := e.c.ApplyVerdict(t.Context(), verdict(stray, true), 1)
	if err != nil {
		t.Fatalf("ApplyVerdict: %v", err)
	}
	if got != counter.NotCounted {
		t.Errorf("status = %s, want %s", got, counter.NotCounted)
	}
	if d := cmp.Diff(all(counter.Pair{Human: 3}), viewOf(t, e.c, "acme", code, now)); d != "" {
		t.Errorf("counts (-want +got):\n%s", d)
	}
	if n := metric(t, e.reg, "snip_clickcounter_corrections_total", map[string]string{"result": "not_counted"}); n != 1 {
		t.Errorf("corrections{result=not_counted} = %v, want 1", n)
	}
}

// The counter knows per event whether it counted it: a click of the right
// partition that it never counted (the runtime parked it) is past the
// watermark, but not in the recent-ID record, so its verdict records a label
// and moves nothing.
func TestVerdictAboutAnUncountedClickPastTheWatermarkMovesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	code := codeIn(t, 3, 8)
	now := time.Now().UTC()
	var s seqs
	first := click("acme", code, now)
	skipped, last := first, first
	skipped.ID = sibling(first.ID, "0000000000a1")
	last.ID = sibling(first.ID, "0000000000b2")
	evs := s.events(3, first, skipped, last)
	// The runtime parked evs[1]: the counter sees the others only.
	mustHandle(t, e.c, 3, []reader.Event{evs[0], evs[2]})

	got, err := e.c.ApplyVerdict(t.Context(), verdict(evs[1], true), 1)
	if err != nil {
		t.Fatalf("ApplyVerdict: %v", err)
	}
	if got != counter.Relabelled {
		t.Errorf("status = %s, want %s (label recorded)", got, counter.Relabelled)
	}
	if d := cmp.Diff(all(counter.Pair{Human: 2}), viewOf(t, e.c, "acme", code, now)); d != "" {
		t.Errorf("counts (-want +got):\n%s", d)
	}
	// A verdict about a click it did count moves it.
	if _, err := e.c.ApplyVerdict(t.Context(), verdict(evs[2], true), 2); err != nil {
		t.Fatalf("ApplyVerdict: %v", err)
	}
	if d := cmp.Diff(all(counter.Pair{Human: 1, Bot: 1}), viewOf(t, e.c, "acme", code, now)); d != "" {
		t.Errorf("counts after a verdict on a counted click (-want +got):\n%s", d)
	}
}

// Past the recent-ID record's window the watermark of the click's own
// partition decides, as before: a click counted long ago still moves.
func TestVerdictAfterTheRecordExpiredUsesTheOwnPartitionsWatermark(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	code := codeIn(t, 0, 9)
	now := time.Now().UTC()
	var s seqs
	evs := s.events(0, click("acme", code, now), click("acme", code, now))
	mustHandle(t, e.c, 0, evs)
	keys, err := e.rdb.Keys(t.Context(), "cc:{p0}:g*:id:*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("recent-ID keys = %v (%v), want some", keys, err)
	}
	if err := e.rdb.Del(t.Context(), keys...).Err(); err != nil { // the window passed
		t.Fatal(err)
	}
	if _, err := e.c.ApplyVerdict(t.Context(), verdict(evs[0], true), 1); err != nil {
		t.Fatalf("ApplyVerdict: %v", err)
	}
	if d := cmp.Diff(all(counter.Pair{Human: 1, Bot: 1}), viewOf(t, e.c, "acme", code, now)); d != "" {
		t.Errorf("counts (-want +got):\n%s", d)
	}
}

// A recent-ID bucket that expired can come back: a click with an ID in the
// same span of ID time, stored late (an outbox backlog, a skewed clock) and
// counted after the expiry, makes it again, holding only that click's
// fingerprint. It then says nothing about the clicks counted in the span
// before: a verdict about one of them is decided by the watermark, as if
// the bucket were gone. (Read as authoritative, the new bucket said "not
// counted": the verdict moved nothing, and a later verdict back, decided by
// the watermark once the bucket expired again, drove the count negative.)
func TestVerdictAboutAClickCountedBeforeItsBucketCameBackUsesTheWatermark(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	code := codeIn(t, 0, 11)
	now := time.Now().UTC()
	var s seqs
	early := click("acme", code, now)
	evs := s.events(0, early)
	mustHandle(t, e.c, 0, evs)
	keys, err := e.rdb.Keys(t.Context(), "cc:{p0}:g*:id:*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("recent-ID keys = %v (%v), want one", keys, err)
	}
	if err := e.rdb.Del(t.Context(), keys...).Err(); err != nil { // the window passed
		t.Fatal(err)
	}
	late := early
	late.ID = sibling(early.ID, "0000000000c3")
	mustHandle(t, e.c, 0, s.events(0, late)) // the same bucket, made again
	if n, err := e.rdb.Exists(t.Context(), keys[0]).Result(); err != nil || n != 1 {
		t.Fatalf("the bucket %s after the late click: exists=%d (%v), want it made again", keys[0], n, err)
	}

	if _, err := e.c.ApplyVerdict(t.Context(), verdict(evs[0], true), 1); err != nil {
		t.Fatalf("ApplyVerdict: %v", err)
	}
	if d := cmp.Diff(all(counter.Pair{Human: 1, Bot: 1}), viewOf(t, e.c, "acme", code, now)); d != "" {
		t.Errorf("counts after a verdict on the early click (-want +got):\n%s", d)
	}
	// Back to human once the bucket expired again: the click moves back,
	// nothing goes negative.
	if err := e.rdb.Del(t.Context(), keys...).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.ApplyVerdict(t.Context(), verdict(evs[0], false), 2); err != nil {
		t.Fatalf("ApplyVerdict: %v", err)
	}
	if d := cmp.Diff(all(counter.Pair{Human: 2}), viewOf(t, e.c, "acme", code, now)); d != "" {
		t.Errorf("counts after the verdict back (-want +got):\n%s", d)
	}
}

// A recount rebuilds a generation from the oldest event CLICKS retains; a
// click that had aged out before it is in no count of the new generation.
// Verdicts about a click are applied until a day past its retention, so
// one can name such a click after the recount: its bucket in the new
// generation is empty, and the new generation's watermark is past it, yet
// it never counted it. The verdict moves nothing there (it moved a click
// the generation counted instead: one of the link's human clicks became a
// bot).
func TestVerdictAboutAClickOlderThanTheRecountMovesNothingInIt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const p = 0
	code := codeIn(t, p, 13)
	now := time.Now().UTC()
	var s seqs
	oc := click("acme", code, now.Add(-time.Minute))
	oc.ID = idAt(t, oc.Time)[:19] + events.NewID()[19:] // its own bucket
	old := s.events(p, oc)
	mustHandle(t, e.c, p, old)
	// CLICKS no longer holds the old click; the recount starts after it.
	kept := s.events(p, click("acme", code, now))
	e.clicks.store(kept...)
	e.first.Store(kept[0].Seq)
	if err := e.c.OnRewind(t.Context(), p, reader.RewindInfo{ID: events.NewID(), From: kept[0].Seq, Until: kept[0].Seq, MovesBack: true}); err != nil {
		t.Fatal(err)
	}
	mustHandle(t, e.c, p, kept)
	if s := stats(t, e.c, "acme", code); s.AsOf.Generation != 2 || s.Totals != (counter.Pair{Human: 1}) {
		t.Fatalf("after the recount: generation %d, totals %+v; want 2 and the kept click", s.AsOf.Generation, s.Totals)
	}
	status, err := e.c.ApplyVerdict(t.Context(), verdict(old[0], true), 1)
	if err != nil || status != counter.Relabelled {
		t.Fatalf("ApplyVerdict = %v, %v; want relabelled", status, err)
	}
	if d := cmp.Diff(all(counter.Pair{Human: 1}), viewOf(t, e.c, "acme", code, now)); d != "" {
		t.Errorf("counts of the recounted generation (-want +got):\n%s", d)
	}
}

// A Redis that lost everything counts the partition again from the oldest
// event CLICKS retains (catchUp), into a generation that starts empty: a
// click that aged out before is in none of its counts, though verdicts
// about it are still applied for a day. Such a verdict moves nothing (its
// bucket is gone and the watermark is past it, but the generation started
// after it).
func TestVerdictAboutAClickOlderThanARecountAfterRedisLostEverythingMovesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const p = 0
	code := codeIn(t, p, 14)
	now := time.Now().UTC()
	var s seqs
	oc := click("acme", code, now.Add(-time.Minute))
	oc.ID = idAt(t, oc.Time)[:19] + events.NewID()[19:] // its own bucket
	old := s.events(p, oc)
	mustHandle(t, e.c, p, old)
	kept := s.events(p, click("acme", code, now))
	e.clicks.store(kept...)
	e.first.Store(kept[0].Seq)
	if err := e.rdb.FlushDB(t.Context()).Err(); err != nil { // Redis lost everything
		t.Fatal(err)
	}
	fresh := e.newCounter(t, nil) // the partition's next owner
	mustHandle(t, fresh, p, kept)
	status, err := fresh.ApplyVerdict(t.Context(), verdict(old[0], true), 1)
	if err != nil || status != counter.Relabelled {
		t.Fatalf("ApplyVerdict = %v, %v; want relabelled", status, err)
	}
	if d := cmp.Diff(all(counter.Pair{Human: 1}), viewOf(t, fresh, "acme", code, now)); d != "" {
		t.Errorf("counts of the generation counted again (-want +got):\n%s", d)
	}
}
