package ownerstream_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/services/console/internal/consoletest"
	"github.com/snipdev/snip/services/console/internal/ownerstream"
)

// BenchmarkCatchUp measures an owner's stream catching up on a backlog:
// 20,000 of the owner's clicks among 40,000, read from sequence 1, through
// the whole path (ordered consumer, decode, projection, SSE over HTTP,
// client parse) against the floor of the same ordered consumer read bare.
// Both sides run in each iteration, so the ratio holds on a noisy machine.
//
//	go test -run '^$' -bench CatchUp -benchtime 3x ./internal/ownerstream/
func BenchmarkCatchUp(b *testing.B) {
	const perOwner = 20_000
	_, js := consoletest.NATS(b)
	for range perOwner / 1000 {
		var clicks []events.Click
		for i := range 1000 {
			clicks = append(clicks, consoletest.Click("acme", "a", i), consoletest.Click("globex", "g", i))
		}
		consoletest.Publish(b, js, clicks...)
	}
	s := ownerstream.New(js, ownerstream.Config{})
	srv := server(b, s)
	var bare, stream time.Duration
	for b.Loop() {
		t0 := time.Now()
		c, err := js.OrderedConsumer(b.Context(), events.ClicksStream, jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{ownerstream.Filter("acme")}, DeliverPolicy: jetstream.DeliverAllPolicy,
		})
		if err != nil {
			b.Fatal(err)
		}
		it, err := c.Messages(jetstream.PullMaxMessages(100))
		if err != nil {
			b.Fatal(err)
		}
		for range perOwner {
			if _, err := it.Next(); err != nil {
				b.Fatal(err)
			}
		}
		it.Stop()
		bare += time.Since(t0)

		t0 = time.Now()
		cl := connect(b, srv.URL+"?since_seq=0", "acme", "")
		if got := cl.clicks(b, "acme", perOwner); len(got) != perOwner {
			b.Fatalf("%d clicks", len(got))
		}
		cl.resp.Body.Close()
		stream += time.Since(t0)
	}
	b.ReportMetric(float64(b.N*perOwner)/bare.Seconds(), "bare_clicks/s")
	b.ReportMetric(float64(b.N*perOwner)/stream.Seconds(), "stream_clicks/s")
	b.ReportMetric(stream.Seconds()/bare.Seconds(), "stream/bare")
}
