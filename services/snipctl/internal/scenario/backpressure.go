package scenario

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
)

var backpressure = Scenario{
	Name:   "backpressure",
	Claim:  "producers at 1,000/s, readers at 800/s: the backlog grows 200/s; the oldest-unread age crosses its alarm long before the count looks alarming, and the age, not the count, tells a healthy queue from a stuck one",
	Needs:  "nats",
	Lesson: 70 * time.Second,
	run:    runBackpressure,
}

const (
	bpIn         = 1000.0 // events/s produced
	bpOut        = 800.0  // events/s the group handles
	bpSecs       = 60.0   // lesson seconds observed: past the count alarm's 50
	bpAgeAlarm   = 5.0    // seconds: the age alarm
	bpCountWarn  = 10_000 // events: a count alarm as people usually set one
	bpPartitions = 4      // CLICKS partitions in this lesson
	bpBatch      = 500    // events: pkg/reader's default batch size
)

func runBackpressure(ctx context.Context, e *Env) error {
	js, err := e.NATS(ctx, bpPartitions)
	if err != nil {
		return err
	}
	var handled atomic.Int64
	var handledIn [bpPartitions]atomic.Int64 // per partition
	lim := e.limiter(bpOut)
	var assigned atomic.Int64
	cfg := groupConfig("readers", "reader-1")
	cfg.OnAssign = func(context.Context, int, uint64) error { assigned.Add(1); return nil }
	m, err := e.startMember(ctx, cfg, func(ctx context.Context, p int, batch []reader.Event) error {
		for len(batch) > 0 {
			n := min(len(batch), lim.Burst())
			if err := lim.WaitN(ctx, n); err != nil {
				return err
			}
			handledIn[p].Add(int64(n))
			handled.Add(int64(n))
			batch = batch[n:]
		}
		return nil
	})
	if err != nil {
		return err
	}
	defer m.stop()
	if err := waitFor(ctx, 30*time.Second, "the readers to own every partition", func() (bool, error) { return assigned.Load() == bpPartitions, nil }); err != nil {
		return err
	}
	pjs, err := e.Connect("producer")
	if err != nil {
		return err
	}
	// The console's two alarms, sampled every lesson second from the
	// group's consumers (reader.Lag, as `snipctl lag` and the console do),
	// with the scenario's own counters read around each reading.
	smp := e.newSampler(time.Second)
	var samples []bpSample
	var produced atomic.Int64
	var ageAlarmAt, countAlarmAt float64
	var countAtAgeAlarm, backlogAtAgeAlarm float64
	start := time.Now()
	stopSampling := smp.start(ctx, func() {
		// Events the producer handed over and the server has acked (so
		// stored), counted before the lag is read: produced first, the
		// publishes not yet acked after, so none is counted unacked.
		sent := produced.Load()
		s := bpSample{pre: e.Lesson(time.Since(start)), storedPre: sent - int64(pjs.PublishAsyncPending())}
		for p := range s.handledPre {
			s.handledPre[p] = handledIn[p].Load()
		}
		count, age, err := groupLag(ctx, js, "readers")
		if err != nil {
			return // no reading this time: the next tick's
		}
		s.handledPost, s.produced = handled.Load(), produced.Load()
		s.count, s.age, s.at = count, e.Lesson(age), e.Lesson(time.Since(start))
		samples = append(samples, s)
		smp.add("backlog", "events", s.count)
		smp.add("oldest unread age", "s", s.age)
		if ageAlarmAt == 0 && s.age >= bpAgeAlarm {
			ageAlarmAt, countAtAgeAlarm = s.at, s.count
			backlogAtAgeAlarm = float64(s.produced - s.handledPost)
		}
		if countAlarmAt == 0 && s.count >= bpCountWarn {
			countAlarmAt = s.at
		}
	})
	defer stopSampling()

	e.say("producers at %g/s, readers at %g/s, for %g s", bpIn, bpOut, bpSecs)
	total := int(bpIn * bpSecs)
	links := codes(40)
	var handledHalf int64
	var halfAt time.Time
	_, err = emit(ctx, e.Rate(bpIn), e.Real(time.Duration(bpSecs*float64(time.Second))), func(i int) error {
		if i == total/2 {
			handledHalf, halfAt = handled.Load(), time.Now()
		}
		_, err := publishClick(pjs, newClick(links[i%len(links)], i))
		produced.Add(1)
		return err
	})
	if err != nil {
		return err
	}
	end := time.Now()
	handledEnd := handled.Load()
	backlogEnd := float64(int64(total) - handledEnd)
	stopSampling()
	smp.flush()
	if err := waitPublished(ctx, pjs); err != nil {
		return err
	}

	// The readers' rate over the run: the pace is a ceiling, and on a
	// loaded machine the growth below uses what they really did.
	out := e.LessonRate(float64(handledEnd) / end.Sub(start).Seconds())
	e.atMost("readers' rate (paced at 800)", "events/s", bpOut*1.05, out, "the pace is a ceiling; on a loaded machine the growth below uses the measured rate")
	e.note("the readers did %.0f/s in the run's first half", e.LessonRate(float64(handledHalf)/halfAt.Sub(start).Seconds()))
	if out < bpOut*0.97 {
		e.note("the readers ran at %.0f/s, not %.0f/s: the growth uses the measured rate, the alarm times the counts sampled through the run", out, bpOut)
	} else {
		out = bpOut
	}
	// The producers are paced too: on a loaded machine their 60 s of
	// events may take longer to hand over.
	in := float64(total) / e.Lesson(end.Sub(start))
	if in < bpIn*0.97 {
		e.note("the producers managed %.0f/s, not %.0f/s: the growth uses the measured rate", in, bpIn)
	} else {
		in = bpIn
	}
	growth := in - out
	measuredGrowth := backlogEnd / e.Lesson(end.Sub(start))
	e.within("backlog growth", "events/s", growth, measuredGrowth, 0.2, 0, "arrivals minus handling; rates are timer-paced on a shared machine")
	e.within("backlog after an hour (from the measured growth)", "events", growth*3600, measuredGrowth*3600, 0.2, 0, "the same growth, an hour long: not run, multiplied")

	// When each alarm was due, from the counters read with each sample and
	// the events' stored times: the rates need not have been steady (on a
	// loaded machine they are not).
	stored, err := storedTimes(ctx, js, e, start, int64(total), 10*time.Second)
	if err != nil {
		return err
	}
	due, err := predictAlarms(samples, newBPIndex(links), int64(total), stored)
	if err != nil {
		return err
	}
	ageAlarmChecks(e, due, ageAlarmAt)
	e.info("backlog when the age alarm fires", "events", backlogAtAgeAlarm, countAtAgeAlarm, "produced minus handled at that sample: the count looks small then")
	alarmOrderChecks(e, due, ageAlarmAt, countAlarmAt)

	// Part two, in real time at any speed: a big queue that drains fast and
	// a small one that does not move.
	e.say("a queue of 10,000 with a working reader, a queue of 100 with a stuck one")
	q, err := healthyVsStuck(ctx, e, js)
	if err != nil {
		return err
	}
	e.info("healthy queue of 10,000: drain time (real s)", "s", 2, q.healthyDrain.Seconds(), "how fast this machine's reader runs; the lesson's reader does 5,000/s")
	e.info("healthy queue: oldest unread age at most (real s)", "s", 2, q.healthyMaxAge.Seconds(), "about its drain time: under the 5 s age alarm wherever the reader drains 10,000 in under 5 s")
	e.atLeast("stuck queue of 100: oldest unread age when watched (real s)", "s", bpAgeAlarm, q.stuckAge.Seconds(), "watched 10 s, or a second past the healthy queue's worst age: the age alarm fires; a count alarm at 10,000 never would")
	e.exact("the stuck queue's age passes the healthy queue's worst", "bool", 1, b2f(q.stuckAge > q.healthyMaxAge), "age tells them apart")
	e.note("most events seen waiting: %.0f on the healthy queue (its reader reads while the 10,000 arrive; sampled once they are all published), %.0f on the stuck one: the count points at the healthy queue, the age at the stuck one", q.healthyMaxCount, q.stuckCount)
	return nil
}

