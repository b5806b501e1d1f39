// Package series measures a run second by second: clicks offered and sent,
// answers received, errors, latency percentiles of the second, and every
// reader's backlog. The seconds feed the live progress line and the
// report's plots; whole-run latency percentiles come from an HDR histogram
// (3 significant digits, 1 µs to 5 min), so p99.9 over millions of requests
// costs a few tens of kilobytes.
//
// Click-to-counted latency is measured with probes: every probe click's
// send time (its 302, or its publish ack) is noted, and pollers note when a
// reader first shows n probe clicks; the n-th earliest probe is taken to be
// visible then. Clicks of one link are ordered in the log, so this is exact
// for an ordered path and an estimate only where the outbox relay reorders.
package series

import (
	"maps"
	"math"
	"slices"
	"sort"
	"sync"
	"time"

	hdr "github.com/HdrHistogram/hdrhistogram-go"
)

// Phases of a run.
const (
	PhaseLoad  = "load"  // the driver is sending
	PhaseDrain = "drain" // sending ended; readers catch up
)

// Second is one second of a run.
type Second struct {
	// At is the end of the second, in seconds since the run started.
	At    float64 `json:"at"`
	Phase string  `json:"phase"`
	// Span is how long the second really was, in seconds: since the
	// previous one's end. About 1; more where the machine was too busy to
	// tick on time (a ticker drops the ticks it could not deliver), and
	// then the counts below cover the whole span: Rate turns them into
	// rates.
	Span float64 `json:"span_s"`
	// Offered is what the schedule asked for in the second; Sent what the
	// driver started; OK the successful answers received; Errors the rest.
	Offered uint64 `json:"offered"`
	Sent    uint64 `json:"sent"`
	OK      uint64 `json:"ok"`
	Errors  uint64 `json:"errors"`
	// Latency percentiles of the answers received in the second, in ms.
	P50  float64 `json:"p50_ms"`
	P99  float64 `json:"p99_ms"`
	P999 float64 `json:"p999_ms"`
	Max  float64 `json:"max_ms"`
	// Lag is each reader's backlog at the end of the second: the last
	// backlog read that had finished by then.
	Lag map[string]uint64 `json:"lag,omitempty"`
	// LagRead: a backlog read finished within the second, so Lag is the
	// second's own. Without one (reads failing, or one outlasting the
	// second) Lag is an earlier second's, repeated: it says nothing about
	// this one.
	LagRead bool `json:"lag_read,omitempty"`
}

// Meter collects a run's measurements. It is safe for concurrent use.
type Meter struct {
	mu    sync.Mutex
	start time.Time
	rate  float64
	last  time.Time

	sent, ok, errs uint64
	sec            *hdr.Histogram
	all            *hdr.Histogram
	totalSent      uint64
	totalOK        uint64
	totalErrs      uint64
	seconds        []Second
	lag            map[string]uint64
	lagRead        bool // SetLag was called since the last Tick
	peakLag        map[string]uint64

	// offered is the load the schedule offered so far, unrounded, and
	// offeredTicked the sum of the seconds' Offered: each second gets
	// what brings the sum to offered rounded, so the seconds add up to
	// the run's offered load however their lengths round.
	offered       float64
	offeredTicked uint64
	// offerFrom and offerTo bound the driver's schedule (Offer): only the
	// load phase's time within them offers load. Zero: from start on.
	offerFrom, offerTo time.Time

	probeSent []time.Time
	visible   map[string][]time.Time
}

func newHist() *hdr.Histogram { return hdr.New(1, int64(5*time.Minute/time.Microsecond), 3) }

// NewMeter starts measuring a run offered at rate per second from start.
func NewMeter(start time.Time, rate float64) *Meter {
	return &Meter{
		start: start, rate: rate, last: start,
		sec: newHist(), all: newHist(),
		peakLag: map[string]uint64{}, visible: map[string][]time.Time{},
	}
}

// Start is when the run started.
func (m *Meter) Start() time.Time { return m.start }

// Offer sets the driver's schedule: it offers load from begin to end. The
// load phase's time outside it offers none: a driver still waiting for
// the answers to its last requests offers nothing new.
func (m *Meter) Offer(begin, end time.Time) {
	m.mu.Lock()
	m.offerFrom, m.offerTo = begin, end
	m.mu.Unlock()
}

// Sent notes one click handed to the network.
func (m *Meter) Sent() {
	m.mu.Lock()
	m.sent++
	m.totalSent++
	m.mu.Unlock()
}

// Done notes one answer: its latency, and whether it was a success.
// Latencies of failures are not in the percentiles: a refused request is
// fast, a timed-out one is the timeout.
func (m *Meter) Done(latency time.Duration, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !ok {
		m.errs++
		m.totalErrs++
		return
	}
	m.ok++
	m.totalOK++
	us := max(1, latency.Microseconds())
	_ = m.sec.RecordValue(us)
	_ = m.all.RecordValue(us)
}

// SetLag notes every reader's backlog now.
func (m *Meter) SetLag(lag map[string]uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lag = maps.Clone(lag)
	m.lagRead = true
	for k, v := range lag {
		m.peakLag[k] = max(m.peakLag[k], v)
	}
}

