package fraud

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
)

// Detector holds what every partition's state shares: the rules and the
// listed networks. It is immutable and safe for concurrent use.
type Detector struct {
	rules  Rules
	nets   networks
	alpha  float64
	memory int64 // Memory, in ns
}

// NewDetector validates the rules and returns a detector.
func NewDetector(r Rules) (*Detector, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	d := &Detector{rules: r, nets: newNetworks(r.ListedNetworks), alpha: r.floodAlpha()}
	d.memory = int64(d.Memory())
	return d, nil
}

// Rules returns the rules the detector runs.
func (d *Detector) Rules() Rules { return d.rules }

// Memory is the span of event time the state depends on: the longest window
// and five half-lives of the flood baseline (what remains of older traffic
// weighs under 4%). Rebuilding a partition from this much of the log gives
// the state an uninterrupted member would have, up to that remainder; links
// idle for longer are forgotten, as a rebuilding member would not see them.
func (d *Detector) Memory() time.Duration {
	return max(d.rules.Reach(), 5*d.rules.FloodHalfLife)
}

// Label says that one click is a bot, and why. The click is the one being
// judged or an earlier one of the same link (a rule that fires labels the
// clicks of the window in which it fired, not only the one that crossed the
// threshold).
type Label struct {
	// Seq is the click's CLICKS sequence.
	Seq uint64
	// Rule is the rule that labelled it.
	Rule string
	// AlertID is the alert the label belongs to, if one has been raised.
	AlertID string
}

// Judgement is what judging one event decided.
type Judgement struct {
	Seq       uint64
	Code      string
	Owner     string
	SourceBot bool
	// At is the event time the decision was taken at (the click's time,
	// clamped by Rules.MaxClockSkew).
	At time.Time
	// Labels are the clicks labelled bot while judging this event, each at
	// most once in the partition's history.
	Labels []Label
	// Alerts are the alerts raised, each at most once per rule, link, key and
	// alert period.
	Alerts []events.FraudAlert
	// Copy: the event is a copy of one the state judged or fed before (the
	// same event ID under another sequence, see copies.go). Nothing was
	// decided, and the statistics must not count it.
	Copy bool
}

// Partition is the detector's state for one CLICKS partition. Events must be
// fed in stream order; it is not safe for concurrent use (the reader runtime
// hands one partition to one goroutine at a time).
//
// Decisions depend only on the events fed and their order, never on the wall
// clock or on how the events were batched: time is event time, expiry and
// eviction happen in event order, and IDs are derived from the events. Two
// members fed the same events decide the same.
type Partition struct {
	d     *Detector
	clock int64  // the latest event time seen, unix ns
	last  uint64 // the last sequence judged

	visitors *table[stateKey, visitorState]
	links    *table[string, linkState]
	pairs    *table[stateKey, pairState]
	counts   *table[stateKey, labelCount]
	// labelled holds the clicks labelled within reach, so no click is
	// labelled twice; labelledQ expires them in the order they were added
	// (it holds exactly the clicks of labelled). labelledPeak is the most
	// labelled held since it was last made (see expire).
	labelled     map[uint64]struct{}
	labelledQ    window
	labelledPeak int
	// ids records the event IDs seen within Memory, to find copies.
	ids    idRecord
	agents agentCache
	// touched holds the label counters judged since the store last took
	// them (CountsStored), with their alert period index + 1.
	touched map[stateKey]int64
	// startAt is the event time of the first event this state saw: links
	// first seen within a flood window of it have a history it did not see.
	startAt int64
	// startLate: the first event came late (cameLate: an outbox backlog, a
	// redrive), its time behind where the stream was. startAt moves up to
	// the first event on time: taken from the late one, an hour before,
	// every link first seen after it looked watched since the start, a busy
	// one judged against the floor at once and flagged as a flood until
	// its flood became its baseline (FloodAdoptAfter). A stream whose events
	// all come late (a backfill) keeps the first one's time.
	startLate bool
	fresh     bool // nothing judged or fed yet
	// late: the click being judged came late (cameLate) and is behind the
	// clock; its keys are looked up with getAt.
	late bool
}

