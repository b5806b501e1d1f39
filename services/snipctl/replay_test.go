package main

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
)

func publishClicks(t *testing.T, js jetstream.JetStream, n int) {
	t.Helper()
	for i := range n {
		c := events.Click{V: events.ClickVersion, ID: events.NewID(), Time: time.Now().UTC(), Code: "c" + string(rune('a'+i%5)), Owner: "acme", Target: "https://example.com", Visitor: "v"}
		b, _ := json.Marshal(c)
		if _, err := js.Publish(t.Context(), events.ClickSubject(c.Owner, c.Code), b, jetstream.WithMsgID(c.ID)); err != nil {
			t.Fatal(err)
		}
	}
}

func TestReplayAndLag(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t)
	environ := []string{"NATS_URL=" + n.URL, "SNIP_PARTITIONS=2"}
	if out, err := snipctl(t, environ, "topology", "apply"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	js := n.JetStream(t)
	publishClicks(t, js, 20)

	var handled atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- reader.Run(ctx, js, reader.Config{Group: "demo", Member: "m", LeaseTTL: time.Second},
			func(_ context.Context, _ int, b []reader.Event) error { handled.Add(int64(len(b))); return nil })
	}()
	t.Cleanup(func() { cancel(); <-done })
	testenv.WaitFor(t, 30*time.Second, "first pass", func() bool { return handled.Load() == 20 })

	out, err := snipctl(t, environ, "lag", "demo")
	if err != nil {
		t.Fatalf("lag: %v\n%s", err, out)
	}
	if !strings.Contains(out, "demo") || !strings.Contains(out, "oldest unhandled") {
		t.Fatalf("lag output lacks the group or header:\n%s", out)
	}
	out, err = snipctl(t, environ, "replay", "demo", "--from-seq", "1", "--wait")
	if err != nil {
		t.Fatalf("replay: %v\n%s", err, out)
	}
	testenv.WaitFor(t, 30*time.Second, "replayed pass", func() bool { return handled.Load() == 40 })

	if _, err := snipctl(t, environ, "replay", "demo"); err == nil {
		t.Fatal("replay without a position succeeded")
	}
	if _, err := snipctl(t, environ, "replay", "demo", "--since", "1h", "--from-seq", "3"); err == nil {
		t.Fatal("replay with two positions succeeded")
	}
	if out, err := snipctl(t, environ, "replay", "nosuchgroup", "--since", "1h"); err == nil {
		t.Fatalf("replay of a missing group succeeded:\n%s", out)
	}
}
