package jsread_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/loadtest/internal/jsread"
	"github.com/snipdev/snip/loadtest/internal/oracle"
	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// A reader that has caught up with a growing stream receives every new
// message with NumPending 0, and the client buffers them. One call to Next
// must still return everything already stored, not one message per call:
// the oracle polls about once a second, and reading one message a poll made
// a live verify fail while the readers were right.
func TestNextReadsEverythingStoredWhileCaughtUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js := testenv.StartNATS(t).JetStream(t)
	if err := topology.Apply(ctx, js, topology.Defaults()); err != nil {
		t.Fatal(err)
	}
	r := jsread.NewClicks(js, "acme", time.Now().Add(-time.Minute))
	defer r.Close()
	if got, atEnd, err := r.Next(ctx); err != nil || len(got) != 0 || !atEnd {
		t.Fatalf("empty stream: %d clicks, at end %v, err %v", len(got), atEnd, err)
	}

	// Published one at a time, each stored before the next, while the
	// reader's pull is waiting: each is sent with NumPending 0.
	const n = 200
	for i := range n {
		if _, err := js.Publish(ctx, events.ClickSubject("acme", fmt.Sprintf("c%d", i%7)), []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	read, calls := 0, 0
	for deadline := time.Now().Add(10 * time.Second); read < n; calls++ {
		if time.Now().After(deadline) {
			t.Fatalf("read %d of %d in %d calls", read, n, calls)
		}
		got, _, err := r.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		read += len(got)
	}
	// All in one call when they are all buffered; a second (or third) call
	// may be needed for messages still on their way when the first began.
	if calls > 3 {
		t.Errorf("read %d stored messages in %d calls; want at most 3", n, calls)
	}
	if read != n {
		t.Errorf("read %d, want %d", read, n)
	}
}

// The clicks reader gives the oracle each click's fields as published,
// its own time included (what the counter's series count it by), not the
// time it was stored.
func TestClicksReadsEachClicksOwnFields(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	js := testenv.StartNATS(t).JetStream(t)
	if err := topology.Apply(ctx, js, topology.Defaults()); err != nil {
		t.Fatal(err)
	}
	r := jsread.NewClicks(js, "acme", time.Now().Add(-time.Minute))
	defer r.Close()
	// An hour and a half before it is stored: another hour.
	clicked := time.Now().Add(-90 * time.Minute).UTC().Truncate(time.Millisecond)
	c := events.Click{V: events.ClickVersion, ID: uuid.Must(uuid.NewV7()).String(), Time: clicked, Code: "c1", Owner: "acme",
		Target: "https://example.com/", IPPrefix: "198.18.0.0/24", Visitor: "v-1", RequestID: "req-1", Bot: true}
	data, err := json.Marshal(&c)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, events.ClickSubject("acme", "c1"), data); err != nil {
		t.Fatal(err)
	}
	var got []oracle.LogClick
	testenv.WaitFor(t, 10*time.Second, "the click to be read", func() bool {
		cs, _, err := r.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, cs...)
		return len(got) > 0
	})
	want := []oracle.LogClick{{ID: uuid.MustParse(c.ID), RequestID: "req-1", Code: "c1", Bot: true, IPPrefix: "198.18.0.0/24", Visitor: "v-1", Time: clicked}}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(oracle.LogClick{}, "Partition", "StreamSeq", "Stored")); diff != "" {
		t.Errorf("click read (-want +got):\n%s", diff)
	}
}

// A message on a link's subject that is not a click at all (not JSON, no
// code in it) is still a message the link's readers get and park: it is
// read as an invalid click of the link it was stored under, so the oracle
// counts it against a run of that link instead of passing over it (it
// read such a message as a click of no link, which no run owns).
func TestClicksReadsAnUnreadablePayloadAsAnInvalidClickOfItsLink(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	js := testenv.StartNATS(t).JetStream(t)
	if err := topology.Apply(ctx, js, topology.Defaults()); err != nil {
		t.Fatal(err)
	}
	r := jsread.NewClicks(js, "acme", time.Now().Add(-time.Minute))
	defer r.Close()
	for _, payload := range []string{"not a click", `{"id":"x","request_id":"req-2"}`} {
		if _, err := js.Publish(ctx, events.ClickSubject("acme", "c1"), []byte(payload)); err != nil {
			t.Fatal(err)
		}
	}
	var got []oracle.LogClick
	testenv.WaitFor(t, 10*time.Second, "both messages to be read", func() bool {
		cs, _, err := r.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, cs...)
		return len(got) >= 2
	})
	want := []oracle.LogClick{{Code: "c1", Invalid: true}, {Code: "c1", RequestID: "req-2", Invalid: true}}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(oracle.LogClick{}, "Partition", "StreamSeq", "Stored")); diff != "" {
		t.Errorf("messages read (-want +got):\n%s", diff)
	}
}

