package reader_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// clusterSetup starts a three-node NATS cluster with the topology applied at
// 3 replicas and CLICKS in n partitions.
func clusterSetup(t *testing.T, partitions int) (*testenv.NATSCluster, jetstream.JetStream) {
	t.Helper()
	c := testenv.StartNATSCluster(t)
	js := c.JetStream(t)
	o := topology.Defaults()
	o.Partitions, o.Replicas = partitions, 3
	c.ApplyTopology(t, js, o)
	return c, js
}

// startClusterMember runs a member whose connection prefers node i (and
// fails over to the others), as a service with NATS_URL listing every node.
func startClusterMember(t *testing.T, c *testenv.NATSCluster, i int, cfg reader.Config, h reader.Handler) {
	t.Helper()
	nc := connectPreferring(t, c, i)
	js, _ := jetstream.New(nc)
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = 2 * time.Second
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- reader.Run(ctx, js, cfg, h) }()
	stopAll := stopTogether(t, cancel)
	t.Cleanup(func() { stopAll(); <-done; nc.Close() })
}

// connectPreferring connects to every node of c, node i first (failing over
// to the others), with the client's default ping interval, as a service's
// NATS_URL listing every node does. The caller closes it.
func connectPreferring(t *testing.T, c *testenv.NATSCluster, i int) *nats.Conn {
	t.Helper()
	urls := []string{}
	for k := range c.Nodes {
		urls = append(urls, c.Nodes[(i+k)%len(c.Nodes)].URL)
	}
	nc, err := nats.Connect(strings.Join(urls, ","), nats.DontRandomize(), nats.MaxReconnects(-1),
		nats.ReconnectWait(50*time.Millisecond), nats.RetryOnFailedConnect(true))
	if err != nil {
		t.Fatal(err)
	}
	return nc
}

// TestGroupOnAThreeNodeCluster: a group of three members, each connected to
// a different node, reads an R3 CLICKS: every event once, in order per link.
func TestGroupOnAThreeNodeCluster(t *testing.T) {
	t.Parallel()
	c, js := clusterSetup(t, 6)
	rec := newRecorder()
	for i := range 3 {
		id := fmt.Sprintf("m%d", i)
		startClusterMember(t, c, i, rec.track(reader.Config{Group: "g", Member: id, BatchSize: 50}), rec.handler(id))
	}
	testenv.WaitFor(t, 60*time.Second, "the group to settle: three owners, two partitions each", func() bool { return rec.settled(6, 2) })
	const links, perLink = 30, 20
	ids := publish(t, js, links, perLink, 0)
	testenv.WaitFor(t, 60*time.Second, "all events handled", func() bool { return rec.distinct() == len(ids) })
	if dups := rec.check(t, ids, perLink); dups != 0 {
		t.Fatalf("%d duplicate handlings on a stable cluster, want 0", dups)
	}
	for p := range 6 {
		name := topology.GroupConsumerName("g", p)
		testenv.WaitFor(t, 20*time.Second, "consumer "+name+" with a leader and 2 replicas", func() bool {
			cons, err := js.Consumer(t.Context(), events.ClicksStream, name)
			if err != nil {
				return false
			}
			cl := cons.CachedInfo().Cluster
			return cl != nil && cl.Leader != "" && len(cl.Replicas) == 2
		})
	}
}

// TestKillTheClicksLeaderUnderLoad: publishers send clicks with Nats-Msg-Id
// and retry each until acknowledged, as the outbox relay does; the node
// leading CLICKS gets SIGKILL mid-load. Publishing resumes after the
// election, every acknowledged click is in CLICKS exactly once, no click is
// there twice, the group (one member on each node) handles every click, and
// the node catches up when it comes back. It logs the longest time with no
// acknowledgement.
func TestKillTheClicksLeaderUnderLoad(t *testing.T) {
	t.Parallel()
	killUnderLoad(t, "CLICKS leader", clicksLeader(t))
}

