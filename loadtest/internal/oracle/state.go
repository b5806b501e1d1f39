package oracle

import (
	"bytes"
	"fmt"
	"hash/maphash"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/google/uuid"

	"github.com/snipdev/snip/loadtest/internal/truth"
	"github.com/snipdev/snip/loadtest/internal/workload"
	"github.com/snipdev/snip/pkg/events"
)

// state is what the oracle has learned about a run: which clicks the log
// holds, and the verdicts about them. It needs about 20 bytes per click,
// plus 24 per click in HTTP mode for the event ID index, and 8 when
// webhooks are checked; and about 20 per distinct visitor of a link and
// day (uniquesLimit).
type state struct {
	tr  *truth.Truth
	tag workload.Tag
	gen *workload.Generator

	slots []slot
	// present counts clicks of the run in the log; sentFound those whose
	// outcome was Sent. sentSeen counts the sent clicks the log holds a
	// copy of, wherever it is stored: with sentFound, those only stored
	// where readers park them (another partition than their link's, or
	// not a valid click), which are missing for every reader but need not
	// be waited for.
	present, sentFound, sentSeen uint64
	// foreign counts clicks on the run's links that name no click of the
	// run; wrongLink those recorded against another link than they were
	// sent to; dups the extra copies of clicks already seen.
	foreign, wrongLink, dups uint64
	// invalid counts the run's clicks whose payload is not a valid click.
	invalid uint64
	// partitions is how many partitions CLICKS has (Sinks.Partitions);
	// wrongPartition counts the clicks on the run's links stored in
	// another partition than their link's code hashes to
	// (events.Partition): a routing defect, and readers park them
	// (events.ReasonWrongPartition), so they are as good as missing.
	partitions     int
	wrongPartition uint64
	// xffHonoured counts clicks whose network is the visitor's, not the
	// generator's (HTTP mode with X-Forwarded-For).
	xffHonoured uint64

	// byID maps event IDs to sequences when the IDs do not carry them
	// (HTTP mode: the redirect assigns them). Sorted by id once the log is
	// read; see index.
	byID    []idSeq
	indexed bool

	// verdict bookkeeping
	verdictIDs  map[string]struct{}
	verdictDups uint64
	// unresolved are the verdicts on the run's links whose click the log
	// had not shown when they were read: a click stored after the log's
	// last read (an unanswered request relayed late) and labelled at
	// once. resolveVerdicts judges them again once the log is read on;
	// those left at the end name clicks not in the log.
	unresolved []Verdict
	// verdictWrongLink counts verdicts naming another link than their
	// click's.
	verdictWrongLink uint64
	verdictRules     map[string]uint64 // rule -> verdicts labelling a non-burst human click bot
	label            []uint8           // 0 none, labelHuman, labelBot: the last verdict's label
	labelSeq         []uint64          // FRAUD_VERDICTS sequence of that verdict

	// bursts are the visitor and link of each burst the log holds clicks
	// of (by burst number), and burstClicks how many; burstThreshold is
	// the visitor_burst rule's (Options.BurstThreshold); alerted the
	// visitor_burst alerts on the run's links; alertIDs the alert IDs
	// seen, alerts their number, alertDups the copies.
	bursts         map[int64]alertKey
	burstClicks    map[int64]int
	burstThreshold int
	alerted        map[alertKey]struct{}
	alertIDs       map[string]struct{}
	alerts         uint64
	alertDups      uint64

	// lastClick is, per CLICKS partition, the highest stream sequence of a
	// click on the run's links; lastVerdict the highest FRAUD sequence of a
	// verdict about one. Every reader must have processed up to them.
	lastClick   map[int]uint64
	lastVerdict uint64

	// logSeq is, by click, the CLICKS sequence of its first copy: the
	// order a webhook endpoint must get a link's clicks in. Kept only when
	// webhooks are checked (8 bytes per click).
	logSeq []uint64

	// baseHour is the hour (from the Unix epoch) of the first click read
	// (hoursSet once there is one): each slot's hour is an offset from it.
	// minHour is the earliest offset of a click the log holds.
	baseHour int64
	hoursSet bool
	minHour  int16

	// visitors holds a hash of each distinct (link, day, visitor) of the
	// clicks the redirect did not label bots, and uniques their number by
	// link and day: what the counter's daily uniques estimate. Both nil
	// when not kept, and uniquesOff says why (too many links, or more
	// than uniquesLimit entries).
	visitorSeed maphash.Seed
	visitors    map[uint64]struct{}
	uniques     map[linkDay]int64
	uniquesOff  string
}

