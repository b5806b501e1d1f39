package scenario

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
)

var rush = Scenario{
	Name:   "rush",
	Claim:  "a rush the reader cannot keep up with: a producer that buffers in memory dies and loses its buffer; with a log the writer does not notice, the backlog grows by the surplus and drains at the spare capacity",
	Needs:  "nats",
	Lesson: 60 * time.Second,
	run:    runRush,
}

// The lesson's numbers.
const (
	rushRate     = 400.0 // events/s arriving during the rush
	rushRead     = 250.0 // events/s the reader handles
	rushAfter    = 100.0 // events/s arriving after the rush
	rushSecs     = 20.0  // length of the rush
	rushAfterSec = 40.0  // observed after the rush
	eventBytes   = 1024  // size of one event in the naive producer's buffer
	budgetEvents = 2000  // the naive producer's memory budget, in events (2 MB)
	naiveWindow  = 4     // requests the naive producer has in flight at most
)

// rushStarvedStart, when above zero (a test sets it), is the log reader's
// pace in the rush's first half, as a machine busy then and not later
// gives it; from the half-way point the reader has its 250/s again.
// rushStarvedLate likewise is its pace from 10 s after the rush on.
// rushStarvedPartition, when above zero, is the most the partition of the
// rush's last event is handled at from the rush's end until that event
// is, as a machine whose scheduler starves that partition's worker gives
// it: the other partitions share the reader's pace meanwhile.
var rushStarvedStart, rushStarvedLate, rushStarvedPartition float64

// rushStopWhenMeasured, when set (the starved runs' tests set it), ends the
// stretch after the rush once every row's measurement is taken: the 10 s
// after the rush, the rush's last event handled, and the backlog caught
// up. Each row reads what was measured at those moments, so the rest of
// the lesson's 40 s would only lengthen the sparklines; a backlog not
// caught up still runs the whole stretch (the catch-up time's lower bound
// is its end).
var rushStopWhenMeasured bool

// errRushMeasured ends the stretch after the rush early (rushStopWhenMeasured).
var errRushMeasured = errors.New("every measurement taken")

const rushPartitions = 8

// rushLease is the log reader's lease: production's default, not the other
// lessons' 1 s. The rush's one member never leaves and nothing in it waits
// on a lease; but a lease lapses when no heartbeat is stored for its TTL,
// and a machine starved as the rush's tests starve it (a load of 10 and
// more on two cores, the race detector on) stalls the process past 1 s,
// which gave the partitions up and handed batches handled already again.
const rushLease = 3 * time.Second

