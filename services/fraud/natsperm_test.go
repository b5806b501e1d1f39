package main

import (
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/fraud/internal/traffic"
)

// The fraud detector does its whole job as the least-privilege "fraud" user
// of deploy/nats: its group on CLICKS (own inbox prefix, own consumers, the
// partition's recent past read with an ordered consumer), alerts and
// verdicts published, every partition acked to the end.
func TestFraudWorksAsTheDeployedNATSUser(t *testing.T) {
	url := testenv.StartNATSWithConfig(t, filepath.Join("..", "..", "deploy", "nats", "nats.conf"))
	nc, err := nats.Connect(url, nats.UserInfo("admin", "pw-admin"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	admin, _ := jetstream.New(nc)
	_, db := servers.Redis.NewDB(t)
	n := &testenv.NATS{URL: url}

	// snipctl topology apply, as admin, with the options the service checks.
	cfg, err := loadConfig([]string{"SNIP_PARTITIONS=" + strconv.Itoa(partitions)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := topology.Apply(t.Context(), admin, cfg.Topology.Options()); err != nil {
		t.Fatal(err)
	}
	clicks := traffic.Generate(traffic.Spec{Seed: 3, Start: time.Now().Add(-10 * time.Minute), Duration: 6 * time.Minute, HumanRate: 2, Links: 30, Owners: 3, Inject: true})
	if err := traffic.Publish(t.Context(), admin, clicks, 512); err != nil {
		t.Fatal(err)
	}
	start(t, n, db, "m1", "NATS_USER=fraud", "NATS_PASSWORD=pw-fraud", "SNIP_APPLY_TOPOLOGY=false")
	testenv.WaitFor(t, 3*time.Minute, "the group to catch up as the fraud user", func() bool { return caughtUp(t, admin) })
	testenv.WaitFor(t, 30*time.Second, "alerts published as the fraud user", func() bool {
		return len(fraudIDs(t, admin, "fraud.alerts.>")) > 0
	})
}
