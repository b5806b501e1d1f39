package reader_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
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

// BenchmarkFailover measures how long a partition is without a reader after
// its owner crashes: from the crash to the first event handled by the
// member that takes over. Run with -benchtime=5x; each iteration takes a
// few seconds because that is what is being measured.
//
//	go test -run '^$' -bench Failover -benchtime 5x ./pkg/reader/
func BenchmarkFailover(b *testing.B) {
	for _, lease := range []time.Duration{time.Second, 3 * time.Second} {
		b.Run("lease="+lease.String(), func(b *testing.B) {
			var total time.Duration
			for range b.N {
				total += failoverOnce(b, lease)
			}
			b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/failover")
			b.ReportMetric(0, "ns/op")
		})
	}
}

func failoverOnce(b *testing.B, lease time.Duration) time.Duration {
	n := testenv.StartNATS(b)
	js := n.JetStream(b)
	o := topology.Defaults()
	o.Partitions = 1
	if err := topology.Apply(context.Background(), js, o); err != nil {
		b.Fatal(err)
	}
	var handledBy [2]atomic.Int64
	var lastHandled [2]atomic.Int64 // unix nanos of the last event handled
	members := make([]*benchMember, 2)
	for i := range members {
		members[i] = startBenchMember(b, n, reader.Config{Group: "g", Member: fmt.Sprintf("m%d", i), LeaseTTL: lease, AckWait: 10 * lease},
			func(_ context.Context, _ int, batch []reader.Event) error {
				handledBy[i].Add(int64(len(batch)))
				lastHandled[i].Store(time.Now().UnixNano())
				return nil
			})
	}
	// A steady trickle, so the new owner has something to handle at once.
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-t.C:
				c := events.Click{V: 1, ID: events.NewID(), Time: time.Now().UTC(), Code: "x", Owner: "o", Visitor: "v"}
				data, _ := json.Marshal(c)
				_, _ = js.PublishAsync(events.ClickSubject("o", "x"), data, jetstream.WithMsgID(c.ID))
			}
		}
	}()
	var owner int
	testenv.WaitFor(b, 30*time.Second, "an owner handling events", func() bool {
		for i := range handledBy {
			if handledBy[i].Load() > 10 {
				owner = i
				return true
			}
		}
		return false
	})
	other := 1 - owner
	members[owner].nc.Close()
	members[owner].cancel()
	crashed := time.Now()
	testenv.WaitFor(b, 60*time.Second, "the other member to take over", func() bool {
		return lastHandled[other].Load() > crashed.UnixNano()
	})
	return time.Unix(0, lastHandled[other].Load()).Sub(crashed)
}

type benchMember struct {
	nc     *nats.Conn
	cancel context.CancelFunc
}

func startBenchMember(b *testing.B, n *testenv.NATS, cfg reader.Config, h reader.Handler) *benchMember {
	nc, err := nats.Connect(n.URL)
	if err != nil {
		b.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	if testing.Verbose() {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		if err := reader.Run(ctx, js, cfg, h); err != nil {
			b.Error(err)
		}
		close(done)
	}()
	b.Cleanup(func() { cancel(); <-done; nc.Close() })
	return &benchMember{nc: nc, cancel: cancel}
}

// BenchmarkCatchUp compares draining a backlog through the runtime (no-op
// handler) with a bare pull consumer that only acks, on the same server and
// backlog, in one run. The ratio is the runtime's overhead.
//
//	go test -run '^$' -bench CatchUp -benchtime 1x ./pkg/reader/
func BenchmarkCatchUp(b *testing.B) {
	const events_ = 200_000
	n := testenv.StartNATS(b)
	js := n.JetStream(b)
	o := topology.Defaults()
	o.Partitions = 8
	if err := topology.Apply(context.Background(), js, o); err != nil {
		b.Fatal(err)
	}
	for i := range events_ {
		c := events.Click{V: 1, ID: events.NewID(), Time: time.Now().UTC(), Code: fmt.Sprintf("link%d", i%1000), Owner: "o", Target: "https://example.com/", Visitor: "0123456789abcdef0123456789abcdef", UserAgent: "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Safari/537.36", Country: "DE"}
		data, _ := json.Marshal(c)
		if _, err := js.PublishAsync(events.ClickSubject("o", c.Code), data, jetstream.WithMsgID(c.ID)); err != nil {
			b.Fatal(err)
		}
	}
	<-js.PublishAsyncComplete()
	// A publish that failed completes too: both drains must read the
	// whole backlog, so CLICKS must hold it.
	s, err := js.Stream(context.Background(), events.ClicksStream)
	if err != nil {
		b.Fatal(err)
	}
	if got := s.CachedInfo().State.Msgs; got != events_ {
		b.Fatalf("CLICKS holds %d of the %d events published", got, events_)
	}

	b.Run("bare", func(b *testing.B) {
		for range b.N {
			start := time.Now()
			bareDrain(b, js, fmt.Sprintf("bare%d", runs.Add(1)), 8, events_)
			b.ReportMetric(events_/time.Since(start).Seconds(), "events/s")
		}
	})
	b.Run("reader", func(b *testing.B) {
		for range b.N {
			var handled atomic.Int64
			group := runs.Add(1)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			start := time.Now()
			go func() {
				_ = reader.Run(ctx, js, reader.Config{Group: fmt.Sprintf("rd%d", group), Member: "m"},
					func(_ context.Context, _ int, batch []reader.Event) error { handled.Add(int64(len(batch))); return nil })
				close(done)
			}()
			testenv.WaitFor(b, 10*time.Minute, "backlog drained", func() bool { return handled.Load() >= events_ })
			b.ReportMetric(events_/time.Since(start).Seconds(), "events/s")
			cancel()
			<-done
		}
	})
}

// runs names each benchmark run's consumers, so -count > 1 starts afresh.
var runs atomic.Int64

// bareDrain reads every partition with one plain consumer each: Fetch a
// batch, ack its last message (AckAll), as the runtime does, but nothing
// else. It fails the benchmark unless every event was read: a fetch or an
// ack that failed ends its partition early.
func bareDrain(b *testing.B, js jetstream.JetStream, name string, partitions, total int) {
	ctx := context.Background()
	var got atomic.Int64
	done := make(chan struct{}, partitions)
	for p := range partitions {
		c, err := js.CreateConsumer(ctx, events.ClicksStream, jetstream.ConsumerConfig{
			Durable: fmt.Sprintf("%s-p%d", name, p), FilterSubject: events.PartitionFilter(p),
			AckPolicy: jetstream.AckAllPolicy, MaxAckPending: 1000,
		})
		if err != nil {
			b.Fatal(err)
		}
		go func() {
			defer func() { done <- struct{}{} }()
			for got.Load() < int64(total) {
				batch, err := c.Fetch(500, jetstream.FetchMaxWait(100*time.Millisecond))
				if err != nil {
					b.Errorf("fetch: %v", err)
					return
				}
				var last jetstream.Msg
				n := 0
				for m := range batch.Messages() {
					var click events.Click
					_ = json.Unmarshal(m.Data(), &click) // decode, as any reader must
					last, n = m, n+1
				}
				if last != nil {
					if err := last.DoubleAck(ctx); err != nil {
						b.Errorf("ack: %v", err)
						return
					}
					got.Add(int64(n))
				}
			}
		}()
	}
	for range partitions {
		<-done
	}
	if n := got.Load(); n != int64(total) {
		b.Fatalf("the bare drain read %d of %d events", n, total)
	}
}