func runRush(ctx context.Context, e *Env) error {
	if _, err := e.NATS(ctx, rushPartitions); err != nil {
		return err
	}
	surplus := rushRate - rushRead
	fill := budgetEvents / surplus
	backlog := surplus * rushSecs
	catchUp := backlog / (rushRead - rushAfter)
	lastWait := backlog / rushRead

	// Naive: the producer sends each event straight to the reader (a NATS
	// request the reader answers when it has handled it) and keeps what it
	// could not send yet in memory.
	nc, err := e.Conn("naive-reader")
	if err != nil {
		return err
	}
	naiveLimit := e.limiter(rushRead)
	var naiveHandled atomic.Int64
	sub, err := nc.Subscribe("lesson.naive", func(m *nats.Msg) {
		// A request carries a chunk of events; the reader handles them at its pace.
		k := min(max(1, len(m.Data)/eventBytes), naiveLimit.Burst())
		_ = naiveLimit.WaitN(ctx, k)
		naiveHandled.Add(int64(k))
		_ = m.Respond(nil)
	})
	if err != nil {
		return fmt.Errorf("naive reader: %w", err)
	}
	defer sub.Unsubscribe()
	pc, err := e.Conn("naive-producer")
	if err != nil {
		return err
	}
	naive := &naiveProducer{budget: budgetEvents * eventBytes, died: make(chan struct{}), chunk: naiveLimit.Burst(), handled: &naiveHandled}

	// Snip: the producer publishes to CLICKS; a click-counter-like group
	// (pkg/reader, one member) handles 250 events/s.
	var published, sent, handledHalf atomic.Int64
	// The rush's last event waits only for its own partition: one
	// worker per partition hands the handler batches of that partition,
	// in order, and the workers share the reader's pace. So the run also
	// counts the events of that partition handled.
	links := codes(50)
	rushN := int(rushRate * rushSecs)
	lg := &rushLog{
		lim:      e.limiter(rushRead),
		partLim:  e.limiter(max(rushStarvedPartition, 1)),
		lastPart: events.Partition(links[(rushN-1)%len(links)], rushPartitions),
		lastAt:   make(chan time.Time, 1),
	}
	lim, lastPart := lg.lim, lg.lastPart
	if rushStarvedStart > 0 {
		lim.SetLimit(rate.Limit(e.Rate(rushStarvedStart)))
	}
	var assigned atomic.Int64
	cfg := groupConfig("rush", "reader-1")
	cfg.LeaseTTL = rushLease
	reg := prometheus.NewRegistry()
	cfg.Metrics = reg
	cfg.OnAssign = func(context.Context, int, uint64) error { assigned.Add(1); return nil }
	m, err := e.startMember(ctx, cfg, lg.handle)
	if err != nil {
		return err
	}
	defer m.stop()
	// The reader is up before the rush starts.
	if err := waitFor(ctx, 30*time.Second, "the reader to own every partition", func() (bool, error) { return assigned.Load() == 8, nil }); err != nil {
		return err
	}

	pjs, err := e.Connect("producer")
	if err != nil {
		return err
	}
	lat := &latencies{}
	futures := make(chan pubFuture, 100_000)
	var acks sync.WaitGroup
	acks.Go(func() {
		for f := range futures {
			select {
			case <-f.f.Ok():
				published.Add(1)
				lat.add(f.phase, time.Since(f.sent))
			case err := <-f.f.Err():
				e.note("publish failed: %v", err)
			}
		}
	})

	smp := e.newSampler(500 * time.Millisecond)
	stopSampling := smp.start(ctx, func() {
		smp.add("log backlog", "events", float64(sent.Load()-lg.handled.count()))
		smp.add("naive buffer", "KB", float64(naive.bytes())/1024)
	})
	defer stopSampling()

	var naiveDone sync.WaitGroup
	naiveDone.Go(func() { naive.send(ctx, pc) })

	e.say("rush: %g events/s for %g s (lesson time), reader %g/s", rushRate, rushSecs, rushRead)
	start := time.Now()
	sentOnLast := 0 // the rush's events on the last one's partition
	rushSent, err := emit(ctx, e.Rate(rushRate), e.Real(time.Duration(rushSecs*float64(time.Second))), func(i int) error {
		naive.add(start)
		c := newClick(links[i%len(links)], i)
		if i == rushN-1 {
			lg.lastID.Store(c.ID)
		}
		if events.Partition(c.Code, rushPartitions) == lastPart {
			sentOnLast++
		}
		f, err := publishClick(pjs, c)
		if err != nil {
			return err
		}
		phase := 0
		if i >= rushN*3/4 {
			phase = 2
		} else if i < rushN/4 {
			phase = 1
		}
		futures <- pubFuture{f: f, sent: time.Now(), phase: phase}
		if i == rushN/2 {
			handledHalf.Store(lg.handled.count())
			if rushStarvedStart > 0 {
				lim.SetLimit(rate.Limit(e.Rate(rushRead)))
			}
		}
		sent.Add(1)
		return nil
	})
	if err != nil {
		close(futures)
		return err
	}
	rushEnd := time.Now()
	handledInRush := lg.handled.count()
	handledOnLastInRush := lg.onLast.count()
	if rushStarvedPartition > 0 && lg.atLast.Load() == 0 {
		lg.starvePart.Store(true)
	}
	backlogAtEnd := float64(int64(rushN) - handledInRush)
	e.say("after the rush: %g events/s for %g s", rushAfter, rushAfterSec)
	var caughtUp time.Duration
	var backlog10, handled10 float64
	var at10 time.Duration                  // when they were read, from the rush's end
	var sentAfter10 int64                   // events sent after the rush by then
	var handledCaughtUp, sentCaughtUp int64 // events handled by then; sent after the rush by then
	afterStart := time.Now()
	_, err = emit(ctx, e.Rate(rushAfter), e.Real(time.Duration(rushAfterSec*float64(time.Second))), func(i int) error {
		naive.add(start)
		f, err := publishClick(pjs, newClick(links[i%len(links)], rushN+i))
		if err != nil {
			return err
		}
		futures <- pubFuture{f: f, sent: time.Now()}
		since := time.Since(rushEnd)
		sent.Add(1)
		if handled10 == 0 && since >= e.Real(10*time.Second) {
			h := lg.handled.count()
			handled10, backlog10 = float64(h), float64(sent.Load()-h)
			at10, sentAfter10 = since, sent.Load()-int64(rushSent)
			if rushStarvedLate > 0 {
				lim.SetLimit(rate.Limit(e.Rate(rushStarvedLate)))
			}
		}
		if h := lg.handled.count(); caughtUp == 0 && sent.Load()-h <= int64(backlog*0.02) && time.Since(afterStart) > e.Real(time.Second) {
			caughtUp, handledCaughtUp, sentCaughtUp = since, h, sent.Load()-int64(rushSent)
		}
		if rushStopWhenMeasured && handled10 > 0 && caughtUp > 0 && lg.atLast.Load() > 0 {
			return errRushMeasured
		}
		return nil
	})
	if errors.Is(err, errRushMeasured) {
		err = nil
	}
	// The watched stretch ends: a backlog not drained by now gives the
	// catch-up time's lower bound, with the events handled and sent until now.
	watchEnd, handledAtWatchEnd, sentAtWatchEnd := time.Since(rushEnd), lg.handled.count(), sent.Load()-int64(rushSent)
	close(futures)
	acks.Wait()
	stopSampling()
	smp.flush()
	if err != nil {
		return err
	}
	naive.stop()
	naiveDone.Wait()

	// Counted before the last event is looked for: were it not handled
	// by then, it was not when they were counted, and they are the events
	// ahead of it only.
	onPartAtRunEnd := lg.onLast.count()
	var lastAt time.Time
	select {
	case lastAt = <-lg.lastAt:
	default:
	}
	diedAt, accepted := naive.death()
	// Lost: what the producer accepted and the reader never handled,
	// counted at the reader once everything in flight has arrived.
	lost := accepted - int(naiveHandled.Load())
	const pacing = "rates are paced by timers on a shared machine"
	// The readers are paced at 250/s, but a loaded machine may give them
	// less, and not evenly: busy early in the rush and idle later, or the
	// other way round. The backlog at the rush's end is judged with the
	// log reader's rate measured over the whole rush, the stretch it is
	// about, so the reader's pace, whatever the machine made of it, cannot
	// fail a correct system; the rate itself is checked only as a ceiling.
	logRead := e.LessonRate(float64(handledInRush) / rushEnd.Sub(start).Seconds())
	e.atMost("log reader's rate during the rush (paced at 250)", "events/s", rushRead*1.05, logRead, "the pace is a ceiling; a loaded machine may give the reader less, and the backlog below then uses the measured rate")
	if logRead < rushRead*0.97 {
		e.note("the log reader ran at %.0f/s over the rush (%.0f/s in its first half), not %.0f/s: the backlog uses the measured rate", logRead, e.LessonRate(float64(handledHalf.Load())/e.Real(time.Duration(rushSecs/2*float64(time.Second))).Seconds()), rushRead)
	} else {
		logRead = rushRead
	}
	if diedAt > 0 {
		naiveRead := min(rushRead, naive.sentRate(e))
		if naiveRead < rushRead*0.97 {
			e.note("the naive reader ran at %.0f/s, not %.0f/s: its predictions use the measured rate", naiveRead, rushRead)
		} else {
			naiveRead = rushRead
		}
		// The buffer grows by what arrives less what its reader takes,
		// over the stretch until it died: the lesson's 400/s must have
		// arrived over that stretch, which a writer the machine starved
		// early in the rush (and that sends the rest in a burst later)
		// does not do, whatever its rate over the whole rush.
		arrived := e.LessonRate(float64(accepted+1) / diedAt.Seconds()) // the one that did not fit arrived too
		e.within("arrival rate until the naive producer died (premise)", "events/s", rushRate, arrived, 0.1, 0, "the events offered to the naive producer until its buffer passed the budget: its growth is their surplus over its reader")
		e.premise()
		growth := rushRate - naiveRead
		e.within("naive: buffer growth", "KB/s", growth*eventBytes/1024, float64(budgetEvents*eventBytes/1024)/e.Lesson(diedAt), 0.2, 0, pacing)
		e.needsPremise()
		e.within("naive: time to fill the 2 MB budget", "s", budgetEvents/growth, e.Lesson(diedAt), 0.2, 0, pacing)
		e.needsPremise()
		e.atLeast("naive: events lost when it died (never reached the reader)", "events", float64(budgetEvents-naiveWindow*naive.chunk), float64(lost),
			fmt.Sprintf("the buffer dies with the process: its %d events, less the requests in flight (at most %d of %d), which the reader still gets", budgetEvents, naiveWindow, naive.chunk))
	} else {
		e.exact("naive: died at its memory budget", "bool", 1, 0, "it should have")
		e.needsPremise() // a writer the machine starved offers less than the surplus that fills it
	}
	_ = fill
	// The arrival rates are the lesson's premise, what the run sets up,
	// not its findings: a writer the machine starved ran another
	// experiment, and the rows that need the premise are then not judged.
	e.within("arrival rate during the rush (premise)", "events/s", rushRate, float64(rushSent)/e.Lesson(rushEnd.Sub(start)), 0.1, 0, "published on a 5 ms ticker; the surplus over the reader's 250 is what fills the backlog")
	e.premise()
	// The backlog grows by the surplus: the lesson's 400/s for the
	// lesson's 20 s, less the reader's rate over the same 20 s. With the
	// reader's rate measured, what this row still checks is the writer's
	// side: that the rush went into the log on the lesson's clock while
	// the backlog grew. A writer held back towards the reader's pace (the
	// naive producer's window, or a log that pushed back) takes longer to
	// send the rush and leaves a backlog smaller than predicted; a writer
	// the machine starved fails it too, as it fails the arrival rate.
	backlog = (rushRate - logRead) * rushSecs
	e.within("log: backlog when the rush ends", "events", backlog, backlogAtEnd, 0.2, 0, "the surplus over the 20 s, with the reader's rate measured over them")
	e.needsPremise()
	// After the rush the reader may run at another pace than during it,
	// and change pace as it drains, on a loaded machine: each drain
	// prediction uses the reader's rate measured over the stretch it is
	// about (its first 10 s; until the rush's last event; until caught up).
	readRate := func(n int64, d time.Duration) float64 {
		r := e.LessonRate(float64(n) / d.Seconds())
		if r >= rushRead*0.97 {
			return rushRead
		}
		return r
	}
	after := logRead
	if handled10 > 0 {
		after = readRate(int64(handled10)-handledInRush, at10)
	}
	if !lastAt.IsZero() {
		rushLastWaitCheck(e, rushLast{
			partition: lastPart, rushEvents: rushSent, sentOnPart: sentOnLast,
			onPartAtEnd: handledOnLastInRush, onPartAtLast: lg.onPartAtLast.Load(),
			atEnd: handledInRush, atLast: lg.atLast.Load(),
			wait: lastAt.Sub(rushEnd),
		})
	} else {
		// The lesson needs the reader to reach the rush's last event while
		// it watches: a reader the machine starved below that did not set
		// the experiment up. But its partition is read in order, so until
		// the event is handled, fewer than the events ahead of it were:
		// as many or more is the event lost or overtaken, a finding.
		e.exact("log: rush's last event handled before the run ended (premise)", "bool", 1, 0, "the run ended first: its partition's reader was too slow for the 40 s watched")
		e.premise()
		e.atMost("log: its partition's events handled since the rush's end, the last one not among them", "events",
			float64(int64(sentOnLast)-handledOnLastInRush-1), float64(onPartAtRunEnd-handledOnLastInRush),
			"fewer than those ahead of it: the partition is read in order")
	}
	// The drain is the reader's rate less the arrivals: the lesson's
	// 100/s over the same stretch are its premise, which a writer the
	// machine starved after the rush (its acks seconds late) does not
	// offer. The stretch is the first 10 s, to when they were read.
	drained := 0.0
	if at10 > 0 {
		e.within("arrival rate in the first 10 s after the rush (premise)", "events/s", rushAfter, e.LessonRate(float64(sentAfter10)/at10.Seconds()), 0.1, 0, "published on a 5 ms ticker; what keeps arriving while the backlog drains")
		e.premise()
		drained = (backlogAtEnd - backlog10) / e.Lesson(at10)
	}
	e.within("log: drain rate after the rush", "events/s", after-rushAfter, drained, 0.25, 0, "spare capacity, not the reader's full rate: 100/s keep arriving")
	e.needsPremise()
	if after < rushRead {
		e.note("in the first 10 s after the rush the log reader ran at %.0f/s: the drain rate is predicted at that rate", after)
	}
	// With the rate measured until caught up, the row checks that the
	// backlog drained at the spare capacity while the 100/s kept
	// arriving, which over the same stretch are its premise. Not caught up
	// when the run ended, the time is only known to be longer.
	c := rushCatchUp{backlog: backlogAtEnd, caughtUp: caughtUp > 0}
	if !c.caughtUp {
		caughtUp, handledCaughtUp, sentCaughtUp = watchEnd, handledAtWatchEnd, sentAtWatchEnd
	}
	c.rate, c.took = readRate(handledCaughtUp-handledInRush, caughtUp), e.Lesson(caughtUp)
	c.arrivals = e.LessonRate(float64(sentCaughtUp) / caughtUp.Seconds())
	rushCatchUpCheck(e, c)
	_, _ = catchUp, lastWait
	e.exact("log: writes the writer lost or had refused", "events", 0, float64(sent.Load()-published.Load()), "JetStream stores whatever the reader's pace")
	lapses, err := counterTotal(reg, "snip_reader_lease_lapses_total")
	if err != nil {
		return err
	}
	gaps, err := counterTotal(reg, "snip_reader_delivery_gaps_total")
	if err != nil {
		return err
	}
	// A gap is a fetch the client gave up on (1 s after the pull's expiry,
	// fixed by nats.go) while its deliveries were on their way: a process
	// stalled that long loses them, whatever the lesson's settings, and the
	// reader goes on after the last event handled, so nothing is lost (or
	// handled again, unless that batch's ack was lost too). A lapse gives
	// the partitions up and hands the batch in hand again: the counts
	// above are of events, each once (rushLog.handled), so they do not
	// include it twice.
	e.note("the log reader's lease lapsed %.0f times (%s lease) and %.0f fetches lost deliveries on their way (gaps, read again from after the last event handled)", lapses, rushLease, gaps)
	p1, p2 := lat.median(1), lat.median(2)
	e.note("writer p50 ack latency: %s in the first quarter of the rush, %s in its last (the backlog does not slow the writer; on a loaded machine both move with the load)",
		p1.Round(time.Microsecond), p2.Round(time.Microsecond))
	return nil
}

