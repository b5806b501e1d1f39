package scenario

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/snipdev/snip/pkg/reader"
)

var thursday = Scenario{
	Name:   "thursday",
	Claim:  "a reader's bug made a wrong report: fix it, move the group back to a point in time, recount, and the report is right; a new reader loads only the last three days",
	Needs:  "nats",
	Lesson: 5 * time.Second,
	run:    runThursday,
}

const (
	thDays    = 5
	thPerDay  = 400 // clicks per "day" (one lesson second each)
	thBotEach = 10  // every 10th click is a bot's
	// thPartitions is CLICKS' partition count in the lesson.
	thPartitions = 4
)

func runThursday(ctx context.Context, e *Env) error {
	js, err := e.NATS(ctx, thPartitions)
	if err != nil {
		return err
	}
	links := codes(20)
	truth := map[string]int{} // human clicks per link
	bots := 0
	pjs, err := e.Connect("producer")
	if err != nil {
		return err
	}
	// Five "days" of clicks, a lesson second each; the time each day began
	// is what a replay or a new reader starts from.
	var dayStart []time.Time
	for d := range thDays {
		dayStart = append(dayStart, time.Now())
		_, err := emit(ctx, e.Rate(thPerDay), e.Real(time.Second), func(i int) error {
			c := newClick(links[i%len(links)], d*thPerDay+i)
			c.Bot = (i/len(links))%thBotEach == thBotEach-1 // every link gets some
			if c.Bot {
				bots++
			} else {
				truth[c.Code]++
			}
			_, err := publishClick(pjs, c)
			return err
		})
		if err != nil {
			return err
		}
		if err := waitPublished(ctx, pjs); err != nil {
			return err
		}
		time.Sleep(20 * time.Millisecond) // a clear boundary between days
	}
	total := thDays * thPerDay

	// The report: human clicks per link, kept per partition so a replay can
	// start a partition's count afresh (OnRewind), as the click counter
	// starts a new generation.
	var mu sync.Mutex
	counts := map[int]map[string]int{}
	var handled atomic.Int64
	var fixed atomic.Bool
	cfg := groupConfig("report", "report-1")
	cfg.OnRewind = func(_ context.Context, p int, _ reader.RewindInfo) error {
		mu.Lock()
		defer mu.Unlock()
		counts[p] = map[string]int{}
		return nil
	}
	m, err := e.startMember(ctx, cfg, func(_ context.Context, p int, batch []reader.Event) error {
		mu.Lock()
		defer mu.Unlock()
		if counts[p] == nil {
			counts[p] = map[string]int{}
		}
		for _, ev := range batch {
			if ev.Click.Bot && fixed.Load() { // the bug: bots were counted
				continue
			}
			counts[p][ev.Click.Code]++
		}
		handled.Add(int64(len(batch)))
		return nil
	})
	if err != nil {
		return err
	}
	defer m.stop()
	if err := waitFor(ctx, 60*time.Second, "the report to read every click", func() (bool, error) { return handled.Load() >= int64(total), nil }); err != nil {
		return err
	}
	wrong := func() (bad, extra int) {
		mu.Lock()
		defer mu.Unlock()
		got := map[string]int{}
		for _, cs := range counts {
			for c, n := range cs {
				got[c] += n
			}
		}
		for _, c := range links {
			if got[c] != truth[c] {
				bad++
				extra += got[c] - truth[c]
			}
		}
		return bad, extra
	}
	wl, extra := wrong()
	e.exact("before the fix: clicks counted that should not be", "clicks", float64(bots), float64(extra), "the bug counted bots")
	e.exact("before the fix: links with a wrong count", "links", float64(len(links)), float64(wl), "every link had bot clicks")

	// The fix ships; the group moves back to the first day and recounts.
	fixed.Store(true)
	e.say("fixed; rewinding group report to the start of day 1")
	before := handled.Load()
	started := time.Now()
	id, err := reader.Rewind(ctx, js, "report", reader.FromTime(dayStart[0]))
	if err != nil {
		return err
	}
	if err := reader.WaitRewind(ctx, js, "report", id); err != nil {
		return err
	}
	if err := waitFor(ctx, 60*time.Second, "the recount", func() (bool, error) { return handled.Load()-before >= int64(total), nil }); err != nil {
		return err
	}
	took := time.Since(started)
	wl, extra = wrong()
	e.exact("after replay: links with a wrong count", "links", 0, float64(wl), "the replay recounted every click with the fix")
	e.exact("after replay: clicks recounted", "clicks", float64(total), float64(handled.Load()-before), "from the first day's first click to the last")
	rate := float64(total) / took.Seconds()
	e.info("replay rate (real, this machine)", "events/s", 2000, rate, "the lesson's sum assumes 2,000/s")
	e.info("5 million events replayed: minutes", "min", 5e6/2000/60, 5e6/rate/60, "at 2,000/s: 42 minutes; at the measured rate: this")

	// A new reader starting at the last three days.
	from := dayStart[thDays-3]
	var newHandled atomic.Int64
	var oldest atomic.Int64
	oldest.Store(int64(total))
	ncfg := groupConfig("backfill", "backfill-1")
	ncfg.Start = reader.StartAtTime(from)
	nm, err := e.startMember(ctx, ncfg, func(_ context.Context, _ int, batch []reader.Event) error {
		for _, ev := range batch {
			if i := int64(indexOf(ev.Click)); i < oldest.Load() {
				oldest.Store(i)
			}
		}
		newHandled.Add(int64(len(batch)))
		return nil
	})
	if err != nil {
		return err
	}
	defer nm.stop()
	want := int64(3 * thPerDay)
	if err := waitFor(ctx, 60*time.Second, "the new reader to load three days", func() (bool, error) { return newHandled.Load() >= want, nil }); err != nil {
		return err
	}
	// Until the group has read CLICKS to its end: a click from before the
	// three days, had it been read, is counted by then.
	if err := waitGroupIdle(ctx, js, "backfill", thPartitions, 60*time.Second); err != nil {
		return err
	}
	e.exact("new reader from 3 days ago: clicks loaded", "clicks", float64(want), float64(newHandled.Load()), "StartAtTime: the first event stored at or after the time")
	e.exact("new reader: its oldest click is day 3's first", "index", float64((thDays-3)*thPerDay), float64(oldest.Load()), "")
	return nil
}

// info records a row that is reported, not judged: a figure of this machine.
func (e *Env) info(name, unit string, predicted, measured float64, why string) {
	e.res.Checks = append(e.res.Checks, Check{Name: name, Unit: unit, Predicted: predicted, Measured: measured, Tolerance: "info", Why: why, OK: true})
}
