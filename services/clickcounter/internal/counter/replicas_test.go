package counter_test

import (
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/events"
)

// With the store waiting for replicas, the verdict and LINKS feeds' writes
// are followed by the wait; on a Redis without replicas it falls short, the
// shortfall is counted per feed, and the writes stand.
func TestFeedsWaitForReplicas(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.store.WaitForReplicas(1, 20*time.Millisecond)
	ctx := t.Context()
	const p = 1
	code := codeIn(t, p, 30)
	if err := e.c.ApplyLinkEvent(ctx, linkEvent(events.LinkCreated, "acme", code), 1); err != nil {
		t.Fatal(err)
	}
	var s seqs
	b := s.events(p, click("acme", code, time.Now().UTC()))
	mustHandle(t, e.c, p, b)
	if _, err := e.c.ApplyVerdict(ctx, verdict(b[0], true), 1); err != nil {
		t.Fatal(err)
	}
	if got := stats(t, e.c, "acme", code).Totals.Bot; got != 1 {
		t.Errorf("bot total = %d, want 1: the verdict stands", got)
	}
	for feed, want := range map[string]float64{"links": 1, "verdicts": 1} {
		if got := metric(t, e.reg, "snip_clickcounter_replica_wait_short_total", map[string]string{"feed": feed}); got != want {
			t.Errorf("replica_wait_short_total{feed=%s} = %v, want %v", feed, got, want)
		}
	}
}