// rushLog is the lesson's log reader: its pace, and what it counts of the
// events it handles.
type rushLog struct {
	lim        *rate.Limiter // the reader's pace
	partLim    *rate.Limiter // the starved partition's, while starvePart
	lastPart   int           // the partition of the rush's last event
	starvePart atomic.Bool   // from the rush's end until its last event is handled
	lastID     atomic.Value  // the rush's last event's ID, once sent
	// handled counts the events handled, each once: a batch handed again
	// (abandoned when the lease may have lapsed) comes with events
	// handled already, and counted per handing they would be counted
	// twice, in the backlog (sent less handled) and in the reader's rates.
	handled distinctCount
	onLast  distinct // the events of lastPart handled, each once
	// The events handled (in all; of its partition) when the rush's last
	// one was, and when it was (once).
	atLast, onPartAtLast atomic.Int64
	lastAt               chan time.Time
}

// handle is the reader's handler: it hands the batch on at the reader's
// pace and counts what it handled.
func (r *rushLog) handle(ctx context.Context, p int, batch []reader.Event) error {
	for len(batch) > 0 {
		n := min(len(batch), r.lim.Burst())
		if p == r.lastPart && r.starvePart.Load() {
			n = min(n, r.partLim.Burst())
			if err := r.partLim.WaitN(ctx, n); err != nil {
				return err
			}
		}
		if err := r.lim.WaitN(ctx, n); err != nil {
			return err
		}
		for _, ev := range batch[:n] {
			if p == r.lastPart {
				r.onLast.add(ev.Click.ID)
			}
			r.handled.add(ev.Click.ID)
			if id, ok := r.lastID.Load().(string); ok && id == ev.Click.ID {
				// Kept once, before the run is told it was handled.
				if r.atLast.CompareAndSwap(0, r.handled.count()) {
					r.onPartAtLast.Store(r.onLast.count())
					r.starvePart.Store(false)
				}
				select { // once: a redelivery must not block the handler
				case r.lastAt <- time.Now():
				default:
				}
			}
		}
		batch = batch[n:]
	}
	return nil
}

