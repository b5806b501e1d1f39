package scenario

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
)

// bpHistory fabricates a run's samples, one a lesson second: producers at
// 1,000/s, readers at first (events/s) for the first 30 s and then (events/s)
// after, the handled events shared evenly by the partitions, and event i
// stored at i/1000 s.
func bpHistory(first, then float64) ([]bpSample, func(int64) (float64, error)) {
	var samples []bpSample
	for t := 1.0; t <= bpSecs; t++ {
		h := first * min(t, 30)
		if t > 30 {
			h += then * (t - 30)
		}
		s := bpSample{pre: t, at: t, handledPost: int64(h), produced: int64(bpIn * t), storedPre: int64(bpIn * t)}
		for p := range s.handledPre {
			s.handledPre[p] = int64(h / bpPartitions)
		}
		samples = append(samples, s)
	}
	return samples, func(i int64) (float64, error) { return float64(i) / bpIn, nil }
}

// The alarm predictions follow the rates the samples show, not one average:
// readers at 800/s that slow to 500/s halfway (654/s over the run, as on a
// loaded machine) leave the age alarm due when the FIFO age at 800/s says,
// 25 s, not at 5 / (1 - 654/1000) = 14.5 s, and the count alarm when the
// backlog built at 200/s and then 500/s reaches 10,000 (38 s), not at
// 10,000 / 346 = 29 s; it cannot fire before the backlog with a batch in
// hand per partition does (34 s).
func TestBackpressurePredictionsFollowTheRates(t *testing.T) {
	t.Parallel()
	links := codes(40)
	total := int64(bpIn * bpSecs)
	for _, tc := range []struct {
		name                       string
		first, then                float64
		latest, earliest           float64
		countLatest, countEarliest float64
	}{
		// Partitions 0 and 3 hold 11 of the 40 links: handled at 200/s
		// each, the oldest that could be unacked is 0.273 t + 1.8 s old.
		{"steady", 800, 800, 25, 12, 50, 40},
		{"slowed_halfway", 800, 500, 25, 12, 38, 34},
	} {
		t.Run(tc.name, func(t *testing.T) {
			samples, stored := bpHistory(tc.first, tc.then)
			due, err := predictAlarms(samples, newBPIndex(links), total, stored)
			if err != nil {
				t.Fatal(err)
			}
			want := bpAlarms{latest: tc.latest, earliest: tc.earliest, countLatest: tc.countLatest, countEarliest: tc.countEarliest}
			if due != want {
				t.Errorf("due %+v, want %+v", due, want)
			}
		})
	}

	// The age alarm of the run that failed against one average rate (18 s)
	// is within what this history predicts, with a count alarm when the
	// counters say; an age alarm that fired on the count (with it) or by a
	// batch's worth too soon is not, nor a count alarm later than the
	// counters say or sooner than the batches in hand allow.
	samples, stored := bpHistory(800, 500)
	due, err := predictAlarms(samples, newBPIndex(links), total, stored)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name       string
		age, count float64
		fail       []string
	}{
		{"measured", 18, 38, nil},
		{"count_alarm_with_the_batches_in_hand", 18, 35, nil},
		{"age_alarm_on_the_count", 38, 38, []string{"age alarm (5 s) fires no later than the FIFO age says", "count alarm's time minus the age alarm's"}},
		{"age_alarm_too_soon", 8, 38, []string{"age alarm (5 s) fires no earlier than with full batches unacked"}},
		{"age_alarm_never", 0, 38, []string{"age alarm (5 s) fires no later than the FIFO age says", "age alarm (5 s) fires no earlier than with full batches unacked", "count alarm's time minus the age alarm's"}},
		{"count_alarm_late", 18, 41.3, []string{"count alarm (10,000) fires no later than the counters say"}},
		{"count_alarm_too_soon", 18, 30, []string{"count alarm (10,000) fires no earlier than with full batches in hand"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &Env{speed: 1, res: &Result{}}
			ageAlarmChecks(e, due, tc.age)
			alarmOrderChecks(e, due, tc.age, tc.count)
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

// A reading of the lag that takes seconds (a loaded machine: 4 and then 15
// lesson seconds here) shows the count when the server answered, near its
// start, while the counters read after it are far ahead: the count alarm
// fires at the end of the reading after the one the counters read after it
// would name, and that is within the bounds. Readers at 500/s, producers
// at 1,000/s, the count at 10,000 from 20 s on.
func TestCountAlarmAfterASlowReadingIsWithinTheBounds(t *testing.T) {
	t.Parallel()
	sample := func(pre, at float64) bpSample {
		s := bpSample{pre: pre, at: at, handledPost: int64(500 * at), produced: int64(bpIn * at), storedPre: int64(bpIn * pre)}
		for p := range s.handledPre {
			s.handledPre[p] = int64(500 * pre / bpPartitions)
		}
		return s
	}
	var samples []bpSample
	for t := 1.0; t <= 19; t++ {
		samples = append(samples, sample(t, t))
	}
	// The reading from 19 s to 23 s saw 9,500 (not yet alarming), the one
	// from 23 s to 38 s saw 11,500: the alarm fired at 38 s. The counters
	// read after the first said 11,500 already.
	samples = append(samples, sample(19, 23), sample(23, 38), sample(38, 39), sample(39, 40))
	// The events are stored in the far future: the age bounds never fall
	// due, and only the count's are read.
	due, err := predictAlarms(samples, newBPIndex(codes(40)), int64(bpIn*bpSecs), func(int64) (float64, error) { return math.Inf(1), nil })
	if err != nil {
		t.Fatal(err)
	}
	if due.countLatest != 39 || due.countEarliest != 16 {
		t.Fatalf("count alarm due by %g, not before %g; want 39 and 16", due.countLatest, due.countEarliest)
	}
	e := &Env{speed: 1, res: &Result{}}
	alarmOrderChecks(e, due, 10, 38)
	for _, c := range e.res.Checks {
		if !c.OK {
			t.Errorf("%s: predicted %g, measured %g: FAIL", c.Name, c.Predicted, c.Measured)
		}
	}
}

// A lag read that fails is not a queue of zero: the wait for the healthy
// queue to drain, and the reading of the stuck queue, end on a read that
// succeeded, or at their deadline with the read's error. Here the group has
// no consumers (reader.ErrNoGroup) until a member starts.
func TestBackpressureLagReadsRetryAFailedRead(t *testing.T) {
	t.Parallel()
	e, js, reads := noGroupEnv(t, bpPartitions)
	ctx := t.Context()
	const timeout = 300 * time.Millisecond
	start := time.Now()
	n, age, err := watchDrain(ctx, js, "g", func() bool { return true }, timeout)
	if took := time.Since(start); !errors.Is(err, reader.ErrNoGroup) || took < timeout {
		t.Fatalf("watchDrain of a group with no consumers, after %v: %v, %v, %v; want %v at the %v deadline", took, n, age, err, reader.ErrNoGroup, timeout)
	}
	start = time.Now()
	n, age, err = readGroupLag(ctx, js, "g", timeout)
	if took := time.Since(start); !errors.Is(err, reader.ErrNoGroup) || took < timeout {
		t.Fatalf("readGroupLag of a group with no consumers, after %v: %v, %v, %v; want %v at the %v deadline", took, n, age, err, reader.ErrNoGroup, timeout)
	}

	// The group shows after the first reads failed: the read goes on
	// until it reads the group's lag.
	type lagRead struct {
		n   float64
		err error
	}
	done := make(chan lagRead, 1)
	before := reads.Load()
	go func() {
		n, _, err := readGroupLag(ctx, js, "g", 60*time.Second)
		done <- lagRead{n, err}
	}()
	awaitReads(t, "readGroupLag", "CLICKS with no group on it", reads, before+4, done)
	startIdleMember(t, e)
	if r := awaitDone(t, "readGroupLag", done); r.err != nil || r.n != 0 {
		t.Fatalf("readGroupLag = %v, %v; want 0 events of an empty stream", r.n, r.err)
	}
}

// A stored time that cannot be read is the prediction's error, not a sample
// passed over: passing over it moves a bound to a later sample (here the
// age alarm's latest, due at 25 s, would read 26 s). The stored times come
// from CLICKS on a real NATS server, one of the run's events deleted.
func TestPredictAlarmsNamesAStoredTimeItCannotRead(t *testing.T) {
	t.Parallel()
	e, js, _ := noGroupEnv(t, bpPartitions)
	ctx := t.Context()
	pjs, err := e.Connect("producer")
	if err != nil {
		t.Fatal(err)
	}
	const total = 3
	start := time.Now()
	for i := range total {
		if _, err := publishClick(pjs, newClick("link0", i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := waitPublished(ctx, pjs); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteMsg(ctx, 2); err != nil {
		t.Fatal(err)
	}
	const retry = 300 * time.Millisecond
	stored, err := storedTimes(ctx, js, e, start, total, retry)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stored(0); err != nil {
		t.Fatalf("stored time of event 0: %v", err)
	}
	began := time.Now()
	if at, err := stored(1); !errors.Is(err, jetstream.ErrMsgNotFound) || time.Since(began) < retry {
		t.Fatalf("stored time of the deleted event 1 after %v: %v, %v; want %v at the %v deadline", time.Since(began), at, err, jetstream.ErrMsgNotFound, retry)
	}

	samples, history := bpHistory(800, 800)
	missing := int64(800 * 25) // handled by 25 s: the sample the latest bound is due at
	_, err = predictAlarms(samples, newBPIndex(codes(40)), int64(bpIn*bpSecs), func(i int64) (float64, error) {
		if i == missing {
			return 0, fmt.Errorf("CLICKS sequence %d: %w", i+1, jetstream.ErrMsgNotFound)
		}
		return history(i)
	})
	if !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("predictAlarms with event %d's stored time unreadable: %v, want %v", missing, err, jetstream.ErrMsgNotFound)
	}
}
