package scenario

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

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

// earliestAgeAlarm is the lesson time at which the oldest unacked event's
// age first reaches bpAgeAlarm if every partition holds a full batch (up
// to batch events of its backlog) unacked while it is handled: the FIFO
// age (1 - out/in) t plus that batch's handling time at out/partitions.
func earliestAgeAlarm(in, out float64, partitions int, batch float64) float64 {
	perPart := out / float64(partitions)
	for t := 0.0; t < 3600; t += 0.01 {
		held := min(batch, (in-out)*t/float64(partitions))
		if (1-out/in)*t+held/perPart >= bpAgeAlarm {
			return t
		}
	}
	return 3600
}

func runBackpressure(ctx context.Context, e *Env) error {
	js, err := e.NATS(ctx, bpPartitions)
	if err != nil {
		return err
	}
	var handled atomic.Int64
	lim := e.limiter(bpOut)
	var assigned atomic.Int64
	cfg := groupConfig("readers", "reader-1")
	cfg.OnAssign = func(context.Context, int, uint64) error { assigned.Add(1); return nil }
	m, err := e.startMember(ctx, cfg, func(ctx context.Context, _ int, batch []reader.Event) error {
		for len(batch) > 0 {
			n := min(len(batch), lim.Burst())
			if err := lim.WaitN(ctx, n); err != nil {
				return err
			}
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
	// group's consumers (reader.Lag, as `snipctl lag` and the console do).
	smp := e.newSampler(time.Second)
	var ageAlarmAt, countAlarmAt float64
	var countAtAgeAlarm float64
	start := time.Now()
	stopSampling := smp.start(ctx, func() {
		count, age := groupLag(ctx, js, "readers")
		lessonAge := e.Lesson(age)
		at := e.Lesson(time.Since(start))
		smp.add("backlog", "events", count)
		smp.add("oldest unread age", "s", lessonAge)
		if ageAlarmAt == 0 && lessonAge >= bpAgeAlarm {
			ageAlarmAt, countAtAgeAlarm = at, count
		}
		if countAlarmAt == 0 && count >= bpCountWarn {
			countAlarmAt = at
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

	// The readers' rate over the run: the pace is a ceiling, and on a
	// loaded machine the predictions use what they really did.
	out := e.LessonRate(float64(handledEnd) / end.Sub(start).Seconds())
	e.atMost("readers' rate (paced at 800)", "events/s", bpOut*1.05, out, "the pace is a ceiling; on a loaded machine the predictions below use the measured rate")
	e.note("the readers did %.0f/s in the run's first half", e.LessonRate(float64(handledHalf)/halfAt.Sub(start).Seconds()))
	if out < bpOut*0.97 {
		e.note("the readers ran at %.0f/s, not %.0f/s: the predictions use the measured rate", out, bpOut)
	} else {
		out = bpOut
	}
	// The producers are paced too: on a loaded machine their 30 s of
	// events may take longer to hand over.
	in := float64(total) / e.Lesson(end.Sub(start))
	if in < bpIn*0.97 {
		e.note("the producers managed %.0f/s, not %.0f/s: the predictions use the measured rate", in, bpIn)
	} else {
		in = bpIn
	}
	growth := in - out
	measuredGrowth := backlogEnd / e.Lesson(end.Sub(start))
	e.within("backlog growth", "events/s", growth, measuredGrowth, 0.2, 0, "arrivals minus handling; rates are timer-paced on a shared machine")
	e.within("backlog after an hour (from the measured growth)", "events", growth*3600, measuredGrowth*3600, 0.2, 0, "the same growth, an hour long: not run, multiplied")
	// FIFO: the oldest unread event at time t was produced at t*out/in,
	// so its age is t*(1 - out/in): were every event acked as soon as it
	// is handled, the alarm would fire at predAge, and it cannot fire later
	// (the oldest unacked event is at least as old as the oldest unread).
	// The reader acks per batch (up to bpBatch events of one partition), so
	// the oldest unacked event can be older by the time its batch takes to
	// handle: the alarm fires no earlier than when that sum reaches 5 s.
	predAge := bpAgeAlarm / (1 - out/in)
	earliest := earliestAgeAlarm(in, out, bpPartitions, bpBatch)
	late := "age grows at 1 - out/in seconds per second (+1: sampled once a lesson second)"
	early := fmt.Sprintf("a batch of up to %d events of a partition is acked when all are handled: the FIFO age plus its handling time (-1: sampled once a lesson second)", bpBatch)
	if steady := out >= 0.8*bpOut && in >= 0.8*bpIn; steady {
		e.atMost("age alarm (5 s) fires no later than the FIFO age says", "s", predAge+1, ageAlarmAt, late)
		e.atLeast("age alarm (5 s) fires no earlier than with full batches unacked", "s", earliest-1, ageAlarmAt, early)
	} else {
		// The bounds assume steady rates; a machine too loaded to keep 80%
		// of the lesson's pace makes them uneven, so the times are shown,
		// not judged (the exact rows below still are).
		e.info("age alarm (5 s) fires no later than the FIFO age says", "s", predAge+1, ageAlarmAt, late)
		e.info("age alarm (5 s) fires no earlier than with full batches unacked", "s", earliest-1, ageAlarmAt, early)
		e.note("the machine kept less than 80%% of the lesson's pace (readers %.0f/s, producers %.0f/s): the alarm times are shown, not judged", out, in)
	}
	e.info("backlog when the age alarm fires", "events", growth*ageAlarmAt, countAtAgeAlarm, "growth x the time it fired: the count looks small then (sampled once a lesson second)")
	alarmOrderChecks(e, growth, ageAlarmAt, countAlarmAt)

	// Part two, in real time at any speed: a big queue that drains fast and
	// a small one that does not move.
	e.say("a queue of 10,000 with a working reader, a queue of 100 with a stuck one")
	q, err := healthyVsStuck(ctx, e, js)
	if err != nil {
		return err
	}
	e.info("healthy queue of 10,000: drain time (real s)", "s", 2, q.healthyDrain.Seconds(), "how fast this machine's reader runs; the lesson's reader does 5,000/s")
	e.info("healthy queue: oldest unread age at most (real s)", "s", 2, q.healthyMaxAge.Seconds(), "about its drain time: under the 5 s age alarm wherever the reader drains 10,000 in under 5 s")
	e.atLeast("stuck queue of 100: oldest unread age after 10 s (real s)", "s", bpAgeAlarm, q.stuckAge.Seconds(), "the age alarm fires; a count alarm at 10,000 never would")
	e.exact("the stuck queue's age passes the healthy queue's worst", "bool", 1, b2f(q.stuckAge > q.healthyMaxAge), "age tells them apart")
	e.note("most events seen waiting: %.0f on the healthy queue (its reader reads while the 10,000 arrive; sampled once they are all published), %.0f on the stuck one: the count points at the healthy queue, the age at the stuck one", q.healthyMaxCount, q.stuckCount)
	return nil
}

// alarmOrderChecks judges when the count alarm fired and that the age alarm
// fired before it, from the lesson times the sampler saw each cross its
// threshold (0: it never did).
func alarmOrderChecks(e *Env, growth, ageAlarmAt, countAlarmAt float64) {
	countAt := bpCountWarn / growth
	fired := countAlarmAt
	if fired == 0 {
		fired = math.NaN()
	}
	e.within("count alarm (10,000) fires", "s", countAt, fired, 0.2, 1, "10,000 / the growth (+1: sampled once a lesson second; a little sooner, as the count includes the batches in hand); NaN: it never fired")
	lead := math.NaN()
	if ageAlarmAt > 0 && countAlarmAt > 0 {
		lead = countAlarmAt - ageAlarmAt
	}
	e.atLeast("count alarm's time minus the age alarm's", "s", 1, lead,
		fmt.Sprintf("both from the samples' timestamps: the age alarm first, by at least one sample (the FIFO age says by %.0f s); NaN: one never fired", countAt-bpAgeAlarm/(1-bpOut/bpIn)))
}

// groupLag sums a group's unhandled events and returns the oldest one's age.
func groupLag(ctx context.Context, js jetstream.JetStream, group string) (float64, time.Duration) {
	lag, err := reader.Lag(ctx, js, group)
	if err != nil {
		return 0, 0
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
		return n, 0
	}
	return n, time.Since(oldest)
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
	observe := func() {
		n, age := groupLag(ctx, js, "healthy")
		q.healthyMaxAge = max(q.healthyMaxAge, age)
		q.healthyMaxCount = max(q.healthyMaxCount, n)
	}
	for i := range 10_000 {
		if _, err := publishClick(pjs, newClick(links[i%len(links)], i)); err != nil {
			return q, err
		}
	}
	if err := waitPublished(ctx, pjs); err != nil {
		return q, err
	}
	err = waitFor(ctx, 60*time.Second, "the healthy queue to drain", func() (bool, error) {
		observe()
		return done.Load() >= 10_000, nil
	})
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
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return q, ctx.Err()
	case <-t.C:
	}
	q.stuckCount, q.stuckAge = groupLag(ctx, js, "stuck")
	return q, nil
}
