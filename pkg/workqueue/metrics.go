package workqueue

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	deliveries *prometheus.CounterVec
	dead       *prometheus.CounterVec
	retries    *prometheus.CounterVec
	backlog    *prometheus.GaugeVec
	inFlight   prometheus.Gauge
	duration   prometheus.Histogram
	parkErrors prometheus.Counter
	// rescueRetries counts advisories whose rescue failed and was put off.
	rescueRetries prometheus.Counter
	// termsUnconfirmed counts TERMs the server never confirmed.
	termsUnconfirmed prometheus.Counter
	// rescuedDone counts jobs that ran out of deliveries though done.
	rescuedDone prometheus.Counter
}

func newMetrics(source string, reg prometheus.Registerer) *metrics {
	ns := "snip_" + source
	m := &metrics{
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "deliveries_total",
			Help: "Job deliveries by outcome: done, retried (with backoff; as retries_total), dead_lettered, handed_back (at shutdown: NAKed, requeued as a fresh copy, or, on the last try, left to the rescuer).",
		}, []string{"outcome"}),
		dead: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "dead_letters_total",
			Help: "Jobs parked on DEAD_LETTER by reason, and by who parked them: worker (a decision) or advisory (a delivery that never reached one).",
		}, []string{"reason", "via"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "retries_total",
			Help: "Failed deliveries retried with backoff, by the failure's reason: transient failures before the last try, and failures that could not be dead-lettered (see dead_letter_errors_total).",
		}, []string{"reason"}),
		backlog: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Name: "dead_letter_backlog",
			Help: "Dead letters of this source waiting on DEAD_LETTER, by reason (sampled every backlog interval).",
		}, []string{"reason"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Name: "jobs_in_flight",
			Help: "Jobs this process is working on.",
		}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Name: "job_duration_seconds",
			Help:    "Time from taking a job to its handler's result.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}),
		parkErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "dead_letter_errors_total",
			Help: "Failed publishes to DEAD_LETTER (the job is kept and retried).",
		}),
		rescueRetries: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "rescue_retries_total",
			Help: "Rescues of a job that ran out of deliveries that failed and were put off (its advisory is kept and retried with backoff).",
		}),
		rescuedDone: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "rescued_done_total",
			Help: "Jobs that ran out of deliveries though their work was done (the last try's ack was lost): removed from the queue without a dead letter.",
		}),
		termsUnconfirmed: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "terms_unconfirmed_total",
			Help: "TERMs (after a park or a hand-back) the server did not confirm in three tries: the job may come back once.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.deliveries, m.dead, m.retries, m.backlog, m.inFlight, m.duration, m.parkErrors, m.rescueRetries, m.termsUnconfirmed, m.rescuedDone)
	}
	return m
}