// visitorState is one (link, visitor) identity: its newest
// VisitorThreshold+1 clicks. 48 bytes plus the clicks.
type visitorState struct {
	win       window
	lastAt    int64
	through   uint64 // clicks up to this sequence are labelled
	alertedIn int64  // alert period index + 1 of the last alert raised
}

// linkState is one link: its human-looking clicks in the last FloodWindow,
// the current FloodWindow-long bucket and the baseline.
type linkState struct {
	win window
	// lastAt is the link's newest click time, which the state expires by:
	// a late click (an outbox backlog, a redrive) does not move it back,
	// which would drop the state of a busy link, its flood or its baseline,
	// and judge its next clicks as a new link's.
	lastAt    int64
	through   uint64
	alertedIn int64
	bucket    int64 // index of the current bucket; valid when started
	inBucket  int   // clicks in it
	floodRun  int   // consecutive closed buckets in which it flooded
	flagged   bool  // the link flooded during the current bucket
	started   bool
	warm      bool    // baseline has at least one closed bucket
	unknown   bool    // first seen just after the state began: history unseen
	baseline  float64 // EWMA of clicks per bucket, flood buckets left out
}

// pairState is one (link, network prefix): when an unfurler last fetched the
// link from it, and the recent browser-looking clicks from it.
type pairState struct {
	recent window
	// lastAt (the newest click, which the state expires by) and lastUnfurl
	// (the newest unfurler click) never move back on a late click: the
	// state would expire, or forget the unfurler, while browser-agent
	// fetches are still to be paired with it.
	lastAt     int64
	lastUnfurl int64
	unfurled   bool
}

// labelCount counts the clicks one per-click rule labelled on one link with
// one key in the current alert period.
type labelCount struct {
	// lastAt is the counter's newest click time, which it expires by (an
	// alert period after it): a late click does not move it back, which
	// would drop a count in progress, the next click starting it from 0.
	lastAt    int64
	period    int64 // alert period index + 1
	count     int
	alertedIn int64
}

// pairLimit bounds the browser-looking clicks remembered per (link, prefix)
// for an unfurler that arrives after them.
const pairLimit = 16

// NewPartition returns empty state for one partition.
func (d *Detector) NewPartition() *Partition {
	r := d.rules
	return &Partition{
		d:        d,
		visitors: newTable[stateKey](r.MaxIdentities, func(v *visitorState) int64 { return v.lastAt }),
		links:    newTable[string](r.MaxLinks, func(v *linkState) int64 { return v.lastAt }),
		pairs:    newTable[stateKey](r.MaxPairs, func(v *pairState) int64 { return v.lastAt }),
		counts:   newTable[stateKey](r.MaxLinks, func(v *labelCount) int64 { return v.lastAt }),
		labelled: make(map[uint64]struct{}),
		ids:      newIDRecord(),
		touched:  make(map[stateKey]int64),
		agents:   agentCache{max: 4096},
		fresh:    true,
	}
}

// Last is the last sequence judged or fed; events at or before it are
// skipped, which makes redelivery harmless.
func (p *Partition) Last() uint64 { return p.last }

// Judge judges one event and returns what it decided; ok is false when the
// event was already judged (its sequence is not after Last). A copy of an
// event judged or fed within Memory (the same event ID under another
// sequence) decides nothing: its Judgement has Copy set.
func (p *Partition) Judge(ev reader.Event) (j Judgement, ok bool) {
	if ev.Seq <= p.last {
		return Judgement{}, false
	}
	j = Judgement{Seq: ev.Seq, Code: ev.Click.Code, Owner: ev.Click.Owner, SourceBot: ev.Click.Bot}
	p.judge(ev, &j)
	return j, true
}

// Feed updates the state with an event without deciding anything: the
// rebuild of a partition taken over, whose decisions its previous owner
// already published. The state afterwards is the same as after Judge.
func (p *Partition) Feed(ev reader.Event) bool {
	if ev.Seq <= p.last {
		return false
	}
	p.judge(ev, nil)
	return true
}

// Stats is the size of a partition's state.
type Stats struct {
	Identities, Links, Pairs, Labelled int
	// IDs counts the event IDs recorded to find copies.
	IDs int
	// Evicted counts states pushed out by a cap (not expired by time).
	Evicted uint64
}

