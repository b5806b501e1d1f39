package topology_test

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// TestApplyOnAThreeNodeClusterReplicatesEverything: with Replicas 3 on a
// three-node cluster, every stream, every consumer Apply declares and the
// members bucket have a leader and two replicas, one per node; re-applying
// changes nothing.
func TestApplyOnAThreeNodeClusterReplicatesEverything(t *testing.T) {
	t.Parallel()
	c := testenv.StartNATSCluster(t)
	js := c.JetStream(t)
	ctx := t.Context()
	o := topology.Defaults()
	o.Replicas = 3
	for i := range 2 {
		if err := topology.Apply(ctx, js, o); err != nil {
			t.Fatalf("apply %d: %v", i+1, err)
		}
	}
	threeNodes := func(what string, cl *jetstream.ClusterInfo) {
		t.Helper()
		if cl == nil || cl.Leader == "" || len(cl.Replicas) != 2 {
			t.Errorf("%s: cluster info %+v, want a leader and 2 replicas", what, cl)
			return
		}
		nodes := map[string]bool{cl.Leader: true}
		for _, r := range cl.Replicas {
			nodes[r.Name] = true
		}
		if len(nodes) != 3 {
			t.Errorf("%s: on nodes %v, want all 3", what, nodes)
		}
	}
	names := []string{"KV_" + topology.MembersBucket}
	for _, cfg := range topology.Streams(o) {
		names = append(names, cfg.Name)
	}
	for _, name := range names {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		if r := s.CachedInfo().Config.Replicas; r != 3 {
			t.Errorf("stream %s: %d replicas, want 3", name, r)
		}
		threeNodes("stream "+name, s.CachedInfo().Cluster)
	}
	consumers := map[string]string{
		topology.PreviewConsumer:              events.PreviewJobsStream,
		topology.ClickCounterLinksConsumer:    events.LinksStream,
		topology.ClickCounterVerdictsConsumer: events.FraudStream,
		topology.WebhooksAlertsConsumer:       events.FraudStream,
	}
	for name, stream := range consumers {
		cons, err := js.Consumer(ctx, stream, name)
		if err != nil {
			t.Fatalf("consumer %s on %s: %v", name, stream, err)
		}
		threeNodes("consumer "+name, cons.CachedInfo().Cluster)
	}
}
