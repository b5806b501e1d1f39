package counter

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
)

// The scratch a write keeps for the next batch is emptied first: none of its
// delta's slices, its marks or its maps holds a string of the batch (the
// clicks' strings share their messages' memory, which it would
// otherwise keep alive), and it keeps its room for the next batch.
func TestBatchScratchKeepsNothingOfItsBatch(t *testing.T) {
	c := &Counter{window: time.Minute}
	now := time.Now().UTC()
	evs := make([]reader.Event, 300)
	for i := range evs {
		evs[i] = reader.Event{Seq: uint64(i + 1), Click: events.Click{V: events.ClickVersion, ID: events.NewID(), Time: now,
			Code: "c" + string(rune('a'+i%20)), Owner: "acme", Visitor: "v" + string(rune('a'+i%7)), Country: "DE",
			Referrer: "https://example.org/" + string(rune('a'+i%3))}}
	}
	sc := &batchScratch{}
	b := c.build(0, State{Read: 1, Write: 1}, evs, map[string]Label{}, map[string]bool{}, sc)
	if b.w.Counted != int64(len(evs)) || len(sc.delta.Links) != 20 {
		t.Fatalf("built %d events over %d links, want %d over 20", b.w.Counted, len(sc.delta.Links), len(evs))
	}
	sc.empty()
	d := &sc.delta
	for _, l := range d.Links[:cap(d.Links)] {
		if l != (LinkDelta{}) {
			t.Fatalf("an emptied delta's links hold %+v", l)
		}
	}
	for _, c := range d.combos[:cap(d.combos)] {
		if c != (comboDelta{}) {
			t.Fatalf("an emptied delta's combos hold %+v", c)
		}
	}
	for _, v := range d.visitors[:cap(d.visitors)] {
		if v != (visitorEntry{}) {
			t.Fatalf("an emptied delta's visitors hold %+v", v)
		}
	}
	for _, m := range sc.w.Marks[:cap(sc.w.Marks)] {
		if m != (Mark{}) {
			t.Fatalf("an emptied scratch's marks hold %+v", m)
		}
	}
	if len(d.linkIdx)+len(d.comboIdx)+len(d.dayIdx)+len(d.seen)+len(d.hosts)+len(sc.seen) != 0 || sc.w.Delta != nil {
		t.Fatal("an emptied scratch's maps or write still hold the batch")
	}
	if cap(d.Links) < 20 || cap(sc.w.Marks) < len(evs) {
		t.Errorf("an emptied scratch kept room for %d links and %d marks, want 20 and %d", cap(d.Links), cap(sc.w.Marks), len(evs))
	}
}

// applyOnly is a store whose Apply applies everything and State says
// nothing was counted (nothing else is called by a write).
type applyOnly struct {
	Store
	applied int
}

func (s *applyOnly) State(context.Context, int) (State, error) { return State{Read: 1, Write: 1}, nil }

func (s *applyOnly) Apply(context.Context, *Write) (ApplyResult, error) {
	s.applied++
	return ApplyResult{Status: Applied}, nil
}

// A write's scratch is kept for the next batch across garbage collections,
// which a catch-up runs every few batches (a sync.Pool drops what it holds
// at each), emptied, with its room.
func TestBatchScratchIsKeptAcrossCollections(t *testing.T) {
	st := &applyOnly{}
	c, err := New(Options{Store: st, Clicks: struct{ Clicks }{}, Partitions: 1, DedupWindow: time.Minute, ClicksMaxAge: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	evs := make([]reader.Event, 300)
	for i := range evs {
		evs[i] = reader.Event{Seq: uint64(i + 1), Click: events.Click{V: events.ClickVersion, ID: events.NewID(), Time: now,
			Code: "c" + string(rune('a'+i%20)), Owner: "acme", Visitor: "v", Country: "DE"}}
	}
	if err := c.write(t.Context(), 0, evs); err != nil || st.applied != 1 {
		t.Fatalf("write: %v, %d applied", err, st.applied)
	}
	runtime.GC()
	runtime.GC()
	if len(c.batches) != 1 {
		t.Fatalf("%d scratches kept after two collections, want 1", len(c.batches))
	}
	sc := <-c.batches
	if len(sc.delta.Links) != 0 || len(sc.w.Marks) != 0 || cap(sc.w.Marks) < len(evs) || cap(sc.delta.Links) < 20 {
		t.Errorf("kept scratch: %d links (room %d), %d marks (room %d); want none, with room for 20 and %d",
			len(sc.delta.Links), cap(sc.delta.Links), len(sc.w.Marks), cap(sc.w.Marks), len(evs))
	}
}
