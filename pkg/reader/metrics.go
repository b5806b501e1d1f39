package reader

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the runtime's Prometheus collectors, labelled by group (and
// partition where it matters). Lag and age are reported by the member that
// owns the partition; a partition nobody owns has no series here, which is
// why the console and `snipctl lag` read the same figures from the server
// (Lag) instead.
type metrics struct {
	events      *prometheus.CounterVec
	parked      *prometheus.CounterVec
	redelivered *prometheus.CounterVec
	errors      *prometheus.CounterVec
	replays     *prometheus.CounterVec
	batchSecs   *prometheus.HistogramVec
	batchSize   *prometheus.HistogramVec
	lag         *prometheus.GaugeVec
	ackPending  *prometheus.GaugeVec
	oldestAge   *prometheus.GaugeVec
	owned       *prometheus.GaugeVec
	acquiring   *prometheus.GaugeVec
	members     *prometheus.GaugeVec
	rebalances  *prometheus.CounterVec
	gaps        *prometheus.CounterVec
	resumeMoved *prometheus.CounterVec
	duplicates  *prometheus.CounterVec
	lapses      *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "snip", Subsystem: "reader", Name: "events_total",
			Help: "Events handled successfully, per group and partition.",
		}, []string{"group", "partition"}),
		parked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "snip", Subsystem: "reader", Name: "parked_total",
			Help: "Events parked on DEAD_LETTER, by reason; one parked again within DEAD_LETTER's duplicate window counts once.",
		}, []string{"group", "reason"}),
		redelivered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "snip", Subsystem: "reader", Name: "redeliveries_total",
			Help: "Events delivered more than once to the group (JetStream redeliveries).",
		}, []string{"group"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "snip", Subsystem: "reader", Name: "handler_errors_total",
			Help: "Handler and OnPassed failures: transient (batch or call retried), poison (one event parked), panic.",
		}, []string{"group", "kind"}),
		replays: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "snip", Subsystem: "reader", Name: "handler_replays_total",
			Help: "Times a handler asked for its partition's events again from an earlier sequence (reader.Replay) and the consumer was moved back.",
		}, []string{"group"}),
		batchSecs: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "snip", Subsystem: "reader", Name: "batch_seconds",
			Help:    "Time the handler took per batch, retries included.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"group"}),
		batchSize: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "snip", Subsystem: "reader", Name: "batch_events",
			Help:    "Events per batch handed to the handler.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 15),
		}, []string{"group"}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "snip", Subsystem: "reader", Name: "lag_events",
			Help: "Events of the partition not yet delivered to the group.",
		}, []string{"group", "partition"}),
		ackPending: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "snip", Subsystem: "reader", Name: "ack_pending_events",
			Help: "Events delivered to the partition's owner and not yet acked.",
		}, []string{"group", "partition"}),
		oldestAge: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "snip", Subsystem: "reader", Name: "oldest_unprocessed_age_seconds",
			Help: "Age of the oldest event of the partition the group has not acked (0 when caught up).",
		}, []string{"group", "partition"}),
		owned: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "snip", Subsystem: "reader", Name: "owned_partitions",
			Help: "Partitions this member holds: taken over, and not yet given back (one being given up counts until its last batch is acked and it is unpinned).",
		}, []string{"group"}),
		acquiring: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "snip", Subsystem: "reader", Name: "acquiring_partitions",
			Help: "Partitions assigned to this member that it is still taking over: waiting for the previous owner to let go (at most 2 lease TTLs plus the drain timeout), resetting a dead owner's events in flight.",
		}, []string{"group"}),
		members: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "snip", Subsystem: "reader", Name: "live_members",
			Help: "Live members of the group as this member sees them (0 once it has left).",
		}, []string{"group"}),
		rebalances: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "snip", Subsystem: "reader", Name: "rebalances_total",
			Help: "Times this member's set of partitions changed.",
		}, []string{"group"}),
	}
	m.gaps = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "snip", Subsystem: "reader", Name: "delivery_gaps_total",
		Help: "Deliveries the server made that never reached the member (seen as consumer-sequence gaps); each makes the partition go on after the last event handled before it (its ack floor, or past it where that batch's ack was lost: a group started at new events acks that batch again and goes on from its floor, handing the events past the floor again only if that ack fails too).",
	}, []string{"group"})
	m.resumeMoved = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "snip", Subsystem: "reader", Name: "takeover_reassigns_total",
		Help: "Takeovers where another member acked the partition after this one took it over and before its first batch; the reader's state was rebuilt (OnRevoke, OnAssign) to resume at its first event.",
	}, []string{"group"})
	m.duplicates = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "snip", Subsystem: "reader", Name: "duplicate_member_leases_total",
		Help: "Writes of this member's lease by another process given the same member name; the one that joined later stops (reader.ErrDuplicateMember).",
	}, []string{"group"})
	m.lapses = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "snip", Subsystem: "reader", Name: "lease_lapses_total",
		Help: "Heartbeats stored only after this member's lease may have lapsed (none stored for a lease TTL: a member cut off from NATS, or starved of CPU); each time the member gave every partition up and took afresh what the group then gave it.",
	}, []string{"group"})
	if reg != nil {
		reg.MustRegister(m.events, m.parked, m.redelivered, m.errors, m.replays, m.batchSecs, m.batchSize,
			m.lag, m.ackPending, m.oldestAge, m.owned, m.acquiring, m.members, m.rebalances, m.gaps, m.resumeMoved, m.duplicates, m.lapses)
	}
	return m
}

func (m *metrics) forgetPartition(group string, p int) {
	ps := strconv.Itoa(p)
	m.lag.DeleteLabelValues(group, ps)
	m.ackPending.DeleteLabelValues(group, ps)
	m.oldestAge.DeleteLabelValues(group, ps)
}
