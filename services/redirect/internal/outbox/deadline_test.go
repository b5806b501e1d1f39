package outbox

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
)

// TestCommitterSubmitByAndWaitByEndAtTheDeadline: SubmitBy gives up on a
// full queue at its deadline, WaitBy on an outcome not known by its
// deadline, both with context.DeadlineExceeded and no context of the
// caller's ending; a timer reused after firing carries no stale tick into
// the next wait, a cancelled context still ends a wait, and a wait whose
// deadline is far off returns the outcome once the worker wrote it.
func TestCommitterSubmitByAndWaitByEndAtTheDeadline(t *testing.T) {
	testenv.Parallel(t)
	e := newEnv(t, 1)
	c := NewCommitter(e.rdb, e.layout, CommitterConfig{MaxBatch: 1, Workers: 1, MaxEntries: 1 << 40,
		Timeout: 5 * time.Second, Cooldown: time.Second}, NewMetrics(prometheus.NewRegistry()))
	defer c.Close()
	submit := func(ctx context.Context, deadline time.Time) (Ticket, error) {
		return c.SubmitBy(ctx, deadline, 0, []byte(events.NewID()), []byte("clicks.acme.abc"), []byte("{}"), 0)
	}

	// Not started: the queue (MaxBatch*Workers = 1) fills with one click.
	queued, err := submit(t.Context(), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := submit(t.Context(), start.Add(50*time.Millisecond)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("SubmitBy to a full queue: %v, want context.DeadlineExceeded", err)
	}
	if waited := time.Since(start); waited < 50*time.Millisecond {
		t.Fatalf("SubmitBy gave up after %s, before its deadline", waited)
	}
	for range 3 { // the same pooled timers, fired, then reused
		start = time.Now()
		if _, err := queued.WaitBy(t.Context(), start.Add(20*time.Millisecond)); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("WaitBy with no worker: %v, want context.DeadlineExceeded", err)
		}
		if waited := time.Since(start); waited < 20*time.Millisecond {
			t.Fatalf("WaitBy gave up after %s, before its deadline", waited)
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(50*time.Millisecond, cancel)
	if _, err := queued.WaitBy(ctx, time.Now().Add(time.Hour)); !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitBy with its context cancelled and the deadline an hour off: %v, want context.Canceled (a stale tick of a reused timer would say DeadlineExceeded)", err)
	}

	c.Start()
	at, err := queued.WaitBy(t.Context(), time.Now().Add(30*time.Second))
	if err != nil || at < time.Now().Add(-time.Minute).UnixMilli() {
		t.Fatalf("WaitBy once the worker runs: %d, %v; want the stored time", at, err)
	}
	if again, err := queued.WaitBy(t.Context(), time.Now()); err != nil || again != at {
		t.Fatalf("WaitBy of a done ticket: %d, %v; want %d again at once", again, err, at)
	}
	queued.Release()
	tk, err := submit(t.Context(), time.Now().Add(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tk.WaitBy(t.Context(), time.Now().Add(30*time.Second)); err != nil {
		t.Fatalf("a click submitted and waited for by deadline: %v", err)
	}
	tk.Release()
	if n, err := e.rdb.XLen(t.Context(), e.layout.OutboxKey(0, LaneClicks)).Result(); err != nil || n != 2 {
		t.Fatalf("outbox holds %d, %v; want the 2 clicks submitted in time (the one SubmitBy gave up on never queued)", n, err)
	}
}
