package loader

import "github.com/prometheus/client_golang/prometheus"

// metrics are the loader's collectors. The ClickHouse adapter counts the
// inserts themselves (rows, latency, batch size, errors by class), and the
// reader runtime the lag and age of the oldest unprocessed event.
//
// parked counts the poison the handler returns, not the parking: the
// runtime parks the event after the handler returned, and offers no hook
// for when that is done, so a batch handed again (the park failed because
// the partition moved, or the process died before the ack) counts its
// event again. The runtime's snip_reader_parked_total counts each event
// stored on DEAD_LETTER once (a park again within DEAD_LETTER's duplicate
// window is not counted).
type metrics struct {
	parked  *prometheus.CounterVec
	skipped prometheus.Counter
	waiting prometheus.Gauge
	flushes *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) metrics {
	m := metrics{
		parked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "snip_warehouse_rows_parked_total",
			Help: "Clicks the loader refused as rows and handed to the runtime to be parked (reader.Poison), by reason; counted again if the batch is handed again (its park failed, a crash before its ack). Events parked: snip_reader_parked_total{group=\"warehouse-loader\"}.",
		}, []string{"reason"}),
		skipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "snip_warehouse_backfill_skipped_total",
			Help: "Backlog events skipped because their click is older than the backfill cut the group was made with, each counted once, when its batch is done.",
		}),
		waiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "snip_warehouse_rows_waiting",
			Help: "Rows handed to the loader and not yet inserted (their events are not acked).",
		}),
		flushes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "snip_warehouse_flushes_total",
			Help: "Inserts started, by what started them: size (MaxRows reached), linger, backlog (catching up: no linger), or drain (shutdown).",
		}, []string{"trigger"}),
	}
	for _, r := range []string{ReasonBadRow, ReasonImplausibleTime} {
		m.parked.WithLabelValues(r)
	}
	for _, t := range []string{"size", "linger", "backlog", "drain"} {
		m.flushes.WithLabelValues(t)
	}
	if reg != nil {
		reg.MustRegister(m.parked, m.skipped, m.waiting, m.flushes)
	}
	return m
}
