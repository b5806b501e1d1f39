// Package consoletest sets up what the console's tests read: an embedded
// NATS server with Snip's topology, and clicks published as the redirect
// service's relay publishes them. It is test support: only _test.go files
// import it.
package consoletest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/console/internal/ownerstream"
	"github.com/snipdev/snip/services/console/internal/sse"
)

// Partitions is the CLICKS partition count of the tests' topology.
const Partitions = 4

// NATS starts an embedded JetStream server with the topology applied (in
// memory) and returns it with a JetStream client.
func NATS(tb testing.TB) (*testenv.NATS, jetstream.JetStream) {
	tb.Helper()
	n := testenv.StartNATS(tb)
	js := n.JetStream(tb)
	o := topology.Defaults()
	o.Partitions = Partitions
	o.Storage = jetstream.MemoryStorage
	if err := topology.Apply(tb.Context(), js, o); err != nil {
		tb.Fatal(err)
	}
	return n, js
}

// Click is the i-th click of owner/code: a valid event with a fresh ID,
// every tenth a bot, a country and a referrer.
func Click(owner, code string, i int) events.Click {
	return events.Click{
		V: events.ClickVersion, ID: events.NewID(), Time: time.Now().UTC(),
		Code: code, Owner: owner, Target: "https://example.com/" + code,
		IPPrefix: "203.0.113.0/24", Visitor: fmt.Sprintf("visitor-%d", i%7),
		UserAgent: "Mozilla/5.0", Referrer: "https://news.example.org/item?id=" + fmt.Sprint(i),
		Country: "DE", RequestID: fmt.Sprintf("req-%d", i), Bot: i%10 == 9,
	}
}

// Publish sends clicks to CLICKS with their IDs as Nats-Msg-Id and returns
// the stream sequence of each, in order.
func Publish(tb testing.TB, js jetstream.JetStream, clicks ...events.Click) []uint64 {
	tb.Helper()
	futures := make([]jetstream.PubAckFuture, len(clicks))
	for i, c := range clicks {
		b, err := json.Marshal(c)
		if err != nil {
			tb.Fatal(err)
		}
		if futures[i], err = js.PublishAsync(events.ClickSubject(c.Owner, c.Code), b, jetstream.WithMsgID(c.ID)); err != nil {
			tb.Fatal(err)
		}
	}
	seqs := make([]uint64, len(clicks))
	for i, f := range futures {
		select {
		case ack := <-f.Ok():
			seqs[i] = ack.Sequence
		case err := <-f.Err():
			tb.Fatalf("publish click %d: %v", i, err)
		case <-time.After(30 * time.Second):
			tb.Fatalf("publish click %d: no ack in 30 s", i)
		}
	}
	return seqs
}

// Clicks returns n clicks of owner/code numbered from 0.
func Clicks(owner, code string, n int) []events.Click {
	out := make([]events.Click, n)
	for i := range out {
		out[i] = Click(owner, code, i)
	}
	return out
}

// Alert is a valid fraud alert about owner/code with a deterministic ID of
// the shape the fraud service gives (rule:code:key:period).
func Alert(owner, code, rule string, n int) events.FraudAlert {
	now := time.Now().UTC().Truncate(time.Second)
	return events.FraudAlert{
		V: events.FraudVersion, ID: fmt.Sprintf("%s:%s:-:%d", rule, code, now.Unix()+int64(n)),
		Rule: rule, Code: code, Owner: owner, WindowStart: now.Add(-time.Minute), WindowEnd: now,
		Count: 30 + n, Threshold: 20, Time: now, Detail: "test alert",
	}
}

// PublishAlert stores a on FRAUD as the fraud service does and returns its
// sequence.
func PublishAlert(tb testing.TB, js jetstream.JetStream, a events.FraudAlert) uint64 {
	tb.Helper()
	b, err := json.Marshal(a)
	if err != nil {
		tb.Fatal(err)
	}
	ack, err := js.Publish(tb.Context(), events.FraudAlertSubject(a.Code), b, jetstream.WithMsgID(a.ID))
	if err != nil {
		tb.Fatal(err)
	}
	return ack.Sequence
}

