package oracle_test

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"

	"github.com/snipdev/snip/loadtest/internal/oracle"
	"github.com/snipdev/snip/loadtest/internal/truth"
	"github.com/snipdev/snip/loadtest/internal/workload"
	"github.com/snipdev/snip/pkg/events"
)

// The fakes below are plain values behind the oracle's source interfaces:
// what a sink would answer, so each case can change one answer.

type fakeLog struct{ clicks []oracle.LogClick }

func (f *fakeLog) Next(context.Context) ([]oracle.LogClick, bool, error) {
	c := f.clicks
	f.clicks = nil
	return c, true, nil
}

// lateLog is a log whose late clicks are stored while the oracle reads it:
// they are there from the at-th read on (the first read takes every sent
// click, the second ends the settling).
type lateLog struct {
	clicks, late []oracle.LogClick
	at, reads    int
}

func (f *lateLog) Next(context.Context) ([]oracle.LogClick, bool, error) {
	f.reads++
	c := f.clicks
	f.clicks = nil
	if f.reads == f.at {
		c = append(c, f.late...)
	}
	return c, true, nil
}

type fakeVerdicts struct{ verdicts []oracle.Verdict }

func (f *fakeVerdicts) Next(context.Context) ([]oracle.Verdict, bool, error) {
	v := f.verdicts
	f.verdicts = nil
	return v, true, nil
}

type fakeAlerts struct{ alerts []oracle.Alert }

func (f *fakeAlerts) Next(context.Context) ([]oracle.Alert, bool, error) {
	a := f.alerts
	f.alerts = nil
	return a, true, nil
}

// fakeCounter is each link's stats, with series as long as the stats API
// answers, ending at the world's clock; Stats cuts them to the span asked
// for, as the API does.
type fakeCounter map[string]oracle.LinkStats

func (f fakeCounter) Stats(_ context.Context, code string, span oracle.Span) (oracle.LinkStats, error) {
	st := f[code]
	st.Hourly = st.Hourly[max(0, len(st.Hourly)-span.Hours):]
	st.Daily = st.Daily[max(0, len(st.Daily)-span.Days):]
	return st, nil
}

type whRow struct {
	code string
	id   uuid.UUID
	bot  bool
}

type fakeWarehouse struct{ rows []whRow }

func (f *fakeWarehouse) LinkCounts(_ context.Context, _, prefix string) (map[string]oracle.WarehouseCount, error) {
	out := map[string]oracle.WarehouseCount{}
	seen := map[uuid.UUID]bool{}
	for _, r := range f.rows {
		if !strings.HasPrefix(r.code, prefix) {
			continue
		}
		c := out[r.code]
		c.Rows++
		if !seen[r.id] {
			seen[r.id] = true
			c.Distinct++
			if r.bot {
				c.DistinctBots++
			}
		}
		out[r.code] = c
	}
	return out, nil
}

func (f *fakeWarehouse) EventIDs(_ context.Context, _, prefix string, fn func(string, uuid.UUID, bool)) error {
	seen := map[whRow]bool{}
	for _, r := range f.rows {
		if strings.HasPrefix(r.code, prefix) && !seen[r] {
			seen[r] = true
			fn(r.code, r.id, r.bot)
		}
	}
	return nil
}

// fakeWebhooks is the run's webhook receiver: what its endpoint was
// delivered, and the endpoint's queue.
type fakeWebhooks struct {
	wants  map[string]bool
	d      oracle.WebhookDeliveries
	queued uint64
}

func (f *fakeWebhooks) Endpoint() string                       { return "ep_test" }
func (f *fakeWebhooks) Wants(code string) bool                 { return f.wants[code] }
func (f *fakeWebhooks) Deliveries() oracle.WebhookDeliveries   { return f.d }
func (f *fakeWebhooks) Queued(context.Context) (uint64, error) { return f.queued, nil }
func (f *fakeWebhooks) event(code string) (int, *oracle.WebhookEvent) {
	for i := range f.d.Events {
		if f.d.Events[i].Code == code {
			return i, &f.d.Events[i]
		}
	}
	return -1, nil
}

// fakeReaders are readers at fixed positions.
type fakeReaders []oracle.Position

func (f fakeReaders) Positions(context.Context) ([]oracle.Position, error) { return f, nil }

// otherTraffic is the backlog every fake reader has besides the run: a
// demo's trickle that never lets it reach 0.
const otherTraffic = 5

const tag = workload.Tag(0x123456789)

var at = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

// The world's clicks are clickEvery apart from runStart on (by sequence),
// each stored storeDelay after its own time, and verified at verifyAt: the
// run spans two hours and two UTC days, and the click at 23:59:48 is
// stored in the next hour and day.
var (
	runStart = time.Date(2025, 5, 31, 23, 40, 0, 0, time.UTC)
	verifyAt = time.Date(2025, 6, 1, 0, 30, 0, 0, time.UTC)
)

const (
	clickEvery = 12 * time.Second
	storeDelay = 15 * time.Second
)

func spec() workload.Spec {
	return workload.Spec{Seed: 7, Links: 5, ZipfS: 1, BotShare: 0.2, BurstShare: 0.2, BurstSize: 5, Visitors: 1000, CountryShare: 0.5}
}

// world is a run in which every sink is right; cases break one thing.
type world struct {
	tr        *truth.Truth
	gen       *workload.Generator
	log       []oracle.LogClick
	verdicts  []oracle.Verdict
	alerts    []oracle.Alert
	counter   fakeCounter
	warehouse []whRow
	// readers, if set, changes the readers' positions, which are otherwise
	// exactly at the run's last events with other traffic waiting behind.
	readers func([]oracle.Position) []oracle.Position
	// webhooks, if set, changes what the webhook endpoint was delivered,
	// which is otherwise every click of the log on its links (links 0, 2
	// and 4), once, in the log's order, each request signed.
	webhooks func(*fakeWebhooks)
	// now is the clock of the verification and of the counter's series
	// (verifyAt unless a case changes it before recount).
	now time.Time
	// hourOf, if set, is the time the counter counts a click at (its own
	// time otherwise); uniques, if set, the counter's uniques of a link's
	// day, from its clicks in the log (what the redirect did not label
	// bots, by distinct visitor, otherwise).
	hourOf  func(oracle.LogClick) time.Time
	uniques func(clicks []oracle.LogClick) int64
}

// worldPartitions is how many partitions the world's CLICKS has.
const worldPartitions = 2

// webhookLinks are the links the world's endpoint wants.
var webhookLinks = []string{tag.LinkCode(0), tag.LinkCode(2), tag.LinkCode(4)}

// deliveries are what a right webhooks service delivers for the log: the
// first copy of each click of the run on a wanted link, in the log's order.
func (w *world) deliveries() *fakeWebhooks {
	f := &fakeWebhooks{wants: map[string]bool{}}
	for _, c := range webhookLinks {
		f.wants[c] = true
	}
	seen := map[uint64]bool{}
	for _, c := range w.log {
		seq, ok := w.seq(c)
		if !ok || seq >= w.tr.Attempts || seen[seq] {
			continue
		}
		seen[seq] = true
		code := tag.LinkCode(w.gen.Visit(seq).Link)
		if !f.wants[code] {
			continue
		}
		f.d.Events = append(f.d.Events, oracle.WebhookEvent{ID: c.ID.String(), Type: "click", Code: code, Copies: 1, First: uint64(len(f.d.Events) + 1)})
	}
	f.d.Requests = uint64(len(f.d.Events)/10 + 1)
	if w.webhooks != nil {
		w.webhooks(f)
	}
	return f
}

// newWorld builds a perfect run of 200 clicks in the given mode: every
// sent click in the log, every burst click judged a bot, the counter and
// warehouse consistent with both.
func newWorld(t *testing.T, mode truth.Mode) *world {
	t.Helper()
	return newWorldOf(t, mode, spec())
}

