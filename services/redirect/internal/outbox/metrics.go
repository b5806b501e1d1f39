package outbox

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the outbox's and relay's Prometheus metrics. The alarms
// (docs/runbooks/redirect-outbox.md) are on Depth, OldestAge and Parked.
type Metrics struct {
	Depth          *prometheus.GaugeVec // shard, lane
	OldestAge      *prometheus.GaugeVec // shard, lane
	DepthSum       *prometheus.GaugeVec // lane
	OldestAgeMax   *prometheus.GaugeVec // lane
	DeadEntries    prometheus.Gauge
	Rejected       *prometheus.CounterVec // reason: full, unavailable
	BatchSize      prometheus.Histogram
	CommitDuration prometheus.Histogram
	Published      *prometheus.CounterVec // lane
	PublishErrors  *prometheus.CounterVec // lane, kind
	Parked         *prometheus.CounterVec // lane, reason
	Late           *prometheus.CounterVec // lane
	LeasesHeld     prometheus.Gauge
	LeasesLost     prometheus.Counter
	RelayInstances prometheus.Gauge
	// UntrimmedRecords counts the records of batches acknowledged but not
	// trimmed (Records), by lane and outcome: written, write_failed,
	// superseded (not written: another holder's record is there),
	// adopted (not written: the lane's record names a batch from the
	// same head reaching as far or further, which the relay trims),
	// applied (trimmed by the relay that read it), stale (it trimmed
	// nothing), read_failed, malformed.
	UntrimmedRecords *prometheus.CounterVec
	// ShardCapacity is the most entries one shard's lane holds: an alert
	// compares each shard's depth with it, since a hot link fills its own
	// shard long before the outbox as a whole is full.
	ShardCapacity prometheus.Gauge
}

// NewMetrics registers the metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	const ns, sub = "snip", "redirect"
	m := &Metrics{
		Depth: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "outbox_depth",
			Help: "Entries waiting in the outbox, per shard and lane (sampled)."}, []string{"shard", "lane"}),
		OldestAge: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "outbox_oldest_age_seconds",
			Help: "Age of the oldest outbox entry, per shard and lane; 0 when empty (sampled)."}, []string{"shard", "lane"}),
		DepthSum: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "outbox_depth_total_entries",
			Help: "Entries waiting in the outbox, all shards together, per lane (sampled)."}, []string{"lane"}),
		OldestAgeMax: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "outbox_oldest_age_max_seconds",
			Help: "Age of the oldest outbox entry over all shards, per lane (sampled)."}, []string{"lane"}),
		ShardCapacity: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "outbox_shard_capacity_entries",
			Help: "The most entries one shard's lane holds (SNIP_OUTBOX_MAX_ENTRIES / SNIP_OUTBOX_SHARDS); a write to a full one is refused."}),
		DeadEntries: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "outbox_dead_entries",
			Help: "Entries parked in Redis because JetStream and DEAD_LETTER both refused them (sampled)."}),
		Rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "outbox_rejected_total",
			Help: "Outbox writes not done, by reason (full, unavailable)."}, []string{"reason"}),
		BatchSize: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "commit_batch_size",
			Help:    "Clicks written per group commit (one Redis round trip).",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}}),
		CommitDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "commit_duration_seconds",
			Help:    "Duration of one group commit's Redis round trip.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16)}),
		Published: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "relay_published_total",
			Help: "Outbox entries published to JetStream and acknowledged, per lane."}, []string{"lane"}),
		PublishErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "relay_errors_total",
			Help: "Relay errors, per lane and kind (publish, permanent, redis, lease)."}, []string{"lane", "kind"}),
		Parked: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "relay_parked_total",
			Help: "Entries JetStream refused for good, parked on DEAD_LETTER (dead.outbox.<reason>) or in Redis."}, []string{"lane", "reason"}),
		Late: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "relay_late_dropped_total",
			Help: "Outbox entries deleted without publishing because Redis stored them after their validity: the redirect had stopped waiting for them (recorded straight in JetStream, or answered with an error)."}, []string{"lane"}),
		LeasesHeld: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "relay_leases_held",
			Help: "Outbox shards this instance relays now."}),
		LeasesLost: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "relay_leases_lost_total",
			Help: "Shard leases lost before being released (expired or taken over)."}),
		RelayInstances: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "relay_instances",
			Help: "Live relay instances seen in the last heartbeat."}),
		UntrimmedRecords: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "relay_untrimmed_records_total",
			Help: "Records in NATS of batches JetStream acknowledged and Redis did not trim, per lane and outcome: written, write_failed, superseded (another holder's record kept), adopted (the lane's record from the same head reaching as far or further trimmed in the batch's place), applied (trimmed by the relay that took the shard), stale (trimmed nothing), read_failed (the lane waits), malformed."}, []string{"lane", "outcome"}),
	}
	reg.MustRegister(m.Depth, m.OldestAge, m.DepthSum, m.OldestAgeMax, m.ShardCapacity, m.DeadEntries, m.Rejected, m.BatchSize,
		m.CommitDuration, m.Published, m.PublishErrors, m.Parked, m.Late, m.LeasesHeld, m.LeasesLost, m.RelayInstances, m.UntrimmedRecords)
	return m
}
