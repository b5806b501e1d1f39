package topology_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

func TestApplyIsIdempotentAndKeepsData(t *testing.T) {
	t.Parallel()
	js := testenv.StartNATS(t).JetStream(t)
	ctx := t.Context()
	o := topology.Defaults()
	if err := topology.Apply(ctx, js, o); err != nil {
		t.Fatalf("first apply: %v", err)
	}
	if _, err := js.Publish(ctx, events.ClickSubject("acme", "abc"), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	o.ClicksMaxAge = 3 * 24 * time.Hour // a mutable change
	if err := topology.Apply(ctx, js, o); err != nil {
		t.Fatalf("second apply: %v", err)
	}
	s, err := js.Stream(ctx, events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.CachedInfo().State.Msgs; got != 1 {
		t.Fatalf("CLICKS has %d messages after re-apply, want 1", got)
	}
	if got := s.CachedInfo().Config.MaxAge; got != o.ClicksMaxAge {
		t.Fatalf("CLICKS MaxAge = %s after re-apply, want %s", got, o.ClicksMaxAge)
	}
	for _, cfg := range topology.Streams(o) {
		if _, err := js.Stream(ctx, cfg.Name); err != nil {
			t.Errorf("stream %s: %v", cfg.Name, err)
		}
	}
	n, err := topology.Partitions(ctx, js)
	if err != nil || n != o.Partitions {
		t.Fatalf("Partitions() = %d, %v; want %d", n, err, o.Partitions)
	}
}

func TestApplyRefusesPartitionChange(t *testing.T) {
	t.Parallel()
	js := testenv.StartNATS(t).JetStream(t)
	o := topology.Defaults()
	if err := topology.Apply(t.Context(), js, o); err != nil {
		t.Fatal(err)
	}
	o.Partitions = 12
	if err := topology.Apply(t.Context(), js, o); !errors.Is(err, topology.ErrPartitionsChanged) {
		t.Fatalf("apply with other partition count: err = %v, want ErrPartitionsChanged", err)
	}
}

// The server's partition() mapping and events.Partition must agree, or tools
// would look for a link's clicks in the wrong partition.
func TestPartitionMatchesServer(t *testing.T) {
	t.Parallel()
	js := testenv.StartNATS(t).JetStream(t)
	ctx := t.Context()
	o := topology.Defaults()
	o.Partitions = 6
	if err := topology.Apply(ctx, js, o); err != nil {
		t.Fatal(err)
	}
	const n = 300
	for i := range n {
		if _, err := js.Publish(ctx, events.ClickSubject("acme", fmt.Sprintf("code%d", i)), nil); err != nil {
			t.Fatal(err)
		}
	}
	s, err := js.Stream(ctx, events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]int{}
	for seq := uint64(1); seq <= n; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		code := fmt.Sprintf("code%d", seq-1)
		want := events.PartitionedClickSubject(o.Partitions, "acme", code)
		if m.Subject != want {
			t.Fatalf("stored subject %q, events.PartitionedClickSubject says %q", m.Subject, want)
		}
		seen[events.PartitionOf(m.Subject)]++
	}
	if len(seen) != o.Partitions {
		t.Fatalf("300 codes landed in %d partitions, want all %d: %v", len(seen), o.Partitions, seen)
	}
}

func TestPreviewConsumerRetryPolicy(t *testing.T) {
	t.Parallel()
	js := testenv.StartNATS(t).JetStream(t)
	if err := topology.Apply(t.Context(), js, topology.Defaults()); err != nil {
		t.Fatal(err)
	}
	c, err := js.Consumer(t.Context(), events.PreviewJobsStream, topology.PreviewConsumer)
	if err != nil {
		t.Fatal(err)
	}
	cfg := c.CachedInfo().Config
	got, _ := json.Marshal(struct {
		MaxDeliver int
		BackOff    []time.Duration
		Ack        jetstream.AckPolicy
	}{cfg.MaxDeliver, cfg.BackOff, cfg.AckPolicy})
	want, _ := json.Marshal(struct {
		MaxDeliver int
		BackOff    []time.Duration
		Ack        jetstream.AckPolicy
	}{5, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second}, jetstream.AckExplicitPolicy})
	if string(got) != string(want) {
		t.Fatalf("preview consumer = %s, want %s", got, want)
	}
}

// A second Apply with nothing to change must not update any stream: services
// whose NATS user may only read stream info rely on it.
func TestApplyTwiceUpdatesNothing(t *testing.T) {
	t.Parallel()
	js := testenv.StartNATS(t).JetStream(t)
	ctx := t.Context()
	if err := topology.Apply(ctx, js, topology.Defaults()); err != nil {
		t.Fatal(err)
	}
	for _, cfg := range topology.Streams(topology.Defaults()) {
		s, err := js.Stream(ctx, cfg.Name)
		if err != nil {
			t.Fatal(err)
		}
		if !topology.StreamUpToDate(s.CachedInfo().Config, cfg) {
			t.Errorf("stream %s is reported out of date right after Apply: Apply would update it every time", cfg.Name)
		}
	}
}