// clicksLeader picks the node that leads CLICKS.
func clicksLeader(t *testing.T) func(*testenv.NATSCluster, jetstream.JetStream) *testenv.NATSNode {
	return func(c *testenv.NATSCluster, js jetstream.JetStream) *testenv.NATSNode {
		leader, err := c.StreamLeader(t.Context(), js, events.ClicksStream)
		if err != nil {
			t.Fatal(err)
		}
		return leader
	}
}

// freezeFor is how long TestFreezeTheClicksLeaderUnderLoad keeps the node
// frozen: longer than any timeout on the way (the 2 s publish timeout, the
// members' 2 s lease, Raft's election timeouts), short of the client's ping
// interval (2 minutes), as a machine that hangs for a while and comes back.
const freezeFor = 30 * time.Second

// TestFreezeTheClicksLeaderUnderLoad: the same load, but the node leading
// CLICKS (the worst node to lose: every publish waits on it) is frozen with
// SIGSTOP for 30 s and thawed with SIGCONT, as a hung machine or a long GC
// pause would be: it keeps its sockets open and answers nothing, so no
// client or peer is told. The two other nodes elect a leader and the
// publishers connected to them go on; those connected to the frozen node
// wait with it (their retries go to the same socket) and go on when it
// thaws. Every acknowledged click is in CLICKS exactly once, nothing is
// there twice, and the group (one member on each node) handles every click
// and settles again with its three members: no reader stays stuck. It logs
// the longest time with no acknowledgement at all and per publisher.
func TestFreezeTheClicksLeaderUnderLoad(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("holds a node frozen for 30 s; run without -short (CI does)")
	}
	underLoad(t, "CLICKS leader, frozen for "+freezeFor.String(), clicksLeader(t), func(node *testenv.NATSNode, count func() int) {
		frozenAt, before := time.Now(), count()
		node.Pause()
		// Resumed by the cluster's Close too, should the test fail here.
		testenv.WaitFor(t, freezeFor+30*time.Second, "the freeze to last its time with 2000 clicks acknowledged meanwhile", func() bool {
			return time.Since(frozenAt) >= freezeFor && count() >= before+2000
		})
		node.Resume()
		thawed := count()
		testenv.WaitFor(t, 60*time.Second, "2000 more clicks acknowledged after the thaw", func() bool { return count() >= thawed+2000 })
	}, func(*testenv.NATSNode) {})
}

// TestKillAGroupConsumersLeaderUnderLoad: the same, killing a node that
// leads one of the group's partition consumers but not CLICKS, so the
// publishers go on and the consumer's Raft group elects a leader while its
// partition is being read.
func TestKillAGroupConsumersLeaderUnderLoad(t *testing.T) {
	t.Parallel()
	killUnderLoad(t, "leader of consumer g-p0, not of CLICKS", func(c *testenv.NATSCluster, js jetstream.JetStream) *testenv.NATSNode {
		ctx := t.Context()
		name := topology.GroupConsumerName("g", 0)
		var victim *testenv.NATSNode
		testenv.WaitFor(t, 30*time.Second, "consumer g-p0 led by a node that does not lead CLICKS", func() bool {
			sl, err1 := c.StreamLeader(ctx, js, events.ClicksStream)
			cl, err2 := c.ConsumerLeader(ctx, js, events.ClicksStream, name)
			if err1 != nil || err2 != nil {
				return false
			}
			if cl != sl {
				victim = cl
				return true
			}
			// Ask the consumer's leader to step down; another replica takes over.
			_, _ = c.Connect(t).Request("$JS.API.CONSUMER.LEADER.STEPDOWN."+events.ClicksStream+"."+name, nil, 2*time.Second)
			return false
		})
		return victim
	})
}

// killUnderLoad runs the load, kills the node pick chooses, and checks the
// outcome.
func killUnderLoad(t *testing.T, what string, pick func(*testenv.NATSCluster, jetstream.JetStream) *testenv.NATSNode) {
	underLoad(t, what, pick, func(node *testenv.NATSNode, count func() int) {
		before := count()
		node.Kill()
		testenv.WaitFor(t, 60*time.Second, "2000 more clicks acknowledged after the kill", func() bool { return count() >= before+2000 })
	}, func(node *testenv.NATSNode) {
		// The killed node comes back and catches up.
		if err := node.Start(); err != nil {
			t.Fatal(err)
		}
	})
}

