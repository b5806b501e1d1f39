package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/clickcounter/internal/benchmix"
	"github.com/snipdev/snip/services/clickcounter/internal/counter"
	"github.com/snipdev/snip/services/clickcounter/internal/jsfeed"
	"github.com/snipdev/snip/services/clickcounter/internal/redisstore"
)

// BenchmarkCatchUp measures replay speed: CLICKS holds a backlog of N
// clicks (CLICKCOUNTER_BENCH_EVENTS, default 200,000) of the benchmix mix
// (10,000 links, Zipf), and four readers drain it one after the other on the same
// server, each with batches of 2,000 (CLICKCOUNTER_BENCH_BATCH) over the 8 partitions in parallel:
//
//   - bare: one pull consumer per partition that fetches and acks (AckAll,
//     the last message of each batch), nothing else;
//   - bare pinned: the same with the groups' priority policy (pinned_client),
//     so what the server's fence costs per event is seen apart from the runtime;
//   - noop: the reader runtime with a handler that does nothing;
//   - counter: the reader runtime with the click counter writing to Redis.
//
// nats-server runs as a process of its own (testenv.NewNATSProcess), so the
// CPU time each phase costs is read per process from /proc/<pid>/stat
// (utime+stime, before and after): the benchmark process (the reader, and
// the counter's Go side), nats-server and redis-server, in microseconds per
// click.
//
// CLICKCOUNTER_BENCH_HOT=1 puts every click on one link (so one partition):
// the viral-link case, where a batch is one link's clicks; the bare reader
// then drains that one partition.
//
// CLICKCOUNTER_BENCH_PROFILE=<dir> writes a CPU profile of the benchmark
// process for each phase alone (<dir>/bare.cpu, bare-pinned.cpu, noop.cpu,
// counter.cpu), without the publishing before them; -cpuprofile, which
// covers the whole run, cannot be given with it.
//
// Each iteration drains the same backlog with consumers and groups of its
// own (named after the iteration) and a fresh Redis database, so -benchtime
// 2x or more measures the backlog again rather than waiting on consumers
// that have read it all.
//
// Run it once: go test -run '^$' -bench CatchUp -benchtime 1x ./services/clickcounter
func BenchmarkCatchUp(b *testing.B) {
	n := 200_000
	if v := os.Getenv("CLICKCOUNTER_BENCH_EVENTS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			b.Fatalf("CLICKCOUNTER_BENCH_EVENTS=%q: %v", v, err)
		}
	}
	batch := 2000 // the service default, CLICKCOUNTER_BATCH_SIZE
	if v := os.Getenv("CLICKCOUNTER_BENCH_BATCH"); v != "" {
		batch, _ = strconv.Atoi(v)
	}
	hot := os.Getenv("CLICKCOUNTER_BENCH_HOT") == "1"
	nc, err := testenv.NewNATSProcess(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	js := nc.JetStream(b)
	ctx := context.Background()
	o := topology.Defaults()
	if err := topology.Apply(ctx, js, o); err != nil {
		b.Fatal(err)
	}
	mix := benchmix.New()
	if hot {
		mix = benchmix.NewHot()
	}
	start := time.Now()
	publishBacklog(b, js, mix, n)
	b.Logf("published %d clicks in %s (hot=%v)", n, time.Since(start).Round(time.Millisecond), hot)
	procs := []benchProc{{"bench", os.Getpid()}, {"nats-server", nc.Nodes[0].PID()}, {"redis-server", servers.Redis.PID()}}

	prof := phaseProfiler(b, os.Getenv("CLICKCOUNTER_BENCH_PROFILE"))
	for i := 0; b.Loop(); i++ {
		// A consumer or group of an earlier iteration has read the whole
		// backlog: each iteration's are its own, and start at the oldest.
		name := func(base string) string {
			if i == 0 {
				return base
			}
			return base + "-" + strconv.Itoa(i)
		}
		cpu0 := cpuTimes(b, procs)
		stop := prof("bare")
		bare := drainBare(b, js, name("bench-bare"), o.Partitions, batch, n, false)
		stop()
		cpuP0 := cpuTimes(b, procs)
		stop = prof("bare-pinned")
		pinned := drainBare(b, js, name("bench-pinned"), o.Partitions, batch, n, true)
		stop()
		cpu1 := cpuTimes(b, procs)
		stop = prof("noop")
		noop := drainGroup(b, js, name("bench-noop"), batch, n, func(_ context.Context, _ int, evs []reader.Event) error { return nil }, nil)
		stop()
		cpu2 := cpuTimes(b, procs)
		rdb, _ := servers.Redis.NewDB(b)
		c, err := counter.New(counter.Options{Store: redisstore.New(rdb), Clicks: jsfeed.Clicks{JS: js}, Partitions: o.Partitions,
			DedupWindow: 10 * time.Minute, ClicksMaxAge: o.ClicksMaxAge, Metrics: prometheus.NewRegistry()})
		if err != nil {
			b.Fatal(err)
		}
		_ = rdb.ConfigResetStat(ctx).Err()
		cpu3 := cpuTimes(b, procs)
		stop = prof("counter")
		cnt := drainGroup(b, js, name(topology.GroupClickCounter), batch, n, c.HandleBatch, c)
		stop()
		cpu4 := cpuTimes(b, procs)
		if info, err := rdb.Info(ctx, "commandstats").Result(); err == nil {
			for _, line := range strings.Split(info, "\n") {
				if strings.HasPrefix(line, "cmdstat_evalsha") || strings.HasPrefix(line, "cmdstat_eval:") {
					b.Logf("redis %s", strings.TrimSpace(line))
				}
			}
		}
		var counted int64
		for p := range o.Partitions {
			v, _ := rdb.HGet(ctx, fmt.Sprintf("cc:{p%d}:g1:pos", p), "events").Int64()
			counted += v
		}
		if counted != int64(n) {
			b.Fatalf("counter counted %d events, want %d", counted, n)
		}
		rate := func(d time.Duration) float64 { return float64(n) / d.Seconds() }
		b.ReportMetric(rate(bare), "bare_events/s")
		b.ReportMetric(rate(pinned), "bare_pinned_events/s")
		b.ReportMetric(rate(noop), "runtime_noop_events/s")
		b.ReportMetric(rate(cnt), "counter_events/s")
		b.ReportMetric(bare.Seconds()/cnt.Seconds(), "counter/bare")
		b.Logf("%d events: bare %s (%.0f/s), bare pinned %s (%.0f/s), runtime no-op %s (%.0f/s), counter %s (%.0f/s); counter/bare = %.2f",
			n, bare.Round(time.Millisecond), rate(bare), pinned.Round(time.Millisecond), rate(pinned), noop.Round(time.Millisecond), rate(noop),
			cnt.Round(time.Millisecond), rate(cnt), bare.Seconds()/cnt.Seconds())
		for _, ph := range []struct {
			name       string
			before, at []time.Duration
		}{{"bare", cpu0, cpuP0}, {"bare pinned", cpuP0, cpu1}, {"runtime no-op", cpu1, cpu2}, {"counter", cpu3, cpu4}} {
			var parts []string
			total := 0.0
			for i, pr := range procs {
				us := float64((ph.at[i] - ph.before[i]).Microseconds()) / float64(n)
				total += us
				parts = append(parts, fmt.Sprintf("%s %.2f", pr.name, us))
				if ph.name == "counter" {
					b.ReportMetric(us, "counter_cpu_us/click_"+pr.name)
				}
			}
			b.Logf("CPU per click, %s: %s; total %.2f µs", ph.name, strings.Join(parts, ", "), total)
		}
	}
}