// Stats returns the current size of the state.
func (p *Partition) Stats() Stats {
	return Stats{
		Identities: p.visitors.len(), Links: p.links.len(), Pairs: p.pairs.len(), Labelled: len(p.labelled), IDs: p.ids.n,
		Evicted: p.visitors.evicted + p.links.evicted + p.pairs.evicted + p.counts.evicted,
	}
}

// eventTime is the click's own time, clamped to MaxClockSkew after it was
// stored. Event.Stored is zero only in tests that build events by hand.
func (p *Partition) eventTime(ev reader.Event) time.Time {
	t := ev.Click.Time
	if !ev.Stored.IsZero() {
		if lim := ev.Stored.Add(p.d.rules.MaxClockSkew); t.After(lim) {
			t = lim
		}
	}
	return t
}

// judge runs every rule on one event. With j nil (rebuild) it records what
// it would have decided in the state but returns nothing.
func (p *Partition) judge(ev reader.Event, j *Judgement) {
	tt := p.eventTime(ev)
	t := tt.UnixNano()
	if j != nil {
		j.At = tt
	}
	p.last = ev.Seq
	if p.copyOf(ev, t) {
		// The same event under another sequence: it was judged (or fed)
		// as itself already, so it changes nothing here.
		if j != nil {
			j.Copy = true
		}
		return
	}
	late := cameLate(ev)
	// A click come late and behind the clock may be older than its keys'
	// newest: it leaves them where they are in the tables' order (getAt).
	p.late = late && t < p.clock
	switch {
	case p.fresh:
		p.fresh, p.startAt, p.startLate = false, t, late
	case p.startLate && !late:
		// The first event on time says where the stream was when the
		// state began, which a late first event does not (startLate).
		p.startAt, p.startLate = max(p.startAt, t), false
	}
	if t > p.clock {
		p.clock = t
		p.expire()
	}

	c := &ev.Click
	self := click{seq: ev.Seq, at: t}
	agent := p.agents.classify(c.UserAgent)
	human := !c.Bot // still looks like a person

	// Per-click rules: the click alone says it is not a person.
	if human {
		if n, ok := p.d.nets.match(c.IPPrefix); ok {
			alert := p.countLabel(j, c, t, RuleListedNetwork, n.String(), "clicks from listed network "+n.String())
			p.label(j, self, RuleListedNetwork, alert)
			human = false
		}
	}
	if agent.Bot() {
		alert := ""
		if agent.alerts() {
			alert = p.countLabel(j, c, t, RuleBotAgent, agent.Name, fmt.Sprintf("clicks from %s agent %q", agent.Class, agent.Name))
		}
		if human {
			p.label(j, self, RuleBotAgent, alert)
			human = false
		}
	}
	if c.IPPrefix != "" {
		human = p.unfurlerPair(j, c, self, agent, human)
	}
	// Velocity rules see only clicks that still look human: a bot already
	// labelled needs no burst to be found, and a flood is about traffic that
	// passes for people.
	if !human {
		return
	}
	p.visitorBurst(j, c, self)
	if _, burst := p.labelled[self.seq]; burst {
		return // one identity's burst must not make its link look flooded
	}
	p.linkFlood(j, c, self)
}

// cameLate reports whether ev was stored more than CopyLateness after its
// click time (a click is stored milliseconds after the redirect served it).
func cameLate(ev reader.Event) bool {
	return !ev.Stored.IsZero() && ev.Stored.Sub(ev.Click.Time) > CopyLateness
}