// newWorldOf is newWorld with another traffic model.
func newWorldOf(t *testing.T, mode truth.Mode, spec workload.Spec) *world {
	t.Helper()
	g, err := workload.New(spec)
	if err != nil {
		t.Fatal(err)
	}
	w := &world{
		tr: &truth.Truth{Version: truth.Version, Mode: mode, Tag: tag.String(), Owner: "demo", Spec: spec,
			Attempts: 200, Refused: []uint64{3}, Uncertain: []uint64{4, 5}},
		gen:     g,
		counter: fakeCounter{},
		now:     verifyAt,
	}
	for seq := range uint64(200) {
		if seq == 3 || seq == 5 { // refused; and one unanswered request that was not recorded
			continue
		}
		v := g.Visit(seq)
		w.addClick(seq, v)
	}
	w.recount()
	return w
}

func (w *world) addClick(seq uint64, v workload.Visit) {
	id := tag.EventID(seq, at)
	if w.tr.Mode == truth.ModeHTTP {
		id = uuid.Must(uuid.NewV7()).String()
	}
	clicked := runStart.Add(time.Duration(seq) * clickEvery)
	c := oracle.LogClick{ID: uuid.MustParse(id), RequestID: tag.RequestID(seq), Code: tag.LinkCode(v.Link), Bot: v.Kind == workload.Bot, IPPrefix: workload.IPPrefix(v.IP),
		Partition: events.Partition(tag.LinkCode(v.Link), worldPartitions), StreamSeq: uint64(len(w.log) + 1), Visitor: fmt.Sprint("visitor-", v.Identity),
		Time: clicked, Stored: clicked.Add(storeDelay)}
	w.log = append(w.log, c)
	if v.Kind == workload.Burst {
		w.verdicts = append(w.verdicts, oracle.Verdict{ID: "burst:" + id, ClickID: c.ID, Code: c.Code, Bot: true, Rule: "visitor_burst", FraudSeq: uint64(len(w.verdicts) + 1)})
		// One alert per visitor and link (the rule alerts once an hour).
		a := oracle.Alert{ID: "visitor_burst:" + c.Code + ":" + c.Visitor, Rule: "visitor_burst", Code: c.Code, Key: c.Visitor}
		if !slices.Contains(w.alerts, a) {
			w.alerts = append(w.alerts, a)
		}
	}
	w.warehouse = append(w.warehouse, whRow{code: c.Code, id: c.ID, bot: c.Bot})
}

// recount sets the counter from the log and the verdicts.
func (w *world) recount() {
	w.counter = fakeCounter{}
	// A verdict corrects the link it names, as the counter applies it.
	label := map[uuid.UUID]bool{}
	code := map[uuid.UUID]string{}
	for _, c := range w.log {
		code[c.ID] = c.Code
	}
	for _, v := range w.verdicts {
		if code[v.ClickID] == v.Code {
			label[v.ClickID] = v.Bot
		}
	}
	seen := map[uuid.UUID]bool{}
	type linkHour struct {
		code string
		hour time.Time
	}
	hours := map[linkHour]oracle.Pair{}
	days := map[linkHour]oracle.Pair{}
	dayClicks := map[linkHour][]oracle.LogClick{}
	for _, c := range w.log {
		if seen[c.ID] {
			continue
		}
		seen[c.ID] = true
		bot := c.Bot
		if l, ok := label[c.ID]; ok {
			bot = l
		}
		clicked := c.Time
		if w.hourOf != nil {
			clicked = w.hourOf(c)
		}
		h, d := linkHour{c.Code, clicked.Truncate(time.Hour)}, linkHour{c.Code, clicked.Truncate(24 * time.Hour)}
		hours[h] = incd(hours[h], bot)
		days[d] = incd(days[d], bot)
		dayClicks[d] = append(dayClicks[d], c)
		t := w.counter[c.Code]
		if t.Countries == nil {
			t.Countries, t.Referrers = map[string]oracle.Pair{}, map[string]oracle.Pair{}
		}
		// The dimensions the click was sent with.
		country, referrer := "unknown", "(direct)"
		if seq, ok := w.seq(c); ok {
			v := w.gen.Visit(seq)
			if v.Country != "" {
				country = v.Country
			}
			if v.Referrer != "" {
				referrer = strings.TrimPrefix(strings.TrimSuffix(strings.SplitN(strings.TrimPrefix(v.Referrer, "https://"), "/", 2)[0], "/"), "www.")
			}
		}
		inc(&t.Totals, bot)
		t.Countries[country] = incd(t.Countries[country], bot)
		t.Referrers[referrer] = incd(t.Referrers[referrer], bot)
		w.counter[c.Code] = t
	}
	// The series as long as the API answers, ending at the world's clock.
	uniques := w.uniques
	if uniques == nil {
		uniques = distinctVisitors
	}
	for code, t := range w.counter {
		for i := oracle.MaxSeriesHours - 1; i >= 0; i-- {
			h := w.now.Truncate(time.Hour).Add(-time.Duration(i) * time.Hour)
			t.Hourly = append(t.Hourly, oracle.HourCount{Hour: h, Pair: hours[linkHour{code, h}]})
		}
		for i := oracle.MaxSeriesDays - 1; i >= 0; i-- {
			d := linkHour{code, w.now.Truncate(24*time.Hour).AddDate(0, 0, -i)}
			t.Daily = append(t.Daily, oracle.DayCount{Day: d.hour, Pair: days[d], Uniques: uniques(dayClicks[d])})
		}
		w.counter[code] = t
	}
}

// distinctVisitors is what a right counter's uniques estimate for a day's
// clicks: the distinct visitors of those the redirect did not label bots.
func distinctVisitors(clicks []oracle.LogClick) int64 {
	seen := map[string]bool{}
	for _, c := range clicks {
		if !c.Bot && c.Visitor != "" {
			seen[c.Visitor] = true
		}
	}
	return int64(len(seen))
}

func inc(p *oracle.Pair, bot bool) {
	if bot {
		p.Bot++
	} else {
		p.Human++
	}
}

func incd(p oracle.Pair, bot bool) oracle.Pair {
	inc(&p, bot)
	return p
}

// clickTime returns the time of the click with the given ID.
func (w *world) clickTime(t *testing.T, id uuid.UUID) time.Time {
	t.Helper()
	for _, c := range w.log {
		if c.ID == id {
			return c.Time
		}
	}
	t.Fatalf("no click %s in the log", id)
	return time.Time{}
}

// shiftHour adds d to the counter's hour of link code that holds at.
func (w *world) shiftHour(t *testing.T, code string, at time.Time, d oracle.Pair) {
	t.Helper()
	st := w.counter[code]
	for i := range st.Hourly {
		if st.Hourly[i].Hour.Equal(at.Truncate(time.Hour)) {
			st.Hourly[i].Human += d.Human
			st.Hourly[i].Bot += d.Bot
			return
		}
	}
	t.Fatalf("no hour %s in the series of %s", at, code)
}

// shiftDay adds d to the counter's day of link code that holds at.
func (w *world) shiftDay(t *testing.T, code string, at time.Time, d oracle.Pair) {
	t.Helper()
	st := w.counter[code]
	for i := range st.Daily {
		if st.Daily[i].Day.Equal(at.Truncate(24 * time.Hour)) {
			st.Daily[i].Human += d.Human
			st.Daily[i].Bot += d.Bot
			return
		}
	}
	t.Fatalf("no day %s in the series of %s", at, code)
}

// busiestDay returns the counter's day with the most unique visitors.
func (w *world) busiestDay(t *testing.T) *oracle.DayCount {
	t.Helper()
	var best *oracle.DayCount
	for _, st := range w.counter {
		for i := range st.Daily {
			if best == nil || st.Daily[i].Uniques > best.Uniques {
				best = &st.Daily[i]
			}
		}
	}
	if best == nil || best.Uniques == 0 {
		t.Fatal("no day with unique visitors")
	}
	return best
}

// uniquesTolerance is the oracle's documented tolerance for the counter's
// uniques: 2 visitors and 5 standard errors (0.81% each) of want.
func uniquesTolerance(want int64) int64 {
	return 2 + int64(math.Ceil(5*0.0081*float64(want)))
}