// phaseProfiler returns a function that starts a CPU profile of one phase
// into dir/<phase>.cpu and returns its stop; with dir empty it does nothing.
func phaseProfiler(b *testing.B, dir string) func(phase string) (stop func()) {
	b.Helper()
	if dir == "" {
		return func(string) func() { return func() {} }
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	return func(phase string) func() {
		f, err := os.Create(filepath.Join(dir, phase+".cpu"))
		if err != nil {
			b.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			b.Fatalf("profile %s (with -cpuprofile, leave CLICKCOUNTER_BENCH_PROFILE unset): %v", phase, err)
		}
		return func() {
			pprof.StopCPUProfile()
			if err := f.Close(); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// benchProc is a process whose CPU time the benchmark reads.
type benchProc struct {
	name string
	pid  int
}

// cpuTimes reads each process's user+system CPU time from /proc/<pid>/stat
// (fields 14 and 15, in clock ticks of 1/100 s, Linux's USER_HZ).
func cpuTimes(b *testing.B, procs []benchProc) []time.Duration {
	b.Helper()
	out := make([]time.Duration, len(procs))
	for i, pr := range procs {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pr.pid))
		if err != nil {
			b.Fatalf("CPU time of %s: %v", pr.name, err)
		}
		// The command name (field 2) is in parentheses and may hold spaces.
		rest := string(data[strings.LastIndexByte(string(data), ')')+2:])
		f := strings.Fields(rest) // f[0] is field 3
		utime, err1 := strconv.ParseInt(f[11], 10, 64)
		stime, err2 := strconv.ParseInt(f[12], 10, 64)
		if err1 != nil || err2 != nil {
			b.Fatalf("CPU time of %s: parse %q", pr.name, rest)
		}
		out[i] = time.Duration(utime+stime) * 10 * time.Millisecond
	}
	return out
}

// publishBacklog stores n clicks, async, with their IDs as Nats-Msg-Id.
func publishBacklog(b *testing.B, js jetstream.JetStream, mix *benchmix.Mix, n int) {
	b.Helper()
	now := time.Now().UTC()
	for range n {
		c := mix.Click("acme", now)
		data, _ := json.Marshal(c)
		if _, err := js.PublishAsync(events.ClickSubject(c.Owner, c.Code), data, jetstream.WithMsgID(c.ID), jetstream.WithStallWait(time.Minute)); err != nil {
			b.Fatalf("publish: %v", err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(5 * time.Minute):
		b.Fatal("publishes not acknowledged after 5 minutes")
	}
}

// drainBare reads CLICKS with one plain pull consumer per partition
// (AckAll, the group consumers' settings; durables prefix-p0, prefix-p1...)
// and acks each batch's last message; it returns the time from
// the first message to the last ack. pinned gives the consumers the groups'
// priority policy (pinned_client), for which the server adds the pin ID to
// every message it delivers. It fails the benchmark if the n events are not
// all read within 30 minutes.
func drainBare(b *testing.B, js jetstream.JetStream, prefix string, partitions, batch, n int, pinned bool) time.Duration {
	b.Helper()
	ctx := context.Background()
	var done atomic.Int64
	var first sync.Once
	var t0 time.Time
	var wg sync.WaitGroup
	deadline := time.Now().Add(30 * time.Minute)
	for p := range partitions {
		cfg := jetstream.ConsumerConfig{
			Durable: prefix + "-p" + strconv.Itoa(p), FilterSubject: events.PartitionFilter(p),
			AckPolicy: jetstream.AckAllPolicy, AckWait: time.Minute, MaxAckPending: 2 * batch, MaxDeliver: -1,
		}
		var opts []jetstream.FetchOpt
		if pinned {
			cfg.PriorityGroups, cfg.PriorityPolicy = []string{topology.PriorityGroup}, jetstream.PriorityPolicyPinned
			opts = append(opts, jetstream.FetchPriorityGroup(topology.PriorityGroup))
		}
		cons, err := js.CreateOrUpdateConsumer(ctx, events.ClicksStream, cfg)
		if err != nil {
			b.Fatalf("consumer %s: %v", cfg.Durable, err)
		}
		wg.Go(func() {
			for done.Load() < int64(n) {
				if time.Now().After(deadline) {
					b.Errorf("bare consumers %s read %d of %d events in 30 minutes", prefix, done.Load(), n)
					return
				}
				mb, err := cons.Fetch(batch, append(opts, jetstream.FetchMaxWait(100*time.Millisecond))...)
				if err != nil {
					continue
				}
				var last jetstream.Msg
				k := 0
				for m := range mb.Messages() {
					first.Do(func() { t0 = time.Now() })
					last = m
					k++
				}
				if last != nil {
					if err := last.DoubleAck(ctx); err != nil {
						b.Errorf("ack: %v", err)
						return
					}
					done.Add(int64(k))
				}
			}
		})
	}
	wg.Wait()
	if got := done.Load(); got < int64(n) {
		b.Fatalf("bare consumers %s read %d of %d events", prefix, got, n)
	}
	return time.Since(t0)
}

// drainGroup runs the reader runtime with h until it has handled n events,
// and returns the time from the first batch to the last.
func drainGroup(b *testing.B, js jetstream.JetStream, group string, batch, n int, h reader.Handler, c *counter.Counter) time.Duration {
	b.Helper()
	var handled atomic.Int64
	var first sync.Once
	var t0 time.Time
	var t1 atomic.Int64
	finished := make(chan struct{})
	var fin sync.Once
	wrapped := func(ctx context.Context, p int, evs []reader.Event) error {
		first.Do(func() { t0 = time.Now() })
		if err := h(ctx, p, evs); err != nil {
			return err
		}
		if handled.Add(int64(len(evs))) >= int64(n) {
			t1.Store(time.Now().UnixNano())
			fin.Do(func() { close(finished) })
		}
		return nil
	}
	cfg := reader.Config{Group: group, BatchSize: batch, Start: reader.StartAtOldest()}
	if c != nil {
		cfg.OnAssign, cfg.OnRevoke, cfg.OnRewind = c.OnAssign, c.OnRevoke, c.OnRewind
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- reader.Run(ctx, js, cfg, wrapped) }()
	select {
	case <-finished:
	case err := <-errc:
		cancel()
		b.Fatalf("reader %s stopped: %v", group, err)
	case <-time.After(30 * time.Minute):
		cancel()
		b.Fatalf("reader %s handled %d of %d events in 30 minutes", group, handled.Load(), n)
	}
	cancel()
	if err := <-errc; err != nil {
		b.Fatalf("reader %s: %v", group, err)
	}
	return time.Unix(0, t1.Load()).Sub(t0)
}