// expire drops the state the advancing clock has made irrelevant.
func (p *Partition) expire() {
	r := &p.d.rules
	now := p.clock
	p.visitors.expire(now - int64(r.VisitorWindow))
	p.pairs.expire(now - int64(r.PairWindow))
	p.links.expire(now - int64(p.d.Memory()))
	p.counts.expire(now - int64(r.AlertPeriod))
	p.ids.expire(now - p.d.memory)
	// A label can only be given to a click inside some window, so labels
	// older than twice the reach (slack for slightly unordered clocks) are
	// never looked up again.
	cutoff := now - 2*int64(r.Reach())
	n := 0
	for n < p.labelledQ.len() && p.labelledQ.c[n].at < cutoff {
		delete(p.labelled, p.labelledQ.c[n].seq)
		n++
	}
	p.labelledQ.dropFront(n)
	// A Go map keeps the room it grew to after its entries are deleted: a
	// flood of 10,000 labelled clicks a second would hold its 1.2 million
	// entries' room (about 40 bytes each) until the partition is rebuilt.
	// Once it is down to a quarter of its peak, it is made again from the
	// queue, so the memory follows the clicks of the last 2 x reach. Each
	// rebuild copies at most a third of the deletions since the last, so
	// the cost per label stays constant.
	if l := len(p.labelled); p.labelledPeak >= minLabelledRebuild && l <= p.labelledPeak/4 {
		m := make(map[uint64]struct{}, l)
		for _, c := range p.labelledQ.c {
			m[c.seq] = struct{}{}
		}
		p.labelled, p.labelledPeak = m, l
	}
}

// minLabelledRebuild is the peak below which the map of labelled clicks is
// not made again: its room is then a few hundred kilobytes at most.
const minLabelledRebuild = 4096

// label labels a click once; the first rule to label it names the reason.
func (p *Partition) label(j *Judgement, c click, rule, alertID string) {
	if _, done := p.labelled[c.seq]; done {
		return
	}
	p.labelled[c.seq] = struct{}{}
	p.labelledQ.push(c, 0)
	p.labelledPeak = max(p.labelledPeak, len(p.labelled))
	if j != nil {
		j.Labels = append(j.Labels, Label{Seq: c.seq, Rule: rule, AlertID: alertID})
	}
}

// raise raises an alert unless one was raised for the same rule, link and
// key in the same alert period (alertedIn remembers which). It returns the
// alert's ID either way. detail, the alert's Detail, is called only when
// the alert is raised: a flood calls raise for every click it labels.
//
// alertedIn never moves back. A burst or flood of an earlier period than
// the last alert's, come late (an outbox backlog, a redrive, a click of
// the minute before the hour judged after the hour's first), raises
// nothing and its labels name the last alert: the state holds one period
// per rule, link and key, the latest. Raising the earlier period's alert
// there and moving alertedIn back to it raised it again if it had been
// raised, and the latest period's again at the next click.
func (p *Partition) raise(j *Judgement, alertedIn *int64, a events.FraudAlert, at int64, detail func() string) string {
	ap := int64(p.d.rules.AlertPeriod)
	period := max(at/ap, *alertedIn-1)
	a.ID = AlertID(a.Rule, a.Code, a.Key, time.Unix(0, period*ap))
	if *alertedIn == period+1 {
		return a.ID
	}
	*alertedIn = period + 1
	if j != nil {
		a.Detail = detail()
		a.V = events.FraudVersion
		a.Time = time.Unix(0, at).UTC()
		a.WindowStart = a.WindowStart.UTC()
		a.WindowEnd = a.WindowEnd.UTC()
		j.Alerts = append(j.Alerts, a)
	}
	return a.ID
}

// countLabel counts a click a per-click rule matched and raises the rule's
// alert for the link once the count in the alert period passes
// LabelAlertThreshold. It returns the alert's ID once raised, else "".
func (p *Partition) countLabel(j *Judgement, c *events.Click, t int64, rule, key, what string) string {
	r := &p.d.rules
	k := keyOf(rule+"\x00"+c.Code, key)
	period := t / int64(r.AlertPeriod)
	if lc, ok := p.counts.peek(k); ok && lc.period > period+1 {
		// A click of an earlier alert period than the counter's, come late
		// (an outbox backlog, a redrive): its period's count is gone from
		// the state. Starting the counter again at its period would throw
		// the current period's count away, and the current period's next
		// click would start it again from 0.
		return ""
	}
	lc := p.counts.getAt(k, nil, t, p.late)
	lc.lastAt = max(lc.lastAt, t)
	if lc.period != period+1 {
		lc.period, lc.count = period+1, 0
	}
	lc.count++
	if j != nil {
		p.touched[k] = lc.period
	}
	if lc.count <= r.LabelAlertThreshold {
		return ""
	}
	start := time.Unix(0, period*int64(r.AlertPeriod))
	return p.raise(j, &lc.alertedIn, events.FraudAlert{
		Rule: rule, Code: c.Code, Owner: c.Owner, Key: key,
		WindowStart: start, WindowEnd: start.Add(r.AlertPeriod),
		Count: lc.count, Threshold: r.LabelAlertThreshold,
	}, t, func() string {
		return fmt.Sprintf("more than %d %s within %s", r.LabelAlertThreshold, what, r.AlertPeriod)
	})
}

