package oracle

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sync/errgroup"

	"github.com/snipdev/snip/loadtest/internal/truth"
)

// Sink keys for Options.Require and Sinks.Skip.
const (
	KeyCounter   = "counter"
	KeyWarehouse = "warehouse"
	KeyFraud     = "fraud"
	KeyWebhooks  = "webhooks"
)

// Sinks are the readers to check. Log and Readers are always there (they
// are NATS); a nil reader is a sink that is not deployed or not configured,
// and Skip says why.
type Sinks struct {
	Log     LogReader
	Readers Positions
	// Partitions is how many partitions CLICKS has (required): a click of
	// the run stored in another partition than its link's code hashes to
	// (events.Partition) fails the log row, a routing defect, and counts
	// as missing, as readers park it.
	Partitions int
	// Verdicts is fraud detection's verdicts: the labels the counter
	// applies, and what the fraud verdicts row judges. Its row is
	// skipped when Skip names KeyFraud (fraud not checked): the verdicts
	// are then read only for the counter's labels.
	Verdicts VerdictReader
	// Alerts is fraud detection's alerts, checked with the verdicts
	// (under KeyFraud).
	Alerts    AlertReader
	Counter   CounterReader
	Warehouse WarehouseReader
	// Webhooks is the load test's own webhook receiver, registered as an
	// endpoint of the run's owner: what it was delivered is checked, and
	// its queue in the webhooks service must be empty for the run to be
	// caught up.
	Webhooks WebhookReader
	// Skip gives, by sink key, why a sink is not checked: a nil one, or
	// the fraud rows while Verdicts is read for the counter.
	Skip map[string]string
	// Expect names the readers (as Positions names them) of the sinks
	// being checked: each must have a position, or the run is not caught
	// up (a consumer group not seen is not one that has processed the run).
	Expect []string
}

// Options tune the waiting.
type Options struct {
	// Deadline bounds the whole verification: reading the log, readers
	// catching up, and sinks converging (default 2m).
	Deadline time.Duration
	// Settle is how long the first read of the log goes on after every
	// sent click is in it, for unanswered requests that were recorded late
	// (default 2s). After it the log is read on at every poll.
	Settle time.Duration
	// Poll is the interval between checks (default 500ms).
	Poll time.Duration
	// SetLimit is the most clicks whose event ID sets are compared in the
	// warehouse; above it only counts are (default 2,000,000).
	SetLimit uint64
	// BurstThreshold is fraud detection's visitor_burst threshold
	// (FRAUD_VISITOR_THRESHOLD, default 20): a burst is expected labelled
	// and alerted only when the log holds more than this many of its
	// clicks.
	BurstThreshold int
	// Require lists sink keys that fail the run when they are not
	// configured, instead of being skipped.
	Require []string
	// Progress, if set, receives a line now and then while waiting.
	Progress func(string)
	// Now is the clock that decides how many hours and days of the
	// counter's series to ask for (default time.Now); the counter answers
	// by its own.
	Now func() time.Time
}

