package fraud_test

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/services/fraud/internal/fraud"
)

// labelledBytesBound is the most bytes one remembered labelled click may
// cost, the figure the README's Bounds section multiplies out.
const labelledBytesBound = 64

// floodEvents is one partition's traffic: a quiet link for 61 s (so the
// state is older than a flood window and the flooded link is judged against
// the floor from its first click), then rate clicks a second for secs
// seconds on one link, each from its own visitor (no burst) and so each
// labelled link_flood, then quiet more seconds of one click a second.
func floodEvents(rate, secs, quiet int) []reader.Event {
	var evs []reader.Event
	add := func(at time.Time, code, visitor string) {
		evs = append(evs, reader.Event{Seq: uint64(len(evs) + 1), Stored: at, Deliveries: 1, Click: events.Click{
			V: events.ClickVersion, ID: events.NewID(), Time: at, Code: code, Owner: "acme",
			Target: "https://example.com/", Visitor: visitor, UserAgent: browser, Country: "NL",
		}})
	}
	for i := range 61 {
		add(t0.Add(time.Duration(i)*time.Second), "quiet", fmt.Sprintf("q%d", i))
	}
	start := t0.Add(61 * time.Second)
	for i := range rate * secs {
		add(start.Add(time.Duration(i)*time.Second/time.Duration(rate)), "viral", fmt.Sprintf("v%d", i))
	}
	after := start.Add(time.Duration(secs) * time.Second)
	for i := range quiet {
		add(after.Add(time.Duration(i)*time.Second), "quiet", fmt.Sprintf("z%d", i))
	}
	return evs
}

// heldAfter judges evs with one partition's state under rules r, and
// returns the live heap the state holds at the end (after a GC) and its
// Stats. The caller keeps evs alive until its last call: events freed
// during a measurement would be counted against the state.
func heldAfter(t *testing.T, r fraud.Rules, evs []reader.Event) (int64, fraud.Stats) {
	t.Helper()
	d, err := fraud.NewDetector(r)
	if err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	p := d.NewPartition()
	for _, ev := range evs {
		p.Judge(ev)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	st := p.Stats()
	runtime.KeepAlive(p)
	return int64(after.HeapAlloc) - int64(before.HeapAlloc), st
}

// unflooded is r with a flood floor no link reaches: the same windows and
// identities as under r, nothing labelled.
func unflooded(r fraud.Rules) fraud.Rules {
	r.FloodFloor = 1 << 30
	return r
}

// The record of labelled clicks (so that no click is labelled twice, by two
// rules) is bounded by event time only: every click labelled in the last
// twice the longest window. A sustained flood of one link, every click
// labelled, must leave that many clicks remembered, no more, and each must
// cost at most labelledBytesBound bytes of heap: the bound per click/s of
// flood the README gives. The cost is the live heap of the flooded state
// less that of the same traffic with nothing labelled.
//
// Not parallel: it measures the heap, and parallel tests wait until it is
// done.
func TestLabelledClicksMemoryPerFloodClick(t *testing.T) {
	const rate = 1000 // labelled clicks a second
	r := fraud.Defaults()
	keep := 2 * r.Reach()
	secs := int(keep/time.Second) + 10
	evs := floodEvents(rate, secs, 0)
	flooded, fst := heldAfter(t, r, evs)
	plain, pst := heldAfter(t, unflooded(r), evs)
	runtime.KeepAlive(evs)

	if pst.Labelled != 0 {
		t.Fatalf("%d clicks labelled without a flood; the comparison is void", pst.Labelled)
	}
	// Every flood click of the last 2 x reach is remembered (the clock is
	// the last click's time: the first click kept is at most one second
	// of flood, rate clicks, off).
	want := int(keep/time.Second) * rate
	if fst.Labelled < want || fst.Labelled > want+rate {
		t.Fatalf("%d labelled clicks remembered after %d s of a %d/s flood; want the %s kept, %d..%d",
			fst.Labelled, secs, rate, keep, want, want+rate)
	}
	per := float64(flooded-plain) / float64(fst.Labelled)
	t.Logf("%d labelled clicks remembered: %.1f bytes each (state %d bytes flooded, %d not); %.1f kB per labelled click/s of a sustained flood",
		fst.Labelled, per, flooded, plain, per*keep.Seconds()/1000)
	if per > labelledBytesBound {
		t.Errorf("%.1f bytes per remembered labelled click, over the %d the README's bound assumes", per, labelledBytesBound)
	}
}

// Once a flood is over and its labels are past 2 x reach, the record of
// labelled clicks gives its memory back: the state holds what the same
// traffic unlabelled holds, not the room the flood's labels took.
func TestLabelledClicksMemoryIsGivenBackAfterAFlood(t *testing.T) {
	const rate, secs = 1000, 130
	r := fraud.Defaults()
	quiet := int(2*r.Reach()/time.Second) + 10
	evs := floodEvents(rate, secs, quiet)
	flooded, fst := heldAfter(t, r, evs)
	plain, _ := heldAfter(t, unflooded(r), evs)
	runtime.KeepAlive(evs)

	if fst.Labelled != 0 {
		t.Fatalf("%d labelled clicks remembered %d s after the flood, want none", fst.Labelled, quiet)
	}
	left := float64(flooded-plain) / float64(rate*secs)
	t.Logf("%.2f bytes per flood label left %d s after the flood (state %d bytes flooded, %d not)", left, quiet, flooded, plain)
	if left > 1 {
		t.Errorf("%.1f bytes per flood label still held after the flood (%d bytes): the record kept the flood's room", left, flooded-plain)
	}
}