// OwnerClicks reads n click events from an owner's stream. It fails the test
// on a click of another owner, an event id that is not the click's CLICKS
// sequence, or a field an owner must not get (the visitor's identity or
// network, the request ID); it returns the sequences in the order read.
func OwnerClicks(tb testing.TB, r *sse.Reader, owner string, n int) []uint64 {
	tb.Helper()
	var seqs []uint64
	for len(seqs) < n {
		e, err := r.Next()
		if err != nil {
			tb.Fatalf("%s's stream: after %d of %d clicks: %v", owner, len(seqs), n, err)
		}
		if e.Name != "click" {
			continue
		}
		var c ownerstream.Click
		if err := json.Unmarshal(e.Data, &c); err != nil {
			tb.Fatal(err)
		}
		switch {
		case c.Owner != owner:
			tb.Fatalf("%s's stream sent a click of %s (seq %d)", owner, c.Owner, c.Seq)
		case e.ID != strconv.FormatUint(c.Seq, 10):
			tb.Fatalf("event id %q for click seq %d", e.ID, c.Seq)
		case bytes.Contains(e.Data, []byte(`"visitor"`)) || bytes.Contains(e.Data, []byte(`"ip_prefix"`)) || bytes.Contains(e.Data, []byte(`"request_id"`)):
			tb.Fatalf("an owner's click carries the visitor's identity, network or the request ID: %s", e.Data)
		}
		seqs = append(seqs, c.Seq)
	}
	return seqs
}

// Breakable is a JetStream client whose ordered consumers' message iterators
// a test can end, as nats.go ends them when the connection closes for good:
// Next fails under whoever reads, who has to open another consumer. (A
// deleted consumer, a NATS restart or a reconnect do not show: nats.go's
// ordered consumer recreates itself after its last message.)
type Breakable struct {
	jetstream.JetStream

	mu     sync.Mutex
	open   []jetstream.MessagesContext
	opened int
}

// NewBreakable wraps js.
func NewBreakable(js jetstream.JetStream) *Breakable { return &Breakable{JetStream: js} }

// OrderedConsumer creates the consumer on the server, as js does.
func (b *Breakable) OrderedConsumer(ctx context.Context, stream string, cfg jetstream.OrderedConsumerConfig) (jetstream.Consumer, error) {
	c, err := b.JetStream.OrderedConsumer(ctx, stream, cfg)
	if err != nil {
		return nil, err
	}
	return &breakableConsumer{Consumer: c, b: b}, nil
}

// Break ends every iterator opened so far.
func (b *Breakable) Break() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, it := range b.open {
		it.Stop()
	}
	b.open = nil
}

// Opened counts the iterators opened.
func (b *Breakable) Opened() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.opened
}

type breakableConsumer struct {
	jetstream.Consumer
	b *Breakable
}

func (c *breakableConsumer) Messages(opts ...jetstream.PullMessagesOpt) (jetstream.MessagesContext, error) {
	it, err := c.Consumer.Messages(opts...)
	if err != nil {
		return nil, err
	}
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	c.b.open = append(c.b.open, it)
	c.b.opened++
	return it, nil
}

// DownGroup makes a consumer group's consumers on every partition of
// CLICKS, as the reader runtime does, with no member: a reader that is
// down (its lag grows, its replays stay under way).
func DownGroup(tb testing.TB, js jetstream.JetStream, group string) {
	tb.Helper()
	for p := range Partitions {
		cfg := topology.GroupConsumerConfig(group, p, topology.GroupConsumer{
			AckWait: time.Minute, PinnedTTL: 5 * time.Second, MaxAckPending: 100, DeliverPolicy: jetstream.DeliverAllPolicy,
		})
		if _, err := js.CreateOrUpdateConsumer(tb.Context(), events.ClicksStream, cfg); err != nil {
			tb.Fatal(err)
		}
	}
}
