package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/snipdev/snip/loadtest/internal/chaos"
	"github.com/snipdev/snip/loadtest/internal/httpload"
	"github.com/snipdev/snip/loadtest/internal/oracle"
	"github.com/snipdev/snip/loadtest/internal/series"
	"github.com/snipdev/snip/loadtest/internal/truth"
	"github.com/snipdev/snip/loadtest/internal/workload"
)

// faultList collects repeated --fault flags.
type faultList []chaos.Fault

func (f *faultList) String() string { return fmt.Sprint(len(*f), " faults") }

func (f *faultList) Set(spec string) error {
	fault, err := chaos.Parse(spec)
	if err != nil {
		return err
	}
	*f = append(*f, fault)
	return nil
}

// chaosPlan is how each fault's run is shaped.
type chaosPlan struct {
	target  string
	rate    int
	warmup  time.Duration // load before the fault
	tail    time.Duration // load after the fault ended
	timeout time.Duration // per request: slower answers are unanswered
	xff     bool
	wf      workloadFlags
	sf      sinkFlags
	require []string
	out     string
}

// chaosResult is one row of the chaos table.
type chaosResult struct {
	Fault    string
	Sent     uint64 // requests answered 302
	InClicks uint64 // of the run's clicks, in CLICKS
	Counted  string // counter's total, or why not checked
	Loaded   string // warehouse's distinct event IDs, or why not checked
	Lost     uint64 // most clicks missing in any checked sink
	Doubled  uint64 // most clicks stored or counted twice in any sink
	Recover  time.Duration
	Passed   bool
	Err      error
	// Judged is set once the oracle gave its verdict. Stopped is set on a
	// run that a stop (Ctrl-C, SIGTERM) ended before it (or before it
	// began): neither passed nor failed.
	Judged  bool
	Stopped bool
}

// cmdChaos runs each fault in turn against a running system, under HTTP
// load, and judges each run with the oracle.
func cmdChaos(ctx context.Context, env *Env, args []string) error {
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	var p chaosPlan
	var faults faultList
	p.wf.register(fs)
	p.sf.register(fs)
	fs.Var(&faults, "fault", "a fault to inject (repeatable), in turn, each in its own run:\n"+chaos.Spec)
	fs.StringVar(&p.target, "target", "http://127.0.0.1:8080", "the redirect service's base URL")
	fs.IntVar(&p.rate, "rate", 500, "redirects per second during each run")
	fs.DurationVar(&p.warmup, "warmup", 5*time.Second, "load before each fault")
	fs.DurationVar(&p.tail, "tail", 15*time.Second, "load after each fault ended")
	fs.DurationVar(&p.timeout, "timeout", 5*time.Second, "per-request timeout (a slower answer counts as unanswered)")
	fs.BoolVar(&p.xff, "xff", true, "send each visitor's address in X-Forwarded-For")
	fs.StringVar(&p.out, "out", "", "directory for each run's truth.json (default loadtest/reports/chaos-<time>)")
	if err := parse(fs, args, env.Stderr); err != nil {
		return err
	}
	if len(faults) == 0 {
		return fmt.Errorf("no --fault given: %w", errUsage)
	}
	if p.rate < 1 || p.warmup < 0 || p.tail < time.Second {
		return fmt.Errorf("--rate at least 1, --warmup not negative, --tail at least 1s: %w", errUsage)
	}
	if p.timeout <= 0 {
		return fmt.Errorf("--timeout %s: want more than 0: %w", p.timeout, errUsage)
	}
	if err := p.sf.check(); err != nil {
		return err
	}
	var err error
	if p.require, err = p.sf.required(); err != nil {
		return err
	}
	if p.out == "" {
		p.out = filepath.Join(filepath.Dir(reportDir("", time.Now(), workload.Tag(0))), "chaos-"+time.Now().Format("20060102-150405"))
	}
	if err := ensureDir(p.out); err != nil {
		return err
	}
	sys, err := connect(ctx, env, &p.sf)
	if err != nil {
		return err
	}
	defer sys.close()
	results := make([]chaosResult, 0, len(faults))
	for i, f := range faults {
		if ctx.Err() != nil {
			results = append(results, chaosResult{Fault: f.Name, Recover: -1, Stopped: true, Err: errors.New("not run: stopped")})
			continue
		}
		fmt.Fprintf(env.Stderr, "chaos %d/%d: %s\n", i+1, len(faults), f.Name)
		truthFile := filepath.Join(p.out, fmt.Sprintf("%02d-truth.json", i+1))
		r := runChaos(ctx, env, sys, f, &p, truthFile)
		if ctx.Err() != nil && !r.Judged {
			r.stopped(truthFile)
		}
		results = append(results, r)
	}
	fmt.Fprintln(env.Stdout)
	if err := writeChaosTable(env.Stdout, results); err != nil {
		return err
	}
	return chaosVerdict(results)
}