func (o *Options) defaults() {
	if o.Deadline <= 0 {
		o.Deadline = 2 * time.Minute
	}
	if o.Settle <= 0 {
		o.Settle = 2 * time.Second
	}
	if o.Poll <= 0 {
		o.Poll = 500 * time.Millisecond
	}
	if o.SetLimit == 0 {
		o.SetLimit = 2_000_000
	}
	if o.BurstThreshold <= 0 {
		o.BurstThreshold = 20
	}
	if o.Progress == nil {
		o.Progress = func(string) {}
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// Report is the oracle's answer.
type Report struct {
	Rows   []Result `json:"rows"`
	Passed bool     `json:"passed"`
	// LogWait is how long the log took to hold every sent click (or a
	// copy of it where readers park it, which fails the log row).
	LogWait time.Duration `json:"log_wait_ns"`
	// CatchUp is how long, from the start of Verify, until every reader
	// had processed every event of the run (CaughtUp); negative if never.
	CatchUp time.Duration `json:"catch_up_ns"`
	// Backlog is the last backlog seen, by reader: the run's events and
	// any other traffic's.
	Backlog map[string]uint64 `json:"backlog"`
	// Behind lists, at the end, the readers' partitions that had not
	// processed the run's last event.
	Behind []Behind `json:"behind,omitempty"`
}

// queryTimeout bounds each query to a sink.
const queryTimeout = 30 * time.Second

// Verify checks every sink against the truth, waiting for readers to catch
// up and converge, until all pass or the deadline passes. It returns an
// error only when it cannot read the log or the backlog at all; a sink that
// disagrees is a failed row, not an error.
func Verify(ctx context.Context, tr *truth.Truth, sinks Sinks, opts Options) (*Report, error) {
	opts.defaults()
	s, err := newState(tr)
	if err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	if sinks.Partitions < 1 {
		return nil, fmt.Errorf("verify: %d partitions of CLICKS: want at least 1", sinks.Partitions)
	}
	s.partitions = sinks.Partitions
	s.burstThreshold = opts.BurstThreshold
	if sinks.Webhooks != nil {
		// Order per link is judged against CLICKS' order.
		s.logSeq = make([]uint64, len(s.slots))
	}
	start := time.Now()
	dctx, cancel := context.WithDeadline(ctx, start.Add(opts.Deadline))
	defer cancel()

	rep := &Report{CatchUp: -1}
	if err := readLog(dctx, s, sinks.Log, opts); err != nil && (!errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil) {
		return nil, fmt.Errorf("verify: read CLICKS: %w", err)
	}
	rep.LogWait = time.Since(start)
	parked := ""
	if n := s.sentSeen - s.sentFound; n > 0 {
		parked = fmt.Sprintf(" (%d more stored where readers park them)", n)
	}
	opts.Progress(fmt.Sprintf("log: %d of %d sent clicks found%s in %s", s.sentFound, tr.SentCount(), parked, rep.LogWait.Round(time.Millisecond)))

	c := &checker{s: s, sinks: sinks, opts: opts}
	deadline := start.Add(opts.Deadline)
	var posErr error
	for {
		// Each read and query has its own timeout; only the waiting
		// between polls is bounded by the deadline, so the last pass still
		// reads every sink. The log is read on first: a click stored since
		// the last read (a copy stored again, an unanswered request
		// recorded late) is judged like any other, and the readers, whose
		// positions are read next, must have processed it too. Positions
		// are read before the verdicts: a reader of FRAUD is then judged
		// against every verdict published before fraud detection's
		// position was read.
		lctx, lcancel := context.WithTimeout(ctx, queryTimeout)
		err := readToEnd(lctx, s, sinks.Log)
		lcancel()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("verify: %w", ctx.Err())
		}
		if err != nil {
			return nil, fmt.Errorf("verify: read CLICKS: %w", err)
		}
		// A verdict read before its click (one stored since the last
		// read) is judged now that the log may hold it.
		s.resolveVerdicts()
		bctx, bcancel := context.WithTimeout(ctx, queryTimeout)
		pos, err := sinks.Readers.Positions(bctx)
		// The endpoint's queue is read after the group's positions: a
		// group that had queued every click of the run and an empty queue
		// after it mean every click was delivered.
		var queued uint64
		if err == nil && sinks.Webhooks != nil {
			if queued, err = sinks.Webhooks.Queued(bctx); err != nil {
				err = fmt.Errorf("webhooks endpoint %s queue: %w", sinks.Webhooks.Endpoint(), err)
			}
		}
		bcancel()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("verify: %w", ctx.Err())
		}
		if sinks.Verdicts != nil {
			if err := readVerdicts(ctx, s, sinks.Verdicts); err != nil {
				return nil, fmt.Errorf("verify: read FRAUD_VERDICTS: %w", err)
			}
		}
		if sinks.Alerts != nil {
			if err := readAlerts(ctx, s, sinks.Alerts); err != nil {
				return nil, fmt.Errorf("verify: read FRAUD: %w", err)
			}
		}
		posErr = err
		var readers []string
		var behind []Behind
		if err == nil {
			rep.Backlog = backlogs(pos)
			t := s.targets()
			t.Readers = sinks.Expect
			readers, behind = CaughtUp(pos, t)
			if sinks.Webhooks != nil {
				q := webhookQueue(sinks.Webhooks.Endpoint())
				readers = append(readers, q)
				if queued > 0 {
					behind = append(behind, Behind{Reader: q, Partition: -1, Backlog: queued, Queue: true})
				}
			}
		}
		caught := err == nil && len(behind) == 0
		if caught && rep.CatchUp < 0 {
			rep.CatchUp = time.Since(start)
		}
		rows := c.rows(ctx, caught)
		if caught && Passed(rows) {
			// Everything agrees: one last full pass, so a value that
			// changed after it was first seen matching is caught.
			c.confirm = true
			rows = c.rows(ctx, caught)
		}
		if (caught && Passed(rows)) || !time.Now().Before(deadline) {
			if !caught {
				rep.CatchUp = -1 // caught up once, behind again: not caught up
			}
			rep.Behind = behind
			rep.Rows = append(rows, readersRow(readers, behind, rep.Backlog, rep.CatchUp, posErr))
			rep.Passed = Passed(rep.Rows)
			return rep, nil
		}
		var waiting []string
		for _, b := range behind {
			waiting = append(waiting, b.String())
		}
		opts.Progress(fmt.Sprintf("waiting: %s; %s", limitList("reader partitions behind the run", waiting), failing(rows)))
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("verify: %w", ctx.Err())
		case <-time.After(min(opts.Poll, time.Until(deadline))):
		}
	}
}

