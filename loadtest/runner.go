package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/loadtest/internal/chquery"
	"github.com/snipdev/snip/loadtest/internal/counterhttp"
	"github.com/snipdev/snip/loadtest/internal/jsread"
	"github.com/snipdev/snip/loadtest/internal/oracle"
	"github.com/snipdev/snip/loadtest/internal/report"
	"github.com/snipdev/snip/loadtest/internal/series"
	"github.com/snipdev/snip/loadtest/internal/truth"
	"github.com/snipdev/snip/loadtest/internal/whrecv"
	"github.com/snipdev/snip/loadtest/internal/workload"
	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/natsconn"
	"github.com/snipdev/snip/pkg/topology"
)

// system is the connections to the system under test.
type system struct {
	nc        *nats.Conn
	js        jetstream.JetStream
	readers   *jsread.Readers
	counter   *counterhttp.Client
	warehouse *chquery.Client
	fraud     bool
	// partitions is how many partitions CLICKS has.
	partitions int
	// webhooksAPI is the webhooks API a run registers its receiver with;
	// "" when webhooks are not checked.
	webhooksAPI string
	skip        map[string]string
}

func (s *system) close() {
	if s.warehouse != nil {
		_ = s.warehouse.Close()
	}
	if s.nc != nil {
		s.nc.Close()
	}
}

