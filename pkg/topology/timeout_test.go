package topology_test

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// TestApplyGoesOnAfterAnUnansweredCreate: the server creates LINKS but its
// answer never reaches Apply (as when a busy cluster answers after the
// client's request timeout). Apply goes on: it finds the stream the
// unanswered create made and applies the rest.
func TestApplyGoesOnAfterAnUnansweredCreate(t *testing.T) {
	t.Parallel()
	nc := testenv.StartNATS(t).Connect(t)
	// A relay between the client's API prefix and the server's: requests
	// go to the server as they are, and the server's answer to the first
	// create of LINKS is dropped.
	var creates, dropped atomic.Int32
	sub, err := nc.Subscribe("SLOW.API.>", func(m *nats.Msg) {
		subj := "$JS.API." + strings.TrimPrefix(m.Subject, "SLOW.API.")
		resp, err := nc.Request(subj, m.Data, 5*time.Second)
		if err != nil {
			return
		}
		if subj == "$JS.API.STREAM.CREATE."+events.LinksStream && creates.Add(1) == 1 {
			dropped.Add(1)
			return
		}
		_ = m.Respond(resp.Data)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	js, err := jetstream.NewWithAPIPrefix(nc, "SLOW.API", jetstream.WithDefaultTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := topology.Apply(t.Context(), js, topology.Defaults()); err != nil {
		t.Fatalf("apply after an unanswered create: %v", err)
	}
	if dropped.Load() != 1 {
		t.Fatalf("%d answers dropped, want 1", dropped.Load())
	}
	for _, cfg := range topology.Streams(topology.Defaults()) {
		if _, err := js.Stream(t.Context(), cfg.Name); err != nil {
			t.Errorf("stream %s: %v", cfg.Name, err)
		}
	}
}
