package natsconn_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/natsconn"
	"github.com/snipdev/snip/pkg/testenv"
)

// Drain lets pending publishes reach the stream and returns once the
// connection is closed.
func TestDrainDeliversPendingPublishesAndCloses(t *testing.T) {
	t.Parallel()
	ns := testenv.StartNATS(t)
	nc, err := natsconn.Connect(natsconn.Config{URL: ns.URL, Name: "drain-test"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	reader := ns.Connect(t)
	sub, err := reader.SubscribeSync("drain.test")
	if err != nil {
		t.Fatal(err)
	}
	if err := reader.Flush(); err != nil {
		t.Fatal(err)
	}
	const n = 1000
	for range n {
		if err := nc.Publish("drain.test", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := natsconn.Drain(ctx, nc); err != nil {
		t.Fatalf("Drain: %v", err)
	}
	if !nc.IsClosed() {
		t.Error("connection not closed after Drain")
	}
	for i := range n {
		if _, err := sub.NextMsg(5 * time.Second); err != nil {
			t.Fatalf("message %d of %d published before Drain: %v", i+1, n, err)
		}
	}
}

// When the context ends before the drain does, the connection is closed at
// once and the context's error returned.
func TestDrainClosesWhenTheContextEnds(t *testing.T) {
	t.Parallel()
	ns := testenv.StartNATS(t)
	nc, err := natsconn.Connect(natsconn.Config{URL: ns.URL, Name: "drain-test"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := natsconn.Drain(ctx, nc); err != context.Canceled && err != nil {
		t.Fatalf("Drain with an ended context: %v, want context.Canceled (or nil if it drained first)", err)
	}
	testenv.WaitFor(t, 5*time.Second, "the connection to close", nc.IsClosed)
}