// alertKey is what a per-visitor alert is about.
type alertKey struct{ code, visitor string }

// ruleVisitorBurst is fraud detection's per-visitor rule, the one bursts
// trip.
const ruleVisitorBurst = "visitor_burst"

type slot struct {
	id   uuid.UUID
	n    uint8 // copies seen, saturating
	bot  bool  // Click.Bot as stored
	seen bool  // a copy seen, here or where readers park it (state.sentSeen)
	hour int16 // the click's own hour, from state.baseHour
}

type idSeq struct {
	id  uuid.UUID
	seq uint64
}

const (
	labelHuman = 1
	labelBot   = 2
)

func newState(tr *truth.Truth) (*state, error) {
	if err := tr.Validate(); err != nil {
		return nil, err
	}
	tag, _ := tr.RunTag()
	gen, err := workload.New(tr.Spec)
	if err != nil {
		return nil, err
	}
	s := &state{
		tr: tr, tag: tag, gen: gen,
		slots:        make([]slot, tr.Attempts),
		verdictIDs:   map[string]struct{}{},
		verdictRules: map[string]uint64{},
		lastClick:    map[int]uint64{},
		bursts:       map[int64]alertKey{},
		burstClicks:  map[int64]int{},
		alerted:      map[alertKey]struct{}{},
		alertIDs:     map[string]struct{}{},
	}
	if n := gen.NumLinks(); n > dimLinkLimit {
		s.uniquesOff = fmt.Sprintf("%d links, more than %d", n, dimLinkLimit)
	} else {
		s.visitorSeed, s.visitors, s.uniques = maphash.MakeSeed(), map[uint64]struct{}{}, map[linkDay]int64{}
	}
	return s, nil
}

// codePrefix starts every link code of the run.
func (s *state) codePrefix() string { return codePrefix(s.tag) }

func codePrefix(tag workload.Tag) string { return "lt-" + tag.String() + "-" }

// linkOf returns the link index of one of the run's codes.
func (s *state) linkOf(code string) (int, bool) { return linkOf(s.tag, s.gen.NumLinks(), code) }

// linkOf returns the link index of code, if it is one of the links of the
// run tagged tag.
func linkOf(tag workload.Tag, links int, code string) (int, bool) {
	rest, ok := strings.CutPrefix(code, codePrefix(tag))
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(rest, 36, 32)
	if err != nil || int(n) >= links {
		return 0, false
	}
	return int(n), true
}

// seqOf returns the sequence a stored click names, by its event ID (events
// mode) or its request ID (HTTP mode).
func (s *state) seqOf(c *LogClick) (uint64, bool) { return seqOf(s.tr, s.tag, c) }

func seqOf(tr *truth.Truth, tag workload.Tag, c *LogClick) (uint64, bool) {
	var seq uint64
	var ok bool
	if tr.Mode == truth.ModeEvents {
		seq, ok = tag.SeqOfUUID(c.ID)
	} else {
		seq, ok = tag.ParseRequestID(c.RequestID)
	}
	return seq, ok && seq < tr.Attempts
}

// addClick records one click read from the log.
func (s *state) addClick(c *LogClick) {
	if _, ours := s.linkOf(c.Code); !ours {
		return // another link of the owner: not the run's business
	}
	// Every click on the run's links is the readers' to process (count,
	// load, or park), valid or not.
	s.lastClick[c.Partition] = max(s.lastClick[c.Partition], c.StreamSeq)
	seq, ok := s.seqOf(c)
	if c.Partition != events.Partition(c.Code, s.partitions) {
		s.wrongPartition++
		if ok {
			s.see(seq) // accounted for, so the log is not waited on for it
		}
		return
	}
	switch {
	case !ok:
		s.foreign++
		return
	case c.Invalid:
		s.invalid++ // readers park it: as good as missing
		s.see(seq)
		return
	}
	s.see(seq)
	sl := &s.slots[seq]
	if sl.n > 0 {
		s.dups++
		if sl.n < 255 {
			sl.n++
		}
		return
	}
	sl.n, sl.id, sl.bot, sl.hour = 1, c.ID, c.Bot, s.hourOffset(c.Time)
	if s.logSeq != nil {
		s.logSeq[seq] = c.StreamSeq
	}
	s.present++
	if s.tr.Outcome(seq) == truth.Sent {
		s.sentFound++
	}
	v := s.gen.Visit(seq)
	if !c.Bot {
		s.addVisitor(v.Link, dayOfHour(s.clickHour(sl)), c.Visitor)
	}
	if c.Code != s.tag.LinkCode(v.Link) {
		s.wrongLink++
	}
	if v.Kind == workload.Burst {
		if _, seen := s.bursts[v.Burst]; !seen {
			s.bursts[v.Burst] = alertKey{code: s.tag.LinkCode(v.Link), visitor: c.Visitor}
		}
		s.burstClicks[v.Burst]++
	}
	if s.tr.ForwardedFor && c.IPPrefix == workload.IPPrefix(v.IP) {
		s.xffHonoured++
	}
	if s.tr.Mode == truth.ModeHTTP {
		s.byID = append(s.byID, idSeq{c.ID, seq})
		s.indexed = false
	}
}