// unfurlerPair is the HEAD-then-GET rule. The redirect does not publish HEAD
// requests, so the pattern is seen from the GETs: a preview unfurler fetches
// with its own agent, and the same service fetches again at once with a
// browser agent (X does one bot GET and several browser-agent requests,
// Dub #2309). Browser-looking clicks from the unfurler's network prefix on
// the same link within PairWindow before or after its click are labelled.
// It returns whether the click still looks human.
//
// "Within" is either way, by the clicks' own times, whatever order they
// came in: a click come late (an outbox backlog, a redrive) is older than
// clicks already judged. Measured one way only, a late browser-agent click
// was paired with an unfurler that came any time after it, and a late
// unfurler with every browser-agent click still waiting, however long
// after it they came (a person labelled bot, the worst mistake the rule can
// make). An unfurler takes out of the waiting clicks only those it pairs:
// the others still wait for the unfurler of their own time. A browser-agent
// click is compared with the newest unfurler only (the state keeps one):
// a late one within PairWindow of an earlier unfurler of the prefix, not
// of its newest, is not paired.
func (p *Partition) unfurlerPair(j *Judgement, c *events.Click, self click, agent Agent, human bool) bool {
	win := int64(p.d.rules.PairWindow)
	k := keyOf(c.Code, c.IPPrefix)
	if agent.Class == ClassUnfurler {
		ps := p.pairs.getAt(k, nil, self.at, p.late)
		ps.lastAt, ps.lastUnfurl, ps.unfurled = max(ps.lastAt, self.at), max(ps.lastUnfurl, self.at), true
		waiting := ps.recent.c[:0]
		for _, e := range ps.recent.c {
			if !near(self.at, e.at, win) {
				waiting = append(waiting, e)
				continue
			}
			if _, done := p.labelled[e.seq]; !done {
				p.label(j, e, RuleUnfurlerPair, p.countLabel(j, c, self.at, RuleUnfurlerPair, c.IPPrefix, "browser-agent fetches paired with an unfurler from "+c.IPPrefix))
			}
		}
		if len(waiting) == 0 {
			waiting = nil // release the array
		}
		ps.recent.c = waiting
		return human
	}
	if !human {
		return false
	}
	ps := p.pairs.getAt(k, nil, self.at, p.late)
	ps.lastAt = max(ps.lastAt, self.at)
	if ps.unfurled && near(self.at, ps.lastUnfurl, win) {
		p.label(j, self, RuleUnfurlerPair, p.countLabel(j, c, self.at, RuleUnfurlerPair, c.IPPrefix, "browser-agent fetches paired with an unfurler from "+c.IPPrefix))
		return false
	}
	ps.recent.expire(self.at - win)
	ps.recent.push(self, pairLimit)
	return true
}

// near reports whether times a and b are at most d apart, either way.
func near(a, b, d int64) bool { return a-b <= d && b-a <= d }

