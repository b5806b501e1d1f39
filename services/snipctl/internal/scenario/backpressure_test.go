package scenario

import (
	"slices"
	"testing"
)

// bpHistory fabricates a run's samples, one a lesson second: producers at
// 1,000/s, readers at first (events/s) for the first 30 s and then (events/s)
// after, the handled events shared evenly by the partitions, and event i
// stored at i/1000 s.
func bpHistory(first, then float64) ([]bpSample, func(int64) (float64, bool)) {
	var samples []bpSample
	for t := 1.0; t <= bpSecs; t++ {
		h := first * min(t, 30)
		if t > 30 {
			h += then * (t - 30)
		}
		s := bpSample{pre: t, at: t, handledPost: int64(h), produced: int64(bpIn * t)}
		for p := range s.handledPre {
			s.handledPre[p] = int64(h / bpPartitions)
		}
		samples = append(samples, s)
	}
	return samples, func(i int64) (float64, bool) { return float64(i) / bpIn, true }
}

// The alarm predictions follow the rates the samples show, not one average:
// readers at 800/s that slow to 500/s halfway (654/s over the run, as on a
// loaded machine) leave the age alarm due when the FIFO age at 800/s says,
// 25 s, not at 5 / (1 - 654/1000) = 14.5 s, and the count alarm when the
// backlog built at 200/s and then 500/s reaches 10,000 (38 s), not at
// 10,000 / 346 = 29 s.
func TestBackpressurePredictionsFollowTheRates(t *testing.T) {
	t.Parallel()
	links := codes(40)
	total := int64(bpIn * bpSecs)
	for _, tc := range []struct {
		name                    string
		first, then             float64
		latest, earliest, count float64
	}{
		// Partitions 0 and 3 hold 11 of the 40 links: handled at 200/s
		// each, the oldest that could be unacked is 0.273 t + 1.8 s old.
		{"steady", 800, 800, 25, 12, 50},
		{"slowed_halfway", 800, 500, 25, 12, 38},
	} {
		t.Run(tc.name, func(t *testing.T) {
			samples, stored := bpHistory(tc.first, tc.then)
			due := predictAlarms(samples, newBPIndex(links), total, stored)
			if due.latest != tc.latest || due.earliest != tc.earliest || due.count != tc.count {
				t.Errorf("due at latest %g, earliest %g, count %g; want %g, %g, %g", due.latest, due.earliest, due.count, tc.latest, tc.earliest, tc.count)
			}
		})
	}

	// The measured alarms of the run that failed against one average rate
	// (age at 18 s, count at 41.3 s) are within what this history predicts;
	// an age alarm that fired on the count (with it) or by a batch's worth
	// too soon is not.
	samples, stored := bpHistory(800, 500)
	due := predictAlarms(samples, newBPIndex(links), total, stored)
	for _, tc := range []struct {
		name       string
		age, count float64
		fail       []string
	}{
		{"measured", 18, 41.3, nil},
		{"age_alarm_on_the_count", 38, 38, []string{"age alarm (5 s) fires no later than the FIFO age says", "count alarm's time minus the age alarm's"}},
		{"age_alarm_too_soon", 8, 41.3, []string{"age alarm (5 s) fires no earlier than with full batches unacked"}},
		{"age_alarm_never", 0, 41.3, []string{"age alarm (5 s) fires no later than the FIFO age says", "age alarm (5 s) fires no earlier than with full batches unacked", "count alarm's time minus the age alarm's"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &Env{speed: 1, res: &Result{}}
			ageAlarmChecks(e, due, tc.age)
			alarmOrderChecks(e, due.count, tc.age, tc.count)
			var failed []string
			for _, c := range e.res.Checks {
				if !c.OK {
					failed = append(failed, c.Name)
				}
			}
			if !slices.Equal(failed, tc.fail) {
				t.Errorf("rows that FAIL: %q, want %q", failed, tc.fail)
			}
		})
	}
}