// readLog reads CLICKS until every sent click is accounted for (found, or
// stored where readers park it: a routing defect or an invalid click is
// judged at once, not waited on until the deadline) and the reader is at
// the end, then for Settle longer. Verify reads on at every poll.
func readLog(ctx context.Context, s *state, log LogReader, opts Options) error {
	for {
		if err := readToEnd(ctx, s, log); err != nil {
			return err
		}
		if s.logComplete() {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(opts.Poll / 5):
		}
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(opts.Settle):
	}
	return readToEnd(ctx, s, log)
}

// readToEnd reads what CLICKS stored since the last read, up to its end.
func readToEnd(ctx context.Context, s *state, log LogReader) error {
	for {
		clicks, atEnd, err := log.Next(ctx)
		if err != nil {
			return err
		}
		for i := range clicks {
			s.addClick(&clicks[i])
		}
		if atEnd {
			return nil
		}
	}
}

func readVerdicts(ctx context.Context, s *state, vr VerdictReader) error {
	for {
		vs, atEnd, err := vr.Next(ctx)
		if err != nil {
			return err
		}
		for i := range vs {
			s.addVerdict(&vs[i])
		}
		if atEnd {
			return nil
		}
	}
}

func readAlerts(ctx context.Context, s *state, ar AlertReader) error {
	for {
		as, atEnd, err := ar.Next(ctx)
		if err != nil {
			return err
		}
		for i := range as {
			s.addAlert(&as[i])
		}
		if atEnd {
			return nil
		}
	}
}

// checker compares the sinks with the state, remembering the counter's
// answers so a poll asks again only about links that did not match.
type checker struct {
	s     *state
	sinks Sinks
	opts  Options
	// counter answers by code
	counter map[string]LinkStats
	// confirm asks every link again.
	confirm bool
}

