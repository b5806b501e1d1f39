package scenario

import (
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// failingCollector is a member's metric that cannot be gathered.
type failingCollector struct{ desc *prometheus.Desc }

var errCollect = errors.New("collect failed")

func (c failingCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }
func (c failingCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.NewInvalidMetric(c.desc, errCollect)
}

// A registry that cannot gather is the lease lapses' error, not a count of
// zero: the premise row would otherwise take the lapses of the registries
// that did gather for every member's.
func TestLeaseLapsesNamesAGatherThatFailed(t *testing.T) {
	t.Parallel()
	ok, bad := prometheus.NewRegistry(), prometheus.NewRegistry()
	lapses := prometheus.NewCounter(prometheus.CounterOpts{Name: "snip_reader_lease_lapses_total"})
	lapses.Add(2)
	ok.MustRegister(lapses)
	bad.MustRegister(failingCollector{prometheus.NewDesc("snip_lesson_broken", "a metric that cannot be gathered", nil, nil)})
	if n, err := leaseLapses(map[string]*prometheus.Registry{"six-1": ok}); n != 2 || err != nil {
		t.Fatalf("leaseLapses = %v, %v; want 2", n, err)
	}
	if n, err := leaseLapses(map[string]*prometheus.Registry{"six-1": ok, "six-2": bad}); !errors.Is(err, errCollect) {
		t.Fatalf("leaseLapses with six-2's registry failing = %v, %v; want %v", n, err, errCollect)
	}
}
