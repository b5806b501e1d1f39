package scenario

import (
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/snipdev/snip/pkg/reader"
)

// A batch handed to the log reader again (abandoned when its lease may have
// lapsed, and fetched again) is counted once: the backlog is the events
// sent less the events handled, and the reader's rates are events per
// second, so an event handed twice is still one event handled. So are the
// events handled when the rush's last one was.
func TestRushCountsABatchHandedAgainOnce(t *testing.T) {
	t.Parallel()
	lg := &rushLog{
		lim:      rate.NewLimiter(rate.Inf, 100),
		partLim:  rate.NewLimiter(rate.Inf, 100),
		lastPart: 3,
		lastAt:   make(chan time.Time, 1),
	}
	var batch []reader.Event
	for i := range 5 {
		batch = append(batch, reader.Event{Click: newClick("link0", i), Partition: 3, Seq: uint64(i + 1)})
	}
	lg.lastID.Store(batch[4].Click.ID)
	if err := lg.handle(t.Context(), 3, batch[:3]); err != nil {
		t.Fatal(err)
	}
	// The lease lapsed: the batch comes again, with the rest of the partition.
	if err := lg.handle(t.Context(), 3, batch); err != nil {
		t.Fatal(err)
	}
	if got := lg.handled.count(); got != 5 {
		t.Errorf("events handled = %d, want 5 (3 of them handed twice)", got)
	}
	if got := lg.onLast.count(); got != 5 {
		t.Errorf("events of the last one's partition handled = %d, want 5", got)
	}
	if got := lg.atLast.Load(); got != 5 {
		t.Errorf("events handled when the rush's last one was = %d, want 5", got)
	}
	select {
	case <-lg.lastAt:
	default:
		t.Error("the last event's handling was not reported")
	}
}