// rushCatchUp is what the run saw of the backlog's drain after the rush:
// the events left at the rush's end, whether the backlog drained (under 2%
// of the lesson's peak) before the run ended, the lesson seconds from the
// rush's end until it did (or until the run ended: a lower bound), and the
// log reader's rate and the arrival rate over those seconds.
type rushCatchUp struct {
	backlog  float64
	caughtUp bool
	took     float64
	rate     float64
	arrivals float64
}

// rushCatchUpCheck judges the catch-up time: the backlog at the rush's end
// at the reader's rate less the 100/s still arriving. Those 100/s over the
// same stretch are the row's premise: a writer the machine starved after
// the rush offers fewer, the backlog then drains sooner than the lesson
// says, and the row is not judged (with the arrivals measured in the
// formula instead, the row would only restate its own measurements: the
// backlog drained is what was handled less what arrived). A reader no faster
// than the arrivals never drains it: the prediction is then never (+Inf),
// which a backlog that drained contradicts. A backlog that had not drained
// when the run ended gives a lower bound, not a time: the row then checks
// that the prediction is no earlier than that bound, within the tolerance,
// rather than comparing the bound as if it were the catch-up time.
func rushCatchUpCheck(e *Env, c rushCatchUp) {
	const name = "log: catch-up time"
	predicted := math.Inf(1)
	if spare := c.rate - rushAfter; spare > 0 {
		predicted = c.backlog / spare
	}
	const rel, abs = 0.25, 1.0
	why := "rates are paced by timers on a shared machine; the reader's rate until caught up less the 100/s arriving (never, at or below them); caught up = backlog under 2% of its peak"
	if c.rate < rushRead {
		e.note("until caught up the log reader ran at %.0f/s: the catch-up time is predicted at that rate", c.rate)
	}
	e.within("arrival rate from the rush's end until caught up (premise)", "events/s", rushAfter, c.arrivals, 0.1, 0,
		"published on a 5 ms ticker; what keeps arriving while the backlog drains, over the stretch the catch-up time is about (to the run's end, if not caught up)")
	e.premise()
	if c.caughtUp {
		e.within(name, "s", predicted, c.took, rel, abs, why)
		e.needsPremise()
		return
	}
	e.note("the backlog had not drained when the run ended, %.1f s after the rush: the catch-up time measured is a lower bound", c.took)
	e.res.Checks = append(e.res.Checks, Check{
		Name: name, Unit: "s", Predicted: predicted, Measured: c.took,
		Tolerance: fmt.Sprintf("≥ measured -%.0f%% -%g", rel*100, abs),
		Why:       why + "; not caught up when the run ended: the measured time is a lower bound, which the prediction must not fall short of",
		OK:        c.took <= predicted*(1+rel)+abs,
	})
	e.needsPremise()
}