// stopped marks a run a stop ended before the oracle's verdict: not
// judged, whatever error the stop made its steps end with (a verification
// cut short is no failure seen), with the way to judge it later when its
// truth was written.
func (res *chaosResult) stopped(truthFile string) {
	res.Stopped, res.Passed = true, false
	note := "stopped before the verdict: not judged"
	if _, err := os.Stat(truthFile); err == nil {
		note += " (loadtest verify --truth " + truthFile + " checks the run)"
	}
	res.Err = errors.New(note)
}

// chaosVerdict is the chaos command's outcome: errVerifyFailed (exit 1) if
// a run judged, or ended by an error of its own, did not pass; otherwise
// errNotJudged (exit 3) if a stop ended a run before its verdict or kept
// it from running; nil when every run passed.
func chaosVerdict(results []chaosResult) error {
	stopped := 0
	for _, r := range results {
		switch {
		case r.Stopped:
			stopped++
		case !r.Passed:
			return errVerifyFailed
		}
	}
	if stopped > 0 {
		return fmt.Errorf("stopped: %d of %d fault runs not judged: %w", stopped, len(results), errNotJudged)
	}
	return nil
}

// recoveredBy reports whether second s, ending at now, shows the system
// recovered from a fault that ended at faultEnd: a second of the schedule
// (one that offered load: after it the driver only waits for its last
// answers, and a second in which none came says nothing) a second or more
// after the fault's end, no request failed, the 302s received came within a
// twentieth of the requests offered, and the total backlog, in a read that
// began a second or more after the fault's end, was at most normal.
func recoveredBy(s series.Second, now, faultEnd, lagBegan time.Time, backlog, normal uint64) bool {
	settled := faultEnd.Add(time.Second)
	return now.After(settled) && s.Offered > 0 && s.Errors == 0 && s.OK+s.OK/20 >= s.Offered &&
		lagBegan.After(settled) && backlog <= normal
}

// runChaos is one run: load for warmup, the fault, load for tail, then the
// oracle. Time to recover is from the fault's end to the end of the first
// second in which no request failed, the 302s received came within a
// twentieth of the requests offered (the rest still in flight), and the
// readers' total backlog was back to normal (at most twice the largest seen before the fault, or
// one second of traffic, whichever is more: readers batch, so it is never
// 0 under load), as read by a backlog read that began a second or more
// after the fault's end (reads run on their own loop); when that did not happen during the tail, to the end of
// the catch-up after the load (waitCaughtUp, watched from the load's end
// while the oracle runs).
func runChaos(ctx context.Context, env *Env, sys *system, f chaos.Fault, p *chaosPlan, truthFile string) chaosResult {
	res := chaosResult{Fault: f.Name, Recover: -1}
	gen, err := workload.New(p.wf.spec(p.rate))
	if err != nil {
		res.Err = err
		return res
	}
	tag := workload.NewTag()
	owner, err := httpload.CreateLinks(ctx, p.target, env.Cfg.APIKey, p.wf.linkBase, tag, gen.NumLinks())
	if err != nil {
		res.Err = err
		return res
	}
	duration := p.warmup + f.Hold + p.tail
	start := time.Now()
	m := series.NewMeter(start, float64(p.rate))
	rec := truth.NewRecorder(int(float64(p.rate) * duration.Seconds()))
	cfg := httpload.Config{
		Base: p.target, Rate: p.rate, Duration: duration, Timeout: p.timeout,
		ForwardedFor: p.xff, CountryHeader: "X-Country", Tag: tag, Gen: gen,
	}

	bg, stopBG := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var faultEnd, recovered time.Time
	var faultErr error
	var baseLag uint64 // the largest total backlog before the fault: readers batch
	faultStarted := false
	wg.Go(func() {
		if !sleepCtx(bg, p.warmup) {
			return
		}
		fmt.Fprintf(env.Stderr, "%5.0fs inject: %s\n", time.Since(start).Seconds(), f.Name)
		mu.Lock()
		faultStarted = true
		mu.Unlock()
		end, err := chaos.Run(bg, f)
		fmt.Fprintf(env.Stderr, "%5.0fs fault over: %s\n", time.Since(start).Seconds(), f.Name)
		mu.Lock()
		faultEnd, faultErr = end, err
		mu.Unlock()
	})
	// The backlog is read on its own loop, as in a load run: a read that
	// takes longer than a second on a loaded machine delays the judgement
	// of recovery by its own length, not by a whole fault.
	var last lastLag
	wg.Go(func() { lagLoop(bg, sys, m, &last) })
	wg.Go(func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-bg.Done():
				return
			case now := <-tick.C:
				lag, began, lerr := last.since()
				if lerr == nil && began.IsZero() {
					lerr = errNoLagYet
				}
				s := m.Tick(now, series.PhaseLoad)
				line := progressLine(s, lag, lerr)
				if _, at, _ := last.get(); lerr == nil && now.Sub(at) > 2*time.Second {
					line += fmt.Sprintf(" (read %.0fs ago)", now.Sub(at).Seconds())
				}
				fmt.Fprintln(env.Stderr, line)
				mu.Lock()
				if lerr == nil && !faultStarted {
					baseLag = max(baseLag, total(lag))
				}
				if !faultEnd.IsZero() && recovered.IsZero() && lerr == nil &&
					recoveredBy(s, now, faultEnd, began, total(lag), max(uint64(p.rate), 2*baseLag)) {
					recovered = now
				}
				mu.Unlock()
			}
		}
	})
	attempts, driveErr := httpload.Run(ctx, cfg, rec, m)
	loadEnd := time.Now()
	stopBG()
	wg.Wait()
	if faultErr != nil {
		res.Err = faultErr
		return res
	}
	if driveErr != nil && attempts == 0 {
		res.Err = driveErr
		return res
	}

	refused, uncertain, answers := rec.Finish(attempts)
	tr := &truth.Truth{
		Version: truth.Version, Mode: truth.ModeHTTP, Tag: tag.String(), Owner: owner, Spec: gen.Spec(),
		Started: start, Ended: loadEnd, ForwardedFor: p.xff, Attempts: attempts, Refused: refused, Uncertain: uncertain, Answers: answers,
	}
	if err := tr.Save(truthFile); err != nil {
		res.Err = err
		return res
	}
	if sys.webhooksAPI != "" {
		sys.skip[oracle.KeyWebhooks] = "not checked by chaos: only loadtest http|events --verify runs a receiver"
	}
	// Without a recovery in the tail, the catch-up after the load is the
	// time to recover: watched from the load's end while the oracle reads
	// at its pace, so the oracle's own time is not counted in.
	caught := make(chan time.Duration, 1)
	if recovered.IsZero() {
		cctx, stopCatchUp := context.WithCancel(ctx)
		defer stopCatchUp()
		go func() { caught <- waitCaughtUp(cctx, sys, tr, loadEnd, p.sf.deadline, nil) }()
	}
	sinks, closeSinks := sys.sinks(owner, start.Add(-time.Second), nil)
	vr, err := oracle.Verify(ctx, tr, sinks, oracle.Options{
		Deadline: p.sf.deadline, SetLimit: p.sf.setLimit, BurstThreshold: p.sf.burstThreshold, Require: p.require,
		Progress: func(s string) { fmt.Fprintln(env.Stderr, "verify:", s) },
	})
	closeSinks()
	if err != nil {
		res.Err = err
		return res
	}
	if faultEnd.IsZero() {
		res.Err = errors.New("the fault did not end before the load")
		return res
	}
	if recovered.IsZero() {
		if d := <-caught; d >= 0 {
			recovered = loadEnd.Add(d)
		}
	}
	if !recovered.IsZero() {
		res.Recover = recovered.Sub(faultEnd)
	}
	res.Sent, res.Passed, res.Judged = tr.SentCount(), vr.Passed, true
	res.tally(vr.Rows)
	if !vr.Passed {
		var bad []string
		for _, r := range vr.Rows {
			if r.Status == oracle.Fail {
				bad = append(bad, r.Sink)
			}
		}
		res.Err = fmt.Errorf("oracle failed: %s (the run's truth: %s)", strings.Join(bad, ", "), truthFile)
	}
	return res
}

