package livefeed

import (
	"math"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	browsers  prometheus.Gauge
	received  prometheus.Counter
	skipped   prometheus.Counter
	dropped   prometheus.Counter
	malformed prometheus.Counter
	refused   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) metrics {
	m := metrics{
		browsers: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "snip", Subsystem: "console", Name: "live_browsers",
			Help: "Browsers watching the live clicks."}),
		received: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "snip", Subsystem: "console", Name: "live_clicks_received_total",
			Help: "Clicks the live feed's consumer read from CLICKS."}),
		skipped: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "snip", Subsystem: "console", Name: "live_clicks_skipped_total",
			Help: "Clicks not forwarded to browsers because of the rate limit."}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "snip", Subsystem: "console", Name: "live_clicks_dropped_total",
			Help: "Clicks a browser lost because its queue was full (summed over browsers)."}),
		malformed: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "snip", Subsystem: "console", Name: "live_clicks_malformed_total",
			Help: "Messages on CLICKS that are not valid clicks (not shown)."}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "snip", Subsystem: "console", Name: "live_browsers_refused_total",
			Help: "Browsers refused because the most allowed already watch."}),
	}
	if reg != nil {
		reg.MustRegister(m.browsers, m.received, m.skipped, m.dropped, m.malformed, m.refused)
	}
	return m
}

func float64bits(f float64) uint64     { return math.Float64bits(f) }
func float64frombits(b uint64) float64 { return math.Float64frombits(b) }
