package service

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// A service whose SNIP_CLICKS_MAX_AGE is shorter than the CLICKS the
// operator applied stops at start with topology.ErrRetentionShrinks, as for
// a partition count that contradicts the stream, rather than retrying until
// it is stopped: no retry cures it. CLICKS keeps its age limit.
func TestPrepareStopsAtARetentionThatWouldShrinkTheStream(t *testing.T) {
	t.Parallel()
	ns := testenv.StartNATS(t)
	js := ns.JetStream(t)
	operator := Topology{ApplyTopology: true, Partitions: 4, Replicas: 1, ClicksMaxAge: 30 * 24 * time.Hour, ClicksMaxBytes: -1}
	if err := topology.Apply(t.Context(), js, operator.Options()); err != nil {
		t.Fatal(err)
	}
	svc := operator
	svc.ClicksMaxAge = 168 * time.Hour
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	err := svc.Prepare(ctx, discard, js)
	if !errors.Is(err, topology.ErrRetentionShrinks) || ctx.Err() != nil {
		t.Fatalf("Prepare = %v (context: %v), want ErrRetentionShrinks at once", err, ctx.Err())
	}
	s, err := js.Stream(t.Context(), "CLICKS")
	if err != nil {
		t.Fatal(err)
	}
	if got := s.CachedInfo().Config.MaxAge; got != operator.ClicksMaxAge {
		t.Fatalf("CLICKS max age %s after the service's start, want %s", got, operator.ClicksMaxAge)
	}
}

// A service started without the cluster's SNIP_REPLICAS stops at start with
// topology.ErrReplicasLowered rather than scaling every stream down to one
// copy, or retrying until it is stopped. CLICKS keeps its three replicas.
func TestPrepareStopsAtFewerReplicasThanTheStreamsHave(t *testing.T) {
	t.Parallel()
	c := testenv.StartNATSCluster(t)
	js := c.JetStream(t)
	operator := Topology{ApplyTopology: true, Partitions: 2, Replicas: 3, ClicksMaxAge: 168 * time.Hour, ClicksMaxBytes: -1}
	c.ApplyTopology(t, js, operator.Options())
	svc := operator
	svc.Replicas = 1
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	err := svc.Prepare(ctx, discard, js)
	if !errors.Is(err, topology.ErrReplicasLowered) || ctx.Err() != nil {
		t.Fatalf("Prepare = %v (context: %v), want ErrReplicasLowered at once", err, ctx.Err())
	}
	s, err := js.Stream(t.Context(), "CLICKS")
	if err != nil {
		t.Fatal(err)
	}
	if got := s.CachedInfo().Config.Replicas; got != 3 {
		t.Fatalf("CLICKS has %d replicas after the service's start, want 3", got)
	}
}