// rushLast is what the run saw of the rush's last event: the events handled
// (in all; of its partition, each once) at the rush's end and when it was
// handled, the rush's events (in all; on its partition), and its wait.
type rushLast struct {
	partition                 int
	rushEvents, sentOnPart    int // the rush's events, in all and on its partition
	onPartAtEnd, onPartAtLast int64
	atEnd, atLast             int64
	wait                      time.Duration // from the rush's end
}

// rushLastWaitCheck judges the wait for the rush's last event. The events
// ahead of it are those of its own partition: each partition is read in
// order by its own worker (pkg/reader), and the workers share the reader's
// pace, so the reader hands other partitions' events, later arrivals among
// them, in between. How the pace is shared is the machine's: a partition
// with more of the rush's links has more backlog, and a worker the
// scheduler starves comes back to the pace less often. So the wait is
// predicted with the partition's backlog at the rush's end and the rate
// that partition drained at until then (its events handled, each once, per
// second), and the row checks the rest of the formula, as the other drain
// rows do: the events ahead of it in its partition went first, and none
// behind it did (a later event of the partition handled before it drains
// the partition faster than the wait shows; one ahead of it left for
// after, slower). The group's backlog at the group's rate is only a note:
// it holds where every partition drains in step.
func rushLastWaitCheck(e *Env, l rushLast) {
	backlog := float64(int64(l.sentOnPart) - l.onPartAtEnd)
	drained := e.LessonRate(float64(l.onPartAtLast-l.onPartAtEnd) / l.wait.Seconds())
	predicted := math.Inf(1)
	if drained > 0 {
		predicted = backlog / drained
	}
	e.within("log: wait for the rush's last event", "s", predicted, e.Lesson(l.wait), 0.25, 0.5,
		"its partition's backlog at the rush's end, at the rate that partition drained until then: the events ahead of it in its partition go first")
	all := e.LessonRate(float64(l.atLast-l.atEnd) / l.wait.Seconds())
	groupBacklog := float64(int64(l.rushEvents) - l.atEnd)
	e.note("until the rush's last event the log reader handled %d events (%.0f/s), %d on its partition %d (%.0f/s), which held %.0f of the %.0f left at the rush's end; the whole backlog at the reader's rate would be %.1f s, right only where every partition drains in step",
		l.atLast-l.atEnd, all, l.onPartAtLast-l.onPartAtEnd, l.partition, drained, backlog, groupBacklog, groupBacklog/all)
}