// A reader whose consumer's server is killed must go on reading: on a
// cluster the oracle's reader is a one-replica consumer on one node, and a
// reader left waiting on a pull request that server lost reports the run's
// clicks as lost. The client here is connected to another node, so nothing
// but the missing heartbeats tells it.
func TestNextGoesOnWhenTheConsumersServerIsKilled(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c := testenv.StartNATSCluster(t)
	opts := topology.Defaults()
	opts.Replicas = 3
	c.ApplyTopology(t, c.JetStream(t), opts)
	publish := func(js jetstream.JetStream, from, n int) {
		t.Helper()
		for i := from; i < from+n; i++ {
			// Retried under one ID: the stream may be electing a leader.
			testenv.WaitFor(t, 30*time.Second, "a click stored", func() bool {
				pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				defer cancel()
				_, err := js.Publish(pctx, events.ClickSubject("acme", fmt.Sprintf("c%d", i%7)), []byte(`{}`), jetstream.WithMsgID(strconv.Itoa(i)))
				return err == nil
			})
		}
	}
	readUpTo := func(r *jsread.Clicks, read *int, want int, within time.Duration) {
		t.Helper()
		testenv.WaitFor(t, within, fmt.Sprintf("%d clicks read", want), func() bool {
			got, _, err := r.Next(ctx)
			if err != nil {
				t.Fatal(err)
			}
			*read += len(got)
			if *read > want {
				t.Fatalf("read %d, want %d", *read, want)
			}
			return *read == want
		})
	}
	since := time.Now().Add(-time.Minute)
	publish(c.JetStream(t), 0, 50)

	// A reader on one node whose consumer is on another (the server places
	// it at random).
	var (
		r     *jsread.Clicks
		js    jetstream.JetStream
		read  int
		where *testenv.NATSNode
	)
	for i := range 12 {
		via := c.Nodes[i%len(c.Nodes)]
		nc, err := nats.Connect(via.URL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, _ = jetstream.New(nc)
		r, read = jsread.NewClicks(js, "acme", since), 0
		readUpTo(r, &read, 50, 30*time.Second)
		name, err := jsread.ConsumerNode(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if name != via.Name {
			where = c.Node(name)
			break
		}
		r.Close()
	}
	if where == nil {
		t.Fatal("12 readers' consumers were on the node their client was connected to")
	}
	defer r.Close()

	// Killed and started again at once: the restarted server makes the
	// consumer again from its assignment, without the reader's pull
	// request, and tells the reader nothing.
	where.Kill()
	if err := where.Start(); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitHealthy(60 * time.Second); err != nil {
		t.Fatal(err)
	}
	publish(js, 50, 50)
	readUpTo(r, &read, 100, 30*time.Second)
}

// A reader of FRAUD_VERDICTS, whose messages hold up to 500 labels (up to
// 768 KiB each), must not ask for more than the server will send one client
// at once: a pull of thousands of such messages is hundreds of MB queued for
// one connection, over the server's limit for a client's pending data, and
// the server closes the connection as a slow consumer. The oracle then
// reconnected about twenty times while reading a five-minute flood's
// verdicts back. Every verdict must be read with no reconnect.
func TestVerdictsReadLargeMessagesWithoutReconnecting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// A nats-server process of its own: an embedded one would store and
	// send the 120 MB under the race detector, in this test's process.
	n, err := testenv.NewNATSProcess(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	nc := n.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := topology.Apply(ctx, js, topology.Defaults()); err != nil {
		t.Fatal(err)
	}
	// 700 messages of 500 labels and about 180 KB: over 120 MB in all.
	const msgs = 700
	referrer := "https://example.com/" + strings.Repeat("r", 130)
	now := time.Now()
	// Published asynchronously, a window of 32 at a time, so each message
	// is made while the server stores the ones before it.
	pub, err := jetstream.New(n.Connect(t), jetstream.WithPublishAsyncMaxPending(32))
	if err != nil {
		t.Fatal(err)
	}
	for m := range msgs {
		labels := make([]events.FraudVerdictLabel, events.MaxVerdictLabels)
		for i := range labels {
			labels[i] = events.FraudVerdictLabel{ClickID: events.NewID(), ClickSeq: uint64(m*events.MaxVerdictLabels + i + 1),
				Code: "viral", Owner: "acme", Rule: "link_flood", Bot: true, ClickTime: now, Country: "DE", Referrer: referrer}
		}
		parts := events.SplitVerdicts(0, uint64(m*events.MaxVerdictLabels+1), uint64((m+1)*events.MaxVerdictLabels), labels)
		if len(parts) != 1 {
			t.Fatalf("message %d split into %d parts; want 1", m, len(parts))
		}
		data, err := json.Marshal(parts[0])
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pub.PublishAsync(events.FraudVerdictBatchSubject(0), data, jetstream.WithMsgID(parts[0].ID),
			jetstream.WithStallWait(time.Minute)); err != nil {
			t.Fatalf("publish message %d: %v", m, err)
		}
	}
	select {
	case <-pub.PublishAsyncComplete():
	case <-time.After(time.Minute):
		t.Fatal("the publishes not acknowledged within a minute")
	}
	// Every message stored: a publish that failed is missing here.
	st, err := js.Stream(ctx, events.FraudVerdictsStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != msgs {
		t.Fatalf("FRAUD_VERDICTS holds %d messages, want the %d published", info.State.Msgs, msgs)
	}

	r := jsread.NewVerdicts(js, "acme", now.Add(-time.Minute))
	defer r.Close()
	read := 0
	for deadline := time.Now().Add(60 * time.Second); read < msgs*events.MaxVerdictLabels; {
		if time.Now().After(deadline) {
			t.Fatalf("read %d of %d verdicts in 60 s (reconnects %d)", read, msgs*events.MaxVerdictLabels, nc.Stats().Reconnects)
		}
		got, _, err := r.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		read += len(got)
	}
	if rc := nc.Stats().Reconnects; rc != 0 || read != msgs*events.MaxVerdictLabels {
		t.Errorf("read %d verdicts with %d reconnects; want %d with none", read, rc, msgs*events.MaxVerdictLabels)
	}
}

// The alerts reader gives the owner's alerts on FRAUD, as the oracle
// compares them with the run's bursts, and leaves out other owners' and
// payloads no owner could read either.
func TestAlertsReadsTheOwnersAlerts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js := testenv.StartNATS(t).JetStream(t)
	if err := topology.Apply(ctx, js, topology.Defaults()); err != nil {
		t.Fatal(err)
	}
	alert := func(id, owner, code, key string) []byte {
		b, err := json.Marshal(events.FraudAlert{V: events.FraudVersion, ID: id, Rule: "visitor_burst", Code: code, Owner: owner, Key: key, Time: time.Now().UTC()})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, m := range []struct {
		code string
		data []byte
	}{
		{"abc", alert("visitor_burst:abc:v1", "acme", "abc", "v1")},
		{"xyz", alert("visitor_burst:xyz:v2", "other", "xyz", "v2")},
		{"abc", []byte(`{"v":1,"id":"broken"}`)},
		{"abd", alert("visitor_burst:abd:v3", "acme", "abd", "v3")},
	} {
		if _, err := js.Publish(ctx, events.FraudAlertSubject(m.code), m.data); err != nil {
			t.Fatal(err)
		}
	}
	r := jsread.NewAlerts(js, "acme", time.Now().Add(-time.Minute))
	defer r.Close()
	var got []string
	testenv.WaitFor(t, 10*time.Second, "both of acme's alerts", func() bool {
		as, _, err := r.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range as {
			got = append(got, a.ID+" "+a.Rule+" "+a.Code+" "+a.Key)
		}
		return len(got) >= 2
	})
	want := "visitor_burst:abc:v1 visitor_burst abc v1,visitor_burst:abd:v3 visitor_burst abd v3"
	if strings.Join(got, ",") != want {
		t.Errorf("alerts %q, want %q", strings.Join(got, ","), want)
	}
}

// A backlog read reports each partition consumer of every group (its
// backlog and ack floor, by group and partition, in that order) and costs
// a handful of JetStream requests however many groups and partitions
// there are: one listing per stream. Read one consumer at a time it was
// about ninety requests for five groups of eight partitions, several
// seconds on a loaded machine, so the load test's once-a-second backlog
// read, which its keep-up verdict is judged on, finished in few seconds.
func TestPositionsReadEveryGroupInAFewRequests(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	nc := testenv.StartNATS(t).Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	o := topology.Defaults()
	if err := topology.Apply(ctx, js, o); err != nil {
		t.Fatal(err)
	}
	groups := []string{"ga", "gb", "gc", "gd", "ge"}
	for _, g := range groups {
		for p := range o.Partitions {
			if _, err := js.CreateOrUpdateConsumer(ctx, events.ClicksStream, topology.GroupConsumerConfig(g, p, topology.GroupConsumer{AckWait: time.Minute, MaxAckPending: 1000})); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Clicks on 40 links, so every partition has some; count them by the
	// partition CLICKS stores them in.
	clicks, err := js.Stream(ctx, events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	perPartition := make([]uint64, o.Partitions)
	for i := range 200 {
		ack, err := js.Publish(ctx, events.ClickSubject("acme", fmt.Sprintf("code%d", i%40)), []byte(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		m, err := clicks.GetMsg(ctx, ack.Sequence) // the stored subject names the partition
		if err != nil {
			t.Fatal(err)
		}
		perPartition[events.PartitionOf(m.Subject)]++
	}
	// The server acknowledges a publish before it tells the stream's
	// consumers (its signal queue, a goroutine of its own): until then a
	// consumer's pending count leaves the message out. On a busy machine
	// the last clicks were still uncounted by the first groups listed, a
	// backlog of 29 where 30 were stored. Every consumer has counted every
	// click before the backlog is read.
	testenv.WaitFor(t, 30*time.Second, "every consumer to count its partition's clicks", func() bool {
		counted := 0
		l := clicks.ListConsumers(ctx)
		for ci := range l.Info() {
			g, p, ok := strings.Cut(ci.Name, "-p")
			n, err := strconv.Atoi(p)
			if ok && err == nil && slices.Contains(groups, g) && n < len(perPartition) && ci.NumPending == perPartition[n] {
				counted++
			}
		}
		return l.Err() == nil && counted == len(groups)*o.Partitions
	})
	// Group ga handles partition 0: fetch it all as its owner would, and ack.
	c, err := js.Consumer(ctx, events.ClicksStream, topology.GroupConsumerName("ga", 0))
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Fetch(int(perPartition[0]), jetstream.FetchPriorityGroup(topology.PriorityGroup), jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var last jetstream.Msg
	for m := range b.Messages() {
		last = m
	}
	if err := b.Error(); err != nil || last == nil {
		t.Fatalf("fetch partition 0: %v (a message: %v)", err, last != nil)
	}
	if err := last.DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	md, _ := last.Metadata()

	r := jsread.NewReaders(js)
	before := nc.Stats().OutMsgs
	pos, err := r.Positions(ctx)
	requests := nc.Stats().OutMsgs - before
	if err != nil {
		t.Fatal(err)
	}
	// The topology's own consumers (the counter's on FRAUD_VERDICTS, say)
	// are read too; this test's groups are the ones it knows the backlog of.
	mine := pos[:0:0]
	for _, p := range pos {
		if slices.Contains(groups, p.Reader) {
			mine = append(mine, p)
		}
	}
	var want []oracle.Position
	for _, g := range groups {
		for p := range o.Partitions {
			w := oracle.Position{Reader: g, Stream: events.ClicksStream, Partition: p, Backlog: perPartition[p]}
			if g == "ga" && p == 0 {
				w.Backlog, w.AckFloor = 0, md.Sequence.Stream
			}
			want = append(want, w)
		}
	}
	if diff := cmp.Diff(want, mine); diff != "" {
		t.Errorf("positions (-want +got):\n%s", diff)
	}
	if requests > 4 {
		t.Errorf("a backlog read of %d groups of %d partitions sent %d messages, want at most 4 (one listing per stream, and each stream's info)", len(groups), o.Partitions, requests)
	}
}
