package chwriter

import "github.com/prometheus/client_golang/prometheus"

// metrics are the inserts as ClickHouse saw them.
type metrics struct {
	rows        prometheus.Counter
	duration    prometheus.Histogram
	batchRows   prometheus.Histogram
	errors      *prometheus.CounterVec
	lastSuccess prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) metrics {
	m := metrics{
		rows: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "snip_warehouse_rows_inserted_total",
			Help: "Rows ClickHouse accepted (redelivered events count again; the schema absorbs them).",
		}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "snip_warehouse_insert_duration_seconds",
			Help:    "Duration of each INSERT statement the server accepted, from prepare to its acknowledgement (not the schema and view checks before it; a batch split at WAREHOUSE_MAX_DAYS_PER_INSERT days is several).",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}),
		batchRows: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "snip_warehouse_insert_rows",
			Help:    "Rows per INSERT statement the server accepted (a batch spanning more days than WAREHOUSE_MAX_DAYS_PER_INSERT goes as several).",
			Buckets: []float64{1, 10, 100, 1000, 2500, 5000, 10000, 20000, 50000, 100000},
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "snip_warehouse_insert_errors_total",
			Help: "Failed inserts by class; schema, auth and partitions need an operator (alert on any).",
		}, []string{"class"}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "snip_warehouse_last_insert_timestamp_seconds",
			Help: "Unix time of the last successful insert.",
		}),
	}
	for _, c := range []string{ClassUnavailable, ClassTimeout, ClassOverloaded, ClassPartitions, ClassMissing, ClassSchema, ClassAuth, ClassServer, ClassBadRow, ClassCanceled, ClassOther} {
		m.errors.WithLabelValues(c)
	}
	if reg != nil {
		reg.MustRegister(m.rows, m.duration, m.batchRows, m.errors, m.lastSuccess)
	}
	return m
}
