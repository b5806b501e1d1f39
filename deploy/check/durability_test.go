package check

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/topology"
)

// BenchmarkSyncInterval measures what fsync policy costs the click path:
// async publishes of realistic clicks (with Nats-Msg-Id) into CLICKS on a
// file-backed server, under the server default (fsync every 2 minutes), the
// 1 s interval deploy/ uses, and fsync on every write (sync_interval: always).
//
//	go test -run '^$' -bench SyncInterval -benchtime 1x ./deploy/check/
func BenchmarkSyncInterval(b *testing.B) {
	cases := []struct {
		name     string
		interval time.Duration
		always   bool
	}{
		{name: "default_2m", interval: 0},
		{name: "1s", interval: time.Second},
		{name: "always", always: true},
	}
	const n = 100_000
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			for range b.N {
				rate := publishRate(b, tc.interval, tc.always, n)
				b.ReportMetric(rate, "msgs/s")
			}
		})
	}
}

func publishRate(b *testing.B, interval time.Duration, always bool, n int) float64 {
	ns, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: filepath.Join(b.TempDir(), "js"),
		SyncInterval: interval, SyncAlways: always,
	})
	if err != nil {
		b.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		b.Fatal("nats not ready")
	}
	defer ns.Shutdown()
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err := topology.Apply(context.Background(), js, topology.Defaults()); err != nil {
		b.Fatal(err)
	}
	payloads := make([][]byte, n)
	ids := make([]string, n)
	for i := range n {
		c := events.Click{V: 1, ID: events.NewID(), Time: time.Now().UTC(), Code: fmt.Sprintf("link%d", i%1000), Owner: "acme",
			Target: "https://example.com/some/page", Visitor: "0123456789abcdef0123456789abcdef", IPPrefix: "203.0.113.0/24",
			UserAgent: "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0 Safari/537.36", Country: "DE"}
		payloads[i], _ = json.Marshal(c)
		ids[i] = c.ID
	}
	start := time.Now()
	for i := range n {
		if _, err := js.PublishAsync(events.ClickSubject("acme", fmt.Sprintf("link%d", i%1000)), payloads[i], jetstream.WithMsgID(ids[i]), jetstream.WithStallWait(time.Minute)); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(5 * time.Minute):
		b.Fatal("acks did not arrive")
	}
	rate := float64(n) / time.Since(start).Seconds()
	// A future that completed with an error is complete too: the rate is
	// one of stored clicks only if CLICKS holds every one.
	s, err := js.Stream(context.Background(), events.ClicksStream)
	if err != nil {
		b.Fatal(err)
	}
	if got := s.CachedInfo().State.Msgs; got != uint64(n) {
		b.Fatalf("CLICKS holds %d of the %d clicks published", got, n)
	}
	return rate
}
