package redirect

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the hot path's metrics. The counters the hot path touches are
// resolved once here, so a redirect does no label lookup.
type Metrics struct {
	CacheHits          prometheus.Counter
	CacheMisses        prometheus.Counter
	CacheInvalidations prometheus.Counter
	// Lookups of a link whose cache entry had passed its TTL, answered from
	// the stale entry: its lookup in Redis failed, or an earlier one did
	// and none has been answered since.
	CacheStaleServed prometheus.Counter
	// Background lookups of a link served stale, while Redis was taken for
	// failing: answered (the link, or not found) or failed.
	CacheRevalidated        prometheus.Counter
	CacheRevalidationFailed prometheus.Counter
	Misses                  prometheus.Counter // unknown codes
	Clicks                  prometheus.Counter // recorded in the outbox
	RecordedDirect          prometheus.Counter // recorded straight in JetStream
	DirectDuration          prometheus.Histogram
	Unrecorded              *prometheus.CounterVec // reason
	// Clicks the outbox stored on a Redis master whose replicas did not
	// acknowledge them within the replica wait: published straight to
	// CLICKS as well, or (NATS failing too) left on the master alone.
	ReplicaShortPublished  prometheus.Counter
	ReplicaShortMasterOnly prometheus.Counter
	// Writes of the API (op: create_link, delete_link, create_owner,
	// store_key, revoke_key) whose replica wait fell short: stored on the
	// master alone.
	WritesReplicaShort *prometheus.CounterVec
	Heads              prometheus.Counter
	Latency            prometheus.Histogram
	Following          prometheus.Gauge
}

// NewMetrics registers the metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	const ns, sub = "snip", "redirect"
	lookups := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "cache_lookups_total",
		Help: "Link cache lookups, by result (hit, miss)."}, []string{"result"})
	recorded := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "clicks_recorded_total",
		Help: "Clicks recorded before their 302, by path: outbox (Redis) or jetstream (straight to CLICKS when the outbox did not answer in time)."}, []string{"path"})
	short := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "clicks_replica_wait_short_total",
		Help: "Clicks stored in the outbox whose Redis master's replicas did not acknowledge them within SNIP_OUTBOX_WAIT_REPLICAS_TIMEOUT, by outcome: published (also recorded straight in CLICKS) or master_only (that failed too; answered 302, lost if the master dies before its replica catches up)."},
		[]string{"outcome"})
	revalidations := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "cache_revalidations_total",
		Help: "Background lookups in Redis of a link answered from its stale entry while Redis was failing, one at a time, by result: answered (the link refreshed, or found deleted: Redis answers again) or failed."}, []string{"result"})
	m := &Metrics{
		CacheHits:   lookups.WithLabelValues("hit"),
		CacheMisses: lookups.WithLabelValues("miss"),
		CacheInvalidations: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "cache_invalidations_total",
			Help: "Link cache entries dropped because LINKS said the link changed."}),
		CacheStaleServed: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "cache_stale_served_total",
			Help: "Cache misses for a link whose entry had passed SNIP_CACHE_TTL, answered from that entry (stale-if-error, within SNIP_CACHE_STALE_IF_ERROR) because its lookup in Redis failed, or an earlier lookup failed and none has been answered since (then without a lookup of its own)."}),
		CacheRevalidated:        revalidations.WithLabelValues("answered"),
		CacheRevalidationFailed: revalidations.WithLabelValues("failed"),
		Misses: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "misses_total",
			Help: "Redirect requests for unknown or deleted codes (404); not clicks."}),
		Clicks:         recorded.WithLabelValues("outbox"),
		RecordedDirect: recorded.WithLabelValues("jetstream"),
		DirectDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "direct_publish_duration_seconds",
			Help:    "Time to record a click straight in JetStream (publish to PubAck), when the outbox did not answer in time.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16)}),
		Unrecorded: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "clicks_unrecorded_total",
			Help: "Clicks recorded on neither path (outbox, JetStream): refused with 503 (policy reject) or redirected without their click (policy redirect), by reason (full, unavailable)."},
			[]string{"reason"}),
		ReplicaShortPublished:  short.WithLabelValues("published"),
		ReplicaShortMasterOnly: short.WithLabelValues("master_only"),
		WritesReplicaShort: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "writes_replica_wait_short_total",
			Help: "Link and API-key writes (op: create_link, delete_link, store_key, revoke_key, create_owner) whose Redis master's replicas did not acknowledge them within SNIP_OUTBOX_WAIT_REPLICAS_TIMEOUT: answered as usual, on the master alone until its replica catches up."},
			[]string{"op"}),
		Heads: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "head_requests_total",
			Help: "HEAD requests answered with a 302 and not counted as clicks."}),
		Latency: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "redirect_duration_seconds",
			Help:    "Time from request to 302, click recording included.",
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 16)}),
		Following: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "links_following",
			Help: "1 while this instance follows LINKS to invalidate its link cache; 0 means the cache TTL alone bounds staleness."}),
	}
	reg.MustRegister(lookups, revalidations, recorded, short, m.WritesReplicaShort, m.DirectDuration, m.CacheInvalidations, m.CacheStaleServed, m.Misses, m.Unrecorded, m.Heads, m.Latency, m.Following)
	return m
}