// orNaN is t, or NaN for 0: an alarm that never fired.
func orNaN(t float64) float64 {
	if t == 0 {
		return math.NaN()
	}
	return t
}

// storedTimes returns when CLICKS stored the run's event i, in lesson
// seconds since start. The run's total events are the stream's first,
// published in order on one connection, so event i is at sequence i+1; the
// last one is checked to be where it should be. A read that fails is read
// again until retry passes, and then is the error: every event of the run
// is in CLICKS, and one the lesson cannot read is not one it may skip.
func storedTimes(ctx context.Context, js jetstream.JetStream, e *Env, start time.Time, total int64, retry time.Duration) (func(i int64) (float64, error), error) {
	s, err := js.Stream(ctx, events.ClicksStream)
	if err != nil {
		return nil, fmt.Errorf("clicks stream: %w", err)
	}
	last, err := s.GetMsg(ctx, uint64(total))
	if err != nil {
		return nil, fmt.Errorf("the run's last event: %w", err)
	}
	var c events.Click
	if err := json.Unmarshal(last.Data, &c); err != nil || indexOf(c) != int(total-1) {
		return nil, fmt.Errorf("CLICKS sequence %d is not the run's last event (%d)", total, total-1)
	}
	seen := map[int64]float64{}
	return func(i int64) (float64, error) {
		if t, ok := seen[i]; ok {
			return t, nil
		}
		var m *jetstream.RawStreamMsg
		err := waitFor(ctx, retry, fmt.Sprintf("CLICKS sequence %d", i+1), func() (bool, error) {
			var err error
			m, err = s.GetMsg(ctx, uint64(i)+1)
			return err == nil, err
		})
		if err != nil {
			return 0, err
		}
		t := e.Lesson(m.Time.Sub(start))
		seen[i] = t
		return t, nil
	}, nil
}