// clickOf returns the index in the log of the first click of the given kind.
func (w *world) clickOf(t *testing.T, kind workload.Kind) int {
	t.Helper()
	for i, c := range w.log {
		seq, _ := w.seq(c)
		if w.gen.Visit(seq).Kind == kind {
			return i
		}
	}
	t.Fatalf("no %s click in the log", kind)
	return 0
}

func (w *world) seq(c oracle.LogClick) (uint64, bool) {
	if w.tr.Mode == truth.ModeEvents {
		return tag.SeqOfUUID(c.ID)
	}
	return tag.ParseRequestID(c.RequestID)
}

// positions are the readers exactly at the run's last events: each group on
// both partitions of CLICKS, the counter's consumer on FRAUD.
func (w *world) positions() []oracle.Position {
	last := map[int]uint64{}
	for _, c := range w.log {
		last[c.Partition] = max(last[c.Partition], c.StreamSeq)
	}
	var verdict uint64
	for _, v := range w.verdicts {
		verdict = max(verdict, v.FraudSeq)
	}
	var pos []oracle.Position
	for _, g := range []string{"click-counter", "fraud-detection", "warehouse-loader"} {
		for p := range 2 {
			pos = append(pos, oracle.Position{Reader: g, Stream: "CLICKS", Partition: p, AckFloor: last[p], Backlog: otherTraffic})
		}
	}
	pos = append(pos, oracle.Position{Reader: "FRAUD_VERDICTS/click-counter-verdicts", Stream: "FRAUD_VERDICTS", Partition: -1, AckFloor: verdict, Backlog: otherTraffic})
	if w.readers != nil {
		pos = w.readers(pos)
	}
	return pos
}

func (w *world) sinks() oracle.Sinks {
	return oracle.Sinks{
		Log:        &fakeLog{clicks: append([]oracle.LogClick(nil), w.log...)},
		Partitions: worldPartitions,
		Readers:    fakeReaders(w.positions()),
		Verdicts:   &fakeVerdicts{verdicts: append([]oracle.Verdict(nil), w.verdicts...)},
		Alerts:     &fakeAlerts{alerts: append([]oracle.Alert(nil), w.alerts...)},
		Counter:    w.counter,
		Warehouse:  &fakeWarehouse{rows: w.warehouse},
		Webhooks:   w.deliveries(),
	}
}

// testBurstThreshold is the visitor_burst threshold the cases verify with:
// the worlds' bursts are 5 clicks, and the fullest burst the log lacks a
// click of (burst 0: seq 3 refused) keeps 4, more than it.
const testBurstThreshold = 3

