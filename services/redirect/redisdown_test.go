package main

import (
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/testenv"
)

// openLoop sends rate clicks a second, spread over codes, each on its own
// goroutine (an open model: a slow answer does not delay the next request),
// until stop is closed. The returned wait waits for the answers.
func openLoop(l *ledger, base string, codes []string, rate int, stop <-chan struct{}) (wait func()) {
	var wg sync.WaitGroup
	done := make(chan struct{})
	go func() {
		defer close(done)
		start := time.Now()
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		sent := 0
		for {
			select {
			case <-stop:
				return
			case now := <-tick.C:
				// Catch up on ticks the runtime dropped: the schedule, not
				// the ticker, sets the rate.
				due := int(now.Sub(start).Seconds() * float64(rate))
				for ; sent < due; sent++ {
					code := codes[sent%len(codes)]
					wg.Go(func() { _, _ = l.click(base, code) })
				}
			}
		}
	}()
	return func() { <-done; wg.Wait() }
}

// TestGuarantee_RedisFrozenLosesNoClickAndRedirectsGoOn freezes the real
// redis-server (SIGSTOP: it keeps its sockets and answers nothing, like a
// hung server) under open-loop traffic on cached links. Every request still
// gets its 302 within a bound (the outbox wait plus JetStream's ack),
// because the clicks the outbox does not take in time are published
// straight to CLICKS; after the thaw the writes Redis stored late are
// dropped by the relay. Every click that got a 302 is in CLICKS exactly
// once, and nothing else is.
func TestGuarantee_RedisFrozenLosesNoClickAndRedirectsGoOn(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	n := testenv.StartNATS(t)
	cfg := testConfig(r.URL(0), n.URL)
	in := startInstance(t, cfg)
	l := newLedger()
	codes := warmLinks(t, l, in.URL, n.JetStream(t), "f", 8)
	stop := make(chan struct{})
	// A modest rate: the embedded NATS server runs race-instrumented in this
	// process, and an overloaded one acks late, which turns redirects into
	// 503s (a fault of both stores, not the one this test injects).
	wait := openLoop(l, in.URL, codes, 100, stop)
	testenv.WaitFor(t, 30*time.Second, "traffic before the freeze", func() bool { return l.total() >= 100 })
	r.Pause()
	frozenAt := l.total()
	lastLog := time.Now()
	testenv.WaitFor(t, 60*time.Second, "clicks recorded straight in JetStream while redis is frozen", func() bool {
		direct := metric(t, in.URL, "snip_redirect_clicks_recorded_total", `path="jetstream"`)
		if time.Since(lastLog) > 10*time.Second { // say where it stands if this takes long
			lastLog = time.Now()
			l.mu.Lock()
			t.Logf("frozen: %d served since the freeze, %v direct, %d refused (%q)", l.totalLocked()-frozenAt, direct, l.refused, l.why)
			l.mu.Unlock()
		}
		return l.total() >= frozenAt+300 && direct >= 250
	})
	r.Resume()
	viaOutbox := metric(t, in.URL, "snip_redirect_clicks_recorded_total", `path="outbox"`)
	testenv.WaitFor(t, 60*time.Second, "clicks in the outbox again after the thaw", func() bool {
		return metric(t, in.URL, "snip_redirect_clicks_recorded_total", `path="outbox"`) >= viaOutbox+100
	})
	close(stop)
	wait()

	served, _ := l.expectInCLICKSAnyOrder(t, n.JetStream(t))
	p50, p99, top := l.latencies()
	direct := metric(t, in.URL, "snip_redirect_clicks_recorded_total", `path="jetstream"`)
	late := metric(t, in.URL, "snip_redirect_relay_late_dropped_total")
	t.Logf("%d clicks served (%d straight to JetStream), %d refused; 302 latency p50 %s p99 %s max %s; %v late outbox entries dropped",
		served, int(direct), l.refused, p50, p99, top, late)
	if l.refused != 0 {
		t.Fatalf("%d requests were not answered 302 while redis was frozen: %q", l.refused, l.why)
	}
	if bound := cfg.OutboxWait + cfg.DirectTimeout + time.Second; top > bound {
		t.Fatalf("slowest 302 took %s; want it bounded by the outbox wait plus the ack bound (%s)", top, bound)
	}
}