// bpSample is one sample of the run, in lesson seconds since its start:
// what reader.Lag said (count, age) and what the scenario's own counters
// said around it, the readers' per partition read before the lag and in all
// after it, so that the bounds below hold whatever the rates did.
type bpSample struct {
	pre, at     float64             // before reading the lag, after it
	count, age  float64             // reader.Lag: events waiting, oldest unread age
	handledPre  [bpPartitions]int64 // events handled per partition, before
	handledPost int64               // events handled, after
	storedPre   int64               // events stored in CLICKS (their publishes acked), before
	produced    int64               // events handed to the producer's client, after
}

// bpIndex maps a partition's events to the run's: event i of the run is
// stored as the r-th of partition Partition(links[i%len(links)]), in order.
type bpIndex struct {
	cycle int     // len(links): the run's events repeat the links in turn
	of    [][]int // per partition: the offsets within a cycle of its links
}

func newBPIndex(links []string) bpIndex {
	x := bpIndex{cycle: len(links), of: make([][]int, bpPartitions)}
	for i, l := range links {
		p := events.Partition(l, bpPartitions)
		x.of[p] = append(x.of[p], i)
	}
	return x
}

// event returns the run's index of partition p's r-th event (from 0).
func (x bpIndex) event(p int, r int64) int64 {
	n := int64(len(x.of[p]))
	if n == 0 {
		return math.MaxInt64
	}
	return r/n*int64(x.cycle) + int64(x.of[p][r%n])
}

// bpAlarms are the lesson-second times, from the samples, at which each
// alarm was due; NaN where no sample made it due.
type bpAlarms struct {
	latest, earliest           float64 // the age alarm's bounds
	countLatest, countEarliest float64 // the count alarm's bounds
}

// predictAlarms reads each sample against the stored time of the run's
// events (stored: lesson seconds since the start). A stored time it cannot
// read is its error: passing over that sample would move a bound to a later
// one. Stored order is the producer's order, so:
//
//   - The oldest unacked event is at least as old as event handledPost (of
//     handledPost+1 events one is unhandled, so unacked): the age alarm is
//     due by the first sample at which that event is 5 s old, latest.
//   - The reader acks a batch (up to bpBatch events of one partition) once
//     it has handled all of it, so every partition's events before its
//     handledPre - bpBatch are acked: the oldest unacked event is at most as
//     old as the oldest of those partitions' next ones, and the alarm cannot
//     fire before the first sample at which that one is 5 s old, earliest.
//   - The count is the events stored and not yet acked at the moment the
//     server answered, somewhere between pre and at; on a loaded machine
//     a reading can take seconds, and the counters read after it are then
//     well ahead of what it saw. It is at least storedPre - handledPost,
//     so the count alarm is due by the first sample at which that reaches
//     bpCountWarn, latest. Every partition's events before its
//     handledPre - bpBatch are acked, so it is at most produced minus the
//     handledPre of all partitions plus bpPartitions x bpBatch (the
//     batches in hand), and the alarm cannot fire before the first sample
//     at which that reaches bpCountWarn, earliest.
func predictAlarms(samples []bpSample, x bpIndex, total int64, stored func(i int64) (float64, error)) (bpAlarms, error) {
	a := bpAlarms{latest: math.NaN(), earliest: math.NaN(), countLatest: math.NaN(), countEarliest: math.NaN()}
	for _, s := range samples {
		if math.IsNaN(a.latest) && s.handledPost < total {
			t, err := stored(s.handledPost)
			if err != nil {
				return a, fmt.Errorf("when the run's event %d was stored: %w", s.handledPost, err)
			}
			if s.pre-t >= bpAgeAlarm {
				a.latest = s.at
			}
		}
		if math.IsNaN(a.earliest) {
			oldest := int64(math.MaxInt64)
			for p, h := range s.handledPre {
				oldest = min(oldest, x.event(p, max(0, h-bpBatch)))
			}
			if oldest < total {
				t, err := stored(oldest)
				if err != nil {
					return a, fmt.Errorf("when the run's event %d was stored: %w", oldest, err)
				}
				if s.at-t >= bpAgeAlarm {
					a.earliest = s.at
				}
			}
		}
		if math.IsNaN(a.countLatest) && float64(s.storedPre-s.handledPost) >= bpCountWarn {
			a.countLatest = s.at
		}
		if math.IsNaN(a.countEarliest) {
			most := s.produced + bpPartitions*bpBatch
			for _, h := range s.handledPre {
				most -= h
			}
			if float64(most) >= bpCountWarn {
				a.countEarliest = s.at
			}
		}
	}
	return a, nil
}

