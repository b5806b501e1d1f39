package consolesessions

import (
	"sync"
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// Revocations of every session at once (two operators, two console
// instances) each end with the not_before in force, the latest of them,
// none with an error: a write that lost the race to another reads the
// bucket again, whether it was creating not_before or updating it.
func TestRevokeAllAtOnceEndsWithTheLatest(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t)
	js := n.JetStream(t)
	ctx := t.Context()
	if _, err := js.CreateKeyValue(ctx, topology.ConsoleSessionsBucketConfig(topology.Defaults())); err != nil {
		t.Fatal(err)
	}
	base := time.Now()
	for round := range 5 {
		const writers = 8
		var wg sync.WaitGroup
		errs := make(chan error, writers)
		for i := range writers {
			s := New(js) // each as its own console instance
			at := base.Add(time.Duration(round*writers+i) * time.Millisecond)
			wg.Go(func() {
				if _, err := s.RevokeAll(ctx, at); err != nil {
					errs <- err
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("round %d: a revocation at once with others failed: %v", round, err)
		}
		want := base.Add(time.Duration(round*writers+writers-1) * time.Millisecond)
		got, err := New(js).RevokeAll(ctx, base)
		if err != nil || !got.Equal(time.UnixMilli(want.UnixMilli())) {
			t.Fatalf("round %d: not_before %v, %v; want the latest, %v", round, got, err, time.UnixMilli(want.UnixMilli()))
		}
	}
}