// connect opens NATS and finds the readers' public views as the sink flags
// say.
func connect(ctx context.Context, env *Env, sf *sinkFlags) (*system, error) {
	nc, err := natsconn.Connect(env.Cfg.nats("loadtest"), env.Log)
	if err != nil {
		return nil, err
	}
	sys := &system{nc: nc, skip: map[string]string{}}
	if sys.js, err = jetstream.New(nc); err != nil {
		sys.close()
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	sys.readers = jsread.NewReaders(sys.js)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if sys.partitions, err = topology.Partitions(cctx, sys.js); err != nil {
		sys.close()
		return nil, fmt.Errorf("find CLICKS at %s (is the system running?): %w", env.Cfg.NATSURL, err)
	}
	if err := sys.findSinks(cctx, env, sf); err != nil {
		sys.close()
		return nil, err
	}
	return sys, nil
}

func (s *system) findSinks(ctx context.Context, env *Env, sf *sinkFlags) error {
	switch sf.counter {
	case off:
		s.skip[oracle.KeyCounter] = "off (--counter-url off)"
	case auto:
		if err := answers(ctx, demoCounterURL+"/healthz"); err != nil {
			s.skip[oracle.KeyCounter] = "not deployed: nothing answers at " + demoCounterURL
		} else {
			s.counter = counterhttp.New(demoCounterURL, env.Cfg.APIKey)
		}
	default:
		s.counter = counterhttp.New(sf.counter, env.Cfg.APIKey)
	}
	switch sf.clickhouse {
	case off:
		s.skip[oracle.KeyWarehouse] = "off (--clickhouse off)"
	default:
		dsn := sf.clickhouse
		if dsn == auto {
			dsn = demoClickHouse
		}
		wh, err := chquery.Open(dsn)
		if err == nil {
			err = wh.Ping(ctx)
		}
		switch {
		case err == nil:
			s.warehouse = wh
		case sf.clickhouse == auto:
			if wh != nil {
				_ = wh.Close()
			}
			s.skip[oracle.KeyWarehouse] = "not deployed: " + err.Error()
		default:
			return fmt.Errorf("warehouse at %s: %w", dsn, err)
		}
	}
	webhooks := sf.webhooks
	if webhooks == "" {
		webhooks = off
		if req, _ := sf.required(); slices.Contains(req, oracle.KeyWebhooks) {
			webhooks = auto
		}
	}
	switch webhooks {
	case off:
		s.skip[oracle.KeyWebhooks] = "off (--webhooks off)"
	case auto:
		if err := answers(ctx, demoWebhooks+"/healthz"); err != nil {
			s.skip[oracle.KeyWebhooks] = "not deployed: nothing answers at " + demoWebhooks
		} else {
			s.webhooksAPI = demoWebhooks
		}
	default:
		s.webhooksAPI = strings.TrimSuffix(webhooks, "/")
	}
	groups, err := s.readers.Groups(ctx)
	if err != nil {
		return err
	}
	switch sf.fraud {
	case off:
		s.skip[oracle.KeyFraud] = "off (--fraud off)"
	case "on":
		s.fraud = true
	case auto:
		s.fraud = slices.Contains(groups, topology.GroupFraudDetection)
		if !s.fraud {
			s.skip[oracle.KeyFraud] = "not deployed: no " + topology.GroupFraudDetection + " group on CLICKS"
		}
	default:
		return fmt.Errorf("--fraud %q: want auto, on or off: %w", sf.fraud, errUsage)
	}
	return nil
}

// answers reports whether anything answers an HTTP GET at url.
func answers(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Timeout: 2 * time.Second}).Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// sinks are the oracle's sources for one run; rcv is the run's webhook
// receiver, nil when webhooks are not checked.
func (s *system) sinks(owner string, since time.Time, rcv *whrecv.Receiver) (oracle.Sinks, func()) {
	log := jsread.NewClicks(s.js, owner, since)
	out := oracle.Sinks{Log: log, Partitions: s.partitions, Readers: s.readers, Skip: s.skip}
	closers := []func(){log.Close}
	// The counter applies every verdict, fraud checked or not: its bot
	// split, dimensions and series are judged by the final labels, so the
	// verdicts are read whenever the counter is checked. With fraud not
	// checked (Skip says why) the fraud rows are skipped all the same.
	if s.fraud || s.counter != nil {
		v := jsread.NewVerdicts(s.js, owner, since)
		out.Verdicts = v
		closers = append(closers, v.Close)
	}
	if s.fraud {
		a := jsread.NewAlerts(s.js, owner, since)
		out.Alerts = a
		closers = append(closers, a.Close)
	}
	// Each checked sink's readers must be seen caught up.
	if s.fraud {
		out.Expect = append(out.Expect, topology.GroupFraudDetection)
	}
	if s.counter != nil {
		out.Counter = s.counter
		out.Expect = append(out.Expect, topology.GroupClickCounter)
		if s.fraud {
			out.Expect = append(out.Expect, events.FraudVerdictsStream+"/"+topology.ClickCounterVerdictsConsumer)
		}
	}
	if s.warehouse != nil {
		out.Warehouse = s.warehouse
		out.Expect = append(out.Expect, topology.GroupWarehouseLoader)
	}
	if rcv != nil {
		out.Webhooks = rcv
		out.Expect = append(out.Expect, topology.GroupWebhooks)
	}
	return out, func() {
		for _, c := range closers {
			c()
		}
	}
}

// load is one driver run.
type load struct {
	mode    truth.Mode
	command string
	target  string
	rate    int
	owner   string
	tag     workload.Tag
	gen     *workload.Generator
	// forwardedFor: the HTTP driver sends X-Forwarded-For.
	forwardedFor bool
	drive        func(ctx context.Context, rec *truth.Recorder, m *series.Meter) (uint64, error)
}

