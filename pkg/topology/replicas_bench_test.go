package topology_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// BenchmarkPublishReplicas publishes clicks (about 330 bytes of JSON, each
// with its Nats-Msg-Id) to CLICKS as the topology declares it, side by side:
// R1 on one nats-server process and R3 on a three-node cluster of the same
// binary, on the same machine. window is how many publishes are in flight
// (1: a synchronous publish; 256: PublishAsync, as the outbox relay does).
// It reports the rate and the publish-to-ack latency (p50, p99); acks are
// collected in publish order, so a late ack holds up the measurement of the
// ones behind it (the latencies are upper bounds).
//
//	cd pkg && go test -run '^$' -bench PublishReplicas -benchtime 20000x -count 3 ./topology/
func BenchmarkPublishReplicas(b *testing.B) {
	one, err := testenv.NewNATSProcess(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer one.Close()
	three, err := testenv.NewNATSCluster(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer three.Close()
	for _, w := range []int{1, 256} {
		for _, c := range []struct {
			name     string
			nodes    *testenv.NATSCluster
			replicas int
		}{{"R1-one-node", one, 1}, {"R3-three-nodes", three, 3}} {
			b.Run(fmt.Sprintf("%s/window=%d", c.name, w), func(b *testing.B) {
				benchPublish(b, c.nodes, c.replicas, w)
			})
		}
	}
}

func benchPublish(b *testing.B, c *testenv.NATSCluster, replicas, window int) {
	nc, err := nats.Connect(c.URL)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(window))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	o := topology.Defaults()
	o.Replicas = replicas
	cfg := topology.Streams(o)[0]
	s, err := js.CreateOrUpdateStream(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Purge(ctx); err != nil {
		b.Fatal(err)
	}
	payloads := make([][]byte, 64)
	for i := range payloads {
		cl := events.Click{V: events.ClickVersion, ID: events.NewID(), Time: time.Now().UTC(), Code: fmt.Sprintf("code%d", i), Owner: "acme",
			Target: "https://example.com/some/landing/page?utm_source=newsletter", Visitor: "3f2a9c0d1e4b5a6c", Referrer: "https://news.example.org/",
			Country: "DE", UserAgent: "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36", RequestID: "r"}
		payloads[i], _ = json.Marshal(cl)
	}
	lat := make([]time.Duration, 0, b.N)
	type sent struct {
		at time.Time
		f  jetstream.PubAckFuture
	}
	var (
		pending chan sent
		done    chan struct{}
	)
	if window > 1 {
		pending, done = make(chan sent, window), make(chan struct{})
		go func() {
			defer close(done)
			for p := range pending {
				select {
				case <-p.f.Ok():
					lat = append(lat, time.Since(p.at))
				case err := <-p.f.Err():
					b.Errorf("publish: %v", err)
				}
			}
		}()
	}
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		data := payloads[i%len(payloads)]
		subj := events.ClickSubject("acme", fmt.Sprintf("code%d", i%len(payloads)))
		id := jetstream.WithMsgID(fmt.Sprintf("%d-%d", start.UnixNano(), i))
		at := time.Now()
		if window == 1 {
			if _, err := js.Publish(ctx, subj, data, id); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(at))
			continue
		}
		f, err := js.PublishAsync(subj, data, id)
		if err != nil {
			b.Fatal(err)
		}
		pending <- sent{at, f}
	}
	if window > 1 {
		close(pending)
		<-done
	}
	elapsed := time.Since(start)
	b.StopTimer()
	slices.Sort(lat)
	if len(lat) == 0 {
		return
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}