// distinct counts events by ID, each once.
type distinct struct {
	mu   sync.Mutex
	seen map[string]struct{}
}

// add records id and reports whether it is new.
func (d *distinct) add(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.seen == nil {
		d.seen = map[string]struct{}{}
	}
	if _, ok := d.seen[id]; ok {
		return false
	}
	d.seen[strings.Clone(id)] = struct{}{} // not the batch's payload memory (reader.Event)
	return true
}

func (d *distinct) count() int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return int64(len(d.seen))
}

// distinctCount counts events by ID, each once, with a count that is read
// without the lock (the sampler and the writer read it as it runs).
type distinctCount struct {
	seen distinct
	n    atomic.Int64
}

func (d *distinctCount) add(id string) {
	if d.seen.add(id) {
		d.n.Add(1)
	}
}

func (d *distinctCount) count() int64 { return d.n.Load() }

type pubFuture struct {
	f     jetstream.PubAckFuture
	sent  time.Time
	phase int // 1: first quarter of the rush, 2: last quarter
}

type latencies struct {
	mu sync.Mutex
	v  [3][]time.Duration
}

func (l *latencies) add(phase int, d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.v[phase] = append(l.v[phase], d)
}

func (l *latencies) median(phase int) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	v := slices.Clone(l.v[phase])
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	return v[len(v)/2]
}