func (c *checker) rows(ctx context.Context, caught bool) []Result {
	s := c.s
	rows := []Result{s.logResult()}
	if s.tr.Mode == truth.ModeHTTP {
		rows = append(rows, s.sourceLabelResult())
	}
	if _, off := c.sinks.Skip[KeyFraud]; c.sinks.Verdicts != nil && !off {
		rows = append(rows, s.fraudResult())
	} else {
		rows = append(rows, c.skip(KeyFraud, SinkFraud))
	}
	if c.sinks.Alerts != nil {
		rows = append(rows, s.alertResult())
	} else {
		rows = append(rows, c.skip(KeyFraud, SinkFraudAlerts))
	}
	want := s.expectedLinks()
	if c.sinks.Counter != nil {
		rows = append(rows, c.counterRows(ctx, want)...)
	} else {
		rows = append(rows, c.skip(KeyCounter, SinkCounter))
	}
	if c.sinks.Warehouse != nil {
		rows = append(rows, c.warehouseRows(ctx, want, caught)...)
	} else {
		rows = append(rows, c.skip(KeyWarehouse, SinkWarehouse))
	}
	if c.sinks.Webhooks != nil {
		rows = append(rows, s.webhookRows(c.sinks.Webhooks)...)
	} else {
		rows = append(rows, c.skip(KeyWebhooks, SinkWebhooks))
	}
	return rows
}

func (c *checker) skip(key, sink string) Result {
	why := c.sinks.Skip[key]
	if why == "" {
		why = "not configured"
	}
	if slices.Contains(c.opts.Require, key) {
		return Result{Sink: sink, Status: Fail, Note: "required, but " + why}
	}
	return skipped(sink, why)
}

// counterRows asks the counter for every link whose last answer did not
// match (every link on the first and the confirming pass).
func (c *checker) counterRows(ctx context.Context, want map[string]linkTotals) []Result {
	if c.counter == nil {
		c.counter = make(map[string]LinkStats, len(want))
	}
	var ask []string
	for code, w := range want {
		got, ok := c.counter[code]
		if c.confirm || !ok || !w.matches(got) {
			ask = append(ask, code)
		}
	}
	span := c.s.span(c.opts.Now())
	var mu sync.Mutex
	var errs []string
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for _, code := range ask {
		g.Go(func() error {
			qctx, cancel := context.WithTimeout(gctx, queryTimeout)
			defer cancel()
			st, err := c.sinks.Counter.Stats(qctx, code, span)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err.Error())
				delete(c.counter, code)
				return nil
			}
			c.counter[code] = st
			return nil
		})
	}
	_ = g.Wait()

	tot := Result{Sink: SinkCounter}
	bots := Result{Sink: SinkCounterBots}
	countries := Result{Sink: SinkCounterCountries}
	referrers := Result{Sink: SinkCounterReferrers}
	var wrong, wrongDims []string
	var tooMany, unchecked int
	var sc seriesCheck
	for code, w := range want {
		got, ok := c.counter[code]
		if !ok {
			tot.Missing += w.total // unknown: counted as missing until read
			tot.Expected += w.total
			continue
		}
		h, b := got.Totals.Human, got.Totals.Bot
		okTotal := countDiff(&tot, w.total, uint64(max(0, h+b)))
		// A negative count is a correction applied once too often; the
		// total may still be right.
		okBots := countDiff(&bots, w.bot, nonNegative(&bots, b))
		if h < 0 {
			bots.Extra += uint64(-h)
			okBots = false
		}
		if !okTotal || !okBots {
			wrong = append(wrong, fmt.Sprintf("%s want %d/%d got %d/%d", code, w.total-w.bot, w.bot, h, b))
		}
		switch {
		case w.countries == nil:
			unchecked++
		case len(w.countries) > TopDimensions || len(w.referrers) > TopDimensions:
			tooMany++
		default:
			okC := dimDiff(&countries, w.countries, got.Countries)
			okR := dimDiff(&referrers, w.referrers, got.Referrers)
			if !okC || !okR {
				wrongDims = append(wrongDims, code)
			}
		}
		if w.hours != nil {
			sc.link(code, w, got)
		}
	}
	sort.Strings(wrong)
	sort.Strings(wrongDims)
	tot.Note = limitList("links off (human/bot)", wrong)
	if len(errs) > 0 {
		tot.Note = strings.TrimPrefix(tot.Note+"; ", "; ") + fmt.Sprintf("%d stats requests failed, e.g. %s", len(errs), errs[0])
		tot.Missing = max(tot.Missing, 1)
	}
	tot.judge()
	bots.Note = "bot = source label, corrected by the last fraud verdict"
	bots.judge()
	dimNote := "by name, human and bot apart, with the final labels"
	if s := limitList("links off", wrongDims); s != "" {
		dimNote += "; " + s
	}
	if tooMany > 0 {
		dimNote += fmt.Sprintf("; %d links with more than %d names not checked", tooMany, TopDimensions)
	}
	if unchecked > 0 {
		dimNote = fmt.Sprintf("not checked: %d links, more than %d", unchecked, dimLinkLimit)
	}
	countries.Note, referrers.Note = dimNote, dimNote
	countries.judge()
	referrers.judge()
	if unchecked > 0 {
		// No link was compared: a PASS here could not have failed.
		countries.Status, referrers.Status = Skipped, Skipped
	}
	hours, days, uniques := sc.rows(unchecked, c.s.uniquesOff)
	if len(errs) > 0 {
		bots.Status, countries.Status, referrers.Status = Fail, Fail, Fail
		hours.Status, days.Status, uniques.Status = Fail, Fail, Fail
	}
	return []Result{tot, bots, countries, referrers, hours, days, uniques}
}

