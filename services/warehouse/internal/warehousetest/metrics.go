package warehousetest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Metric returns the value of a counter or gauge, or the sample count of a
// histogram, in reg; with labels ("name", "value", ...) only the series with
// those labels counts. Series that match are summed; none is 0.
func Metric(tb testing.TB, reg prometheus.Gatherer, name string, labels ...string) float64 {
	tb.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		tb.Fatalf("gather metrics: %v", err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue series
				}
			}
			switch {
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			case m.Histogram != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}
