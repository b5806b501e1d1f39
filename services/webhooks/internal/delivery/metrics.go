package delivery

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the per-endpoint collectors. The endpoint label is the
// endpoint ID: one series per endpoint. The gauges go when its sender stops
// here; every series goes, on every instance, once the endpoint is deleted
// (an owner's create and delete would otherwise add series without bound).
type Metrics struct {
	queued    *prometheus.CounterVec
	dropped   *prometheus.CounterVec
	delivered *prometheus.CounterVec
	failed    *prometheus.CounterVec
	backlog   *prometheus.GaugeVec
	oldest    *prometheus.GaugeVec
	disabled  *prometheus.GaugeVec
	latency   *prometheus.HistogramVec

	mu sync.Mutex
	// ids are the endpoints this instance may hold series of: each is
	// noted before its first series is made, and dropped by forgetAll.
	ids map[string]struct{}
}

// NewMetrics registers the collectors on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	l := []string{"endpoint"}
	m := &Metrics{
		ids: map[string]struct{}{},
		queued: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "snip", Subsystem: "webhooks", Name: "queued_events_total",
			Help: "Events queued for an endpoint."}, l),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "snip", Subsystem: "webhooks", Name: "dropped_events_total",
			Help: "Oldest events dropped because an endpoint's backlog was full (replayable from the streams)."}, l),
		delivered: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "snip", Subsystem: "webhooks", Name: "delivered_events_total",
			Help: "Events delivered (2xx) to an endpoint, counted as they leave its queue: one the backlog bound dropped while its batch was in flight is counted as dropped only."}, l),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "snip", Subsystem: "webhooks", Name: "failed_attempts_total",
			Help: "Delivery attempts that failed (non-2xx, timeout, refused address, transport)."}, l),
		backlog: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "snip", Subsystem: "webhooks", Name: "backlog_events",
			Help: "Events waiting for an endpoint."}, l),
		oldest: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "snip", Subsystem: "webhooks", Name: "oldest_undelivered_age_seconds",
			Help: "Age of the oldest event waiting for an endpoint (0 when none)."}, l),
		disabled: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "snip", Subsystem: "webhooks", Name: "endpoint_disabled",
			Help: "1 when an endpoint was disabled for failing too long."}, l),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "snip", Subsystem: "webhooks", Name: "delivery_seconds",
			Help: "Duration of delivery attempts.", Buckets: prometheus.ExponentialBuckets(0.005, 2, 14)}, l),
	}
	for _, c := range []prometheus.Collector{m.queued, m.dropped, m.delivered, m.failed, m.backlog, m.oldest, m.disabled, m.latency} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// forget removes the endpoint's gauges: its sender stopped here, and
// another instance may send for it now.
func (m *Metrics) forget(id string) {
	m.backlog.DeleteLabelValues(id)
	m.oldest.DeleteLabelValues(id)
	m.disabled.DeleteLabelValues(id)
}

// note records that series of endpoint id may be made from now on.
func (m *Metrics) note(id string) {
	m.mu.Lock()
	m.ids[id] = struct{}{}
	m.mu.Unlock()
}

// noted returns the endpoints noted and not forgotten since.
func (m *Metrics) noted() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.ids))
	for id := range m.ids {
		out = append(out, id)
	}
	return out
}

// forgetAll removes every series of a deleted endpoint.
func (m *Metrics) forgetAll(id string) {
	m.mu.Lock()
	delete(m.ids, id)
	m.mu.Unlock()
	m.forget(id)
	m.queued.DeleteLabelValues(id)
	m.dropped.DeleteLabelValues(id)
	m.delivered.DeleteLabelValues(id)
	m.failed.DeleteLabelValues(id)
	m.latency.DeleteLabelValues(id)
}