// runLoad runs a driver with the progress line and the probe pollers, saves
// the truth, verifies if asked, and writes the report.
func runLoad(ctx context.Context, env *Env, sys *system, l load, rf *runFlags, sf *sinkFlags) error {
	require, err := sf.required()
	if err != nil {
		return err
	}
	start := time.Now()
	dir := reportDir(rf.out, start, l.tag)
	if err := ensureDir(dir); err != nil {
		return err
	}
	m := series.NewMeter(start, float64(l.rate))
	rec := truth.NewRecorder(int(float64(l.rate) * rf.duration.Seconds()))

	// The endpoint gets the clicks stored after it exists: registered
	// before the load.
	var rcv *whrecv.Receiver
	if sys.webhooksAPI != "" && rf.verify {
		if rcv, err = startReceiver(ctx, env, sys, l, sf); err != nil {
			return err
		}
		defer stopReceiver(env, rcv)
	}

	bg, stopBG := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var phase phaseFlag
	wg.Go(func() { progress(bg, env, sys, m, &phase) })
	probe := l.tag.LinkCode(l.gen.ProbeLink())
	if sys.counter != nil && l.gen.Spec().ProbeEvery > 0 {
		wg.Go(func() {
			poll(bg, 50*time.Millisecond, func(ctx context.Context) (int, error) {
				h, b, err := sys.counter.Totals(ctx, probe)
				return int(h + b), err
			}, func(n int, at time.Time) { m.ProbeCount("counter", n, at) })
		})
	}
	if sys.warehouse != nil && l.gen.Spec().ProbeEvery > 0 {
		wg.Go(func() {
			poll(bg, 250*time.Millisecond, func(ctx context.Context) (int, error) {
				return sys.warehouse.Count(ctx, l.owner, probe)
			}, func(n int, at time.Time) { m.ProbeCount("warehouse", n, at) })
		})
	}
	defer func() {
		stopBG()
		wg.Wait()
	}()

	fmt.Fprintf(env.Stderr, "run %s: %s at %d/s for %s against %s (report in %s)\n", l.tag, l.mode, l.rate, rf.duration, l.target, dir)
	attempts, driveErr := l.drive(ctx, rec, m)
	loadEnd := time.Now()
	// Stopped during the load, or the driver gave up: the load did not
	// run its --duration.
	stoppedInLoad := ctx.Err() != nil
	loadCut := stoppedInLoad || driveErr != nil
	phase.set(series.PhaseDrain)

	refused, uncertain, answers := rec.Finish(attempts)
	truthFile := filepath.Join(dir, "truth.json")
	tr := &truth.Truth{
		Version: truth.Version, Mode: l.mode, Tag: l.tag.String(), Owner: l.owner, Spec: l.gen.Spec(),
		Started: start, Ended: loadEnd, Duration: rf.duration, ForwardedFor: l.forwardedFor, Attempts: attempts, Refused: refused, Uncertain: uncertain, Answers: answers,
	}
	switch {
	case stoppedInLoad:
		tr.LoadCut = "the run was stopped during the load"
	case driveErr != nil:
		tr.LoadCut = "the driver stopped early: " + driveErr.Error()
	}
	if err := ensureDir(dir); err != nil {
		return err
	}
	if err := tr.Save(truthFile); err != nil {
		return err
	}
	if driveErr != nil && attempts == 0 {
		return driveErr
	}

	rep := &report.Report{
		Command: l.command, Mode: string(l.mode), Tag: l.tag.String(), Target: l.target, Started: start,
		LoadTime: loadEnd.Sub(start), Rate: l.rate, CatchUp: -1, Spec: l.gen.Spec(), Answers: answers, LoadCut: loadCut,
	}
	if driveErr != nil {
		rep.Notes = append(rep.Notes, "the driver stopped early: "+driveErr.Error())
	}
	// Catch-up is watched on its own, while the oracle reads at its pace.
	caught := make(chan time.Duration, 1)
	go func() {
		caught <- waitCaughtUp(ctx, sys, tr, loadEnd, sf.deadline, rcv)
	}()
	// A stop (Ctrl-C, SIGTERM) during the load or the verification ends
	// the waiting, not the run's record: what was measured is still
	// printed and written, with the truth to verify later.
	var stopped error
	if rf.verify && ctx.Err() == nil {
		sinks, closeSinks := sys.sinks(l.owner, start.Add(-time.Second), rcv)
		vr, err := oracle.Verify(ctx, tr, sinks, oracle.Options{
			Deadline: sf.deadline, SetLimit: sf.setLimit, BurstThreshold: sf.burstThreshold, Require: require,
			Progress: func(s string) { fmt.Fprintln(env.Stderr, "verify:", s) },
		})
		closeSinks()
		if err != nil && ctx.Err() == nil {
			return err
		}
		rep.Verify = vr
	}
	if rf.verify && rep.Verify == nil {
		note := fmt.Sprintf("stopped before the verification ended: not verified (loadtest verify --truth %s checks the run)", truthFile)
		rep.Notes = append(rep.Notes, note)
		stopped = fmt.Errorf("%s: %w", note, errNotJudged)
	}
	rep.CatchUp = <-caught
	// Stopped, the watcher gave up waiting: a catch-up it had not seen is
	// not measured, not a reader that failed to catch up.
	rep.Stopped = ctx.Err() != nil
	if rep.Verify != nil && !readersPassed(rep.Verify.Rows) {
		// The oracle, reading every event of the run, found a reader that
		// had not processed it: whatever the watcher saw, not caught up.
		rep.CatchUp = -1
	}
	stopBG()
	wg.Wait()
	rep.Summary = m.Summarise(loadEnd.Sub(start))
	rep.KeepUp = report.KeepUpOf(rep)
	if err := finish(env, dir, rep); err != nil {
		return err
	}
	return stopped
}

