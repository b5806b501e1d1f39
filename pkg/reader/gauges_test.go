package reader_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
)

// A member's group gauges say what it holds, not what it was assigned: a
// partition it is still taking over (its previous owner has not let go)
// counts in snip_reader_acquiring_partitions, not in
// snip_reader_owned_partitions, which counts it once taken over and until
// given back. And a member that left reports neither partitions nor
// members: before, owned_partitions counted a partition from its
// assignment (while the previous owner still held it too), and both gauges
// kept their last values after Run returned, for as long as the process
// lived.
func TestAMembersGaugesCountWhatItHoldsAndNothingOnceItLeft(t *testing.T) {
	t.Parallel()
	n, js := setup(t, 1)
	publish(t, js, 1, 1, 0)
	regA, regB := prometheus.NewRegistry(), prometheus.NewRegistry()
	inBatch, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	a := startMember(t, n, reader.Config{Group: "g", Member: "a", Metrics: regA, DrainTimeout: time.Minute},
		func(context.Context, int, []reader.Event) error {
			once.Do(func() { close(inBatch) })
			<-release // a batch that takes long: a keeps the pin meanwhile
			return nil
		})
	select {
	case <-inBatch:
	case <-time.After(30 * time.Second):
		t.Fatal("a was never handed the event")
	}
	gauges := func(reg prometheus.Gatherer) (owned, acquiring, live float64) {
		return groupGauge(t, reg, "snip_reader_owned_partitions"), groupGauge(t, reg, "snip_reader_acquiring_partitions"),
			groupGauge(t, reg, "snip_reader_live_members")
	}
	if owned, acquiring, _ := gauges(regA); owned != 1 || acquiring != 0 {
		t.Errorf("a, handling partition 0: owned %g, acquiring %g; want 1, 0", owned, acquiring)
	}

	startMember(t, n, reader.Config{Group: "g", Member: "b", Metrics: regB},
		func(context.Context, int, []reader.Event) error { return nil })
	testenv.WaitFor(t, 30*time.Second, "b seeing a live", func() bool { _, _, live := gauges(regB); return live == 2 })
	a.cancel() // a leaves: partition 0 goes to b, whose takeover waits for a's batch
	testenv.WaitFor(t, 30*time.Second, "b claiming partition 0", func() bool {
		ls, err := reader.Members(t.Context(), js, "g")
		return err == nil && len(ls) == 1 && ls[0].Member == "b" && slices.Equal(ls[0].Owned, []int{0})
	})
	testenv.WaitFor(t, 10*time.Second, "b's worker for partition 0", func() bool {
		owned, acquiring, _ := gauges(regB)
		return owned+acquiring == 1
	})
	if owned, acquiring, _ := gauges(regB); owned != 0 || acquiring != 1 {
		t.Errorf("b, waiting for a to let partition 0 go: owned %g, acquiring %g; want 0, 1", owned, acquiring)
	}
	if owned, _, _ := gauges(regA); owned != 1 {
		t.Errorf("a, leaving with its batch in hand: owned %g, want 1", owned)
	}

	close(release)
	a.stop(t)
	if owned, acquiring, live := gauges(regA); owned != 0 || acquiring != 0 || live != 0 {
		t.Errorf("a, gone from the group: owned %g, acquiring %g, live members %g; want 0, 0, 0", owned, acquiring, live)
	}
	testenv.WaitFor(t, 30*time.Second, "b taking partition 0 over", func() bool {
		owned, acquiring, live := gauges(regB)
		return owned == 1 && acquiring == 0 && live == 1
	})
}