// A burst that refused or unanswered requests cut to the rule's threshold
// or fewer clicks in the log (a redirect killed mid-burst) is a visitor who
// clicked a few times as far as fraud detection can tell: neither labelled
// nor alerted for being a burst. The oracle judges only bursts the rule can
// find; with a lower threshold the same world fails.
func TestVerifyJudgesOnlyBurstsTheRuleCanFind(t *testing.T) {
	t.Parallel()
	w := newWorld(t, truth.ModeEvents)
	// Burst 0 is seqs 0-4; the log holds 0, 1, 2 and 4. Fraud detection
	// with a threshold of 4 finds no burst there: no verdicts, no alert.
	cut := w.log[w.clickOf(t, workload.Burst)]
	inBurst0 := map[uuid.UUID]bool{}
	for _, c := range w.log {
		if seq, ok := w.seq(c); ok && w.gen.Visit(seq).Kind == workload.Burst && w.gen.Visit(seq).Burst == 0 {
			inBurst0[c.ID] = true
		}
	}
	if len(inBurst0) != 4 {
		t.Fatalf("burst 0 has %d clicks in the log, want 4", len(inBurst0))
	}
	w.verdicts = slices.DeleteFunc(w.verdicts, func(v oracle.Verdict) bool { return inBurst0[v.ClickID] })
	w.alerts = slices.DeleteFunc(w.alerts, func(a oracle.Alert) bool { return a.Code == cut.Code && a.Key == cut.Visitor })
	w.recount()
	for threshold, want := range map[int]oracle.Status{4: oracle.Pass, 3: oracle.Fail} {
		rep, err := oracle.Verify(t.Context(), w.tr, w.sinks(), oracle.Options{
			Deadline: 300 * time.Millisecond, Settle: time.Millisecond, Poll: 10 * time.Millisecond, BurstThreshold: threshold,
			Now: func() time.Time { return w.now },
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rep.Rows {
			if r.Sink != oracle.SinkFraud && r.Sink != oracle.SinkFraudAlerts {
				continue
			}
			if r.Status != want {
				t.Errorf("threshold %d: row %q is %s (missing %d), want %s: %s", threshold, r.Sink, r.Status, r.Missing, want, r.Note)
			}
			if threshold == 4 && r.Sink == oracle.SinkFraud && !strings.Contains(r.Note, "1 bursts not judged") {
				t.Errorf("threshold 4: the verdicts row does not say a burst was not judged: %s", r.Note)
			}
		}
	}
}

// outcome is the part of a row a case asserts.
type outcome struct {
	Missing, Extra, Dup uint64
	Status              oracle.Status
}

func verify(t *testing.T, w *world, sinks oracle.Sinks, require ...string) map[string]outcome {
	t.Helper()
	rep, err := oracle.Verify(t.Context(), w.tr, sinks, oracle.Options{
		Deadline: 300 * time.Millisecond, Settle: time.Millisecond, Poll: 10 * time.Millisecond, Require: require,
		BurstThreshold: testBurstThreshold, Now: func() time.Time { return w.now },
	})
	if err != nil {
		t.Fatalf("verify: %v", err)
	}
	out := map[string]outcome{}
	for _, r := range rep.Rows {
		out[r.Sink] = outcome{r.Missing, r.Extra, r.Dup, r.Status}
	}
	if rep.Passed != oracle.Passed(rep.Rows) {
		t.Errorf("report passed = %v, rows say %v", rep.Passed, oracle.Passed(rep.Rows))
	}
	var b bytes.Buffer
	_ = oracle.WriteTable(&b, rep.Rows)
	t.Logf("\n%s", b.String())
	return out
}

var pass = outcome{Status: oracle.Pass}

func TestVerify(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		mode   truth.Mode
		mutate func(t *testing.T, w *world)
		// require makes unconfigured sinks fail
		require []string
		sinks   func(w *world, s *oracle.Sinks)
		want    map[string]outcome // rows not listed must pass (or be skipped where noted)
	}{
		{name: "everything_right_passes", mode: truth.ModeEvents},
		{name: "everything_right_passes_over_http", mode: truth.ModeHTTP},
		{
			name: "click_missing_from_the_log_is_missing_everywhere", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) {
				i := w.clickOf(t, workload.Human)
				w.log = append(w.log[:i], w.log[i+1:]...)
			},
			want: map[string]outcome{
				oracle.SinkLog: {Missing: 1, Status: oracle.Fail},
				// the readers have a click the log does not: extra
				oracle.SinkCounter:          {Extra: 1, Status: oracle.Fail},
				oracle.SinkCounterCountries: {Extra: 1, Status: oracle.Fail},
				oracle.SinkCounterReferrers: {Extra: 1, Status: oracle.Fail},
				oracle.SinkCounterHours:     {Extra: 1, Status: oracle.Fail},
				oracle.SinkCounterDays:      {Extra: 1, Status: oracle.Fail},
				oracle.SinkWarehouse:        {Extra: 1, Status: oracle.Fail},
			},
		},
		{
			name: "click_stored_twice_is_a_duplicate", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) { w.log = append(w.log, w.log[w.clickOf(t, workload.Human)]) },
			want:   map[string]outcome{oracle.SinkLog: {Dup: 1, Status: oracle.Fail}},
		},
		{
			// A copy stored after the log was first read (a relay that
			// publishes again once JetStream's duplicate window has passed)
			// is a duplicate all the same; the readers, which deduplicate
			// it, have processed it.
			name: "click_stored_again_after_the_first_read_is_a_duplicate", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) {
				c := w.log[w.clickOf(t, workload.Human)]
				c.StreamSeq = uint64(len(w.log) + 1)
				w.log = append(w.log, c)
			},
			sinks: func(w *world, s *oracle.Sinks) {
				s.Log = &lateLog{clicks: w.log[:len(w.log)-1], late: w.log[len(w.log)-1:], at: 3}
			},
			want: map[string]outcome{oracle.SinkLog: {Dup: 1, Status: oracle.Fail}},
		},
		{
			name: "request_recorded_as_two_events_is_a_duplicate", mode: truth.ModeHTTP,
			mutate: func(t *testing.T, w *world) {
				c := w.log[w.clickOf(t, workload.Human)]
				c.ID = uuid.Must(uuid.NewV7())
				w.log = append(w.log, c)
			},
			want: map[string]outcome{oracle.SinkLog: {Dup: 1, Status: oracle.Fail}},
		},
		{
			name: "refused_click_in_the_log_is_extra", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) {
				w.addClick(3, w.gen.Visit(3))
				w.recount()
			},
			want: map[string]outcome{oracle.SinkLog: {Extra: 1, Status: oracle.Fail}},
		},
		{
			name: "click_never_sent_in_the_log_is_extra", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) {
				c := oracle.LogClick{ID: uuid.MustParse(tag.EventID(5000, at)), Code: tag.LinkCode(0)}
				w.log = append(w.log, c)
			},
			want: map[string]outcome{oracle.SinkLog: {Extra: 1, Status: oracle.Fail}},
		},
		{
			name: "click_on_the_wrong_link_is_extra", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) {
				i := w.clickOf(t, workload.Human)
				seq, _ := w.seq(w.log[i])
				w.log[i].Code = tag.LinkCode((w.gen.Visit(seq).Link + 1) % 5)
				w.log[i].Partition = events.Partition(w.log[i].Code, worldPartitions) // CLICKS routes by the code it names
			},
			want: map[string]outcome{oracle.SinkLog: {Extra: 1, Status: oracle.Fail}},
		},
		{
			// CLICKS stored a click in another partition than its link's
			// code hashes to: a routing defect. The readers park it
			// (wrong_partition), so no sink has it; the log row fails,
			// the click missing where it belongs and extra where it is.
			name: "click_in_another_partition_than_its_links_is_a_routing_defect", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) {
				i := slices.IndexFunc(w.log, func(c oracle.LogClick) bool {
					seq, _ := w.seq(c)
					return w.gen.Visit(seq).Kind == workload.Human && !slices.Contains(webhookLinks, c.Code)
				})
				if i < 0 {
					t.Fatal("no human click off the webhook links")
				}
				c := w.log[i]
				w.log = slices.Delete(w.log, i, i+1)
				w.warehouse = slices.DeleteFunc(w.warehouse, func(r whRow) bool { return r.id == c.ID })
				w.recount() // the readers parked it
				c.Partition = (c.Partition + 1) % worldPartitions
				w.log = append(w.log, c)
			},
			want: map[string]outcome{oracle.SinkLog: {Missing: 1, Extra: 1, Status: oracle.Fail}},
		},
		{
			name: "unanswered_request_recorded_once_is_allowed", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) {
				w.addClick(5, w.gen.Visit(5))
				w.recount()
			},
		},
		{
			name: "other_links_of_the_owner_are_ignored", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) {
				w.log = append(w.log, oracle.LogClick{ID: uuid.Must(uuid.NewV7()), Code: "demo-link"})
			},
		},
		{
			name: "bot_not_labelled_at_source", mode: truth.ModeHTTP,
			mutate: func(t *testing.T, w *world) {
				w.log[w.clickOf(t, workload.Bot)].Bot = false
				w.recount()
			},
			want: map[string]outcome{
				oracle.SinkSourceLabels: {Missing: 1, Status: oracle.Fail},
				oracle.SinkWarehouseBot: {Extra: 1, Status: oracle.Fail}, // warehouse keeps the original label
			},
		},
		{
			name: "burst_click_without_a_verdict", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) {
				w.verdicts = w.verdicts[1:]
				w.recount()
			},
			want: map[string]outcome{oracle.SinkFraud: {Missing: 1, Status: oracle.Fail}},
		},
		{
			name: "verdict_about_a_click_not_in_the_log", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) {
				w.verdicts = append(w.verdicts, oracle.Verdict{ID: "x", ClickID: uuid.MustParse(tag.EventID(5, at)), Code: tag.LinkCode(0), Bot: true, FraudSeq: 999})
			},
			want: map[string]outcome{oracle.SinkFraud: {Extra: 1, Status: oracle.Fail}},
		},
		{
			// An unanswered request whose click the redirect's outbox
			// relayed late, stored after the oracle last read the log and
			// labelled by fraud detection at once: its verdict is read
			// before the click is. It is judged once the log has the click
			// (the next poll), not counted for ever as a verdict about a
			// click never stored, nor left out of the click's final label.
			name: "verdict_read_before_its_late_click_is_judged_with_it", mode: truth.ModeHTTP,
			mutate: func(t *testing.T, w *world) {
				w.addClick(5, w.gen.Visit(5))
				c := w.log[len(w.log)-1]
				if c.Bot {
					t.Fatal("click 5 is a bot: the verdict would change no count")
				}
				w.verdicts = append(w.verdicts, oracle.Verdict{ID: "flood:" + c.ID.String(), ClickID: c.ID, Code: c.Code, Bot: true,
					Rule: "link_flood", FraudSeq: uint64(len(w.verdicts) + 1)})
				w.recount()
			},
			sinks: func(w *world, s *oracle.Sinks) {
				// Read 1 takes the sent clicks, 2 ends the settling, 3 is
				// the first poll's, whose verdicts include the late click's.
				s.Log = &lateLog{clicks: w.log[:len(w.log)-1], late: w.log[len(w.log)-1:], at: 4}
			},
		},
		{
			// The counter moves the click's count on the link the verdict
			// names: a verdict about a click of one link that names another
			// is extra, and leaves the click without its label.
			name: "verdict_names_another_link_than_its_click", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) {
				v := &w.verdicts[0]
				seq, _ := tag.SeqOfUUID(v.ClickID)
				v.Code = tag.LinkCode((w.gen.Visit(seq).Link + 1) % 5)
				w.recount()
			},
			// the burst click is not labelled on its link: missing
			want: map[string]outcome{oracle.SinkFraud: {Missing: 1, Extra: 1, Status: oracle.Fail}},
		},
		{
			// The same when the link named is not one of the run's: the
			// counter moves a count on another link of the owner, and the
			// run's human click, left human, agrees everywhere else.
			name: "verdict_names_a_link_outside_the_run", mode: truth.ModeHTTP,
			mutate: func(t *testing.T, w *world) {
				c := w.log[w.clickOf(t, workload.Human)]
				w.verdicts = append(w.verdicts, oracle.Verdict{ID: "flood:" + c.ID.String(), ClickID: c.ID, Code: "demo-link", Bot: true,
					Rule: "link_flood", FraudSeq: uint64(len(w.verdicts) + 1)})
				w.recount()
			},
			want: map[string]outcome{oracle.SinkFraud: {Extra: 1, Status: oracle.Fail}},
		},
		{
			// Every burst labelled, none alerted: the owner's alert list
			// and webhooks never hear of it.
			name: "burst_without_an_alert", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) { w.alerts = w.alerts[1:] },
			want:   map[string]outcome{oracle.SinkFraudAlerts: {Missing: 1, Status: oracle.Fail}},
		},
		{
			name: "alert_about_another_visitor", mode: truth.ModeHTTP,
			mutate: func(t *testing.T, w *world) { w.alerts[0].Key = "someone-else" },
			want:   map[string]outcome{oracle.SinkFraudAlerts: {Missing: 1, Status: oracle.Fail}},
		},
		{
			name: "alert_stored_twice", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) { w.alerts = append(w.alerts, w.alerts[0]) },
			want:   map[string]outcome{oracle.SinkFraudAlerts: {Dup: 1, Status: oracle.Fail}},
		},
		{
			name: "verdict_stored_twice", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) { w.verdicts = append(w.verdicts, w.verdicts[0]) },
			want:   map[string]outcome{oracle.SinkFraud: {Dup: 1, Status: oracle.Fail}},
		},
		{
			name: "later_verdict_wins", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) {
				// A human click judged a bot, then cleared: counted human.
				c := w.log[w.clickOf(t, workload.Human)]
				w.verdicts = append(w.verdicts,
					oracle.Verdict{ID: "flood", ClickID: c.ID, Code: c.Code, Bot: true, Rule: "link_flood", FraudSeq: 1000},
					oracle.Verdict{ID: "clear", ClickID: c.ID, Code: c.Code, Bot: false, Rule: "review", FraudSeq: 1001})
			},
		},
		{
			name: "counter_counts_a_click_twice", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) {
				c := w.counter[tag.LinkCode(1)]
				c.Totals.Human++
				w.counter[tag.LinkCode(1)] = c
			},
			want: map[string]outcome{oracle.SinkCounter: {Extra: 1, Status: oracle.Fail}},
		},
		{
			name: "counter_did_not_apply_a_verdict", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) {
				v := w.verdicts[0]
				c := w.counter[v.Code]
				c.Totals.Human, c.Totals.Bot = c.Totals.Human+1, c.Totals.Bot-1
				w.counter[v.Code] = c
			},
			want: map[string]outcome{oracle.SinkCounterBots: {Missing: 1, Status: oracle.Fail}},
		},
		{
			name: "counter_lost_a_click", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) {
				c := w.counter[tag.LinkCode(0)]
				c.Totals.Human--
				w.counter[tag.LinkCode(0)] = c
			},
			want: map[string]outcome{oracle.SinkCounter: {Missing: 1, Status: oracle.Fail}},
		},
		{
			// Totals right, the click under another country: a wrong
			// dimension shows only by dimension.
			name: "counter_counts_a_click_under_the_wrong_country", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) {
				c := w.log[w.clickOf(t, workload.Human)]
				st := w.counter[c.Code]
				for name, p := range st.Countries {
					if p.Human > 0 {
						p.Human--
						st.Countries[name] = p
						st.Countries["ZZ"] = oracle.Pair{Human: 1}
						break
					}
				}
			},
			want: map[string]outcome{oracle.SinkCounterCountries: {Missing: 1, Extra: 1, Status: oracle.Fail}},
		},
		{
			name: "counter_counts_a_click_under_the_wrong_referrer", mode: truth.ModeHTTP,
			mutate: func(t *testing.T, w *world) {
				c := w.log[w.clickOf(t, workload.Human)]
				st := w.counter[c.Code]
				p := st.Referrers["(direct)"]
				p.Human--
				st.Referrers["(direct)"] = p
				q := st.Referrers["t.co"]
				q.Human++
				st.Referrers["t.co"] = q
			},
			want: map[string]outcome{oracle.SinkCounterReferrers: {Missing: 1, Extra: 1, Status: oracle.Fail}},
		},
		{
			// A verdict moves the click's country and referrer counts from
			// human to bot too; a counter that moved only its totals is off
			// by dimension.
			name: "counter_applied_a_verdict_to_its_totals_only", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) {
				v := w.verdicts[0]
				seq, _ := tag.SeqOfUUID(v.ClickID)
				country := w.gen.Visit(seq).Country
				if country == "" {
					country = "unknown"
				}
				st := w.counter[v.Code]
				p := st.Countries[country]
				p.Human, p.Bot = p.Human+1, p.Bot-1
				st.Countries[country] = p
			},
			want: map[string]outcome{oracle.SinkCounterCountries: {Missing: 1, Extra: 1, Status: oracle.Fail}},
		},
		{
			// The click at 23:59:48 is stored at 00:00:03: a counter that
			// counts clicks by when they were stored puts it in the next
			// hour and the next day. Every total and dimension is right.
			name: "counter_counts_a_click_in_the_hour_it_was_stored", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) {
				w.hourOf = func(c oracle.LogClick) time.Time { return c.Stored }
				w.recount()
			},
			want: map[string]outcome{
				oracle.SinkCounterHours: {Missing: 1, Extra: 1, Status: oracle.Fail},
				oracle.SinkCounterDays:  {Missing: 1, Extra: 1, Status: oracle.Fail},
			},
		},
		{
			// A verdict moves its click from human to bot in the click's
			// hour too; a counter that moved it everywhere else is off
			// in that hour only.
			name: "counter_left_a_verdicts_move_out_of_its_hour", mode: truth.ModeHTTP,
			mutate: func(t *testing.T, w *world) {
				v := w.verdicts[0]
				w.shiftHour(t, v.Code, w.clickTime(t, v.ClickID), oracle.Pair{Human: 1, Bot: -1})
			},
			want: map[string]outcome{oracle.SinkCounterHours: {Missing: 1, Extra: 1, Status: oracle.Fail}},
		},
		{
			name: "counter_left_a_verdicts_move_out_of_its_day", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) {
				v := w.verdicts[len(w.verdicts)-1]
				w.shiftDay(t, v.Code, w.clickTime(t, v.ClickID), oracle.Pair{Human: 1, Bot: -1})
			},
			want: map[string]outcome{oracle.SinkCounterDays: {Missing: 1, Extra: 1, Status: oracle.Fail}},
		},
		{
			// The counter's series answer only the current hour: the
			// run's first hour (98 clicks) is not in them.
			name: "counter_series_shorter_than_asked", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) {
				for code, st := range w.counter {
					st.Hourly = st.Hourly[len(st.Hourly)-1:]
					w.counter[code] = st
				}
			},
			want: map[string]outcome{oracle.SinkCounterHours: {Missing: 98, Status: oracle.Fail}},
		},
		{
			// Bots' visitors are not unique visitors: the run's bots (a
			// fifth of its clicks) put some links' days beyond the
			// HyperLogLog's error.
			name: "counter_counts_bots_in_uniques", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) {
				w.uniques = func(clicks []oracle.LogClick) int64 {
					seen := map[string]bool{}
					for _, c := range clicks {
						seen[c.Visitor] = true
					}
					return int64(len(seen))
				}
				w.recount()
			},
			want: map[string]outcome{oracle.SinkCounterUniques: {Status: oracle.Fail}},
		},
		{
			// A burst is one visitor's five clicks: counted as five.
			name: "counter_counts_clicks_not_visitors_in_uniques", mode: truth.ModeHTTP,
			mutate: func(t *testing.T, w *world) {
				w.uniques = func(clicks []oracle.LogClick) int64 {
					var n int64
					for _, c := range clicks {
						if !c.Bot {
							n++
						}
					}
					return n
				}
				w.recount()
			},
			want: map[string]outcome{oracle.SinkCounterUniques: {Status: oracle.Fail}},
		},
		{
			name: "counter_uniques_at_the_edge_of_the_tolerance_pass", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) {
				d := w.busiestDay(t)
				d.Uniques += uniquesTolerance(d.Uniques)
			},
		},
		{
			name: "counter_uniques_beyond_the_tolerance_fail", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) {
				d := w.busiestDay(t)
				if d.Uniques != 36 {
					t.Fatalf("the busiest day has %d uniques; the case wants 36", d.Uniques)
				}
				d.Uniques -= uniquesTolerance(d.Uniques) + 1
			},
			want: map[string]outcome{oracle.SinkCounterUniques: {Missing: 5, Status: oracle.Fail}},
		},
		{
			name: "warehouse_lost_an_event", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) {
				i := 0
				for w.warehouse[i].bot { // keep the bot flags right
					i++
				}
				w.warehouse = append(w.warehouse[:i], w.warehouse[i+1:]...)
			},
			want: map[string]outcome{oracle.SinkWarehouse: {Missing: 1, Status: oracle.Fail}},
		},
		{
			name: "warehouse_copies_are_not_duplicates", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) { w.warehouse = append(w.warehouse, w.warehouse[:10]...) },
		},
		{
			name: "warehouse_swapped_one_event_for_a_stranger", mode: truth.ModeHTTP,
			mutate: func(t *testing.T, w *world) {
				i := 0
				for w.warehouse[i].bot {
					i++
				}
				w.warehouse[i].id = uuid.Must(uuid.NewV7()) // counts agree, the set does not
			},
			want: map[string]outcome{oracle.SinkWarehouse: {Missing: 1, Extra: 1, Status: oracle.Fail}},
		},
		{
			// One bot and one human click of a link with their flags
			// swapped: the link's counts are right, the events are not.
			name: "warehouse_swapped_two_bot_flags", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) {
				bot := -1
				for i, r := range w.warehouse {
					if r.bot {
						bot = i
						break
					}
				}
				if bot < 0 {
					t.Fatal("no bot in the warehouse")
				}
				for i, r := range w.warehouse {
					if !r.bot && r.code == w.warehouse[bot].code {
						w.warehouse[i].bot, w.warehouse[bot].bot = true, false
						return
					}
				}
				t.Fatal("no human click on the bot's link")
			},
			want: map[string]outcome{oracle.SinkWarehouseBot: {Missing: 1, Extra: 1, Status: oracle.Fail}},
		},
		{
			// A copy of an event with the other bot flag: the distinct
			// counts by ID cannot see it.
			name: "warehouse_copy_with_another_bot_flag", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) {
				r := w.warehouse[0]
				r.bot = !r.bot
				w.warehouse = append(w.warehouse, r)
			},
			want: map[string]outcome{oracle.SinkWarehouse: {Dup: 1, Status: oracle.Fail}},
		},
		{
			name: "unconfigured_sinks_are_skipped", mode: truth.ModeEvents,
			sinks: func(_ *world, s *oracle.Sinks) {
				s.Counter, s.Warehouse, s.Verdicts, s.Alerts, s.Webhooks = nil, nil, nil, nil, nil
			},
			want: map[string]outcome{
				oracle.SinkCounter:     {Status: oracle.Skipped},
				oracle.SinkWarehouse:   {Status: oracle.Skipped},
				oracle.SinkFraud:       {Status: oracle.Skipped},
				oracle.SinkFraudAlerts: {Status: oracle.Skipped},
				oracle.SinkWebhooks:    {Status: oracle.Skipped},
			},
		},
		{
			name: "required_webhooks_missing_fails", mode: truth.ModeEvents, require: []string{oracle.KeyWebhooks},
			sinks: func(_ *world, s *oracle.Sinks) { s.Webhooks = nil },
			want:  map[string]outcome{oracle.SinkWebhooks: {Status: oracle.Fail}},
		},
		{
			name: "webhook_endpoint_missed_a_wanted_click", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) {
				w.webhooks = func(f *fakeWebhooks) { f.d.Events = f.d.Events[1:] }
			},
			want: map[string]outcome{oracle.SinkWebhooks: {Missing: 1, Status: oracle.Fail}},
		},
		{
			name: "webhook_endpoint_got_a_click_its_filter_does_not_want", mode: truth.ModeHTTP,
			mutate: func(t *testing.T, w *world) {
				w.webhooks = func(f *fakeWebhooks) {
					for _, c := range w.log {
						if seq, _ := w.seq(c); w.gen.Visit(seq).Link == 1 {
							f.d.Events = append(f.d.Events, oracle.WebhookEvent{ID: c.ID.String(), Type: "click", Code: c.Code, Copies: 1, First: 1000})
							return
						}
					}
					t.Fatal("no click on link 1")
				}
			},
			want: map[string]outcome{oracle.SinkWebhooks: {Extra: 1, Status: oracle.Fail}},
		},
		{
			name: "webhook_endpoint_got_a_click_never_sent", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) {
				w.webhooks = func(f *fakeWebhooks) {
					f.d.Events = append(f.d.Events, oracle.WebhookEvent{ID: tag.EventID(5000, at), Type: "click", Code: tag.LinkCode(0), Copies: 1, First: 1000})
				}
			},
			want: map[string]outcome{oracle.SinkWebhooks: {Extra: 1, Status: oracle.Fail}},
		},
		{
			name: "webhook_with_a_bad_signature", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) {
				w.webhooks = func(f *fakeWebhooks) { f.d.Requests++; f.d.BadSignatures++ }
			},
			want: map[string]outcome{oracle.SinkWebhookSignatures: {Extra: 1, Status: oracle.Fail}},
		},
		{
			// At-least-once: a click delivered again (a batch repeated, a
			// click stored twice) is counted and passes.
			name: "webhook_delivered_again_is_counted_not_failed", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) {
				w.webhooks = func(f *fakeWebhooks) { f.d.Events[0].Copies = 3 }
			},
			want: map[string]outcome{oracle.SinkWebhooks: {Dup: 2, Status: oracle.Pass}},
		},
		{
			name: "webhook_clicks_of_a_link_out_of_order", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) {
				w.webhooks = func(f *fakeWebhooks) {
					i, e := f.event(tag.LinkCode(2))
					if e == nil {
						t.Fatal("no delivery on link 2")
					}
					for j := i + 1; j < len(f.d.Events); j++ {
						if f.d.Events[j].Code == e.Code {
							f.d.Events[i].First, f.d.Events[j].First = f.d.Events[j].First, f.d.Events[i].First
							return
						}
					}
					t.Fatal("one delivery on link 2")
				}
			},
			want: map[string]outcome{oracle.SinkWebhookOrder: {Missing: 1, Status: oracle.Fail}},
		},
		{
			name: "webhook_endpoint_with_events_queued_is_not_caught_up", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) {
				w.webhooks = func(f *fakeWebhooks) { f.queued = 3 }
			},
			want: map[string]outcome{oracle.SinkReaders: {Missing: 1, Status: oracle.Fail}},
		},
		{
			name: "required_sink_missing_fails", mode: truth.ModeEvents, require: []string{oracle.KeyWarehouse},
			sinks: func(_ *world, s *oracle.Sinks) { s.Warehouse = nil },
			want:  map[string]outcome{oracle.SinkWarehouse: {Status: oracle.Fail}},
		},
		{
			// A backlog that never reaches 0 (other traffic) is fine once
			// the run's last events are acknowledged; one partition short
			// of them is not, even by one event.
			name: "reader_one_event_short_of_the_run_fails", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) {
				w.readers = func(pos []oracle.Position) []oracle.Position {
					for i := range pos {
						if pos[i].Reader == "warehouse-loader" && pos[i].Partition == 1 {
							pos[i].AckFloor--
						}
					}
					return pos
				}
			},
			want: map[string]outcome{oracle.SinkReaders: {Missing: 1, Status: oracle.Fail}},
		},
		{
			name: "reader_of_verdicts_short_of_the_run_fails", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) {
				w.readers = func(pos []oracle.Position) []oracle.Position {
					pos[len(pos)-1].AckFloor--
					return pos
				}
			},
			want: map[string]outcome{oracle.SinkReaders: {Missing: 1, Status: oracle.Fail}},
		},
		{
			name: "partition_without_a_consumer_fails", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) {
				w.readers = func(pos []oracle.Position) []oracle.Position { return pos[1:] }
			},
			want: map[string]outcome{oracle.SinkReaders: {Missing: 1, Status: oracle.Fail}},
		},
		{
			// The counter's group has no consumer anywhere: its totals may
			// agree now, but nothing says it has processed the run (it may
			// still count a redelivery twice).
			name: "checked_sinks_reader_without_a_position_fails", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) {
				w.readers = func(pos []oracle.Position) []oracle.Position {
					return slices.DeleteFunc(pos, func(p oracle.Position) bool { return p.Reader == "click-counter" })
				}
			},
			sinks: func(_ *world, s *oracle.Sinks) { s.Expect = []string{"click-counter", "warehouse-loader"} },
			want:  map[string]outcome{oracle.SinkReaders: {Missing: 1, Status: oracle.Fail}},
		},
		{
			// No sink but the log checked and no reader deployed: the
			// readers row judged nothing, so it is skipped, not passed.
			name: "no_reader_and_no_sink_checked_skips_the_readers_row", mode: truth.ModeEvents,
			sinks: func(_ *world, s *oracle.Sinks) {
				s.Readers = fakeReaders(nil)
				s.Verdicts, s.Alerts, s.Counter, s.Warehouse, s.Webhooks = nil, nil, nil, nil, nil
			},
			want: map[string]outcome{
				oracle.SinkFraud:       {Status: oracle.Skipped},
				oracle.SinkFraudAlerts: {Status: oracle.Skipped},
				oracle.SinkCounter:     {Status: oracle.Skipped},
				oracle.SinkWarehouse:   {Status: oracle.Skipped},
				oracle.SinkWebhooks:    {Status: oracle.Skipped},
				oracle.SinkReaders:     {Status: oracle.Skipped},
			},
		},
		{
			// Behind the run's last event but with nothing left to do: a
			// consumer whose filter leaves the run out.
			name: "reader_with_no_backlog_is_caught_up", mode: truth.ModeEvents,
			mutate: func(t *testing.T, w *world) {
				w.readers = func(pos []oracle.Position) []oracle.Position {
					last := &pos[len(pos)-1]
					last.AckFloor, last.Backlog = 0, 0
					return pos
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t, tc.mode)
			if tc.mutate != nil {
				tc.mutate(t, w)
			}
			sinks := w.sinks()
			if tc.sinks != nil {
				tc.sinks(w, &sinks)
			}
			got := verify(t, w, sinks, tc.require...)
			for sink, o := range got {
				want, listed := tc.want[sink]
				if !listed {
					want = pass
				}
				if want.Missing == 0 && want.Extra == 0 && want.Dup == 0 && want.Status == oracle.Fail {
					// only the status is asserted
					o = outcome{Status: o.Status}
				}
				if diff := cmp.Diff(want, o); diff != "" {
					t.Errorf("row %q (-want +got):\n%s", sink, diff)
				}
			}
			for sink := range tc.want {
				if _, ok := got[sink]; !ok {
					t.Errorf("no row %q", sink)
				}
			}
		})
	}
}

