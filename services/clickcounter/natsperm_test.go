package main

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// The counter does its whole job as the least-privilege "clickcounter" user
// of deploy/nats (its own inbox prefix, its group's consumers, its LINKS and
// verdict feeds): every click counted, every partition acked to the end.
func TestCounterWorksAsTheDeployedNATSUser(t *testing.T) {
	url := testenv.StartNATSWithConfig(t, filepath.Join("..", "..", "deploy", "nats", "nats.conf"))
	nc, err := nats.Connect(url, nats.UserInfo("admin", "pw-admin"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	admin, _ := jetstream.New(nc)
	rdb, db := servers.Redis.NewDB(t)
	s := &system{nats: &testenv.NATS{URL: url}, js: admin, rdb: rdb, redisURL: servers.Redis.URL(db)}

	// What snipctl topology apply does first, as admin, with the options the
	// counter checks.
	if err := topology.Apply(t.Context(), admin, s.testConfig("admin").Topology.Options()); err != nil {
		t.Fatal(err)
	}

	svc := s.start(t, "m1", func(c *Config) { c.NATS.User, c.NATS.Password = "clickcounter", "pw-clickcounter" })
	cs := s.publishClicks(t, codes(5), 4, nil)
	waitTotals(t, svc.addr, totals(cs, 1))
	testenv.WaitFor(t, 30*time.Second, "every partition acked to the end", func() bool {
		lag, err := reader.Lag(t.Context(), admin, topology.GroupClickCounter)
		if err != nil || len(lag) == 0 {
			return false
		}
		for _, pl := range lag {
			if pl.Pending+uint64(pl.AckPending) > 0 {
				return false
			}
		}
		return true
	})
}
