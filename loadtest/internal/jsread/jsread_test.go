package jsread_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/snipdev/snip/loadtest/internal/jsread"
	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// A reader that has caught up with a growing stream receives every new
// message with NumPending 0, and the client buffers them. One call to Next
// must still return everything already stored, not one message per call:
// the oracle polls about once a second, and reading one message a poll made
// a live verify fail while the readers were right.
func TestNextReadsEverythingStoredWhileCaughtUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js := testenv.StartNATS(t).JetStream(t)
	if err := topology.Apply(ctx, js, topology.Defaults()); err != nil {
		t.Fatal(err)
	}
	r := jsread.NewClicks(js, "acme", time.Now().Add(-time.Minute))
	defer r.Close()
	if got, atEnd, err := r.Next(ctx); err != nil || len(got) != 0 || !atEnd {
		t.Fatalf("empty stream: %d clicks, at end %v, err %v", len(got), atEnd, err)
	}

	// Published one at a time, each stored before the next, while the
	// reader's pull is waiting: each is sent with NumPending 0.
	const n = 200
	for i := range n {
		if _, err := js.Publish(ctx, events.ClickSubject("acme", fmt.Sprintf("c%d", i%7)), []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	read, calls := 0, 0
	for deadline := time.Now().Add(10 * time.Second); read < n; calls++ {
		if time.Now().After(deadline) {
			t.Fatalf("read %d of %d in %d calls", read, n, calls)
		}
		got, _, err := r.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		read += len(got)
	}
	// All in one call when they are all buffered; a second (or third) call
	// may be needed for messages still on their way when the first began.
	if calls > 3 {
		t.Errorf("read %d stored messages in %d calls; want at most 3", n, calls)
	}
	if read != n {
		t.Errorf("read %d, want %d", read, n)
	}
}