// webhookBatchWait is the most the run's endpoint waits to fill a batch.
const webhookBatchWait = 200 * time.Millisecond

// startReceiver starts the run's webhook receiver and registers it as an
// endpoint of the run's owner, for clicks on the links whrecv.Filter picks.
func startReceiver(ctx context.Context, env *Env, sys *system, l load, sf *sinkFlags) (*whrecv.Receiver, error) {
	rcv, err := whrecv.Start(sf.webhooksListen)
	if err != nil {
		return nil, err
	}
	codes := make([]string, l.gen.NumLinks())
	for i := range codes {
		codes[i] = l.tag.LinkCode(i)
	}
	links := whrecv.Filter(codes, whrecv.MaxFilterLinks)
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := rcv.Register(rctx, sys.webhooksAPI, env.Cfg.APIKey, l.owner, links, webhookBatchWait); err != nil {
		_ = rcv.Close()
		return nil, err
	}
	fmt.Fprintf(env.Stderr, "webhooks: endpoint %s -> %s, clicks on %d of the run's %d links\n", rcv.Endpoint(), rcv.URL(), len(links), len(codes))
	return rcv, nil
}

// stopReceiver deletes the run's endpoint and stops its receiver.
func stopReceiver(env *Env, rcv *whrecv.Receiver) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := rcv.Unregister(ctx); err != nil {
		fmt.Fprintf(env.Stderr, "webhooks: %v\n", err)
	}
	_ = rcv.Close()
}

// finish prints the summary and the oracle's table and writes the report.
func finish(env *Env, dir string, rep *report.Report) error {
	fmt.Fprintln(env.Stdout)
	report.Text(env.Stdout, rep)
	if rep.Verify != nil {
		fmt.Fprintln(env.Stdout)
		if err := oracle.WriteTable(env.Stdout, rep.Verify.Rows); err != nil {
			return err
		}
	}
	js, htm, err := report.Write(dir, rep)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "\nreport: %s\n        %s\ntruth:  %s\n", htm, js, filepath.Join(dir, "truth.json"))
	if rep.Verify != nil && !rep.Verify.Passed {
		return errVerifyFailed
	}
	return nil
}