// A counter can only be off by a negative count where the totals agree: a
// correction applied once too often. A link with no bot click that shows
// one human more and -1 bots has the right total and, read as "at least 0",
// the right bots; the oracle must fail it.
func TestVerifyFailsANegativeCount(t *testing.T) {
	t.Parallel()
	s := spec()
	s.BotShare, s.BurstShare = 0, 0 // every click human
	tests := []struct {
		name   string
		mutate func(st *oracle.LinkStats)
		sink   string
	}{
		{name: "bots_below_zero", sink: oracle.SinkCounterBots, mutate: func(st *oracle.LinkStats) {
			st.Totals.Human, st.Totals.Bot = st.Totals.Human+1, -1
		}},
		{name: "country_bots_below_zero", sink: oracle.SinkCounterCountries, mutate: func(st *oracle.LinkStats) {
			for name, p := range st.Countries {
				st.Countries[name] = oracle.Pair{Human: p.Human + 1, Bot: -1}
				return
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := newWorldOf(t, truth.ModeEvents, s)
			code := tag.LinkCode(0)
			st := w.counter[code]
			if st.Totals.Bot != 0 || st.Totals.Human == 0 {
				t.Fatalf("link %s counts %+v; want humans only", code, st.Totals)
			}
			tc.mutate(&st)
			w.counter[code] = st
			got := verify(t, w, w.sinks())
			if o := got[tc.sink]; o.Status != oracle.Fail || o.Extra == 0 {
				t.Errorf("row %q: %+v; want FAIL with the negative count extra", tc.sink, o)
			}
		})
	}
}

// spanCounter is a fakeCounter that records the spans it is asked for.
type spanCounter struct {
	fakeCounter
	mu    sync.Mutex
	spans map[oracle.Span]bool
}

func (c *spanCounter) Stats(ctx context.Context, code string, span oracle.Span) (oracle.LinkStats, error) {
	c.mu.Lock()
	c.spans[span] = true
	c.mu.Unlock()
	return c.fakeCounter.Stats(ctx, code, span)
}

// The counter is asked for the series from the hour and day before the
// run's first click on, as far as the stats API goes (48 hours, 30 days):
// a run verified later than that is checked where the series reach, and
// the row says how many clicks it did not check. The world's run is 98
// clicks from 23:40 on May 31st, then 100 from midnight on.
func TestVerifyChecksTheSeriesAsFarAsTheyGo(t *testing.T) {
	t.Parallel()
	type row struct {
		expected uint64
		status   oracle.Status
		note     string // a part of the note
	}
	tests := []struct {
		name   string
		now    time.Time
		mutate func(t *testing.T, w *world)
		span   oracle.Span
		want   map[string]row
	}{
		{
			name: "right_after_the_run", now: verifyAt,
			span: oracle.Span{Hours: 3, Days: 3},
			want: map[string]row{
				oracle.SinkCounterHours: {expected: 198, status: oracle.Pass},
				oracle.SinkCounterDays:  {expected: 198, status: oracle.Pass},
			},
		},
		{
			name: "hourly_series_begins_after_the_runs_first_hour", now: time.Date(2025, 6, 2, 23, 30, 0, 0, time.UTC),
			span: oracle.Span{Hours: 48, Days: 4},
			want: map[string]row{
				oracle.SinkCounterHours: {expected: 100, status: oracle.Pass, note: "98 clicks before the 48-hour series (the run is longer) not checked"},
				oracle.SinkCounterDays:  {expected: 198, status: oracle.Pass},
			},
		},
		{
			name: "what_the_hourly_series_covers_is_still_checked", now: time.Date(2025, 6, 2, 23, 30, 0, 0, time.UTC),
			mutate: func(t *testing.T, w *world) {
				w.shiftHour(t, tag.LinkCode(0), time.Date(2025, 6, 1, 0, 0, 0, 0, time.UTC), oracle.Pair{Human: 1})
			},
			span: oracle.Span{Hours: 48, Days: 4},
			want: map[string]row{
				oracle.SinkCounterHours: {expected: 100, status: oracle.Fail, note: "1 hours off (human/bot): lt-28tfc09-0 2025-06-01T00Z"},
			},
		},
		{
			name: "daily_series_begins_after_the_runs_first_day", now: time.Date(2025, 6, 30, 12, 0, 0, 0, time.UTC),
			span: oracle.Span{Hours: 48, Days: 30},
			want: map[string]row{
				oracle.SinkCounterHours:   {expected: 0, status: oracle.Pass, note: "198 clicks before the 48-hour series"},
				oracle.SinkCounterDays:    {expected: 100, status: oracle.Pass, note: "98 clicks before the 30-day series"},
				oracle.SinkCounterUniques: {status: oracle.Pass, note: "days before the 30-day series not checked"},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t, truth.ModeEvents)
			w.now = tc.now
			w.recount()
			if tc.mutate != nil {
				tc.mutate(t, w)
			}
			sinks := w.sinks()
			counter := &spanCounter{fakeCounter: w.counter, spans: map[oracle.Span]bool{}}
			sinks.Counter = counter
			rep, err := oracle.Verify(t.Context(), w.tr, sinks, oracle.Options{Deadline: 300 * time.Millisecond, Settle: time.Millisecond,
				Poll: 10 * time.Millisecond, BurstThreshold: testBurstThreshold, Now: func() time.Time { return w.now }})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(map[oracle.Span]bool{tc.span: true}, counter.spans); diff != "" {
				t.Errorf("spans asked for (-want +got):\n%s", diff)
			}
			for _, r := range rep.Rows {
				want, ok := tc.want[r.Sink]
				if !ok {
					continue
				}
				if r.Status != want.status || (want.expected != 0 || r.Sink != oracle.SinkCounterUniques) && r.Expected != want.expected || !strings.Contains(r.Note, want.note) {
					t.Errorf("row %q: %d expected, %s, note %q; want %d expected, %s, a note with %q", r.Sink, r.Expected, r.Status, r.Note, want.expected, want.status, want.note)
				}
				delete(tc.want, r.Sink)
			}
			if len(tc.want) > 0 {
				t.Errorf("no rows %v", tc.want)
			}
		})
	}
}