// naiveProducer holds unsent events in memory and sends them one at a time;
// it dies when the buffer passes its budget.
type naiveProducer struct {
	mu       sync.Mutex
	buf      [][]byte
	size     int
	budget   int
	dead     bool
	diedAt   time.Duration
	accepted int // events it took into its buffer before it died
	died     chan struct{}
	stopped  atomic.Bool
	sent     int
	chunk    int
	handled  *atomic.Int64 // events the naive reader handled
	atDeath  int64         // ... when the producer died
}

func (n *naiveProducer) add(start time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.dead {
		return
	}
	n.buf = append(n.buf, make([]byte, eventBytes))
	n.size += eventBytes
	if n.size > n.budget {
		n.dead = true
		n.diedAt = time.Since(start)
		n.atDeath = n.handled.Load()
		n.buf, n.size = nil, 0
		close(n.died)
		return // the event that did not fit was never kept
	}
	n.accepted++
}

func (n *naiveProducer) bytes() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.size
}

func (n *naiveProducer) death() (time.Duration, int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.diedAt, n.accepted
}

func (n *naiveProducer) stop() { n.stopped.Store(true) }

// sentRate is the rate (lesson time) at which the naive producer got events
// to its reader before it died.
func (n *naiveProducer) sentRate(e *Env) float64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.diedAt == 0 {
		return 0
	}
	return e.LessonRate(float64(n.atDeath) / n.diedAt.Seconds())
}