// targets are the run's last events, for CaughtUp.
func (s *state) targets() Targets {
	return Targets{Clicks: s.lastClick, Fraud: s.lastVerdict}
}

// see marks click seq as seen in the log, in any copy.
func (s *state) see(seq uint64) {
	if sl := &s.slots[seq]; !sl.seen {
		sl.seen = true
		if s.tr.Outcome(seq) == truth.Sent {
			s.sentSeen++
		}
	}
}

// logComplete reports whether every click that must be in the log is
// accounted for: stored, or stored where readers park it (another
// partition than its link's, or not a valid click; those fail the log
// row, and waiting longer would not change that).
func (s *state) logComplete() bool { return s.sentSeen == s.tr.SentCount() }

// lookup returns the click sequence of an event ID, if the log holds it.
func (s *state) lookup(id uuid.UUID) (uint64, bool) {
	var seq uint64
	if s.tr.Mode == truth.ModeEvents {
		var ok bool
		if seq, ok = s.tag.SeqOfUUID(id); !ok || seq >= s.tr.Attempts {
			return 0, false
		}
	} else {
		if !s.indexed {
			sort.Slice(s.byID, func(i, j int) bool { return bytes.Compare(s.byID[i].id[:], s.byID[j].id[:]) < 0 })
			s.indexed = true
		}
		i, ok := slices.BinarySearchFunc(s.byID, id, func(e idSeq, id uuid.UUID) int { return bytes.Compare(e.id[:], id[:]) })
		if !ok {
			return 0, false
		}
		seq = s.byID[i].seq
	}
	sl := &s.slots[seq]
	return seq, sl.n > 0 && sl.id == id
}

// addVerdict records one verdict label read from FRAUD_VERDICTS. The latest
// label about a click (by FRAUD_VERDICTS sequence) is its label.
//
// A verdict is the run's when it names one of the run's links or one of its
// clicks: one about a click of the run that names a link outside it is
// wrong, as one naming another of the run's links is.
func (s *state) addVerdict(v *Verdict) {
	_, ours := s.linkOf(v.Code)
	seq, known := s.lookup(v.ClickID)
	if !ours && !known {
		return // another link's click: not the run's business
	}
	s.lastVerdict = max(s.lastVerdict, v.FraudSeq)
	if _, seen := s.verdictIDs[v.ID]; seen {
		s.verdictDups++
		return
	}
	s.verdictIDs[v.ID] = struct{}{}
	if !known {
		s.unresolved = append(s.unresolved, *v)
		return
	}
	s.applyVerdict(v, seq)
}

// resolveVerdicts applies the unresolved verdicts whose click the log now
// holds.
func (s *state) resolveVerdicts() {
	left := s.unresolved[:0]
	for i := range s.unresolved {
		v := &s.unresolved[i]
		if seq, known := s.lookup(v.ClickID); known {
			s.applyVerdict(v, seq)
			continue
		}
		left = append(left, *v)
	}
	s.unresolved = left
}

// applyVerdict records verdict v about click seq of the log.
func (s *state) applyVerdict(v *Verdict, seq uint64) {
	if v.Code != s.tag.LinkCode(s.gen.Visit(seq).Link) {
		// The counter corrects the link a verdict names: this one would
		// move a count on a link the click is not on.
		s.verdictWrongLink++
		return
	}
	if s.label == nil {
		s.label = make([]uint8, len(s.slots))
		s.labelSeq = make([]uint64, len(s.slots))
	}
	if s.label[seq] != 0 && s.labelSeq[seq] > v.FraudSeq {
		return
	}
	s.label[seq], s.labelSeq[seq] = labelHuman, v.FraudSeq
	if v.Bot {
		s.label[seq] = labelBot
	}
	if k := s.gen.Visit(seq).Kind; v.Bot && (k == workload.Human || k == workload.Probe) {
		s.verdictRules[v.Rule]++
	}
}