// waitCaughtUp waits until every sent click of the run tr describes is in
// CLICKS (the redirect's outbox has drained) and every reader has processed
// the run: on each partition, up to the owner's last click stored once the
// run's were all in (the run's last click or later); then, on
// FRAUD_VERDICTS, up to the last verdict message stored once the readers of
// CLICKS got there. Other traffic flowing meanwhile (a demo's trickle)
// neither hides a reader that is behind nor keeps the run from being caught
// up. It returns the time from end to then (-1: not within deadline). With
// a webhook receiver, its endpoint's queue must be empty too, once the
// group has processed the run.
func waitCaughtUp(ctx context.Context, sys *system, tr *truth.Truth, end time.Time, deadline time.Duration, rcv *whrecv.Receiver) time.Duration {
	ctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	c, err := startCatchUp(ctx, sys, tr, end, rcv)
	if err != nil {
		return -1
	}
	defer c.stop()
	for {
		if d, ok := c.step(ctx); ok {
			return d
		}
		if !c.again {
			select {
			case <-ctx.Done():
				return -1
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

// catchUp is waitCaughtUp's watch, one step at a time.
//
// Every sent click is known to be in CLICKS only by ID: the count of the
// run's clicks stored reaches the sent count while a sent click still waits
// in the redirect's outbox when a copy stored twice or a timed-out click
// recorded late makes up the count. Reading the whole run back takes time,
// though, so the targets are taken at once when the count is reached, and
// the readers judged against them, while the run's clicks are read back by
// ID (an oracle.SentLog) on the side. Once every sent click is read, the
// targets are confirmed if every run's click read is at or below them;
// otherwise they were taken too early: they are taken again (every sent
// click being stored by then), and the readers judged afresh. The time
// reported is when the readers passed confirmed targets: reading back
// delays the answer, not the figure.
type catchUp struct {
	sys *system
	tr  *truth.Truth
	end time.Time
	rcv *whrecv.Receiver

	// covered gets, once every sent click has been read from CLICKS, the
	// last stream sequence of the run's clicks per partition.
	covered chan map[int]uint64
	read    sync.WaitGroup
	cancel  context.CancelFunc

	// targets are taken once the count of the run's clicks stored reaches
	// the sent count; confirmed once the run's clicks read by ID are all
	// at or below them. Fraud is read once the readers of CLICKS passed
	// them, and judged against positions read after.
	targets    *oracle.Targets
	confirmed  bool
	fraudKnown bool
	// passed is when (since end) the readers were first seen past
	// targets; -1 not yet.
	passed time.Duration
	// again: the next step should come at once (positions are to be read
	// after the fraud target just taken).
	again bool
}

// startCatchUp starts reading the run's clicks back.
func startCatchUp(ctx context.Context, sys *system, tr *truth.Truth, end time.Time, rcv *whrecv.Receiver) (*catchUp, error) {
	if _, err := oracle.NewSentLog(tr); err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	c := &catchUp{sys: sys, tr: tr, end: end, rcv: rcv, covered: make(chan map[int]uint64, 1), cancel: cancel, passed: -1}
	c.read.Go(func() { c.readBack(rctx) })
	return c, nil
}

// stop ends the reading back.
func (c *catchUp) stop() {
	c.cancel()
	c.read.Wait()
}

// readBack reads the run's clicks from CLICKS until every sent click is
// read, then sends the run's last positions on covered. A reader that
// fails starts over.
func (c *catchUp) readBack(ctx context.Context) {
	for ctx.Err() == nil {
		sl, _ := oracle.NewSentLog(c.tr) // startCatchUp checked the truth
		log := jsread.NewClicks(c.sys.js, c.tr.Owner, c.tr.Started.Add(-time.Second))
		for ctx.Err() == nil && !sl.Complete() {
			clicks, atEnd, err := log.Next(ctx)
			if err != nil {
				break
			}
			sl.Add(clicks)
			if atEnd && !sl.Complete() {
				select {
				case <-ctx.Done():
				case <-time.After(100 * time.Millisecond):
				}
			}
		}
		log.Close()
		if sl.Complete() {
			c.covered <- sl.Last()
			return
		}
	}
}

// step looks once; it returns the catch-up time and true once the run is
// caught up.
func (c *catchUp) step(ctx context.Context) (time.Duration, bool) {
	c.again = false
	if !c.confirmed {
		select {
		case last := <-c.covered:
			c.confirm(ctx, last)
		default:
		}
	}
	if c.targets == nil {
		if stored, err := jsread.StoredClicks(ctx, c.sys.js, c.tr.Owner, "lt-"+c.tr.Tag+"-"); err == nil && stored >= c.tr.SentCount() {
			c.targets, _ = clickTargets(ctx, c.sys.js, c.tr.Owner)
		}
	}
	if c.targets != nil && c.passed < 0 {
		if pos, err := c.sys.readers.Positions(ctx); err == nil {
			_, behind := oracle.CaughtUp(pos, oracle.Targets{Clicks: c.targets.Clicks})
			switch {
			case len(behind) > 0:
			case !c.fraudKnown:
				// Fraud detection has processed the run's clicks: the
				// verdicts about them are stored. A verdict message labels
				// many owners' clicks: the last one stored is the target,
				// and the readers of verdicts are judged on positions read
				// after it.
				c.targets.Fraud, err = jsread.LastStored(ctx, c.sys.js, events.FraudVerdictsStream, events.FraudVerdictSubjects)
				c.fraudKnown = err == nil || errors.Is(err, jetstream.ErrStreamNotFound)
				c.again = c.fraudKnown
			default:
				if _, behind = oracle.CaughtUp(pos, *c.targets); len(behind) == 0 && queueEmpty(ctx, c.rcv) {
					c.passed = time.Since(c.end)
				}
			}
		}
	}
	if c.confirmed && c.passed >= 0 {
		return c.passed, true
	}
	return 0, false
}

// confirm judges the targets against last, the run's last clicks once
// every sent click was read: if one is above them, they were taken too
// early and are taken again, and the readers judged afresh.
func (c *catchUp) confirm(ctx context.Context, last map[int]uint64) {
	c.confirmed = true
	if c.targets != nil && covers(c.targets.Clicks, last) {
		return
	}
	t, err := clickTargets(ctx, c.sys.js, c.tr.Owner)
	if err != nil {
		t = &oracle.Targets{Clicks: map[int]uint64{}}
	}
	for p, seq := range last {
		t.Clicks[p] = max(t.Clicks[p], seq)
	}
	c.targets, c.fraudKnown, c.passed = t, false, -1
}

// covers reports whether targets are at or past last on every partition.
func covers(targets, last map[int]uint64) bool {
	for p, seq := range last {
		if targets[p] < seq {
			return false
		}
	}
	return true
}

// queueEmpty reports whether the webhook endpoint's queue is empty (true
// without a receiver).
func queueEmpty(ctx context.Context, rcv *whrecv.Receiver) bool {
	if rcv == nil {
		return true
	}
	n, err := rcv.Queued(ctx)
	return err == nil && n == 0
}

// clickTargets is, per partition, the last of owner's clicks stored now.
func clickTargets(ctx context.Context, js jetstream.JetStream, owner string) (*oracle.Targets, error) {
	n, err := topology.Partitions(ctx, js)
	if err != nil {
		return nil, err
	}
	t := &oracle.Targets{Clicks: map[int]uint64{}}
	for p := range n {
		seq, err := jsread.LastStored(ctx, js, events.ClicksStream, strconv.Itoa(p)+"."+events.ClickSubject(owner, "*"))
		if err != nil {
			return nil, err
		}
		if seq > 0 {
			t.Clicks[p] = seq
		}
	}
	return t, nil
}

// readersPassed reports whether the oracle's readers row found no reader
// behind: passed, or skipped (no reader to judge).
func readersPassed(rows []oracle.Result) bool {
	for _, r := range rows {
		if r.Sink == oracle.SinkReaders {
			return r.Status != oracle.Fail
		}
	}
	return true
}

func total(m map[string]uint64) uint64 {
	var n uint64
	for _, v := range m {
		n += v
	}
	return n
}

// phaseFlag is the run's phase, read by the progress loop.
type phaseFlag struct {
	mu sync.Mutex
	p  string
}

func (f *phaseFlag) set(p string) { f.mu.Lock(); f.p = p; f.mu.Unlock() }
func (f *phaseFlag) get() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.p == "" {
		return series.PhaseLoad
	}
	return f.p
}

// progress prints a line every second: offered and achieved rate, errors,
// latency of the second, and every reader's backlog as last read. The
// backlog is read on its own loop (lagLoop): on a loaded cluster reading
// every consumer's info can take longer than a second, and a read cut short
// at the tick would leave both the line and the peak lags without it.
func progress(ctx context.Context, env *Env, sys *system, m *series.Meter, phase *phaseFlag) {
	var last lastLag
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { lagLoop(ctx, sys, m, &last) })
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			s := m.Tick(now, phase.get())
			lag, at, err := last.get()
			if err == nil && at.IsZero() {
				err = errNoLagYet
			}
			line := progressLine(s, lag, err)
			if age := now.Sub(at); err == nil && age > 2*time.Second {
				line += fmt.Sprintf(" (read %.0fs ago)", age.Seconds())
			}
			fmt.Fprintln(env.Stderr, line)
		}
	}
}