// visitorBurst is the per-identity rule: more than VisitorThreshold clicks
// within VisitorWindow. The window keeps the newest threshold+1 clicks; when
// they are all within the window of each other, the rule fires and labels
// all of them. That labels exactly the clicks that belong to some window
// with too many clicks: a click in such a window is, at the latest when that
// window's last click arrives, among the newest threshold+1.
//
// Clicks mostly arrive in time order, but not always: an outbox backlog
// relayed after an outage, or a dead-letter redrive, hands in a click hours
// older than the ones the window holds. Two things keep such a click from
// making a burst of clicks that are not one:
//
//   - The span is the window's newest time minus its oldest (by time, not by
//     arrival). Measured from the click being judged, as it was, a late
//     click made the span negative and fired on threshold+1 clicks spread
//     over hours. The span from the click judged to the first arrival is
//     never more than the true span, so only a window that passes that
//     cheap test is scanned: in time order the two are the same, and a
//     window that does not fire costs what it did.
//   - A click older than the identity's newest click minus VisitorWindow is
//     left out of the window. It cannot be in one window with that click or
//     with any click after it, so it can complete no burst with them. Taken
//     in, it would push a kept click out, and for the next threshold clicks
//     the window would hold one real click too few: a real burst among them
//     would fire a click late, its first click unlabelled, or not at all
//     (one of exactly threshold+1 clicks). The clicks it was in a window
//     with, if any, are gone from the state (the window keeps threshold+1
//     clicks, the identity expires a window after its last), so it cannot
//     be judged against them either: the rule labels nothing for it, as for
//     a late click of an identity already expired.
//
// lastAt is the identity's newest click time: a late click does not move it
// back, which would have the identity expire under a burst in progress.
func (p *Partition) visitorBurst(j *Judgement, c *events.Click, self click) {
	r := &p.d.rules
	w := int64(r.VisitorWindow)
	vs := p.visitors.getAt(keyOf(c.Code, c.Visitor), nil, self.at, p.late)
	if self.at < vs.lastAt-w {
		return
	}
	vs.lastAt = max(vs.lastAt, self.at)
	vs.win.push(self, r.VisitorThreshold+1)
	if vs.win.len() <= r.VisitorThreshold || self.at-vs.win.oldest().at > w {
		return
	}
	first, last := vs.win.oldest().at, self.at
	for _, e := range vs.win.c {
		first, last = min(first, e.at), max(last, e.at)
	}
	if last-first > w {
		return
	}
	alert := p.raise(j, &vs.alertedIn, events.FraudAlert{
		Rule: RuleVisitorBurst, Code: c.Code, Owner: c.Owner, Key: c.Visitor,
		WindowStart: time.Unix(0, first), WindowEnd: time.Unix(0, last),
		Count: vs.win.len(), Threshold: r.VisitorThreshold,
	}, last, func() string {
		return fmt.Sprintf("%d clicks by one visitor within %s (at most %d allowed)",
			vs.win.len(), time.Duration(last-first), r.VisitorThreshold)
	})
	for _, e := range vs.win.c {
		if e.seq > vs.through {
			p.label(j, e, RuleVisitorBurst, alert)
		}
	}
	vs.through = self.seq
}