// Tick closes the second ending at now and returns it. phase is PhaseLoad
// while the driver runs (only then is Offered set: rate times the time
// since the last tick within the schedule (Offer), rounded so that the
// seconds' Offered sum to the rate times the schedule's time) and
// PhaseDrain after.
func (m *Meter) Tick(now time.Time, phase string) Second {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := Second{
		At:    now.Sub(m.start).Seconds(),
		Phase: phase,
		Span:  now.Sub(m.last).Seconds(),
		Sent:  m.sent, OK: m.ok, Errors: m.errs,
		P50:  ms(m.sec.ValueAtQuantile(50)),
		P99:  ms(m.sec.ValueAtQuantile(99)),
		P999: ms(m.sec.ValueAtQuantile(99.9)),
		Max:  ms(m.sec.Max()),
		Lag:  maps.Clone(m.lag), LagRead: m.lagRead,
	}
	if phase == PhaseLoad {
		from, to := m.last, now
		if !m.offerTo.IsZero() {
			if from.Before(m.offerFrom) {
				from = m.offerFrom
			}
			if to.After(m.offerTo) {
				to = m.offerTo
			}
		}
		m.offered += m.rate * max(0, to.Sub(from).Seconds())
		s.Offered = uint64(m.offered+0.5) - m.offeredTicked
		m.offeredTicked += s.Offered
	}
	m.last = now
	m.sent, m.ok, m.errs = 0, 0, 0
	m.lagRead = false
	m.sec.Reset()
	m.seconds = append(m.seconds, s)
	return s
}

func ms(us int64) float64 { return float64(us) / 1000 }

// Rate is n, one of the second's counts, per second of its span: the count
// itself for a second of 1 s, and for one without a span (a report written
// before seconds had one).
func (s Second) Rate(n uint64) float64 {
	if s.Span <= 0 {
		return float64(n)
	}
	return float64(n) / s.Span
}

// ProbeSent notes that a probe click was sent (answered 302, or acked) at.
func (m *Meter) ProbeSent(at time.Time) {
	m.mu.Lock()
	m.probeSent = append(m.probeSent, at)
	m.mu.Unlock()
}

// ProbeCount notes that reader sink showed count probe clicks at at.
func (m *Meter) ProbeCount(sink string, count int, at time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v := m.visible[sink]
	for len(v) < count {
		v = append(v, at)
	}
	m.visible[sink] = v
}

// ProbesSent returns how many probes were sent.
func (m *Meter) ProbesSent() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.probeSent)
}

// Summary is the whole run.
type Summary struct {
	Sent   uint64 `json:"sent"`
	OK     uint64 `json:"ok"`
	Errors uint64 `json:"errors"`
	// Throughput is successful answers per second over the load phase.
	Throughput float64 `json:"throughput"`
	P50        float64 `json:"p50_ms"`
	P99        float64 `json:"p99_ms"`
	P999       float64 `json:"p999_ms"`
	Max        float64 `json:"max_ms"`
	// PeakLag is each reader's largest backlog seen.
	PeakLag map[string]uint64 `json:"peak_lag"`
	// ClickToCounted is, per reader, the distribution of probe latencies
	// from send to visible, in ms.
	ClickToCounted map[string]Latency `json:"click_to_counted"`
	Seconds        []Second           `json:"seconds"`
}

// Latency summarises probe latencies.
type Latency struct {
	Probes int     `json:"probes"`
	Seen   int     `json:"seen"`
	P50    float64 `json:"p50_ms"`
	P99    float64 `json:"p99_ms"`
	Max    float64 `json:"max_ms"`
}

// Summarise returns the run so far; loadTime is how long the driver sent.
func (m *Meter) Summarise(loadTime time.Duration) Summary {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := Summary{
		Sent: m.totalSent, OK: m.totalOK, Errors: m.totalErrs,
		P50: ms(m.all.ValueAtQuantile(50)), P99: ms(m.all.ValueAtQuantile(99)),
		P999: ms(m.all.ValueAtQuantile(99.9)), Max: ms(m.all.Max()),
		PeakLag:        maps.Clone(m.peakLag),
		ClickToCounted: map[string]Latency{},
		Seconds:        slices.Clone(m.seconds),
	}
	if loadTime > 0 {
		s.Throughput = float64(m.totalOK) / loadTime.Seconds()
	}
	sent := slices.Clone(m.probeSent)
	slices.SortFunc(sent, func(a, b time.Time) int { return a.Compare(b) })
	for sink, vis := range m.visible {
		var lat []float64
		for i := 0; i < len(vis) && i < len(sent); i++ {
			lat = append(lat, float64(max(0, vis[i].Sub(sent[i])))/float64(time.Millisecond))
		}
		s.ClickToCounted[sink] = summarise(len(sent), lat)
	}
	return s
}

func summarise(probes int, lat []float64) Latency {
	l := Latency{Probes: probes, Seen: len(lat)}
	if len(lat) == 0 {
		return l
	}
	sort.Float64s(lat)
	// Nearest rank, as HDR's percentiles: p of n is the ceil(p*n)-th
	// smallest (the small margin keeps 0.99*100 from rounding up to 100).
	q := func(p float64) float64 {
		return lat[min(len(lat)-1, max(0, int(math.Ceil(p*float64(len(lat))-1e-9))-1))]
	}
	l.P50, l.P99, l.Max = q(0.5), q(0.99), lat[len(lat)-1]
	return l
}