// TestGuarantee_RedisFrozenAndNATSDownRequestsAnsweredWithAnErrorAreNeverCounted:
// with both stores failing (NATS stopped, then Redis frozen) a redirect cannot
// record its click, so it answers 503, and the writes it queued to Redis
// land after the thaw. The relay must drop them: no request answered 503
// has its click in CLICKS, and every click that got a 302 (before and
// after) is there exactly once.
func TestGuarantee_RedisFrozenAndNATSDownRequestsAnsweredWithAnErrorAreNeverCounted(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	n := testenv.StartNATS(t)
	in := startInstance(t, testConfig(r.URL(0), n.URL))
	l := newLedger()
	codes := warmLinks(t, l, in.URL, n.JetStream(t), "b", 4)
	stop := make(chan struct{})
	wait := openLoop(l, in.URL, codes, 50, stop)
	testenv.WaitFor(t, 30*time.Second, "traffic before the faults", func() bool { return l.total() >= 50 })
	// The faults strike between requests: a request in flight at the very
	// instant of the fault is the residual decisions/0014 states (its XADD
	// executed just before the freeze and its reply lost, or its direct
	// publish stored with the ack lost), not what this test is about. So
	// the traffic stops, the stores fail, and new traffic starts.
	close(stop)
	wait()
	// NATS first, then Redis: the outbox wait runs out, the direct publish
	// fails at once (nothing is buffered while disconnected), and the
	// request gets 503 after waiting for its XADD past the entry's validity.
	n.Stop()
	r.Pause()
	stop = make(chan struct{})
	wait = openLoop(l, in.URL, codes, 50, stop)
	testenv.WaitFor(t, 60*time.Second, "503s while both stores are down", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.errored) >= 30
	})
	if got := metric(t, in.URL, "snip_redirect_clicks_unrecorded_total"); got < 30 {
		t.Fatalf("clicks_unrecorded_total = %v, want at least 30", got)
	}
	n.Start()
	r.Resume()
	resumedAt := l.total()
	testenv.WaitFor(t, 60*time.Second, "redirects after recovery", func() bool { return l.total() >= resumedAt+100 })
	close(stop)
	wait()

	testenv.WaitFor(t, 60*time.Second, "the relay to drop the writes redis stored after the thaw", func() bool {
		return metric(t, in.URL, "snip_redirect_relay_late_dropped_total") >= 1 &&
			metricIs(t, in.URL, "snip_redirect_outbox_depth_total_entries", 0, `lane="clicks"`)
	})
	served, errored := l.expectInCLICKSAnyOrder(t, n.JetStream(t))
	t.Logf("%d clicks served, %d requests answered with an error (none in CLICKS), %v late outbox entries dropped",
		served, errored, metric(t, in.URL, "snip_redirect_relay_late_dropped_total"))
}

// TestGuarantee_BothStoresFrozenAnswersUnconfirmed: Redis and the
// nats-server process both frozen (SIGSTOP: they keep their sockets and
// answer nothing). A redirect's XADD is not answered, and its direct
// publish is written to NATS's socket but never acknowledged, on any of its
// attempts. Whether that click is stored is not known when the request
// must be answered: it is stored if the server reads its socket after the
// thaw, and it does. So such a request is answered 503 click_unconfirmed
// with "Snip-Click: unconfirmed", never click_not_recorded (which promises
// the click is not counted). After the thaw: every 302 is in CLICKS once,
// no unconfirmed click more than once, and they are in fact there (the
// answer was right to say it did not know), while the late XADDs are
// dropped by the relay.
func TestGuarantee_BothStoresFrozenAnswersUnconfirmed(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	nc, err := testenv.NewNATSProcess(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	natsNode := nc.Nodes[0]
	cfg := testConfig(r.URL(0), nc.URL)
	cfg.DirectTimeout = 500 * time.Millisecond // production's: three attempts in 1.5 s
	in := startInstance(t, cfg)
	l := newLedger()
	codes := warmLinks(t, l, in.URL, nc.JetStream(t), "u", 4)
	// As in the test above, the faults strike between requests.
	natsNode.Pause()
	r.Pause()
	t.Cleanup(func() { natsNode.Resume(); r.Resume() })
	stop := make(chan struct{})
	wait := openLoop(l, in.URL, codes, 20, stop)
	testenv.WaitFor(t, 60*time.Second, "503 click_unconfirmed while both stores are frozen", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.unconfirmed) >= 10
	})
	close(stop)
	wait()
	natsNode.Resume()
	r.Resume()
	l.mu.Lock()
	unconfirmed, errored := len(l.unconfirmed), len(l.errored)
	why := slices.Clone(l.why)
	l.mu.Unlock()
	if errored > 0 {
		t.Fatalf("%d requests answered an error that says the click is not recorded, though it was sent to JetStream: %q", errored, why)
	}
	if got := metric(t, in.URL, "snip_redirect_clicks_unrecorded_total", `reason="unconfirmed"`); got != float64(unconfirmed) {
		t.Fatalf("clicks_unrecorded_total{reason=\"unconfirmed\"} = %v, want the %d answered so", got, unconfirmed)
	}

	// Traffic after the thaw is served and recorded again.
	stop = make(chan struct{})
	wait = openLoop(l, in.URL, codes, 50, stop)
	resumedAt := l.total()
	testenv.WaitFor(t, 60*time.Second, "redirects after the thaw", func() bool { return l.total() >= resumedAt+50 })
	close(stop)
	wait()
	// The relay drains the outbox: entries Redis stored after their
	// validity (XADDs it read from its socket on the thaw) are dropped as
	// late, the rest published under their event IDs, which JetStream
	// deduplicates against the direct publishes. Whether any XADD reached
	// Redis before its request gave up depends on the scheduling (a commit
	// whose connection timed out is closed, and a commit not yet sent is
	// never sent), so the count of late entries is reported, not required.
	testenv.WaitFor(t, 60*time.Second, "the relay to drain the outbox after the thaw", func() bool {
		return metricIs(t, in.URL, "snip_redirect_outbox_depth_total_entries", 0, `lane="clicks"`)
	})
	late := metric(t, in.URL, "snip_redirect_relay_late_dropped_total")
	js := nc.JetStream(t)
	// Every 302 once, nothing twice, nothing unrequested, no click of a
	// request answered click_not_recorded.
	l.expectInCLICKSAnyOrder(t, js)
	// An unconfirmed click is in CLICKS if its bytes reached the server's
	// socket before the client gave up on the connection (after two
	// unanswered pings, which a slow machine can reach while frozen): the
	// server reads them as soon as it is thawed, long before the post-thaw
	// traffic is all in CLICKS.
	found := 0
	for _, c := range readClicks(t, js) {
		if l.unconfirmed[c.Click.RequestID] {
			found++
		}
	}
	t.Logf("%d requests answered click_unconfirmed while both stores were frozen; %d of their clicks are in CLICKS, once each; %v late outbox entries dropped", unconfirmed, found, late)
	// The frozen server has them in its socket and stores them on thaw
	// (all of them, unless a client gave up on its connection first): the
	// answer that says "not recorded" would have been wrong.
	if found == 0 {
		t.Fatalf("none of the %d unconfirmed clicks is in CLICKS: the test froze nothing in flight", unconfirmed)
	}
}