// underLoad runs the load: a group of three members (one on each node) and
// four publishers (publisher w connected to node w%3 first) that retry each
// click until acknowledged. Once 2000 clicks are acknowledged, hurt hurts
// the node pick chooses and returns when the load may stop; once the group
// has handled every acknowledged click, heal brings the node back. Then
// every acknowledged click must be in CLICKS exactly once, nothing twice,
// the group must handle every click in CLICKS and settle again.
func underLoad(t *testing.T, what string, pick func(*testenv.NATSCluster, jetstream.JetStream) *testenv.NATSNode,
	hurt func(node *testenv.NATSNode, count func() int), heal func(*testenv.NATSNode)) {
	const partitions, publishers, links = 6, 4, 60
	c, js := clusterSetup(t, partitions)
	ctx := t.Context()
	rec := newRecorder()
	for i := range 3 {
		id := fmt.Sprintf("m%d", i)
		startClusterMember(t, c, i, rec.track(reader.Config{Group: "g", Member: id, BatchSize: 100}), rec.handler(id))
	}
	testenv.WaitFor(t, 60*time.Second, "the group to settle", func() bool { return rec.settled(partitions, 2) })

	var (
		mu      sync.Mutex
		acked   []string
		ackedAt []time.Time
		byPub   [publishers][]time.Time
		stop    atomic.Bool
		wg      sync.WaitGroup
		retries atomic.Int64
	)
	for w := range publishers {
		wg.Go(func() {
			// Each publisher on its own connection to all nodes.
			nc := connectPreferring(t, c, w%len(c.Nodes))
			defer nc.Close()
			pjs, _ := jetstream.New(nc)
			for i := 0; !stop.Load(); i++ {
				cl := click(fmt.Sprintf("link%d", (w*7919+i)%links), w*1_000_000+i)
				b, _ := json.Marshal(cl)
				for {
					pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
					_, err := pjs.Publish(pctx, events.ClickSubject(cl.Owner, cl.Code), b, jetstream.WithMsgID(cl.ID))
					cancel()
					if err == nil {
						break
					}
					if ctx.Err() != nil {
						return
					}
					retries.Add(1)
				}
				mu.Lock()
				acked = append(acked, cl.ID)
				ackedAt = append(ackedAt, time.Now())
				byPub[w] = append(byPub[w], time.Now())
				mu.Unlock()
			}
		})
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(acked) }
	testenv.WaitFor(t, 30*time.Second, "2000 clicks acknowledged before the kill", func() bool { return count() >= 2000 })
	leader := pick(c, js)
	killedAt := time.Now()
	hurt(leader, count)
	stop.Store(true)
	wg.Wait()

	mu.Lock()
	times := slices.Clone(ackedAt)
	ids := slices.Clone(acked)
	mu.Unlock()
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	gap := longestGap(times, killedAt)
	elapsed := times[len(times)-1].Sub(times[0])
	t.Logf("hurt %s (%s); %d clicks acknowledged in %s (%.0f/s), %d publish retries; longest time with no ack: %s",
		leader.Name, what, len(ids), elapsed.Round(time.Millisecond), float64(len(ids))/elapsed.Seconds(), retries.Load(), gap.Round(time.Millisecond))
	for w := range publishers {
		first := c.Nodes[w%len(c.Nodes)].Name
		t.Logf("publisher %d (connected to %s first): longest time with no ack: %s",
			w, first, longestGap(byPub[w], killedAt).Round(time.Millisecond))
	}

	// While the node is down, the group handles every acknowledged click.
	testenv.WaitFor(t, 90*time.Second, "the group to handle every acknowledged click", func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		for _, id := range ids {
			if rec.seen[id] == 0 {
				return false
			}
		}
		return true
	})

	heal(leader)
	testenv.WaitFor(t, 60*time.Second, "every CLICKS replica current again", func() bool {
		s, err := js.Stream(ctx, events.ClicksStream)
		if err != nil || s.CachedInfo().Cluster == nil || len(s.CachedInfo().Cluster.Replicas) != 2 {
			return false
		}
		for _, r := range s.CachedInfo().Cluster.Replicas {
			if !r.Current || r.Offline || r.Lag != 0 {
				return false
			}
		}
		return true
	})

	// CLICKS holds each acknowledged click exactly once, and nothing twice.
	inStream, total := readClickIDs(t, c)
	for id, n := range inStream {
		if n != 1 {
			t.Errorf("click %s is in CLICKS %d times", id, n)
		}
	}
	for _, id := range ids {
		if inStream[id] != 1 {
			t.Errorf("acknowledged click %s is in CLICKS %d times, want 1", id, inStream[id])
		}
	}
	t.Logf("CLICKS holds %d clicks: %d acknowledged, %d published whose ack was lost", total, len(ids), int(total)-len(ids))

	// The group handles every click in CLICKS.
	testenv.WaitFor(t, 90*time.Second, "the group to handle every click in CLICKS", func() bool { return rec.distinct() == len(inStream) })
	rec.mu.Lock()
	redelivered := 0
	for id, n := range rec.seen {
		if inStream[id] != 1 {
			t.Errorf("the group handled %s, which is not in CLICKS", id)
		}
		redelivered += n - 1
	}
	rec.mu.Unlock()
	t.Logf("the group handled every click; %d handled again after the leader change (at-least-once)", redelivered)
	// No member stays stuck: the three share the partitions again.
	testenv.WaitFor(t, 60*time.Second, "the group to settle again with its three members", func() bool { return rec.settled(partitions, 2) })
}

