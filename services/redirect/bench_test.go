package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
)

// loadResult is one load run against one server.
type loadResult struct {
	requests int
	errors   int
	elapsed  time.Duration
	p50, p99 time.Duration
}

func (r loadResult) rps() float64 { return float64(r.requests) / r.elapsed.Seconds() }

// load drives GET base/<code> from conns keep-alive connections in a closed
// loop for d and measures throughput and latency. Redirects are not
// followed: a request ends at the 302.
func load(base string, codes []string, conns int, d time.Duration) loadResult {
	tr := &http.Transport{MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns, DisableCompression: true,
		DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	deadline := time.Now().Add(d)
	lat := make([][]time.Duration, conns)
	errs := make([]int, conns)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range conns {
		wg.Go(func() {
			l := make([]time.Duration, 0, 1<<16)
			req, _ := http.NewRequest("GET", base+"/"+codes[w%len(codes)], nil)
			req.Header.Set("User-Agent", "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36")
			for time.Now().Before(deadline) {
				t0 := time.Now()
				resp, err := c.Do(req)
				if err != nil {
					errs[w]++
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusFound {
					errs[w]++
					continue
				}
				l = append(l, time.Since(t0))
			}
			lat[w] = l
		})
	}
	wg.Wait()
	all := slices.Concat(lat...)
	slices.Sort(all)
	r := loadResult{requests: len(all), elapsed: time.Since(start)}
	for _, e := range errs {
		r.errors += e
	}
	if len(all) > 0 {
		r.p50, r.p99 = all[len(all)/2], all[len(all)*99/100]
	}
	return r
}

// bareServer is the baseline: echo answering every /:code with a 302 and
// doing nothing else.
func bareServer(tb testing.TB) string {
	tb.Helper()
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.GET("/:code", func(c echo.Context) error { return c.Redirect(http.StatusFound, "https://example.com/landing") })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv := &http.Server{Handler: e}
	go func() { _ = srv.Serve(ln) }()
	tb.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	return "http://" + ln.Addr().String()
}

// BenchmarkRedirectVsBare is the measurement of docs/benchmarks.md
// "## Redirect": the real service (cached links, every click group-committed
// into the Redis outbox before its 302, the relay publishing to an embedded
// JetStream with dedup) against a bare echo 302 handler, same machine, same
// load generator, alternating rounds in one run. Run it alone:
//
//	go test -run '^$' -bench RedirectVsBare -benchtime 1x ./services/redirect
func BenchmarkRedirectVsBare(b *testing.B) {
	const (
		conns  = 64
		rounds = 3
		round  = 5 * time.Second
	)
	_, db := servers.Redis.NewDB(b)
	n := testenv.StartNATS(b)
	cfg := testConfig(servers.Redis.URL(db), n.URL)
	cfg.OutboxShards, cfg.RelayWindow, cfg.CommitMaxBatch = 16, 512, 256
	cfg.MonitorInterval = time.Second
	in := startInstance(b, cfg)
	bare := bareServer(b)
	var codes []string
	for i := range 64 {
		codes = append(codes, createLink(b, in.URL, fmt.Sprintf("https://example.com/landing/%d", i), ""))
	}
	js := n.JetStream(b)
	testenv.WaitFor(b, 30*time.Second, "the topology", func() bool { return streamCount(js, events.LinksStream) == len(codes) })
	load(in.URL, codes, conns, time.Second) // warm the cache, connections and JIT-free Go
	load(bare, codes, conns, time.Second)

	b.ResetTimer()
	// Phase 1: the whole pipeline (outbox, relay, JetStream) against bare.
	var real, base []loadResult
	for range rounds {
		base = append(base, load(bare, codes, conns, round))
		real = append(real, load(in.URL, codes, conns, round))
	}
	// Phase 2: NATS stopped, so the relay is idle and every click stays in
	// the outbox: the cost of recording a click on the request path alone
	// (what the service does before its 302), against bare again.
	n.Stop()
	var rec, base2 []loadResult
	for range rounds {
		base2 = append(base2, load(bare, codes, conns, round))
		rec = append(rec, load(in.URL, codes, conns, round))
	}
	n.Start()
	b.StopTimer()
	sum := func(rs []loadResult) (rps float64, p50, p99 time.Duration, errs int) {
		for _, r := range rs {
			rps += r.rps()
			p50 += r.p50
			p99 += r.p99
			errs += r.errors
		}
		k := len(rs)
		return rps / float64(k), p50 / time.Duration(k), p99 / time.Duration(k), errs
	}
	brps, bp50, bp99, berr := sum(base)
	rrps, rp50, rp99, rerr := sum(real)
	b2rps, b2p50, b2p99, _ := sum(base2)
	crps, cp50, cp99, cerr := sum(rec)
	for i := range rounds {
		b.Logf("round %d: bare %.0f req/s p50 %s p99 %s | service %.0f req/s p50 %s p99 %s", i+1,
			base[i].rps(), base[i].p50, base[i].p99, real[i].rps(), real[i].p50, real[i].p99)
	}
	for i := range rounds {
		b.Logf("round %d (NATS down): bare %.0f req/s | service recording only %.0f req/s p50 %s p99 %s", i+1,
			base2[i].rps(), rec[i].rps(), rec[i].p50, rec[i].p99)
	}
	b.Logf("bare:    %.0f req/s, p50 %s, p99 %s, %d errors", brps, bp50, bp99, berr)
	b.Logf("service: %.0f req/s, p50 %s, p99 %s, %d errors", rrps, rp50, rp99, rerr)
	b.Logf("ratio:   %.2f (whole pipeline on the same 2 cores)", rrps/brps)
	b.Logf("bare:    %.0f req/s, p50 %s, p99 %s (NATS down)", b2rps, b2p50, b2p99)
	b.Logf("service: %.0f req/s, p50 %s, p99 %s, %d errors (recording into the outbox only)", crps, cp50, cp99, cerr)
	b.Logf("ratio:   %.2f (request path: click in the outbox before the 302)", crps/b2rps)
	// Every click that got a 302 reaches CLICKS, including those the outbox
	// held while NATS was down (the run is a correctness check too).
	var served int
	for _, r := range slices.Concat(real, rec) {
		served += r.requests
	}
	testenv.WaitFor(b, 300*time.Second, "every click in CLICKS", func() bool { return streamCount(js, events.ClicksStream) >= served })
	b.Logf("CLICKS holds %d clicks; %d were served in the measured rounds (plus warm-up)", streamCount(js, events.ClicksStream), served)
	b.ReportMetric(crps/b2rps, "ratio_recording")
	b.ReportMetric(crps, "recording_req/s")
	b.ReportMetric(brps, "bare_req/s")
	b.ReportMetric(rrps, "service_req/s")
	b.ReportMetric(rrps/brps, "ratio")
	b.ReportMetric(float64(rp50.Microseconds()), "service_p50_µs")
	b.ReportMetric(float64(rp99.Microseconds()), "service_p99_µs")
	b.ReportMetric(float64(bp50.Microseconds()), "bare_p50_µs")
	b.ReportMetric(float64(bp99.Microseconds()), "bare_p99_µs")
}