// matches reports whether the counter's answer about a link is what the
// link must show.
func (w linkTotals) matches(got LinkStats) bool {
	if got.Totals.Human < 0 || got.Totals.Bot < 0 ||
		uint64(got.Totals.Human+got.Totals.Bot) != w.total || uint64(got.Totals.Bot) != w.bot {
		return false
	}
	if w.countries == nil {
		return true
	}
	return maps.Equal(w.countries, nonZero(got.Countries)) && maps.Equal(w.referrers, nonZero(got.Referrers)) &&
		new(seriesCheck).link("", w, got)
}

// nonZero leaves out the names with no clicks.
func nonZero(m map[string]Pair) map[string]Pair {
	out := make(map[string]Pair, len(m))
	for k, v := range m {
		if v != (Pair{}) {
			out[k] = v
		}
	}
	return out
}

// nonNegative returns n as a count; a negative count (a correction
// applied once too often) is not a count of anything, and is extra.
func nonNegative(r *Result, n int64) uint64 {
	if n < 0 {
		r.Extra += uint64(-n)
		return 0
	}
	return uint64(n)
}

// dimDiff compares one link's counts by name, human and bot apart.
func dimDiff(r *Result, want, got map[string]Pair) bool {
	ok := true
	for name, w := range want {
		g := got[name]
		ok = countDiff(r, uint64(w.Human), nonNegative(r, g.Human)) && ok
		ok = countDiff(r, uint64(w.Bot), nonNegative(r, g.Bot)) && ok
	}
	for name, g := range got {
		if _, listed := want[name]; !listed {
			ok = countDiff(r, 0, nonNegative(r, g.Human)) && ok
			ok = countDiff(r, 0, nonNegative(r, g.Bot)) && ok
		}
	}
	return ok
}

