package httpapi_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/owners"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/webserver"
	"github.com/snipdev/snip/services/redirect/internal/httpapi"
	"github.com/snipdev/snip/services/redirect/internal/linkstore"
	"github.com/snipdev/snip/services/redirect/internal/outbox"
	"github.com/snipdev/snip/services/redirect/internal/redirect"
	"github.com/snipdev/snip/services/redirect/internal/visitor"
)

var servers *testenv.Servers

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &servers, testenv.WithRedis())) }

// BenchmarkRedirectHandler is GET /:code through echo, the shared
// middleware (recover, request ID), request metrics and the hot path, with
// the click group-committed into a real Redis: everything but the socket.
func BenchmarkRedirectHandler(b *testing.B) {
	rdb, _ := servers.Redis.NewDB(b)
	layout := outbox.NewLayout(16)
	store := linkstore.New(rdb, layout, 1<<40)
	l, err := store.Create(b.Context(), "acme", "https://example.com/landing", "")
	if err != nil {
		b.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	rm := redirect.NewMetrics(reg)
	res := redirect.NewResolver(store, 1000, time.Hour, time.Hour, time.Second, rm)
	defer res.Close()
	c := outbox.NewCommitter(rdb, layout, outbox.CommitterConfig{MaxBatch: 256, Workers: 2, MaxEntries: 1 << 40, Timeout: time.Second, Cooldown: time.Second},
		outbox.NewMetrics(reg))
	c.Start()
	defer c.Close()
	svc := redirect.NewService(res, c, nil, visitor.NewIdentifier(rdb), layout, redirect.Options{Policy: redirect.PolicyReject, OutboxWait: time.Second}, rm)
	web := webserver.New(slog.New(slog.DiscardHandler), reg)
	api := &httpapi.API{Owners: owners.NewStore(rdb), Links: store, Follow: svc, Cache: res, Log: slog.New(slog.DiscardHandler),
		RedirectLatency: rm.Latency, Misses: rm.Misses}
	api.Register(web.Echo, reg)

	b.ReportAllocs()
	b.SetParallelism(32)
	b.RunParallel(func(pb *testing.PB) {
		req := httptest.NewRequest("GET", "/"+l.Code, nil)
		req.RemoteAddr = "203.0.113.9:4711"
		req.Header.Set("User-Agent", "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36")
		for pb.Next() {
			w := httptest.NewRecorder()
			web.Echo.ServeHTTP(w, req)
			if w.Code != http.StatusFound {
				b.Errorf("status %d", w.Code)
				return
			}
		}
	})
}