// send delivers the buffer to the reader in chunks, a few requests in
// flight; an event stays in memory until the reader has answered for it.
func (n *naiveProducer) send(ctx context.Context, nc *nats.Conn) {
	window := make(chan struct{}, naiveWindow)
	var wg sync.WaitGroup
	defer wg.Wait()
	next := 0
	for ctx.Err() == nil && !n.stopped.Load() {
		n.mu.Lock()
		if n.dead {
			n.mu.Unlock()
			return
		}
		k := min(n.chunk, len(n.buf)-next)
		if k > 0 {
			clear(n.buf[next : next+k]) // the request holds them now
			next += k
		}
		n.mu.Unlock()
		if k == 0 {
			time.Sleep(time.Millisecond)
			continue
		}
		select {
		case window <- struct{}{}:
		case <-ctx.Done():
			return
		}
		n.mu.Lock()
		dead := n.dead
		n.mu.Unlock()
		if dead { // it died while this chunk waited for room: nothing more is sent
			return
		}
		wg.Go(func() {
			defer func() { <-window }()
			if _, err := nc.RequestWithContext(ctx, "lesson.naive", make([]byte, k*eventBytes)); err != nil {
				return
			}
			n.mu.Lock()
			defer n.mu.Unlock()
			if !n.dead {
				n.sent += k
				n.size -= k * eventBytes
			}
		})
	}
}
