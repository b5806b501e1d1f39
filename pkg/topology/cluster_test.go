package topology_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// TestApplyOnAThreeNodeClusterReplicatesEverything: with Replicas 3 on a
// three-node cluster, every stream, every consumer Apply declares and
// every bucket (topology.Buckets: the members', the console's sessions and
// the outbox's untrimmed batches) have a leader and two replicas, one per
// node; re-applying changes nothing.
func TestApplyOnAThreeNodeClusterReplicatesEverything(t *testing.T) {
	t.Parallel()
	c := testenv.StartNATSCluster(t)
	js := c.JetStream(t)
	ctx := t.Context()
	o := topology.Defaults()
	o.Replicas = 3
	c.ApplyTopology(t, js, o)
	if err := topology.Apply(ctx, js, o); err != nil { // again: nothing to change
		t.Fatalf("apply again: %v", err)
	}
	// A new asset's Raft group reports its leader and replicas a moment
	// after it is created, so each is polled.
	threeNodes := func(cl *jetstream.ClusterInfo) error {
		if cl == nil || cl.Leader == "" || len(cl.Replicas) != 2 {
			return fmt.Errorf("cluster info %+v, want a leader and 2 replicas", cl)
		}
		nodes := map[string]bool{cl.Leader: true}
		for _, r := range cl.Replicas {
			nodes[r.Name] = true
		}
		if len(nodes) != 3 {
			return fmt.Errorf("on nodes %v, want all 3", nodes)
		}
		return nil
	}
	for _, name := range replicated(o) {
		testenv.WaitFor(t, 20*time.Second, "stream "+name+" on all three nodes", func() bool {
			s, err := js.Stream(ctx, name)
			if err != nil {
				return false
			}
			if r := s.CachedInfo().Config.Replicas; r != 3 {
				t.Fatalf("stream %s: %d replicas, want 3", name, r)
			}
			return threeNodes(s.CachedInfo().Cluster) == nil
		})
	}
	for _, c := range topology.Consumers() {
		testenv.WaitFor(t, 20*time.Second, "consumer "+c.Config.Durable+" on all three nodes", func() bool {
			cons, err := js.Consumer(ctx, c.Stream, c.Config.Durable)
			return err == nil && threeNodes(cons.CachedInfo().Cluster) == nil
		})
	}
}

// replicated names every stream Apply declares, its KV buckets' included
// (bucket B is the stream KV_B): each must have Options.Replicas copies.
// TestTheReplicaChecksCoverEverythingApplyDeclares keeps it whole.
func replicated(o topology.Options) []string {
	var names []string
	for _, cfg := range topology.Streams(o) {
		names = append(names, cfg.Name)
	}
	for _, b := range topology.Buckets(o) {
		names = append(names, "KV_"+b.Bucket)
	}
	return names
}

// TestNoPeersYetIsThePlacementAnswer: the cluster's "no suitable peers for
// placement" is told apart, wrapped or not, from every other API error.
func TestNoPeersYetIsThePlacementAnswer(t *testing.T) {
	t.Parallel()
	noPeers := &jetstream.APIError{Code: 500, ErrorCode: 10005, Description: "no suitable peers for placement, peer offline"}
	if !topology.NoPeersYet(noPeers) || !topology.NoPeersYet(fmt.Errorf("apply topology: bucket x: %w", noPeers)) {
		t.Error("the placement error is not recognised")
	}
	other := &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamNameInUse, Description: "stream name already in use"}
	for _, err := range []error{nil, other, jetstream.ErrStreamNotFound, fmt.Errorf("x: %w", other)} {
		if topology.NoPeersYet(err) {
			t.Errorf("NoPeersYet(%v) = true", err)
		}
	}
}

// A deployment that grew from one server to a three-node cluster applies
// the topology again with Replicas 3 (deploy/README.md): every stream and
// every bucket (the members', which holds the groups' leases, their replay
// requests and fraud detection's origin records, the console's ended
// sessions, and the redirect relay's records of untrimmed batches) then
// have three replicas. Applying once more changes nothing.
func TestApplyWithMoreReplicasScalesEveryStreamAndBucket(t *testing.T) {
	t.Parallel()
	c := testenv.StartNATSCluster(t)
	js := c.JetStream(t)
	ctx := t.Context()
	o := topology.Defaults()
	o.Partitions = 2
	c.ApplyTopology(t, js, o) // one replica: as on the single server
	o.Replicas = 3
	c.ApplyTopology(t, js, o)
	if err := topology.Apply(ctx, js, o); err != nil {
		t.Fatalf("apply again: %v", err)
	}
	for _, name := range replicated(o) {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		if r := s.CachedInfo().Config.Replicas; r != 3 {
			t.Errorf("stream %s: %d replicas after applying Replicas 3, want 3", name, r)
		}
	}
}

// An Apply with fewer replicas than the streams have (a service started
// without SNIP_REPLICAS=3 on the cluster) is refused with
// ErrReplicasLowered, naming the stream, and nothing is scaled down: every
// stream and bucket keeps its three copies. With
// LowerReplicas (`snipctl topology apply --lower-replicas`) the operator
// means it, and Apply scales them down.
func TestApplyRefusesFewerReplicasUnlessAsked(t *testing.T) {
	t.Parallel()
	c := testenv.StartNATSCluster(t)
	js := c.JetStream(t)
	ctx := t.Context()
	o := topology.Defaults()
	o.Partitions, o.Replicas = 2, 3
	c.ApplyTopology(t, js, o)
	replicas := func() map[string]int {
		t.Helper()
		got := map[string]int{}
		for _, name := range replicated(o) {
			s, err := js.Stream(ctx, name)
			if err != nil {
				t.Fatalf("stream %s: %v", name, err)
			}
			got[name] = s.CachedInfo().Config.Replicas
		}
		return got
	}

	one := o
	one.Replicas = 1
	if err := topology.Apply(ctx, js, one); !errors.Is(err, topology.ErrReplicasLowered) || !strings.Contains(err.Error(), events.ClicksStream) {
		t.Errorf("apply with 1 replica over 3: %v, want ErrReplicasLowered naming %s", err, events.ClicksStream)
	}
	for name, r := range replicas() {
		if r != 3 {
			t.Errorf("stream %s: %d replicas after the refused apply, want the 3 it had", name, r)
		}
	}

	one.LowerReplicas = true
	c.ApplyTopology(t, js, one)
	for name, r := range replicas() {
		if r != 1 {
			t.Errorf("stream %s: %d replicas after the apply that means it, want 1", name, r)
		}
	}
}