// A run of more links than the oracle computes counts by dimension for
// (100,000) checks no link's countries, referrers, hours, days or
// visitors: those rows are SKIPPED, saying why, not a PASS that no counter
// could fail. A counter that counts every click of the run in the wrong
// country, hour and day, and no visitor, passes the totals still, as it
// should; nothing else about it was looked at.
func TestVerifySkipsTheRowsOfARunWithTooManyLinksToCheck(t *testing.T) {
	t.Parallel()
	sp := spec()
	sp.Links = 100_001
	w := newWorldOf(t, truth.ModeEvents, sp)
	for code, st := range w.counter {
		st.Countries = map[string]oracle.Pair{"ZZ": st.Totals}
		st.Referrers = map[string]oracle.Pair{"nowhere.example": st.Totals}
		for i := range st.Hourly {
			st.Hourly[i].Pair = oracle.Pair{}
		}
		for i := range st.Daily {
			st.Daily[i].Pair, st.Daily[i].Uniques = oracle.Pair{}, 0
		}
		w.counter[code] = st
	}
	rep, err := oracle.Verify(t.Context(), w.tr, w.sinks(), oracle.Options{Deadline: 300 * time.Millisecond, Settle: time.Millisecond,
		Poll: 10 * time.Millisecond, BurstThreshold: testBurstThreshold, Now: func() time.Time { return w.now }})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]oracle.Status{
		oracle.SinkCounter: oracle.Pass, oracle.SinkCounterBots: oracle.Pass,
		oracle.SinkCounterCountries: oracle.Skipped, oracle.SinkCounterReferrers: oracle.Skipped,
		oracle.SinkCounterHours: oracle.Skipped, oracle.SinkCounterDays: oracle.Skipped, oracle.SinkCounterUniques: oracle.Skipped,
	}
	for _, r := range rep.Rows {
		st, ok := want[r.Sink]
		if !ok {
			continue
		}
		delete(want, r.Sink)
		if r.Status != st {
			t.Errorf("row %q is %s, want %s: %s", r.Sink, r.Status, st, r.Note)
		}
		if st == oracle.Skipped && (!strings.HasPrefix(r.Note, "not checked: ") || !strings.Contains(r.Note, " links, more than 100000")) {
			t.Errorf("row %q does not say why it was not checked: %s", r.Sink, r.Note)
		}
	}
	if len(want) > 0 {
		t.Errorf("no rows %v", want)
	}
	if !rep.Passed {
		t.Errorf("the report failed; its rows:\n%+v", rep.Rows)
	}
}

