package main

import (
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/clickcounter/internal/counter"
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

// An operator deletes both feed consumers under a running counter that
// connects as the deployed user: the counter creates them again as the
// topology declares them, their streams are handed again from the start,
// and the replay moves nothing (every label is stale, every link event
// already recorded); what is published after the deletion is applied.
func TestDeletedFeedConsumersAreCreatedAgainAndTheReplayMovesNothing(t *testing.T) {
	url := testenv.StartNATSWithConfig(t, filepath.Join("..", "..", "deploy", "nats", "nats.conf"))
	nc, err := nats.Connect(url, nats.UserInfo("admin", "pw-admin"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	admin, _ := jetstream.New(nc)
	rdb, db := servers.Redis.NewDB(t)
	s := &system{nats: &testenv.NATS{URL: url}, js: admin, rdb: rdb, redisURL: servers.Redis.URL(db)}
	if err := topology.Apply(t.Context(), admin, s.testConfig("admin").Topology.Options()); err != nil {
		t.Fatal(err)
	}
	svc := s.start(t, "m1", func(c *Config) { c.NATS.User, c.NATS.Password = "clickcounter", "pw-clickcounter" })

	const code, n = "relabelled", 20
	p := events.Partition(code, testPartitions)
	cs := s.publishClicks(t, []string{code}, n, nil)
	waitTotals(t, svc.addr, map[string]counter.Pair{code: {Human: n}})
	seqs := clickSeqs(t, admin, n)
	label := func(cs []events.Click, bot bool) []events.FraudVerdictLabel {
		out := make([]events.FraudVerdictLabel, len(cs))
		for i, c := range cs {
			out[i] = events.FraudVerdictLabel{ClickID: c.ID, ClickSeq: seqs[c.ID], Code: code, Owner: "acme",
				Rule: "link_flood", Bot: bot, ClickTime: c.Time, Country: c.Country, Referrer: c.Referrer, Time: time.Now().UTC()}
		}
		return out
	}
	send := func(labels []events.FraudVerdictLabel) {
		t.Helper()
		// Each message's judged range is its labels' own, so its ID differs.
		bs := events.SplitVerdicts(p, labels[0].ClickSeq, labels[len(labels)-1].ClickSeq, labels)
		if len(bs) != 1 {
			t.Fatalf("%d messages, want one", len(bs))
		}
		data, err := json.Marshal(bs[0])
		if err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Publish(t.Context(), events.FraudVerdictBatchSubject(p), data, jetstream.WithMsgID(bs[0].ID)); err != nil {
			t.Fatal(err)
		}
	}
	link := func(code string) {
		t.Helper()
		e := events.LinkEvent{V: events.LinkVersion, ID: events.NewID(), Kind: events.LinkCreated, Time: time.Now(), Code: code, Owner: "acme"}
		b, _ := json.Marshal(e)
		if _, err := admin.Publish(t.Context(), events.LinkSubject(events.LinkCreated, code), b, jetstream.WithMsgID(e.ID)); err != nil {
			t.Fatal(err)
		}
	}
	// Every click to bot, then the first ten back to human: a replay that
	// applied the first message again would move those ten to bot.
	send(label(cs, true))
	send(label(cs[:10], false))
	link("known")
	waitTotals(t, svc.addr, map[string]counter.Pair{code: {Human: 10, Bot: n - 10}})
	testenv.WaitFor(t, 30*time.Second, "both verdict messages and the link event handled", func() bool {
		return metricValue(t, svc.addr, `snip_clickcounter_feed_messages_total{feed="verdicts",result="ok"}`) == 2 &&
			metricValue(t, svc.addr, `snip_clickcounter_feed_messages_total{feed="links",result="ok"}`) == 1
	})

	for _, c := range []struct{ stream, name string }{
		{events.LinksStream, topology.ClickCounterLinksConsumer},
		{events.FraudVerdictsStream, topology.ClickCounterVerdictsConsumer},
	} {
		if err := admin.DeleteConsumer(t.Context(), c.stream, c.name); err != nil {
			t.Fatal(err)
		}
	}
	send(label(cs[:5], true))
	link("fresh")
	testenv.WaitFor(t, 30*time.Second, "both feeds' consumers created again, every message handed again, and the new ones", func() bool {
		return metricValue(t, svc.addr, `snip_clickcounter_feed_consumer_created_total{feed="links"}`) == 1 &&
			metricValue(t, svc.addr, `snip_clickcounter_feed_consumer_created_total{feed="verdicts"}`) == 1 &&
			metricValue(t, svc.addr, `snip_clickcounter_feed_messages_total{feed="verdicts",result="ok"}`) == 2+3 &&
			metricValue(t, svc.addr, `snip_clickcounter_feed_messages_total{feed="links",result="ok"}`) == 1+2
	})
	waitTotals(t, svc.addr, map[string]counter.Pair{code: {Human: 5, Bot: n - 5}})
	// Each label moved its click once: n, 10 back, 5 again; the replayed
	// n+10 labels were stale.
	if got := metricValue(t, svc.addr, `snip_clickcounter_corrections_total{result="relabelled"}`); got != n+10+5 {
		t.Errorf("%v labels relabelled a click, want %d", got, n+10+5)
	}
	if got := metricValue(t, svc.addr, `snip_clickcounter_corrections_total{result="stale"}`); got != n+10 {
		t.Errorf("%v labels stale, want the %d replayed", got, n+10)
	}
	if _, ok := statsOf(t, svc.addr, "fresh"); !ok {
		t.Error("the link created after the deletion is unknown")
	}
	if up := metricValue(t, svc.addr, `snip_clickcounter_feed_up{feed="verdicts"}`); up != 1 {
		t.Errorf("snip_clickcounter_feed_up{feed=verdicts} = %v, want 1", up)
	}
}

// clickSeqs returns the CLICKS sequence of each of the first n clicks, by
// click ID.
func clickSeqs(t *testing.T, js jetstream.JetStream, n int) map[string]uint64 {
	t.Helper()
	stream, err := js.Stream(t.Context(), events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	seqs := map[string]uint64{}
	for seq := uint64(1); len(seqs) < n; seq++ {
		m, err := stream.GetMsg(t.Context(), seq)
		if err != nil {
			t.Fatal(err)
		}
		c, err := events.DecodeClick(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		seqs[c.ID] = seq
	}
	return seqs
}
