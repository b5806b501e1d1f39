package ownerstream

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	open    prometheus.Gauge
	clicks  prometheus.Counter
	skipped *prometheus.CounterVec
	refused *prometheus.CounterVec
	ended   *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) metrics {
	const ns, sub = "snip", "console"
	m := metrics{
		open: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "owner_streams",
			Help: "Owners' click streams open now."}),
		clicks: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "owner_stream_clicks_total",
			Help: "Clicks sent to owners' streams, counted once flushed to the connection (not when queued for it)."}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "owner_stream_skipped_total",
			Help: "Messages an owner's stream did not send, by the readers' dead-letter reason (malformed, subject_mismatch, implausible_time, ...)."}, []string{"reason"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "owner_streams_refused_total",
			Help: "Streams refused: owner_limit, instance_limit, open_rate (the owner opens streams too often)."}, []string{"reason"}),
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "owner_streams_ended_total",
			Help: "Streams ended: client (left), revoked (its API key revoked or rotated), write_error (not reading), shutdown, consumer (failed)."}, []string{"reason"}),
	}
	if reg != nil {
		reg.MustRegister(m.open, m.clicks, m.skipped, m.refused, m.ended)
	}
	return m
}
