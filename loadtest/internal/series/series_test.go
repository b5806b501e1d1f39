package series_test

import (
	"math"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/snipdev/snip/loadtest/internal/series"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// at is t0 plus d seconds.
func at(d float64) time.Time { return t0.Add(time.Duration(d * float64(time.Second))) }

// counts is what a second (or the run) says about clicks.
type counts struct{ Offered, Sent, OK, Errors uint64 }

func TestSecondsAddUpToTheRun(t *testing.T) {
	t.Parallel()
	// Ticks 1.5 s apart at 3 clicks/s: 4.5 clicks offered in each, so a
	// second rounded on its own would offer 5, 15 over the load's 4.5 s
	// instead of 13.5. The seconds' rounding must not drift from the
	// schedule: their sum is the run's offered load, rounded once.
	m := series.NewMeter(t0, 3)
	type step struct {
		sent, ok, failed int
		at               float64
		phase            string
	}
	steps := []step{
		{sent: 5, ok: 3, failed: 1, at: 1.5, phase: series.PhaseLoad},
		{sent: 4, ok: 5, failed: 0, at: 3, phase: series.PhaseLoad},
		{sent: 4, ok: 2, failed: 2, at: 4.5, phase: series.PhaseLoad},
		{sent: 0, ok: 0, failed: 0, at: 5.5, phase: series.PhaseDrain},
	}
	var got []counts
	var phases []string
	var sum counts
	for _, s := range steps {
		for range s.sent {
			m.Sent()
		}
		for range s.ok {
			m.Done(time.Millisecond, true)
		}
		for range s.failed {
			m.Done(time.Second, false)
		}
		sec := m.Tick(at(s.at), s.phase)
		c := counts{sec.Offered, sec.Sent, sec.OK, sec.Errors}
		got = append(got, c)
		phases = append(phases, sec.Phase)
		sum.Offered += c.Offered
		sum.Sent += c.Sent
		sum.OK += c.OK
		sum.Errors += c.Errors
		if sec.At != s.at {
			t.Errorf("second at %v, want %v", sec.At, s.at)
		}
	}
	want := []counts{{5, 5, 3, 1}, {4, 4, 5, 0}, {5, 4, 2, 2}, {0, 0, 0, 0}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("seconds (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{series.PhaseLoad, series.PhaseLoad, series.PhaseLoad, series.PhaseDrain}, phases); diff != "" {
		t.Errorf("phases (-want +got):\n%s", diff)
	}
	load := 4500 * time.Millisecond
	sm := m.Summarise(load)
	wantOffered := uint64(math.Round(3 * load.Seconds()))
	if diff := cmp.Diff(counts{wantOffered, sm.Sent, sm.OK, sm.Errors}, sum); diff != "" {
		t.Errorf("the seconds' sum against the run's totals, offered against rate x load time (-run +seconds):\n%s", diff)
	}
	if diff := cmp.Diff(counts{0, 13, 10, 3}, counts{0, sm.Sent, sm.OK, sm.Errors}); diff != "" {
		t.Errorf("run totals (-want +got):\n%s", diff)
	}
	if want := 10 / load.Seconds(); sm.Throughput != want {
		t.Errorf("throughput %v, want %v (successes per second of load)", sm.Throughput, want)
	}
	if len(sm.Seconds) != len(steps) {
		t.Errorf("summary holds %d seconds, want %d", len(sm.Seconds), len(steps))
	}
}

// near reports whether got is want within HDR's 3 significant digits.
func near(got, want float64) bool { return math.Abs(got-want) <= want/500 }

func TestPercentilesOfAKnownLatencySet(t *testing.T) {
	t.Parallel()
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	tests := []struct {
		name string
		// ok are the successes' latencies; failed the failures'.
		ok, failed           []time.Duration
		p50, p99, p999, maxx float64
	}{
		{
			name: "uniform_1_to_1000_ms",
			ok: func() (l []time.Duration) {
				for i := 1000; i >= 1; i-- {
					l = append(l, ms(i))
				}
				return l
			}(),
			p50: 500, p99: 990, p999: 999, maxx: 1000,
		},
		{
			name: "one_slow_answer_in_a_thousand_is_the_max_not_p999",
			ok: func() (l []time.Duration) {
				for range 999 {
					l = append(l, ms(1))
				}
				return append(l, 2*time.Second)
			}(),
			p50: 1, p99: 1, p999: 1, maxx: 2000,
		},
		{
			name:   "failures_are_left_out",
			ok:     []time.Duration{ms(5), ms(5), ms(5), ms(5)},
			failed: []time.Duration{30 * time.Second, 30 * time.Second},
			p50:    5, p99: 5, p999: 5, maxx: 5,
		},
		{
			name: "below_a_microsecond_counts_as_one",
			ok:   []time.Duration{0, 100 * time.Nanosecond},
			p50:  0.001, p99: 0.001, p999: 0.001, maxx: 0.001,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := series.NewMeter(t0, 1)
			for _, l := range tc.ok {
				m.Done(l, true)
			}
			for _, l := range tc.failed {
				m.Done(l, false)
			}
			sec := m.Tick(at(1), series.PhaseLoad)
			sm := m.Summarise(time.Second)
			want := [4]float64{tc.p50, tc.p99, tc.p999, tc.maxx}
			for _, got := range []struct {
				what string
				q    [4]float64
			}{
				{"second", [4]float64{sec.P50, sec.P99, sec.P999, sec.Max}},
				{"run", [4]float64{sm.P50, sm.P99, sm.P999, sm.Max}},
			} {
				for i, name := range []string{"p50", "p99", "p99.9", "max"} {
					if !near(got.q[i], want[i]) {
						t.Errorf("%s %s = %v ms, want %v ms", got.what, name, got.q[i], want[i])
					}
				}
			}
		})
	}
}

func TestEachSecondHasItsOwnPercentiles(t *testing.T) {
	t.Parallel()
	m := series.NewMeter(t0, 1)
	for range 100 {
		m.Done(800*time.Millisecond, true)
	}
	first := m.Tick(at(1), series.PhaseLoad)
	for range 100 {
		m.Done(2*time.Millisecond, true)
	}
	second := m.Tick(at(2), series.PhaseLoad)
	empty := m.Tick(at(3), series.PhaseDrain)
	sm := m.Summarise(2 * time.Second)
	got := map[string]float64{
		"first p50": first.P50, "first max": first.Max,
		"second p50": second.P50, "second max": second.Max,
		"empty p50": empty.P50, "empty max": empty.Max,
		"run max": sm.Max,
	}
	want := map[string]float64{
		"first p50": 800, "first max": 800,
		"second p50": 2, "second max": 2,
		"empty p50": 0, "empty max": 0,
		"run max": 800,
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(near)); diff != "" {
		t.Errorf("percentiles (-want +got):\n%s", diff)
	}
	// The run's median lies between the seconds' (HDR reports the
	// highest value equivalent to 2 ms, 800 ms).
	if sm.P50 < 2 || sm.P50 > 800.5 {
		t.Errorf("run p50 %v ms, want one of the recorded latencies", sm.P50)
	}
}

func TestClickToCountedTakesTheNthEarliestProbe(t *testing.T) {
	t.Parallel()
	type shown struct {
		sink  string
		count int
		at    float64
	}
	tests := []struct {
		name  string
		sent  []float64
		shown []shown
		want  map[string]series.Latency
	}{
		{
			// Sent at 3, 1, 2 s: the reader showing one probe at 1.5 s
			// saw the earliest (1 s); three at 5 s, the others.
			name:  "probes_sent_out_of_order",
			sent:  []float64{3, 1, 2},
			shown: []shown{{"counter", 1, 1.5}, {"counter", 3, 5}},
			want:  map[string]series.Latency{"counter": {Probes: 3, Seen: 3, P50: 2000, P99: 3000, Max: 3000}},
		},
		{
			name:  "a_count_shown_again_keeps_its_first_time",
			sent:  []float64{1},
			shown: []shown{{"counter", 1, 1.25}, {"counter", 1, 4}, {"counter", 0, 5}},
			want:  map[string]series.Latency{"counter": {Probes: 1, Seen: 1, P50: 250, P99: 250, Max: 250}},
		},
		{
			name:  "a_reader_short_of_the_probes_has_seen_fewer",
			sent:  []float64{1, 2, 3},
			shown: []shown{{"warehouse", 1, 1.1}},
			want:  map[string]series.Latency{"warehouse": {Probes: 3, Seen: 1, P50: 100, P99: 100, Max: 100}},
		},
		{
			name:  "more_shown_than_sent_counts_only_the_sent",
			sent:  []float64{1, 2},
			shown: []shown{{"counter", 5, 3}},
			want:  map[string]series.Latency{"counter": {Probes: 2, Seen: 2, P50: 1000, P99: 2000, Max: 2000}},
		},
		{
			name:  "shown_before_the_send_was_noted_is_zero",
			sent:  []float64{2},
			shown: []shown{{"counter", 1, 1.9}},
			want:  map[string]series.Latency{"counter": {Probes: 1, Seen: 1}},
		},
		{
			// Nearest rank, as the HDR percentiles: of 100 probes 1 to
			// 100 ms, p50 is the 50th and p99 the 99th, not the max.
			name: "a_hundred_probes_nearest_rank",
			sent: func() (s []float64) {
				for range 100 {
					s = append(s, 1)
				}
				return s
			}(),
			shown: func() (s []shown) {
				for i := 1; i <= 100; i++ {
					s = append(s, shown{"counter", i, 1 + float64(i)/1000})
				}
				return s
			}(),
			want: map[string]series.Latency{"counter": {Probes: 100, Seen: 100, P50: 50, P99: 99, Max: 100}},
		},
		{
			name:  "each_reader_on_its_own",
			sent:  []float64{1, 2},
			shown: []shown{{"counter", 2, 2.5}, {"warehouse", 1, 4}, {"warehouse", 2, 6}},
			want: map[string]series.Latency{
				"counter":   {Probes: 2, Seen: 2, P50: 500, P99: 1500, Max: 1500},
				"warehouse": {Probes: 2, Seen: 2, P50: 3000, P99: 4000, Max: 4000},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := series.NewMeter(t0, 1)
			for _, s := range tc.sent {
				m.ProbeSent(at(s))
			}
			for _, s := range tc.shown {
				m.ProbeCount(s.sink, s.count, at(s.at))
			}
			if m.ProbesSent() != len(tc.sent) {
				t.Errorf("probes sent %d, want %d", m.ProbesSent(), len(tc.sent))
			}
			got := m.Summarise(time.Second).ClickToCounted
			if diff := cmp.Diff(tc.want, got, cmp.Comparer(func(a, b float64) bool { return math.Abs(a-b) < 1e-6 })); diff != "" {
				t.Errorf("click to counted (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLagIsPerSecondAndItsPeakPerReader(t *testing.T) {
	t.Parallel()
	m := series.NewMeter(t0, 1)
	lag := map[string]uint64{"click-counter": 5, "warehouse-loader": 1}
	m.SetLag(lag)
	lag["click-counter"] = 99 // the caller's map is its own
	first := m.Tick(at(1), series.PhaseLoad)
	m.SetLag(map[string]uint64{"click-counter": 2, "warehouse-loader": 7})
	second := m.Tick(at(2), series.PhaseDrain)
	sm := m.Summarise(time.Second)
	if diff := cmp.Diff([]map[string]uint64{
		{"click-counter": 5, "warehouse-loader": 1},
		{"click-counter": 2, "warehouse-loader": 7},
	}, []map[string]uint64{first.Lag, second.Lag}); diff != "" {
		t.Errorf("lag of each second (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]uint64{"click-counter": 5, "warehouse-loader": 7}, sm.PeakLag); diff != "" {
		t.Errorf("peak lag (-want +got):\n%s", diff)
	}
}

// A second with no backlog read of its own repeats the last read's lag and
// says so: the keep-up rule must not take it for the second's.
func TestASecondWithoutABacklogReadSaysSo(t *testing.T) {
	t.Parallel()
	m := series.NewMeter(t0, 1)
	none := m.Tick(at(1), series.PhaseLoad)
	m.SetLag(map[string]uint64{"click-counter": 5})
	read := m.Tick(at(2), series.PhaseLoad)
	stale := m.Tick(at(3), series.PhaseLoad)
	m.SetLag(map[string]uint64{"click-counter": 1})
	again := m.Tick(at(4), series.PhaseLoad)
	type sec struct {
		Lag  map[string]uint64
		Read bool
	}
	want := []sec{{nil, false}, {map[string]uint64{"click-counter": 5}, true}, {map[string]uint64{"click-counter": 5}, false}, {map[string]uint64{"click-counter": 1}, true}}
	var got []sec
	for _, s := range []series.Second{none, read, stale, again} {
		got = append(got, sec{s.Lag, s.LagRead})
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("lag and whether it was read in the second (-want +got):\n%s", diff)
	}
}

func TestConcurrentUseKeepsEveryCount(t *testing.T) {
	t.Parallel()
	const workers, each = 8, 500
	m := series.NewMeter(time.Now(), 1000)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				m.Sent()
				m.Done(time.Duration(i+1)*time.Microsecond, i%5 != 0)
				m.SetLag(map[string]uint64{"click-counter": uint64(w*each + i)})
				if i%50 == 0 {
					m.ProbeSent(time.Now())
					m.ProbeCount("counter", i/50, time.Now())
				}
			}
		})
	}
	// Seconds close while the workers note clicks; the run is read too.
	stop := make(chan struct{})
	var ticker sync.WaitGroup
	var seconds []series.Second
	ticker.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			seconds = append(seconds, m.Tick(time.Now(), series.PhaseLoad))
			_ = m.Summarise(time.Second)
		}
	})
	wg.Wait()
	close(stop)
	ticker.Wait()
	seconds = append(seconds, m.Tick(time.Now(), series.PhaseDrain))
	var sum counts
	for _, s := range seconds {
		sum.Sent += s.Sent
		sum.OK += s.OK
		sum.Errors += s.Errors
	}
	sm := m.Summarise(time.Second)
	want := counts{Sent: workers * each, OK: workers * each * 4 / 5, Errors: workers * each / 5}
	if diff := cmp.Diff(want, counts{Sent: sm.Sent, OK: sm.OK, Errors: sm.Errors}); diff != "" {
		t.Errorf("run totals (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, sum); diff != "" {
		t.Errorf("the seconds' sum (-want +got):\n%s", diff)
	}
	if got := sm.PeakLag["click-counter"]; got != workers*each-1 {
		t.Errorf("peak lag %d, want %d", got, workers*each-1)
	}
	if got := m.ProbesSent(); got != workers*each/50 {
		t.Errorf("probes sent %d, want %d", got, workers*each/50)
	}
}
