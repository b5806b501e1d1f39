package redirect_test

import (
	"context"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/redirect/internal/linkstore"
	"github.com/snipdev/snip/services/redirect/internal/outbox"
	"github.com/snipdev/snip/services/redirect/internal/redirect"
	"github.com/snipdev/snip/services/redirect/internal/visitor"
)

var servers *testenv.Servers

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &servers, testenv.WithRedis())) }

// TestClickFieldsFromTheRequestAreBounded: a request's user agent, referrer
// and request ID go into its click cut to MaxUserAgent, MaxReferrer and
// MaxRequestID bytes (whole UTF-8 characters), so no request can make a
// click larger than CLICKS takes.
func TestClickFieldsFromTheRequestAreBounded(t *testing.T) {
	t.Parallel()
	rdb, _ := servers.Redis.NewDB(t)
	layout := outbox.NewLayout(1)
	store := linkstore.New(rdb, layout, 1<<40)
	l, err := store.Create(t.Context(), "acme", "https://example.com/", "")
	if err != nil {
		t.Fatal(err)
	}
	m := redirect.NewMetrics(prometheus.NewRegistry())
	res := redirect.NewResolver(store, 10, time.Hour, 0, time.Second, m)
	defer res.Close()
	c := outbox.NewCommitter(rdb, layout, outbox.CommitterConfig{MaxBatch: 8, Workers: 1, MaxEntries: 1 << 40, Timeout: 5 * time.Second, Cooldown: time.Second},
		outbox.NewMetrics(prometheus.NewRegistry()))
	c.Start()
	defer c.Close()
	svc := redirect.NewService(res, c, nil, visitor.NewIdentifier(rdb), layout,
		redirect.Options{Policy: redirect.PolicyReject, OutboxWait: 5 * time.Second, Validity: time.Minute}, m)
	v := redirect.Visit{Code: l.Code, Time: time.Now(), IP: netip.MustParseAddr("203.0.113.9"), Country: "DE",
		UserAgent: strings.Repeat("ü", 4000), Referrer: "https://ref.example/" + strings.Repeat("r", 5000), RequestID: strings.Repeat("q", 1000)}
	if _, err := svc.Follow(t.Context(), v); err != nil {
		t.Fatal(err)
	}
	entries, err := rdb.XRange(t.Context(), layout.OutboxKey(0, outbox.LaneClicks), "-", "+").Result()
	if err != nil || len(entries) != 1 {
		t.Fatalf("outbox clicks: %d entries, %v; want 1", len(entries), err)
	}
	data, _ := entries[0].Values["data"].(string)
	click, err := events.DecodeClick([]byte(data))
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.Repeat("ü", redirect.MaxUserAgent/2); click.UserAgent != want {
		t.Errorf("user agent of %d bytes, want the first %d", len(click.UserAgent), len(want))
	}
	if want := v.Referrer[:redirect.MaxReferrer]; click.Referrer != want {
		t.Errorf("referrer of %d bytes, want the first %d", len(click.Referrer), len(want))
	}
	if want := v.RequestID[:redirect.MaxRequestID]; click.RequestID != want {
		t.Errorf("request ID of %d bytes, want the first %d", len(click.RequestID), len(want))
	}
}

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
	res := redirect.NewResolver(store, 1000, time.Hour, time.Hour, time.Second, m)
	defer res.Close()
	c := outbox.NewCommitter(rdb, layout, outbox.CommitterConfig{MaxBatch: 256, Workers: 2, MaxEntries: 1 << 40, Timeout: time.Second, Cooldown: time.Second,
		Written: outbox.NewWritten(layout)}, // as the service runs it
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