// ageAlarmChecks judges when the age alarm fired (0: never) against when
// the samples made it due.
func ageAlarmChecks(e *Env, due bpAlarms, ageAlarmAt float64) {
	fired := orNaN(ageAlarmAt)
	e.atMost("age alarm (5 s) fires no later than the FIFO age says", "s", due.latest, fired,
		"the first sample at which the event the readers' handled count reached (of the events up to it one is unread) was 5 s old; at the lesson's rates the FIFO age, 0.2 s per second, says 25 s; NaN: none")
	e.atLeast("age alarm (5 s) fires no earlier than with full batches unacked", "s", due.earliest, fired,
		fmt.Sprintf("the first sample at which the oldest event that could be unacked (a batch of up to %d events of a partition is acked when all are handled) was 5 s old; NaN: none", bpBatch))
}

// alarmOrderChecks judges when the count alarm fired against when the
// counters made it due, and that the age alarm fired before it, from the
// lesson times the sampler saw each cross its threshold (0: it never did).
func alarmOrderChecks(e *Env, due bpAlarms, ageAlarmAt, countAlarmAt float64) {
	fired := orNaN(countAlarmAt)
	e.atMost("count alarm (10,000) fires no later than the counters say", "s", due.countLatest, fired,
		"the first sample at which the events stored before the reading, less those handled after it, were 10,000; at the lesson's rates 50 s; NaN: none")
	e.atLeast("count alarm (10,000) fires no earlier than with full batches in hand", "s", due.countEarliest, fired,
		fmt.Sprintf("the first sample at which the events produced after the reading, less those handled before it, plus a batch of %d in hand per partition, were 10,000; at the lesson's rates 40 s; NaN: none", bpBatch))
	lead := math.NaN()
	if ageAlarmAt > 0 && countAlarmAt > 0 {
		lead = countAlarmAt - ageAlarmAt
	}
	e.atLeast("count alarm's time minus the age alarm's", "s", 1, lead,
		fmt.Sprintf("both from the samples' timestamps: the age alarm first, by at least one sample (at the lesson's rates the FIFO age says by %.0f s); NaN: one never fired", bpCountWarn/(bpIn-bpOut)-bpAgeAlarm/(1-bpOut/bpIn)))
}

// groupLag sums a group's unhandled events and returns the oldest one's age
// (0 and 0 with the error, when the server could not say: a read that
// failed, or one that found a partition without its consumer, which
// reader.Lag leaves out).
func groupLag(ctx context.Context, js jetstream.JetStream, group string) (float64, time.Duration, error) {
	lag, err := reader.Lag(ctx, js, group)
	if err != nil {
		return 0, 0, err
	}
	if len(lag) != bpPartitions {
		return 0, 0, fmt.Errorf("lag of %s: %d of %d partitions have a consumer", group, len(lag), bpPartitions)
	}
	var n float64
	var oldest time.Time
	for _, l := range lag {
		n += float64(l.Pending) + float64(l.AckPending)
		if !l.OldestUnprocessed.IsZero() && (oldest.IsZero() || l.OldestUnprocessed.Before(oldest)) {
			oldest = l.OldestUnprocessed
		}
	}
	if oldest.IsZero() {
		return n, 0, nil
	}
	return n, time.Since(oldest), nil
}

// queues is what healthyVsStuck saw, by reader.Lag: the most events
// waiting and the oldest unread age of each queue (the healthy one polled
// from when all 10,000 are published until it has drained).
type queues struct {
	healthyMaxAge, healthyDrain, stuckAge time.Duration
	healthyMaxCount, stuckCount           float64
}