func TestVerifyWaitsForReadersToCatchUp(t *testing.T) {
	t.Parallel()
	w := newWorld(t, truth.ModeEvents)
	sinks := w.sinks()
	// The counter shows nothing until its backlog drains on the third poll.
	slow := &slowCounter{real: w.counter, after: 3}
	slow.pos = w.positions()
	sinks.Counter = slow
	sinks.Readers = slow
	rep, err := oracle.Verify(t.Context(), w.tr, sinks, oracle.Options{Deadline: 10 * time.Second, Settle: time.Millisecond, Poll: 5 * time.Millisecond, BurstThreshold: testBurstThreshold, Now: func() time.Time { return w.now }})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Passed {
		var b bytes.Buffer
		_ = oracle.WriteTable(&b, rep.Rows)
		t.Fatalf("verify did not wait for the counter to catch up:\n%s", b.String())
	}
	if rep.CatchUp < 0 {
		t.Errorf("catch-up time %v; want the time the readers reached the run's last events", rep.CatchUp)
	}
}

// slowCounter is a counter that reaches the run's last events after a few
// polls and answers zero until then; other traffic keeps its backlog above
// 0 throughout.
type slowCounter struct {
	real  fakeCounter
	pos   []oracle.Position
	after int
	polls int
}

func (s *slowCounter) Positions(context.Context) ([]oracle.Position, error) {
	s.polls++
	out := append([]oracle.Position(nil), s.pos...)
	if s.polls < s.after {
		for i := range out {
			if out[i].Reader == "click-counter" {
				out[i].AckFloor /= 2
			}
		}
	}
	return out, nil
}