// linkFlood is the per-link rule: more human-looking clicks within
// FloodWindow than max(FloodFloor, FloodFactor x baseline). The baseline is
// an EWMA of the link's clicks per FloodWindow-long bucket; a bucket in which
// the link flooded is left out of it, so a flood never becomes the norm.
//
// A click older than the link's newest click minus FloodWindow, come late
// (an outbox backlog, a redrive), is left out, as visitorBurst leaves one
// out: it cannot be in one window with the newest click or any after it,
// the window holds no click older than a window before the newest, so the
// windows it was in cannot be counted, and its bucket is closed. Taken in,
// it was counted in the window being judged (pushed at its end, it stayed
// until the clicks before it expired), could complete a flood of clicks
// more than a window after it, and a flood going on labelled it link_flood
// for the link's traffic of up to hours later: a person's click labelled
// bot. So no flood labels it, as none labels a late click of a link
// already expired. A click late by less than the window is taken in, at
// the window's end (the window is in stream order, which the labelling
// below relies on): it is counted until the clicks before it expire, at
// most as much longer than its own time would have it as it came late.
// Its own bucket, if closed, is already in the baseline: it is counted in
// the current one (roll), so it weighs in the baseline once, a bucket later
// than its own, a little more than there (one bucket's decay less). Left
// out, it would weigh nothing, the baseline lower and floods flagged
// sooner; folding it into its own bucket's share would need the state to
// keep what weight that bucket went in with, for a click the window
// already counts.
func (p *Partition) linkFlood(j *Judgement, c *events.Click, self click) {
	r := &p.d.rules
	ls := p.links.getAt(c.Code, strings.Clone, self.at, p.late)
	if self.at < ls.lastAt-int64(r.FloodWindow) {
		return
	}
	ls.lastAt = max(ls.lastAt, self.at)
	b := self.at / int64(r.FloodWindow)
	if !ls.started && p.clock < p.startAt+int64(r.FloodWindow) {
		// The state began less than a window ago (a first start, a replay,
		// or the rebuild of a partition taken over), so this link is not
		// necessarily new: its clicks before the start were not seen. It is
		// not judged until a bucket it was watched for in full sets its
		// baseline. Judged against the floor instead, every busy link would
		// look like a flood after each takeover.
		//
		// How long ago is the partition's clock, not the click's own time:
		// a link's first click come late (an outbox backlog, a redrive) of
		// before the start, seen long after it, is of a link the state has
		// watched since, a new one. Taken for one not watched, its next
		// minute went unjudged and then became its baseline: a flood going
		// on was never flagged.
		ls.unknown = true
	}
	p.roll(ls, b)
	ls.inBucket++
	ls.win.expire(self.at - int64(r.FloodWindow))
	ls.win.push(self, 0)
	if ls.unknown {
		return
	}

	limit := float64(r.FloodFloor)
	if ls.warm {
		limit = max(limit, r.FloodFactor*ls.baseline)
	}
	if float64(ls.win.len()) <= limit {
		return
	}
	ls.flagged = true
	first := ls.win.oldest()
	alert := p.raise(j, &ls.alertedIn, events.FraudAlert{
		Rule: RuleLinkFlood, Code: c.Code, Owner: c.Owner,
		WindowStart: time.Unix(0, first.at), WindowEnd: time.Unix(0, self.at),
		Count: ls.win.len(), Threshold: int(limit),
	}, self.at, func() string {
		return fmt.Sprintf("%d clicks within %s; baseline %s per %s, at most %d allowed",
			ls.win.len(), r.FloodWindow, strconv.FormatFloat(ls.baseline, 'f', 1, 64), r.FloodWindow, int(limit))
	})
	// The window is in stream order: what it holds after ls.through is at
	// its end (all of it when the rule first fires, then one click per
	// click). Searching from the end keeps a flood linear; scanning the
	// whole window for each click was quadratic (a minute of a viral link
	// is hundreds of thousands of clicks).
	from := len(ls.win.c)
	for from > 0 && ls.win.c[from-1].seq > ls.through {
		from--
	}
	for _, e := range ls.win.c[from:] {
		p.label(j, e, RuleLinkFlood, alert)
	}
	ls.through = self.seq
}

// roll moves a link's bucket forward to b, folding the closed bucket into
// the baseline (unless the link flooded in it) and decaying the baseline for
// the empty buckets in between. The first closed bucket sets the baseline
// (no bias towards zero for a link just seen); FloodAdoptAfter of flood
// buckets in a row does too. A link whose history the state has not seen
// waits for the first bucket watched in full.
func (p *Partition) roll(ls *linkState, b int64) {
	if !ls.started {
		ls.started, ls.bucket = true, b
		return
	}
	if b <= ls.bucket {
		return // same bucket, or a click whose clock is slightly behind
	}
	a := p.d.alpha
	W := int64(p.d.rules.FloodWindow)
	switch {
	case ls.unknown:
		// Only a bucket that began after the state did was watched in full.
		if ls.bucket*W >= p.startAt {
			ls.baseline, ls.warm, ls.unknown, ls.floodRun = float64(ls.inBucket), true, false, 0
		}
	case ls.flagged:
		ls.floodRun++
		if time.Duration(ls.floodRun)*p.d.rules.FloodWindow >= p.d.rules.FloodAdoptAfter {
			ls.baseline, ls.warm, ls.floodRun = float64(ls.inBucket), true, 0
		}
	case ls.warm:
		ls.baseline = a*float64(ls.inBucket) + (1-a)*ls.baseline
		ls.floodRun = 0
	default:
		ls.baseline, ls.warm, ls.floodRun = float64(ls.inBucket), true, 0
	}
	if gap := b - ls.bucket - 1; gap > 0 {
		ls.floodRun = 0
		if ls.warm {
			ls.baseline *= math.Pow(1-a, float64(gap))
		}
	}
	ls.bucket, ls.inBucket, ls.flagged = b, 0, false
}
