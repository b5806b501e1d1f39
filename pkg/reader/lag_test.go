package reader_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// A narrowed group's consumer owes only its owners' events: the oldest one
// it has not processed is the first of those, not an older event of an
// owner it is not sent.
func TestOldestUnprocessedOfANarrowedConsumer(t *testing.T) {
	t.Parallel()
	_, js := setup(t, 1)
	ctx := t.Context()
	cfg := topology.GroupConsumerConfig("g", 0, topology.GroupConsumer{AckWait: time.Minute, PinnedTTL: 3 * time.Second, MaxAckPending: 1000})
	if _, err := js.CreateConsumer(ctx, events.ClicksStream, cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := topology.NarrowGroup(ctx, js, "g", 1, topology.Interest{"acme": nil, "bob": nil}, 1); err != nil {
		t.Fatal(err)
	}
	stored := map[string]time.Time{}
	for _, owner := range []string{"other", "bob", "acme"} {
		b, _ := json.Marshal(events.Click{V: events.ClickVersion, ID: events.NewID(), Time: time.Now().UTC(), Code: "k" + owner, Owner: owner, Target: "https://example.com/"})
		ack, err := js.Publish(ctx, events.ClickSubject(owner, "k"+owner), b)
		if err != nil {
			t.Fatal(err)
		}
		s, err := js.Stream(ctx, events.ClicksStream)
		if err != nil {
			t.Fatal(err)
		}
		m, err := s.GetMsg(ctx, ack.Sequence)
		if err != nil {
			t.Fatal(err)
		}
		stored[owner] = m.Time
	}
	if !stored["other"].Before(stored["bob"]) {
		t.Fatalf("stored times not increasing: %v", stored)
	}
	s, err := js.Stream(ctx, events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	// The server counts a consumer's pending messages after it acks the
	// publish, not before: read its info until the count is there (a
	// count of 3 would include other's click, and never pass).
	var info *jetstream.ConsumerInfo
	testenv.WaitFor(t, 10*time.Second, "the consumer to count bob's and acme's clicks pending", func() bool {
		c, err := s.Consumer(ctx, topology.GroupConsumerName("g", 0))
		if err != nil {
			t.Fatal(err)
		}
		info = c.CachedInfo()
		return info.NumPending == 2
	})
	got, err := reader.OldestUnprocessed(ctx, s, info)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Equal(stored["bob"]) {
		t.Errorf("oldest unprocessed %v, want bob's click's %v (not other's %v)", got, stored["bob"], stored["other"])
	}
}

// Members reads the group's leases: who is in it and what each holds. Two
// members of "g" on 4 partitions hold two each once settled; the member of
// another group is not listed; a member that leaves is gone from the list.
func TestMembersListsLeasesWithTheirPartitions(t *testing.T) {
	t.Parallel()
	n, js := setup(t, 4)
	ctx := t.Context()
	rec := newRecorder()
	a := startMember(t, n, reader.Config{Group: "g", Member: "a"}, rec.handler("a"))
	startMember(t, n, reader.Config{Group: "g", Member: "b"}, rec.handler("b"))
	startMember(t, n, reader.Config{Group: "other", Member: "c"}, rec.handler("c"))
	testenv.WaitFor(t, 30*time.Second, "a and b holding two partitions each", func() bool {
		ms, err := reader.Members(ctx, js, "g")
		if err != nil {
			t.Fatal(err)
		}
		return len(ms) == 2 && ms[0].Member == "a" && ms[1].Member == "b" && len(ms[0].Owned) == 2 && len(ms[1].Owned) == 2
	})
	a.stop(t)
	testenv.WaitFor(t, 30*time.Second, "only b listed after a left", func() bool {
		ms, err := reader.Members(ctx, js, "g")
		if err != nil {
			t.Fatal(err)
		}
		return len(ms) == 1 && ms[0].Member == "b"
	})
}

// LagAll reads the groups' consumers from one listing of CLICKS'
// consumers: every partition of every group, in order, with its backlog,
// in two requests (the stream, one page of consumers) when the groups are
// caught up, and one more for each partition that is behind (its oldest
// event). Read one consumer at a time it was ten requests a group, which a
// console refreshing five groups on a busy server felt. Lag, by name,
// gives each group's same figures.
func TestLagAllReadsTheGroupsFromOneListing(t *testing.T) {
	t.Parallel()
	const partitions = 8
	n, _ := setup(t, partitions)
	nc := n.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	// One click on partition 2 only: the behind group owes it there.
	c := click("k", 0)
	for p := events.Partition(c.Code, partitions); p != 2; p = events.Partition(c.Code, partitions) {
		c.Code += "x"
	}
	b, _ := json.Marshal(c)
	if _, err := js.Publish(ctx, events.ClickSubject(c.Owner, c.Code), b); err != nil {
		t.Fatal(err)
	}
	gc := topology.GroupConsumer{AckWait: time.Minute, PinnedTTL: 3 * time.Second, MaxAckPending: 1000}
	behind := "behind" // reads from the start: behind by the click; the others start after it
	for _, g := range []string{"caughtup1", "caughtup2", behind} {
		gc.DeliverPolicy = jetstream.DeliverNewPolicy
		if g == behind {
			gc.DeliverPolicy = jetstream.DeliverAllPolicy
		}
		for p := range partitions {
			if _, err := js.CreateConsumer(ctx, events.ClicksStream, topology.GroupConsumerConfig(g, p, gc)); err != nil {
				t.Fatal(err)
			}
		}
	}
	testenv.WaitFor(t, 10*time.Second, "the behind group to count the click pending", func() bool {
		l, err := reader.Lag(ctx, js, behind)
		return err == nil && len(l) == partitions && l[2].Pending == 1
	})

	before := nc.Stats().OutMsgs
	all, err := reader.LagAll(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	if requests := nc.Stats().OutMsgs - before; requests > 3 {
		t.Errorf("LagAll of 3 groups of %d partitions, one partition behind, sent %d requests, want at most 3", partitions, requests)
	}
	if len(all) != 3 {
		t.Fatalf("LagAll: %d groups, want 3: %v", len(all), all)
	}
	for g, parts := range all {
		if len(parts) != partitions {
			t.Fatalf("group %s: %d partitions, want %d", g, len(parts), partitions)
		}
		for i, pl := range parts {
			owes := g == behind && i == 2
			if pl.Partition != i || pl.Consumer != topology.GroupConsumerName(g, i) || (pl.Pending == 1) != owes || pl.OldestUnprocessed.IsZero() == owes {
				t.Errorf("group %s, partition %d: %+v", g, i, pl)
			}
		}
	}
	// Lag reads one group's consumers by name (a service's NATS user may
	// not list CLICKS' consumers): the same figures.
	for g, parts := range all {
		one, err := reader.Lag(ctx, js, g)
		if err != nil || len(one) != len(parts) {
			t.Fatalf("Lag of %s: %v, %v", g, one, err)
		}
		for i := range one {
			if one[i] != parts[i] {
				t.Errorf("Lag of %s, partition %d: %+v, LagAll's %+v", g, i, one[i], parts[i])
			}
		}
	}
	if _, err := reader.Lag(ctx, js, "nosuch"); !errors.Is(err, reader.ErrNoGroup) {
		t.Errorf("Lag of a group with no consumers: %v, want ErrNoGroup", err)
	}
}