// healthyVsStuck fills two groups' view of CLICKS: 10,000 events for a
// working reader and then 100 for one that never reads. Both groups start at
// new events, so each sees only its own queue.
func healthyVsStuck(ctx context.Context, e *Env, js jetstream.JetStream) (q queues, err error) {
	var done atomic.Int64
	var assigned atomic.Int64
	cfg := groupConfig("healthy", "healthy-1")
	cfg.Start = reader.StartAtNew()
	cfg.OnAssign = func(context.Context, int, uint64) error { assigned.Add(1); return nil }
	m, err := e.startMember(ctx, cfg, func(_ context.Context, _ int, batch []reader.Event) error {
		done.Add(int64(len(batch)))
		return nil
	})
	if err != nil {
		return q, err
	}
	defer m.stop()
	if err := waitFor(ctx, 30*time.Second, "the healthy reader", func() (bool, error) { return assigned.Load() == bpPartitions, nil }); err != nil {
		return q, err
	}
	pjs, err := e.Connect("queues")
	if err != nil {
		return q, err
	}
	links := codes(40)
	start := time.Now()
	for i := range 10_000 {
		if _, err := publishClick(pjs, newClick(links[i%len(links)], i)); err != nil {
			return q, err
		}
	}
	if err := waitPublished(ctx, pjs); err != nil {
		return q, err
	}
	q.healthyMaxCount, q.healthyMaxAge, err = watchDrain(ctx, js, "healthy", func() bool { return done.Load() >= 10_000 }, 60*time.Second)
	if err != nil {
		return q, err
	}
	q.healthyDrain = time.Since(start)
	// The stuck reader: its group exists (created at new events), then 100
	// events arrive and nobody reads them.
	scfg := groupConfig("stuck", "stuck-1")
	scfg.Start = reader.StartAtNew()
	var sassigned atomic.Int64
	scfg.OnAssign = func(context.Context, int, uint64) error { sassigned.Add(1); return nil }
	block := make(chan struct{})
	sm, err := e.startMember(ctx, scfg, func(ctx context.Context, _ int, _ []reader.Event) error {
		select { // a handler that hangs on a dependency
		case <-block:
		case <-ctx.Done():
		}
		return context.Canceled
	})
	if err != nil {
		return q, err
	}
	defer func() { close(block); sm.stop() }()
	if err := waitFor(ctx, 30*time.Second, "the stuck reader", func() (bool, error) { return sassigned.Load() == bpPartitions, nil }); err != nil {
		return q, err
	}
	for i := range 100 {
		if _, err := publishClick(pjs, newClick(links[i%len(links)], 10_000+i)); err != nil {
			return q, err
		}
	}
	if err := waitPublished(ctx, pjs); err != nil {
		return q, err
	}
	// Watched for 10 s, or for a second longer than the healthy queue's
	// worst age when a busy machine drained it slower than that: the lesson
	// is that a stuck queue's age passes any healthy one's, which takes as
	// long as the healthy one's worst age.
	t := time.NewTimer(max(10*time.Second, q.healthyMaxAge+time.Second))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return q, ctx.Err()
	case <-t.C:
	}
	q.stuckCount, q.stuckAge, err = readGroupLag(ctx, js, "stuck", 10*time.Second)
	return q, err
}

// watchDrain reads group's lag until drained() says the group has handled
// everything, and returns the most events and the oldest age it read. A
// read that fails is read again, not kept as a lag of zero: the wait ends
// on a read that succeeded, or at timeout with the last read's error.
func watchDrain(ctx context.Context, js jetstream.JetStream, group string, drained func() bool, timeout time.Duration) (maxCount float64, maxAge time.Duration, err error) {
	err = waitFor(ctx, timeout, "the "+group+" queue to drain", func() (bool, error) {
		n, age, err := groupLag(ctx, js, group)
		if err != nil {
			return false, err
		}
		maxAge, maxCount = max(maxAge, age), max(maxCount, n)
		return drained(), nil
	})
	return maxCount, maxAge, err
}

// readGroupLag is groupLag read again while it fails, until timeout: the
// lesson checks what it read, or ends with the read's error, never with a
// lag of zero it did not read.
func readGroupLag(ctx context.Context, js jetstream.JetStream, group string, timeout time.Duration) (count float64, age time.Duration, err error) {
	err = waitFor(ctx, timeout, "the "+group+" group's lag", func() (bool, error) {
		var err error
		count, age, err = groupLag(ctx, js, group)
		return err == nil, err
	})
	return count, age, err
}