// addAlert records one alert read from FRAUD.
func (s *state) addAlert(a *Alert) {
	if _, ours := s.linkOf(a.Code); !ours {
		return
	}
	if _, seen := s.alertIDs[a.ID]; seen {
		s.alertDups++
		return
	}
	s.alertIDs[a.ID] = struct{}{}
	s.alerts++
	if a.Rule == ruleVisitorBurst {
		s.alerted[alertKey{code: a.Code, visitor: a.Key}] = struct{}{}
	}
}

// finalBot is how a reader that applies verdicts must count click seq.
func (s *state) finalBot(seq uint64) bool {
	if s.label != nil && s.label[seq] != 0 {
		return s.label[seq] == labelBot
	}
	return s.slots[seq].bot
}

// forPresent calls fn for every click of the run the log holds.
func (s *state) forPresent(fn func(seq uint64, sl *slot)) {
	for seq := range s.slots {
		if s.slots[seq].n > 0 {
			fn(uint64(seq), &s.slots[seq])
		}
	}
}

// linkTotals are the expected totals of one link.
type linkTotals struct {
	total, bot, sourceBot uint64
	// countries and referrers are the clicks by the dimensions the
	// counter shows, with their final labels; hours and days the clicks by
	// the hour and UTC day of their own time (from the Unix epoch), with
	// their final labels. All nil when the run has too many links to hold
	// them (dimLinkLimit).
	countries, referrers map[string]Pair
	hours, days          map[int64]Pair
	// uniques are the distinct visitors by day of the clicks the redirect
	// did not label bots; nil when not kept (state.uniquesOff).
	uniques map[int64]int64
}

// dimLinkLimit is the most links whose counts by country and referrer the
// oracle computes (about 25 names each in the workload's tables): the
// counter is asked about every link one request at a time, so a run with
// more is not one whose every link can be checked anyway.
const dimLinkLimit = 100_000

// expectedLinks returns, per link code, what every reader must show. A
// click's country and referrer are the ones the generator sent (the
// workload's, recomputed from its sequence): a click the redirect recorded
// under another shows as the counter's error.
func (s *state) expectedLinks() map[string]linkTotals {
	dims := s.gen.NumLinks() <= dimLinkLimit
	out := make(map[string]linkTotals, s.gen.NumLinks())
	for i := range s.gen.NumLinks() {
		t := linkTotals{}
		if dims {
			t.countries, t.referrers = map[string]Pair{}, map[string]Pair{}
			t.hours, t.days = map[int64]Pair{}, map[int64]Pair{}
		}
		if s.uniques != nil {
			t.uniques = map[int64]int64{}
		}
		out[s.tag.LinkCode(i)] = t
	}
	for k, n := range s.uniques {
		out[s.tag.LinkCode(k.link)].uniques[k.day] = n
	}
	s.forPresent(func(seq uint64, sl *slot) {
		v := s.gen.Visit(seq)
		code := s.tag.LinkCode(v.Link)
		t := out[code]
		t.total++
		bot := s.finalBot(seq)
		if bot {
			t.bot++
		}
		if sl.bot {
			t.sourceBot++
		}
		if dims {
			add(t.countries, countryDim(v.Country), bot)
			add(t.referrers, referrerDim(v.Referrer), bot)
			h := s.clickHour(sl)
			add(t.hours, h, bot)
			add(t.days, dayOfHour(h), bot)
		}
		out[code] = t
	})
	return out
}

func (s *state) String() string {
	return fmt.Sprintf("run %s: %d of %d attempts in the log", s.tag, s.present, s.tr.Attempts)
}

// findable reports whether burst b is one fraud detection's visitor_burst
// rule can find: more than its threshold of the burst's clicks are in the
// log. A burst that refused or unanswered requests (a redirect killed
// mid-burst) cut to the threshold or fewer is, as far as the rule can
// tell, a visitor clicking a few times: it is neither labelled nor alerted
// for being a burst, and is not judged.
func (s *state) findable(b int64) bool { return s.burstClicks[b] > s.burstThreshold }

// cutBursts is how many bursts the log holds too few clicks of to be found.
func (s *state) cutBursts() int {
	n := 0
	for b := range s.bursts {
		if !s.findable(b) {
			n++
		}
	}
	return n
}
