package redirect_test

import (
	"context"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/redirect/internal/linkstore"
	"github.com/snipdev/snip/services/redirect/internal/outbox"
	"github.com/snipdev/snip/services/redirect/internal/redirect"
	"github.com/snipdev/snip/services/redirect/internal/visitor"
)

var servers *testenv.Servers

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &servers, testenv.WithRedis())) }

// BenchmarkFollow is the hot path with a cached link against a real Redis:
// resolve, build the click, group-commit it into the outbox. Run it with
// -cpu to see the group commit batch concurrent requests.
func BenchmarkFollow(b *testing.B) {
	rdb, _ := servers.Redis.NewDB(b)
	layout := outbox.NewLayout(16)
	store := linkstore.New(rdb, layout, 1<<40)
	l, err := store.Create(b.Context(), "acme", "https://example.com/landing", "")
	if err != nil {
		b.Fatal(err)
	}
	m := redirect.NewMetrics(prometheus.NewRegistry())
	res := redirect.NewResolver(store, 1000, time.Hour, time.Second, m)
	defer res.Close()
	c := outbox.NewCommitter(rdb, layout, outbox.CommitterConfig{MaxBatch: 256, Workers: 2, MaxEntries: 1 << 40, Timeout: time.Second, Cooldown: time.Second},
		outbox.NewMetrics(prometheus.NewRegistry()))
	c.Start()
	defer c.Close()
	svc := redirect.NewService(res, c, nil, visitor.NewIdentifier(rdb), layout, redirect.Options{Policy: redirect.PolicyReject, OutboxWait: time.Second}, m)
	ip := netip.MustParseAddr("203.0.113.9")
	b.ReportAllocs()
	b.SetParallelism(32) // many requests in flight, as a server has
	b.RunParallel(func(pb *testing.PB) {
		v := redirect.Visit{Code: l.Code, IP: ip, UserAgent: "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36",
			Referrer: "https://news.example/", Country: "DE", RequestID: "0123456789abcdef0123456789abcdef"}
		for pb.Next() {
			v.Time = time.Now()
			if _, err := svc.Follow(context.Background(), v); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
