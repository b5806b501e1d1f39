package outbox

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
)

// TestCommitterLingersOnlyWhileClicksAreDense: with a Linger of an hour, a
// lone click (none before it within the Linger) is written at once, and a
// click that follows another within the Linger waits for more until its
// batch is full: three clicks, one round trip.
func TestCommitterLingersOnlyWhileClicksAreDense(t *testing.T) {
	testenv.Parallel(t)
	e := newEnv(t, 1)
	m := NewMetrics(prometheus.NewRegistry())
	c := NewCommitter(e.rdb, e.layout, CommitterConfig{MaxBatch: 3, Workers: 1, MaxEntries: 1 << 40,
		Timeout: 5 * time.Second, Cooldown: time.Second, Linger: time.Hour}, m)
	c.Start()
	defer c.Close()
	add := func(ctx context.Context) (Ticket, error) {
		return c.Submit(ctx, 0, []byte(events.NewID()), []byte("clicks.acme.abc"), []byte("{}"), 0)
	}

	// Had it lingered, it would wait an hour, far past this deadline.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	lone, err := add(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lone.Wait(ctx); err != nil {
		t.Fatalf("a lone click: %v, want it written without lingering", err)
	}
	lone.Release()

	// The next three come within the Linger of the one before: the worker
	// takes the first, waits, and writes when the batch is full.
	first, err := add(ctx)
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the worker to take the first dense click", func() bool { return len(c.reqs) == 0 })
	var rest []Ticket
	for range 2 {
		tk, err := add(ctx)
		if err != nil {
			t.Fatal(err)
		}
		rest = append(rest, tk)
	}
	for i, tk := range append([]Ticket{first}, rest...) {
		if _, err := tk.Wait(ctx); err != nil {
			t.Fatalf("dense click %d: %v", i, err)
		}
		tk.Release()
	}
	if n, sum := histogramCounts(m.BatchSize); n != 2 || sum != 4 {
		t.Errorf("%d commits of %v clicks in all, want 2 (the lone click, then the three dense ones together)", n, sum)
	}
	if n := e.rdb.XLen(t.Context(), e.layout.OutboxKey(0, LaneClicks)).Val(); n != 4 {
		t.Errorf("outbox holds %d, want 4", n)
	}
}