// BenchmarkRedisFreeze measures what docs/benchmarks.md reports: open-loop
// redirects at SNIP_BENCH_RATE (default 1,000/s) on cached links, Redis
// frozen (SIGSTOP) for SNIP_BENCH_FREEZE (default 20 s) after 5 s, then 5 s
// after the thaw; the 302 latency before, during and after, and the clicks
// lost and doubled (CLICKS against the ledger). Run it once:
//
//	go test -run '^$' -bench RedisFreeze -benchtime 1x .
func BenchmarkRedisFreeze(b *testing.B) {
	rate := envInt("SNIP_BENCH_RATE", 1000)
	freeze := time.Duration(envInt("SNIP_BENCH_FREEZE", 20)) * time.Second
	r := testenv.StartRedis(b)
	n := testenv.StartNATS(b)
	in := startInstance(b, testConfig(r.URL(0), n.URL))
	l := newLedger()
	codes := warmLinks(b, l, in.URL, n.JetStream(b), "z", 50)
	b.ResetTimer()
	for range b.N {
		stop := make(chan struct{})
		wait := openLoop(l, in.URL, codes, rate, stop)
		phase := func(name string, d time.Duration) {
			l.takeLatencies()
			time.Sleep(d) // a measured phase of fixed length, not a wait for a condition
			lat := l.takeLatencies()
			p50, p99, top := percentiles(lat)
			b.Logf("%-14s %6d 302s  p50 %8s  p99 %8s  max %8s", name, len(lat), p50.Round(time.Microsecond), p99.Round(time.Microsecond), top.Round(time.Microsecond))
		}
		phase("before", 5*time.Second)
		r.Pause()
		phase("redis frozen", freeze)
		r.Resume()
		phase("after thaw", 5*time.Second)
		close(stop)
		wait()
	}
	b.StopTimer()
	served, errored := l.expectInCLICKSAnyOrder(b, n.JetStream(b))
	b.Logf("%d clicks served, %d refused (%d with an error status), %v straight to JetStream, %v late outbox entries dropped; lost 0, doubled 0 (checked)",
		served, l.refused, errored, metric(b, in.URL, "snip_redirect_clicks_recorded_total", `path="jetstream"`),
		metric(b, in.URL, "snip_redirect_relay_late_dropped_total"))
}

func envInt(name string, def int) int {
	var v int
	if _, err := fmt.Sscan(os.Getenv(name), &v); err != nil || v <= 0 {
		return def
	}
	return v
}

// takeLatencies returns the latencies recorded since the last call.
func (l *ledger) takeLatencies() []time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.lat
	l.lat = nil
	return out
}

func percentiles(lat []time.Duration) (p50, p99, top time.Duration) {
	if len(lat) == 0 {
		return 0, 0, 0
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	return s[len(s)/2], s[len(s)*99/100], s[len(s)-1]
}
