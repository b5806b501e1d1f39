package reader_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
)

// A member that left leaves nothing behind on the connection it was given:
// a process that runs members one after the other on one connection (a
// member stopped and started again, a service running groups in turn)
// must not gather subscriptions, one per run.
func TestAMemberThatLeftLeavesNoSubscriptionOnItsConnection(t *testing.T) {
	t.Parallel()
	n, _ := setup(t, 1)
	nc, err := nats.Connect(n.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	// After the first run: the connection's own request subscription
	// (made by its first request) stays, and is no member's.
	before := 0
	for i := range 3 {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- reader.Run(ctx, js, reader.Config{Group: "g", Member: "m", LeaseTTL: time.Second}, func(context.Context, int, []reader.Event) error { return nil })
		}()
		testenv.WaitFor(t, 30*time.Second, "the member has joined", func() bool {
			ls, err := reader.Members(t.Context(), js, "g")
			return err == nil && len(ls) == 1
		})
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("run %d: %v", i, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("run %d did not return", i)
		}
		if i == 0 {
			before = nc.NumSubscriptions()
		}
	}
	if after := nc.NumSubscriptions(); after != before {
		t.Errorf("the connection has %d subscriptions after three members ran on it and left, %d after the first", after, before)
	}
}
