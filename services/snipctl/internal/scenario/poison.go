package scenario

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/deadletter"
	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
)

var poison = Scenario{
	Name:   "poison",
	Claim:  "one event that always fails stalls its partition under a reader that retries forever; Snip's reader retries with backoff, parks it on DEAD_LETTER with the reason, moves on, and a redrive after the fix delivers it once",
	Needs:  "nats",
	Lesson: 10 * time.Second,
	run:    runPoison,
}

const (
	poisonPartitions = 4
	poisonRate       = 200.0 // clicks/s over 40 links
	poisonSecs       = 10.0  // traffic after the poison event
	poisonTries      = 5     // Snip's handler gives up after this many tries
	poisonCode       = "poisoned"
)

var errBadTarget = errors.New("target cannot be parsed")

func runPoison(ctx context.Context, e *Env) error {
	js, err := e.NATS(ctx, poisonPartitions)
	if err != nil {
		return err
	}
	poisoned := events.Partition(poisonCode, poisonPartitions)
	var fixed atomic.Bool
	var mu sync.Mutex
	tries := []time.Time{}            // Snip's tries of the poison event
	handledPoison := map[string]int{} // group -> times the poison event was handled
	handled := map[string]int{}

	// The naive reader retries a failing event forever: the runtime retries
	// the batch (a transient error) and nothing behind it in the partition
	// moves.
	naive, err := e.startMember(ctx, groupConfig("naive", "naive-1"), func(_ context.Context, _ int, batch []reader.Event) error {
		for _, ev := range batch {
			if ev.Click.Code == poisonCode {
				return fmt.Errorf("handle click %s: %w", ev.Click.ID, errBadTarget)
			}
		}
		mu.Lock()
		handled["naive"] += len(batch)
		mu.Unlock()
		return nil
	})
	if err != nil {
		return err
	}
	defer naive.stop()
	// Snip's reader tries the event a few times (the runtime backs off
	// between tries), then returns reader.Poison: the runtime parks it on
	// DEAD_LETTER as dead.snip.bad_target and the partition moves on.
	snip, err := e.startMember(ctx, groupConfig("snip", "snip-1"), func(_ context.Context, _ int, batch []reader.Event) error {
		mu.Lock()
		defer mu.Unlock()
		for i, ev := range batch {
			if ev.Click.Code == poisonCode {
				if !fixed.Load() {
					tries = append(tries, time.Now())
					handled["snip"] += i
					if len(tries) < poisonTries {
						return fmt.Errorf("handle click %s: %w", ev.Click.ID, errBadTarget)
					}
					return reader.Poison(i, "bad_target", fmt.Errorf("handle click %s: %w", ev.Click.ID, errBadTarget))
				}
				handledPoison["snip"]++
			}
		}
		handled["snip"] += len(batch)
		return nil
	})
	if err != nil {
		return err
	}
	defer snip.stop()

	pjs, err := e.Connect("producer")
	if err != nil {
		return err
	}
	links := codes(40)
	perPartition := make([]int, poisonPartitions)
	e.say("the poison event goes to partition %d; then %g clicks/s for %g s", poisoned, poisonRate, poisonSecs)
	bad := newClick(poisonCode, 0)
	f, err := publishClick(pjs, bad)
	if err != nil {
		return err
	}
	var badSeq uint64
	select {
	case ack := <-f.Ok():
		badSeq = ack.Sequence
	case err := <-f.Err():
		return fmt.Errorf("publish the poison event: %w", err)
	case <-ctx.Done():
		return ctx.Err()
	}
	poisonedAt := time.Now()
	alarm := &alarmWatch{js: js}
	smp := e.newSampler(500 * time.Millisecond)
	// A sample whose read failed is left out of its series rather than
	// drawn as an empty queue; a note counts them.
	var samples, failedSamples int
	var sampleErr error
	sample := func(group string) {
		samples++
		s, o, err := poisonLag(ctx, js, group, poisoned)
		if err != nil {
			failedSamples++
			sampleErr = err
			return
		}
		smp.add(group+": poisoned partition lag", "events", s)
		smp.add(group+": other partitions lag", "events", o)
	}
	stopSampling := smp.start(ctx, func() {
		next := time.Now().Add(e.Real(smp.step)) // the next tick's
		sample("naive")
		sample("snip")
		alarm.sample(ctx, next)
	})
	defer stopSampling()
	_, err = emit(ctx, e.Rate(poisonRate), e.Real(time.Duration(poisonSecs*float64(time.Second))), func(i int) error {
		c := newClick(links[i%len(links)], i/len(links))
		perPartition[events.Partition(c.Code, poisonPartitions)]++
		_, err := publishClick(pjs, c)
		return err
	})
	if err != nil {
		return err
	}
	if err := waitPublished(ctx, pjs); err != nil {
		return err
	}
	total := 0
	for _, n := range perPartition {
		total += n
	}
	// Snip's group has everything but the poison event.
	if err := waitFor(ctx, 60*time.Second, "snip's group to handle every other click", func() (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		return handled["snip"] >= total, nil
	}); err != nil {
		return err
	}
	// The naive group has everything outside the poisoned partition.
	if err := waitHealthyPartitions(ctx, js, "naive", poisoned, 60*time.Second); err != nil {
		return err
	}
	stopSampling()
	smp.flush()
	if failedSamples > 0 {
		e.note("%d of %d lag samples failed to read and are left out of the series (the last: %v)", failedSamples, samples, sampleErr)
	}
	// The checks read the lag once more; a read that keeps failing ends the
	// lesson with its error rather than checking a zero it did not read.
	var naiveStalled, naiveOthers, snipStalled float64
	if err := waitFor(ctx, 30*time.Second, "the groups' lag", func() (bool, error) {
		var err error
		if naiveStalled, naiveOthers, err = poisonLag(ctx, js, "naive", poisoned); err != nil {
			return false, err
		}
		if snipStalled, _, err = poisonLag(ctx, js, "snip", poisoned); err != nil {
			return false, err
		}
		return true, nil
	}); err != nil {
		return err
	}
	e.atLeast("naive: lag of the poisoned partition", "events", float64(perPartition[poisoned]+1), naiveStalled,
		"everything published there since the poison event (a few before it, fetched in the same batch, count too)")
	e.exact("naive: lag of the other partitions", "events", 0, naiveOthers, "only the poison event's partition stalls")
	e.exact("snip: lag of the poisoned partition", "events", 0, snipStalled, "the poison event was parked and the partition moved on")
	mu.Lock()
	seen := poisonSeen{calls: len(tries), seq: badSeq}
	var gaps []string
	for i := 1; i < len(tries); i++ {
		gaps = append(gaps, tries[i].Sub(tries[i-1]).Round(10*time.Millisecond).String())
	}
	if len(tries) > 0 {
		seen.firstTry = tries[0]
	}
	mu.Unlock()

	// The alarm: DEAD_LETTER has a letter, with its reason.
	groups, err := listLetters(ctx, js, 30*time.Second)
	if err != nil {
		return err
	}
	var letter deadletter.Letter
	for _, g := range groups {
		seen.parked += int(g.Count)
		if g.Source == "snip" && g.Reason == "bad_target" {
			letter = g.Newest
		}
	}
	seen.letter = letter
	seen.id = bad.ID
	poisonChecks(e, seen)
	e.note("snip retried after %v (the reader runtime's backoff: 100 ms doubling, ±30%% jitter, capped; preview jobs use 1, 2, 4, 8 s). Real time: the runtime's backoff is not scaled by --speed", gaps)
	if !alarm.firedAt.IsZero() {
		when := alarm.firedAt.Sub(poisonedAt).Round(10 * time.Millisecond).String()
		if alarm.failedSinceQuiet {
			// The reads between the last that found it empty and the one
			// that found the letter failed: it fired somewhere between.
			since := poisonedAt
			if !alarm.quietAt.IsZero() {
				since = alarm.quietAt
			}
			when = fmt.Sprintf("between %s and %s", since.Sub(poisonedAt).Round(10*time.Millisecond), when)
		}
		e.note("the alarm (DEAD_LETTER not empty) fired %s after the poison event was published; the letter, on %s, says: %q",
			when, letter.Subject, letter.Error)
	}
	if alarm.failed > 0 {
		e.note("%d reads of DEAD_LETTER for the alarm failed and were made again (the last: %v)", alarm.failed, alarm.lastErr)
	}
	e.exact("alarm fired", "bool", 1, b2f(!alarm.firedAt.IsZero()), "the console and the metrics alarm on a non-empty DEAD_LETTER")

	// The fix ships; the dead letter is redriven; Snip's group handles it once.
	fixed.Store(true)
	if letter.Seq == 0 {
		return fmt.Errorf("no dead letter from group snip")
	}
	if _, err := deadletter.Redrive(ctx, js, letter.Seq); err != nil {
		return err
	}
	if err := waitFor(ctx, 30*time.Second, "the redriven event", func() (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		return handledPoison["snip"] >= 1, nil
	}); err != nil {
		return err
	}
	// Until the group has acknowledged it and has nothing else in flight:
	// a second delivery, if there were one, would be pending until then.
	if err := waitGroupIdle(ctx, js, "snip", poisonPartitions, 30*time.Second); err != nil {
		return err
	}
	mu.Lock()
	once := handledPoison["snip"]
	mu.Unlock()
	e.exact("snip: redriven event handled", "times", 1, float64(once), "redrive publishes it once (its own Nats-Msg-Id) and deletes the letter after the ack")
	left, err := listLetters(ctx, js, 30*time.Second)
	if err != nil {
		return err
	}
	e.exact("dead letters after the redrive", "letters", 0, float64(len(left)), "the letter is deleted once CLICKS acked the redrive")
	return nil
}

