package counter

import (
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
)

// The scratch a write puts back in the pool is emptied first: none of its
// delta's slices, its marks or its maps holds a string of the batch (the
// clicks' strings share their messages' memory, which the pool would
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