// errNoLagYet: no backlog read has finished yet.
var errNoLagYet = errors.New("no backlog read yet")

// lastLag is the latest backlog read: the backlog and when it was read, or
// the error of the latest attempt while no read has succeeded.
type lastLag struct {
	mu  sync.Mutex
	lag map[string]uint64
	at  time.Time
	err error
	// began is when the read of lag began: it shows the backlog as it
	// was at some moment after it.
	began time.Time
}

func (l *lastLag) get() (map[string]uint64, time.Time, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lag, l.at, l.err
}

// since returns the latest backlog read and when that read began.
func (l *lastLag) since() (map[string]uint64, time.Time, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lag, l.began, l.err
}

// lagLoop reads every reader's backlog, one read at a time, at most once a
// second, each within 10 s, recording each result in m (peak lags) and last.
func lagLoop(ctx context.Context, sys *system, m *series.Meter, last *lastLag) {
	for ctx.Err() == nil {
		began := time.Now()
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		lag, err := sys.readers.Backlog(rctx)
		cancel()
		last.mu.Lock()
		if err == nil {
			m.SetLag(lag)
			last.lag, last.at, last.err, last.began = lag, time.Now(), nil, began
		} else if last.at.IsZero() && ctx.Err() == nil {
			// Only while nothing was read yet: after that the line shows
			// the last backlog read, with its age.
			last.err = err
		}
		last.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(time.Second - time.Since(began)):
		}
	}
}

func progressLine(s series.Second, lag map[string]uint64, lagErr error) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%5.0fs %-5s offered %6.0f/s sent %6.0f/s ok %6.0f/s err %4d  p50 %7.2fms p99 %7.2fms |",
		s.At, s.Phase, s.Rate(s.Offered), s.Rate(s.Sent), s.Rate(s.OK), s.Errors, s.P50, s.P99)
	if lagErr != nil {
		b.WriteString(" lag ?")
		return b.String()
	}
	names := make([]string, 0, len(lag))
	for k := range lag {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		fmt.Fprintf(&b, " %s %d", k, lag[k])
	}
	if len(names) == 0 {
		b.WriteString(" no readers")
	}
	return b.String()
}

// poll calls count every interval and reports each answer.
func poll(ctx context.Context, every time.Duration, count func(context.Context) (int, error), report func(int, time.Time)) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			n, err := count(qctx)
			cancel()
			if err == nil {
				report(n, time.Now())
			} else if errors.Is(err, context.Canceled) {
				return
			}
		}
	}
}
