package httpapi

import (
	"context"
	"encoding/json"
	"sync"
	"time"
)

// The page carries the panels' first figures, so its first paint shows them
// instead of placeholders while the script's first requests travel. The
// figures come from the same remembered values the panels poll (memo), so a
// page costs nothing more than one poll.

// initialWait is how long the page waits for the first figures; a panel
// whose figures take longer is filled by the script's first poll.
const initialWait = 1500 * time.Millisecond

// initialCompute bounds each computation the page starts: it goes on after
// the page stopped waiting (so the next poll finds it done), as memo's
// computations do whoever asked for them.
const initialCompute = 20 * time.Second

// initial returns the panels' figures available within initialWait, as the
// JSON object the script's renderInitial reads: readers, outbox, webhooks,
// alerts, dlq, warehouse, each shaped as its /api endpoint answers.
func (a *api) initial(ctx context.Context) string {
	var mu sync.Mutex
	out := map[string]any{"alerts": a.d.Alerts.Snapshot()}
	put := func(k string, v any) {
		mu.Lock()
		defer mu.Unlock()
		out[k] = v
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), initialCompute)
	var wg sync.WaitGroup
	wg.Go(func() {
		if s, err := a.readers.Get(cctx); err == nil {
			put("readers", s)
		}
	})
	wg.Go(func() { put("outbox", a.outboxPanel(cctx)) })
	wg.Go(func() { put("webhooks", a.webhooksPanel(cctx)) })
	wg.Go(func() {
		if p, err := a.dlqPanel(cctx); err == nil {
			put("dlq", p)
		}
	})
	wg.Go(func() {
		if s, err := a.warehouse.Get(cctx); err == nil {
			put("warehouse", s)
		}
	})
	done := make(chan struct{})
	go func() {
		wg.Wait()
		cancel()
		close(done)
	}()
	t := time.NewTimer(initialWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	case <-ctx.Done():
	}
	mu.Lock()
	defer mu.Unlock()
	b, err := json.Marshal(out)
	if err != nil {
		return "{}"
	}
	return string(b)
}