// warehouseRows compares the warehouse's per-link distinct event IDs (and,
// when they agree and the run is small enough, the exact ID sets).
func (c *checker) warehouseRows(ctx context.Context, want map[string]linkTotals, caught bool) []Result {
	s := c.s
	qctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	got, err := c.sinks.Warehouse.LinkCounts(qctx, s.tr.Owner, s.codePrefix())
	if err != nil {
		return []Result{{Sink: SinkWarehouse, Status: Fail, Note: "query failed: " + err.Error()}}
	}
	ids := Result{Sink: SinkWarehouse}
	bots := Result{Sink: SinkWarehouseBot}
	var rows, distinct uint64
	for code, w := range want {
		g := got[code]
		countDiff(&ids, w.total, g.Distinct)
		countDiff(&bots, w.sourceBot, g.DistinctBots)
		rows += g.Rows
		distinct += g.Distinct
	}
	for code, g := range got {
		if _, ok := want[code]; !ok {
			ids.Extra += g.Distinct // a code with the run's prefix that the run never made
			ids.Got += g.Distinct
		}
	}
	ids.Note = fmt.Sprintf("by count; %d rows for %d distinct IDs (copies not yet merged are expected)", rows, distinct)
	ids.judge()
	bots.Note = "by count; bot flag as the redirect set it"
	bots.judge()
	if ids.Status == Pass && caught && s.present <= c.opts.SetLimit {
		return c.warehouseSet(ctx, rows, distinct)
	}
	return []Result{ids, bots}
}

// warehouseSet compares the warehouse's event IDs with the log's, one by
// one, and each one's bot flag with the click's: flags swapped between two
// clicks of a link leave the per-link counts right.
func (c *checker) warehouseSet(ctx context.Context, rows, distinct uint64) []Result {
	s := c.s
	r := Result{Sink: SinkWarehouse, Expected: s.present}
	bots := Result{Sink: SinkWarehouseBot}
	seen := make([]bool, len(s.slots))
	qctx, cancel := context.WithTimeout(ctx, 5*queryTimeout)
	defer cancel()
	err := c.sinks.Warehouse.EventIDs(qctx, s.tr.Owner, s.codePrefix(), func(code string, id uuid.UUID, bot bool) {
		r.Got++
		seq, ok := s.lookup(id)
		if !ok || code != s.tag.LinkCode(s.gen.Visit(seq).Link) {
			r.Extra++
			return
		}
		if seen[seq] {
			r.Dup++ // another code or bot flag for the same event
			return
		}
		seen[seq] = true
		if bot {
			bots.Got++
		}
		switch want := s.slots[seq].bot; {
		case want && !bot:
			bots.Missing++
		case !want && bot:
			bots.Extra++
		}
	})
	if err != nil {
		return []Result{{Sink: SinkWarehouse, Status: Fail, Note: "query failed: " + err.Error()}, {Sink: SinkWarehouseBot, Status: Fail, Note: "query failed"}}
	}
	s.forPresent(func(seq uint64, sl *slot) {
		if sl.bot {
			bots.Expected++
		}
		if !seen[seq] {
			r.Missing++
		}
	})
	r.Note = fmt.Sprintf("exact set; %d rows for %d distinct IDs (copies not yet merged are expected)", rows, distinct)
	r.judge()
	bots.Note = "by event ID; bot flag as the redirect set it"
	bots.judge()
	return []Result{r, bots}
}

func total(m map[string]uint64) uint64 {
	var n uint64
	for _, v := range m {
		n += v
	}
	return n
}

func describe(m map[string]uint64) string {
	parts := make([]string, 0, len(m))
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

func failing(rows []Result) string {
	var f []string
	for _, r := range rows {
		if r.Status == Fail {
			f = append(f, fmt.Sprintf("%s (missing %d, extra %d)", r.Sink, r.Missing, r.Extra))
		}
	}
	if len(f) == 0 {
		return "all sinks agree"
	}
	return "not yet: " + strings.Join(f, ", ")
}

func limitList(what string, items []string) string {
	if len(items) == 0 {
		return ""
	}
	const show = 5
	if len(items) > show {
		return fmt.Sprintf("%d %s: %s, ...", len(items), what, strings.Join(items[:show], ", "))
	}
	return fmt.Sprintf("%d %s: %s", len(items), what, strings.Join(items, ", "))
}
