package scenario

import (
	"strconv"
	"testing"

	"github.com/snipdev/snip/pkg/events"
)

// TestReadOrderJudgesEachEventAtItsFirstHanding: the repartition lesson's
// Snip reader is handed a batch again (the lease lapsed, or the ack wait ran
// out on a busy machine): the repeated events are not reads out of order and
// are counted once towards "every event read or parked". Before, CI's run
// counted 73 links out of order (the row predicts 0) and ended its wait for
// "every event read or parked" early, with 1,591 of 1,620 events parked.
func TestReadOrderJudgesEachEventAtItsFirstHanding(t *testing.T) {
	click := func(code string, i int) events.Click {
		return events.Click{ID: code + "-" + strconv.Itoa(i), Code: code, RequestID: strconv.Itoa(i)}
	}
	var r readOrder
	for _, c := range []events.Click{
		click("a", 0), click("a", 1), click("b", 0), click("a", 2),
		click("a", 1), click("a", 2), // the batch handed again
		click("a", 3), click("b", 1),
	} {
		r.read(c)
	}
	if len(r.disordered) != 0 {
		t.Errorf("links read out of order %v, want none: a batch handed again is not a read out of order", r.disordered)
	}
	if r.handled != 6 || r.again != 2 {
		t.Errorf("handled %d, handed again %d; want 6 and 2", r.handled, r.again)
	}

	// A first handing out of order is still one.
	var o readOrder
	for _, c := range []events.Click{click("a", 0), click("a", 2), click("a", 1)} {
		o.read(c)
	}
	if !o.disordered["a"] || len(o.disordered) != 1 {
		t.Errorf("links read out of order %v, want a", o.disordered)
	}
}
