package fraud

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the detector's Prometheus collectors.
type Metrics struct {
	judged        prometheus.Counter
	copies        prometheus.Counter
	behind        prometheus.Counter
	alerts        *prometheus.CounterVec
	verdicts      *prometheus.CounterVec
	duplicates    prometheus.Counter
	lookups       prometheus.Counter
	notInLog      prometheus.Counter
	storeReplays  prometheus.Counter
	wiped         prometheus.Counter
	foreign       prometheus.Counter
	unrecoverable prometheus.Counter
	rebuilds      prometheus.Histogram
	rebuildRead   prometheus.Histogram
	identities    *prometheus.GaugeVec
	links         *prometheus.GaugeVec
	labelled      *prometheus.GaugeVec
	evicted       *prometheus.GaugeVec
}

// NewMetrics registers the collectors on reg (nil: not registered, for tests).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		judged: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "snip_fraud_events_judged_total", Help: "Click events judged (not counting rebuilds).",
		}),
		copies: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "snip_fraud_copies_skipped_total", Help: "Events skipped as copies of an event judged within the state's memory (ten minutes of event time by default): the same event ID stored in CLICKS again under another sequence (a relay retry after the duplicate window, a redrive). Not judged, not counted in the statistics.",
		}),
		behind: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "snip_fraud_events_behind_total", Help: "First deliveries of events at or before the partition's last judged sequence, which are never judged (should stay 0); a retry of a batch this member judged and has not finished is not counted, nor what a partition's consumer deleted and created again hands again.",
		}),
		alerts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "snip_fraud_alerts_total", Help: "Alerts raised and published, by rule (a re-raised alert the FRAUD stream dropped as a duplicate counts too).",
		}, []string{"rule"}),
		verdicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "snip_fraud_verdicts_total", Help: "Per-click verdicts published, by rule.",
		}, []string{"rule"}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "snip_fraud_publish_duplicates_total", Help: "Alerts and verdicts the FRAUD stream acknowledged as duplicates of ones it had (replay, redelivery, takeover).",
		}),
		lookups: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "snip_fraud_click_lookups_total", Help: "Earlier clicks read back from CLICKS to label them.",
		}),
		notInLog: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "snip_fraud_labels_not_in_log_total", Help: "Labels of earlier clicks no longer in CLICKS (retention) when their batch's verdicts were built: no verdict is published for them.",
		}),
		storeReplays: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "snip_fraud_store_replays_total", Help: "Times a partition's statistics in Redis were found behind what had been applied (Redis lost acknowledged writes: a failover to a replica without them, a crash that lost its last second) and the runtime was asked to hand the partition's events again from the first missing one (should stay 0).",
		}),
		foreign: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "snip_fraud_store_foreign_mark_total", Help: "Times a partition was taken over with a high-water mark in Redis ahead of where it resumes that is not an event of the partition in CLICKS: a Redis kept from another CLICKS stream (the stream deleted and created again, its sequences started over). Until the partition's sequences pass that mark, Redis answers each batch as applied before and none of the partition's statistics or alerts is stored; delete the partition's keys (fraud:{p<N>}:*) and restart the member (should stay 0).",
		}),
		wiped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "snip_fraud_store_wiped_total", Help: "Times a partition's statistics were found gone from Redis altogether: no high-water mark, though the partition's statistics began at an earlier sequence, recorded in NATS (a failover to an empty replica, a FLUSHALL, a restore from an empty or old snapshot). The partition's events are handed again from there, as far as CLICKS holds them (should stay 0).",
		}),
		unrecoverable: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "snip_fraud_store_unrecoverable_total", Help: "Times statistics Redis lost altogether included events CLICKS no longer holds (retention): their counts, their alerts in the alert list and their label counters are lost for good (should stay 0).",
		}),
		rebuilds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "snip_fraud_rebuild_duration_seconds", Help: "Time to rebuild a partition's windows from the log on takeover or rewind.",
			Buckets: prometheus.ExponentialBuckets(0.01, 3, 10),
		}),
		rebuildRead: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "snip_fraud_rebuild_events", Help: "Events read from the log per rebuild.",
			Buckets: prometheus.ExponentialBuckets(10, 4, 10),
		}),
		identities: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "snip_fraud_tracked_identities", Help: "(link, visitor) identities tracked, by partition.",
		}, []string{"partition"}),
		links: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "snip_fraud_tracked_links", Help: "Links tracked, by partition.",
		}, []string{"partition"}),
		labelled: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "snip_fraud_remembered_labels", Help: "Labelled clicks remembered so that no click is labelled twice (those of the last twice the longest window of event time, at most 64 bytes each), by partition.",
		}, []string{"partition"}),
		evicted: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "snip_fraud_state_evicted", Help: "States evicted by a cap since the partition was assigned, by partition; growth means a cap is too low for the traffic.",
		}, []string{"partition"}),
	}
	if reg != nil {
		reg.MustRegister(m.judged, m.copies, m.behind, m.alerts, m.verdicts, m.duplicates, m.lookups, m.notInLog, m.storeReplays, m.wiped, m.foreign, m.unrecoverable, m.rebuilds, m.rebuildRead, m.identities, m.links, m.labelled, m.evicted)
	}
	return m
}

func (m *Metrics) observe(partition int, s Stats) {
	p := strconv.Itoa(partition)
	m.identities.WithLabelValues(p).Set(float64(s.Identities))
	m.links.WithLabelValues(p).Set(float64(s.Links))
	m.labelled.WithLabelValues(p).Set(float64(s.Labelled))
	m.evicted.WithLabelValues(p).Set(float64(s.Evicted))
}

func (m *Metrics) forget(partition int) {
	p := strconv.Itoa(partition)
	m.identities.DeleteLabelValues(p)
	m.links.DeleteLabelValues(p)
	m.labelled.DeleteLabelValues(p)
	m.evicted.DeleteLabelValues(p)
}