// longestGap is the longest time between two acknowledgements (times in
// order) from a second before from.
func longestGap(times []time.Time, from time.Time) time.Duration {
	var gap time.Duration
	for i := 1; i < len(times); i++ {
		if times[i].After(from.Add(-time.Second)) {
			gap = max(gap, times[i].Sub(times[i-1]))
		}
	}
	return gap
}

// readClickIDs counts the message IDs in CLICKS, on a fresh connection,
// starting over if a read fails while the cluster is still settling.
func readClickIDs(t *testing.T, c *testenv.NATSCluster) (map[string]int, uint64) {
	t.Helper()
	js := c.JetStream(t)
	var (
		ids   map[string]int
		total uint64
		last  error
	)
	read := func() error {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		s, err := js.Stream(ctx, events.ClicksStream)
		if err != nil {
			return fmt.Errorf("stream info: %w", err)
		}
		total = s.CachedInfo().State.Msgs
		// A plain ephemeral consumer, read with Fetch: a pull sent the
		// moment a consumer is created on a cluster can find no responder
		// yet (interest still crossing the routes), so a failed fetch is
		// retried on the same consumer.
		cons, err := js.CreateConsumer(ctx, events.ClicksStream, jetstream.ConsumerConfig{
			AckPolicy: jetstream.AckNonePolicy, InactiveThreshold: time.Minute, MemoryStorage: true,
		})
		if err != nil {
			return fmt.Errorf("create consumer: %w", err)
		}
		ids = map[string]int{}
		for n, fails := uint64(0), 0; n < total; {
			batch, err := cons.Fetch(500, jetstream.FetchMaxWait(5*time.Second))
			if err != nil {
				if fails++; fails > 20 {
					return fmt.Errorf("fetch: %w", err)
				}
				continue
			}
			for m := range batch.Messages() {
				ids[m.Headers().Get(jetstream.MsgIDHeader)]++
				n++
			}
			if err := batch.Error(); err != nil {
				if fails++; fails > 20 {
					return fmt.Errorf("fetch: %w", err)
				}
			}
		}
		return nil
	}
	testenv.WaitFor(t, 60*time.Second, "a full read of CLICKS", func() bool {
		last = read()
		if last != nil {
			t.Logf("read CLICKS: %v (retrying)", last)
		}
		return last == nil
	})
	return ids, total
}