// tally fills the table's figures from the oracle's rows: what the log,
// the counter and the warehouse hold, and the most clicks any of them lost
// or doubled. The counter counts the log, so a count above the log's
// (its totals' extra) is a click counted twice: it keeps no copies for a
// dup to show, as the log and the warehouse's exact set do.
func (res *chaosResult) tally(rows []oracle.Result) {
	res.Counted, res.Loaded = "skipped", "skipped"
	for _, r := range rows {
		if r.Status == oracle.Skipped {
			continue
		}
		switch r.Sink {
		case oracle.SinkLog:
			res.InClicks = r.Got
		case oracle.SinkCounter:
			res.Counted = fmt.Sprint(r.Got)
		case oracle.SinkWarehouse:
			res.Loaded = fmt.Sprint(r.Got)
		}
		switch r.Sink {
		case oracle.SinkLog, oracle.SinkWarehouse:
			res.Lost = max(res.Lost, r.Missing)
			res.Doubled = max(res.Doubled, r.Dup)
		case oracle.SinkCounter:
			res.Lost = max(res.Lost, r.Missing)
			res.Doubled = max(res.Doubled, r.Dup, r.Extra)
		}
	}
}

// writeChaosTable prints the results: one row per fault.
func writeChaosTable(w io.Writer, rs []chaosResult) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "fault\tsent\tin CLICKS\tcounted\tloaded\tlost\tdoubled\ttime to recover\tverdict\tnote")
	for _, r := range rs {
		verdict, note, rec := "PASS", "", "-"
		switch {
		case r.Stopped:
			verdict = "NOT JUDGED"
		case !r.Passed:
			verdict = "FAIL"
		}
		if r.Err != nil {
			note = r.Err.Error()
		}
		if r.Recover >= 0 {
			rec = r.Recover.Round(100 * time.Millisecond).String()
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", r.Fault, r.Sent, r.InClicks, r.Counted, r.Loaded, r.Lost, r.Doubled, rec, verdict, note)
	}
	return tw.Flush()
}

// sleepCtx waits d or until ctx ends; it reports whether d passed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