func (s *slowCounter) Stats(ctx context.Context, code string, span oracle.Span) (oracle.LinkStats, error) {
	if s.polls < s.after {
		return oracle.LinkStats{}, nil
	}
	return s.real.Stats(ctx, code, span)
}

func TestForwardedForNote(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		ignored  bool
		wantNote string
	}{
		{name: "honoured", wantNote: "visitor address from X-Forwarded-For in 198 of 198 clicks"},
		{name: "ignored", ignored: true, wantNote: "X-Forwarded-For was ignored"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t, truth.ModeHTTP)
			w.tr.ForwardedFor = true
			if tc.ignored {
				for i := range w.log {
					w.log[i].IPPrefix = "127.0.0.0/24"
				}
			}
			rep, err := oracle.Verify(t.Context(), w.tr, w.sinks(), oracle.Options{Deadline: time.Second, Settle: time.Millisecond, Poll: 10 * time.Millisecond, BurstThreshold: testBurstThreshold, Now: func() time.Time { return w.now }})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rep.Rows {
				if r.Sink == oracle.SinkSourceLabels && !strings.Contains(r.Note, tc.wantNote) {
					t.Errorf("note %q, want it to say %q", r.Note, tc.wantNote)
				}
			}
		})
	}
}

// A sent click the log holds only where the readers park it (in another
// partition than its link's, a routing defect, or as no valid click) is
// accounted for as soon as it is read: the first read of the log ends
// then, rather than waiting for a copy where it belongs until the
// deadline, and the log row fails for it.
func TestVerifyDoesNotWaitForAClickStoredWhereReadersParkIt(t *testing.T) {
	t.Parallel()
	for name, park := range map[string]func(c *oracle.LogClick){
		"in_another_partition": func(c *oracle.LogClick) { c.Partition = (c.Partition + 1) % worldPartitions },
		"not_a_valid_click":    func(c *oracle.LogClick) { c.Invalid = true },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t, truth.ModeEvents)
			i := slices.IndexFunc(w.log, func(c oracle.LogClick) bool {
				seq, _ := w.seq(c)
				return w.gen.Visit(seq).Kind == workload.Human && !slices.Contains(webhookLinks, c.Code)
			})
			if i < 0 {
				t.Fatal("no human click off the webhook links")
			}
			c := w.log[i]
			w.log = slices.Delete(w.log, i, i+1)
			w.warehouse = slices.DeleteFunc(w.warehouse, func(r whRow) bool { return r.id == c.ID })
			w.recount() // the readers parked it
			park(&c)
			w.log = append(w.log, c)
			const deadline = 4 * time.Second
			rep, err := oracle.Verify(t.Context(), w.tr, w.sinks(), oracle.Options{Deadline: deadline, Settle: time.Millisecond,
				Poll: 10 * time.Millisecond, BurstThreshold: testBurstThreshold, Now: func() time.Time { return w.now }})
			if err != nil {
				t.Fatal(err)
			}
			if rep.LogWait >= deadline/2 {
				t.Errorf("the log was read for %s of the %s deadline: it waited for the parked click to be stored where it belongs", rep.LogWait, deadline)
			}
			i = slices.IndexFunc(rep.Rows, func(r oracle.Result) bool { return r.Sink == oracle.SinkLog })
			if i < 0 {
				t.Fatal("no log row")
			}
			if r := rep.Rows[i]; r.Status != oracle.Fail || r.Missing != 1 || r.Extra != 1 {
				t.Errorf("log row %s, missing %d, extra %d (%s); want FAIL, the parked click missing and extra", r.Status, r.Missing, r.Extra, r.Note)
			}
		})
	}
}