// alarmWatch watches for the alarm the console and the metrics raise:
// DEAD_LETTER not empty. The poison lesson samples it with the lags.
type alarmWatch struct {
	js      jetstream.JetStream
	firedAt time.Time // the read that first found a letter
	quietAt time.Time // the last read that found none (zero: none did)
	// failedSinceQuiet is whether a read failed after quietAt: the alarm
	// may have fired at any time after quietAt, not only at firedAt.
	failedSinceQuiet bool
	failed           int // reads that failed
	lastErr          error
}

// sample reads DEAD_LETTER once the alarm has not yet fired. A read that
// fails (on a loaded machine a request can time out) is made again until
// one is read or until passes (the next sample's time): dropped, it would
// have the alarm found a sample late. One that keeps failing is counted,
// and the alarm's time then says it is known only since quietAt.
func (a *alarmWatch) sample(ctx context.Context, until time.Time) {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for a.firedAt.IsZero() {
		g, err := deadletter.List(ctx, a.js)
		if err == nil {
			if len(g) > 0 {
				a.firedAt = time.Now()
			} else {
				a.quietAt, a.failedSinceQuiet = time.Now(), false
			}
			return
		}
		a.failed++
		a.lastErr, a.failedSinceQuiet = err, true
		if time.Now().After(until) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// listLetters lists DEAD_LETTER's groups, reading again when a read fails,
// and ends with the read's error only after timeout.
func listLetters(ctx context.Context, js jetstream.JetStream, timeout time.Duration) ([]deadletter.Group, error) {
	var groups []deadletter.Group
	err := waitFor(ctx, timeout, "the dead letters", func() (bool, error) {
		var err error
		groups, err = deadletter.List(ctx, js)
		return err == nil, err
	})
	return groups, err
}

// poisonLag sums a group's unhandled events on the poisoned partition and on
// the others. A read that fails, or one that finds a partition without its
// consumer (reader.Lag leaves it out), is an error, not a lag of zero.
func poisonLag(ctx context.Context, js jetstream.JetStream, group string, poisoned int) (stalled, others float64, err error) {
	lag, err := reader.Lag(ctx, js, group)
	if err != nil {
		return 0, 0, err
	}
	if len(lag) != poisonPartitions {
		return 0, 0, fmt.Errorf("lag of %s: %d of %d partitions have a consumer", group, len(lag), poisonPartitions)
	}
	for _, l := range lag {
		n := float64(l.Pending) + float64(l.AckPending)
		if l.Partition == poisoned {
			stalled += n
		} else {
			others += n
		}
	}
	return stalled, others, nil
}

// waitHealthyPartitions waits until group has nothing pending outside the
// poisoned partition, reading the lag again when a read fails.
func waitHealthyPartitions(ctx context.Context, js jetstream.JetStream, group string, poisoned int, timeout time.Duration) error {
	return waitFor(ctx, timeout, "the "+group+" group's healthy partitions", func() (bool, error) {
		_, o, err := poisonLag(ctx, js, group, poisoned)
		return err == nil && o == 0, err
	})
}

// poisonSeen is what Snip's group left of the poison event: the dead
// letter as DEAD_LETTER stored it, set against the event as CLICKS stored it
// and the handler's calls.
type poisonSeen struct {
	id       string    // the poison event's ID
	seq      uint64    // its CLICKS sequence, from the publish ack
	calls    int       // handler calls with it before the park
	firstTry time.Time // the first of them
	parked   int       // dead letters in DEAD_LETTER
	letter   deadletter.Letter
}

// poisonMinRetry is the least time, in seconds, the reader runtime's
// backoff takes over poisonTries-1 retries: 100 ms doubling, each at most
// 30% shorter (pkg/reader's Config.newBackoff).
func poisonMinRetry() float64 {
	sum, d := 0.0, 0.1
	for range poisonTries - 1 {
		sum += 0.7 * d
		d *= 2
	}
	return sum
}

// poisonChecks judges the park from the dead letter's metadata: the event it
// names, the deliveries the server recorded, and when it was stored.
func poisonChecks(e *Env, s poisonSeen) {
	l := s.letter
	e.exact("dead letters (snip, bad_target)", "letters", 1, float64(s.parked), "one event parked, once")
	named := uint64(0)
	if l.ID == s.id && l.Stream == events.ClicksStream {
		named = l.OrigSeq
	}
	e.exact("dead letter: the CLICKS sequence it names", "seq", float64(s.seq), float64(named),
		"its headers name the poison event's stream and sequence (from the publish ack), and it holds the event's ID")
	e.exact("dead letter: deliveries the server recorded", "deliveries", 1, float64(l.Attempts),
		"Snip-Dead-Attempts, the server's delivery count: the runtime retries in process, the batch kept in progress, so the server delivered it once")
	waited := 0.0
	if !l.Time.IsZero() && !s.firstTry.IsZero() {
		waited = l.Time.Sub(s.firstTry).Seconds()
	}
	e.atLeast("first try to the letter's stored time (real s)", "s", poisonMinRetry(), waited,
		fmt.Sprintf("%d retries with the runtime's backoff (100 ms doubling, at most 30%% shorter) before the park; a runtime that parked at the first failure would store it at once", poisonTries-1))
	e.exact("snip: handler calls with the poison event", "calls", poisonTries, float64(s.calls),
		fmt.Sprintf("it answers reader.Poison on call %d: fewer, the runtime parked a transient failure; more, it ignored the Poison", poisonTries))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
