package reader_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
)

// gaugeOf is the value of a member's gauge name for partition p, and
// whether the member has that series at all.
func gaugeOf(t *testing.T, reg prometheus.Gatherer, name string, p string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "partition" && l.GetValue() == p {
					return m.GetGauge().GetValue(), true
				}
			}
		}
	}
	return 0, false
}

// A handler that hangs on a batch is what the group's stall alerts are
// for: the age of the partition's oldest unprocessed event goes on growing
// while it hangs, rather than staying what it was read before the batch.
func TestTheOldestUnprocessedAgeGrowsWhileTheHandlerHangs(t *testing.T) {
	t.Parallel()
	n, js := setup(t, 1)
	publish(t, js, 1, 1, 0)
	entered, release := make(chan struct{}), make(chan struct{})
	reg := prometheus.NewRegistry()
	first := true
	startMember(t, n, reader.Config{Group: "hang", Member: "m1", Metrics: reg},
		func(ctx context.Context, _ int, _ []reader.Event) error {
			if first {
				first = false
				close(entered)
				select {
				case <-release:
				case <-ctx.Done():
				}
			}
			return nil
		})
	defer close(release)
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler was never handed the event")
	}
	var age float64
	testenv.WaitFor(t, 20*time.Second, "the oldest unprocessed age to grow past 3s while the handler hangs", func() bool {
		age, _ = gaugeOf(t, reg, "snip_reader_oldest_unprocessed_age_seconds", "0")
		return age >= 3
	})
	if pending, _ := gaugeOf(t, reg, "snip_reader_ack_pending_events", "0"); pending != 1 {
		t.Errorf("ack pending gauge %g while the handler holds the one event, want 1", pending)
	}
}
