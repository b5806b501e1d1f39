package oracle

import (
	"fmt"
	"hash/maphash"
	"math"
	"slices"
	"time"
)

// A click's hour and day are those of its own time (LogClick.Time), in
// UTC, as the counter counts them: a click served at 12:59:59.9 and stored
// at 13:00:00.1 is in the 12:00 hour.

// unixHour is the hour of t, counted from the Unix epoch.
func unixHour(t time.Time) int64 { return floorDiv(t.Unix(), 3600) }

// unixDay is the UTC day of t, counted from the Unix epoch.
func unixDay(t time.Time) int64 { return floorDiv(t.Unix(), 86400) }

// dayOfHour is the UTC day an hour is in.
func dayOfHour(h int64) int64 { return floorDiv(h, 24) }

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

func hourName(h int64) string { return time.Unix(h*3600, 0).UTC().Format("2006-01-02T15Z") }

func dayName(d int64) string { return time.Unix(d*86400, 0).UTC().Format(time.DateOnly) }

// hourOffset records the hour of a click's time, as an offset from the
// hour of the first click read: two bytes a click.
func (s *state) hourOffset(t time.Time) int16 {
	h := unixHour(t)
	if !s.hoursSet {
		s.baseHour, s.hoursSet = h, true
	}
	// A valid click's time is within events.MaxClockSkew (30 days) of when
	// it was stored, far inside the 3.7 years an int16 of hours spans; a
	// time beyond is kept at the edge, where no series reaches.
	off := int16(min(max(h-s.baseHour, math.MinInt16), math.MaxInt16))
	s.minHour = min(s.minHour, off) // 0 for the first click: its own offset
	return off
}

// clickHour is the hour (from the Unix epoch) of the click in sl.
func (s *state) clickHour(sl *slot) int64 { return s.baseHour + int64(sl.hour) }

// linkDay is one link (by index) on one UTC day.
type linkDay struct {
	link int
	day  int64
}

// visitorKey is what the distinct-visitor record holds, hashed: the same
// visitor on the same link and day is one entry.
type visitorKey struct {
	link    int
	day     int64
	visitor string
}

// uniquesLimit is the most distinct (link, day, visitor) the oracle keeps
// (as 8-byte hashes, about 20 bytes each in a map): beyond it the run's
// uniques are not checked.
const uniquesLimit = 4_000_000

// addVisitor counts a click's visitor among its link's distinct visitors
// of the day, as the counter's HyperLogLog does: only clicks the redirect
// did not label bots (a fraud verdict later does not change it), and only
// with a visitor. Two visitors whose 64-bit hashes collide (about one in
// 10^6 runs at the limit) are one: within the tolerance anyway.
func (s *state) addVisitor(link int, day int64, visitor string) {
	if s.visitors == nil || visitor == "" {
		return
	}
	k := maphash.Comparable(s.visitorSeed, visitorKey{link: link, day: day, visitor: visitor})
	if _, seen := s.visitors[k]; seen {
		return
	}
	if len(s.visitors) >= uniquesLimit {
		s.visitors, s.uniques = nil, nil
		s.uniquesOff = fmt.Sprintf("more than %d distinct visitors by link and day", uniquesLimit)
		return
	}
	s.visitors[k] = struct{}{}
	s.uniques[linkDay{link: link, day: day}]++
}

// span is what the counter is asked for, at now: every hour and day from
// the one before the run's first click on (so a click counted an hour or a
// day early shows, and the series still covers the run if the counter's
// clock has just passed an hour the oracle's has not), as far as the stats
// API goes.
func (s *state) span(now time.Time) Span {
	if !s.hoursSet {
		return Span{Hours: 1, Days: 1}
	}
	first := s.baseHour + int64(s.minHour)
	hours := unixHour(now) - first + 2
	days := unixDay(now) - dayOfHour(first) + 2
	return Span{Hours: int(min(max(hours, 1), MaxSeriesHours)), Days: int(min(max(days, 1), MaxSeriesDays))}
}

// The counter's uniques are a Redis HyperLogLog (16,384 registers): its
// standard error is 0.81% (1.04/sqrt(16384)), and below a few thousand
// visitors, where the estimate is linear counting, it is off only by the
// visitors that share a register (about n²/32,768 of n). The oracle allows
// uniquesSigmas standard errors, plus uniquesSlack visitors for small sets,
// and nothing for an empty one (an empty HyperLogLog counts 0 exactly).
// Measured on redis-server 7 (random visitors, 300 to 3,000 sets of each
// size) the worst errors were 1 at 10 visitors, 3 at 100, 7 at 300, 18 at
// 1,000, 159 at 10,000 and 695 at 50,000, against tolerances of 3, 7, 15,
// 43, 407 and 2,027; the root-mean-square error stayed at or below 0.81%.
// A counter that counts bots' visitors, or clicks instead of visitors, is
// off by more on any link with a few repeat or bot visitors.
const (
	hllStdErr     = 0.0081
	uniquesSigmas = 5
	uniquesSlack  = 2
)

// uniquesTolerance is how far the counter's estimate may be from want
// distinct visitors.
func uniquesTolerance(want int64) int64 {
	if want <= 0 {
		return 0
	}
	return uniquesSlack + int64(math.Ceil(uniquesSigmas*hllStdErr*float64(want)))
}

// seriesCheck accumulates the comparison of every link's hourly and daily
// series and daily uniques with what the log holds.
type seriesCheck struct {
	hours, days, uniques Result
	// off lists, per row, what is off: link, hour or day, want and got.
	offHours, offDays, offUniques []string
	// beforeHours and beforeDays count the run's clicks in hours (days)
	// older than the longest series the API answers: not checked.
	beforeHours, beforeDays uint64
}

// keyed is one entry of a series: an hour or a day from the Unix epoch and
// its counts.
type keyed struct {
	key int64
	Pair
}

// link compares one link's series with w's, and reports whether they
// agree.
func (sc *seriesCheck) link(code string, w linkTotals, got LinkStats) bool {
	hours := make([]keyed, len(got.Hourly))
	for i, h := range got.Hourly {
		hours[i] = keyed{key: unixHour(h.Hour), Pair: h.Pair}
	}
	days := make([]keyed, len(got.Daily))
	for i, d := range got.Daily {
		days[i] = keyed{key: unixDay(d.Day), Pair: d.Pair}
	}
	before, okH := seriesDiff(&sc.hours, &sc.offHours, code, w.hours, hours, MaxSeriesHours, hourName)
	sc.beforeHours += before
	before, okD := seriesDiff(&sc.days, &sc.offDays, code, w.days, days, MaxSeriesDays, dayName)
	sc.beforeDays += before
	okU := true
	if w.uniques != nil {
		okU = uniquesDiff(&sc.uniques, &sc.offUniques, code, w.uniques, got.Daily)
	}
	return okH && okD && okU
}

// seriesDiff compares a link's series, got, with the clicks it must show
// by hour or day, want, human and bot apart: every entry of got (zero
// where want has none), and every entry of want in got. An entry of want
// older than got's first is not checked only when got is as long as the
// API answers (full): the run began before the series does; it returns
// those clicks. Anything else not in got is missing.
func seriesDiff(r *Result, off *[]string, code string, want map[int64]Pair, got []keyed, full int, name func(int64) string) (before uint64, ok bool) {
	ok = true
	in := make(map[int64]bool, len(got))
	first := int64(math.MaxInt64)
	for _, g := range got {
		in[g.key] = true
		first = min(first, g.key)
		w := want[g.key]
		okH := countDiff(r, uint64(w.Human), nonNegative(r, g.Human))
		okB := countDiff(r, uint64(w.Bot), nonNegative(r, g.Bot))
		if !okH || !okB {
			ok = false
			*off = append(*off, fmt.Sprintf("%s %s want %d/%d got %d/%d", code, name(g.key), w.Human, w.Bot, g.Human, g.Bot))
		}
	}
	for k, w := range want {
		if in[k] || w == (Pair{}) {
			continue
		}
		if len(got) >= full && k < first {
			before += uint64(w.Human + w.Bot)
			continue
		}
		ok = false
		countDiff(r, uint64(w.Human), 0)
		countDiff(r, uint64(w.Bot), 0)
		*off = append(*off, fmt.Sprintf("%s %s want %d/%d, not in the series", code, name(k), w.Human, w.Bot))
	}
	return before, ok
}

// uniquesDiff compares a link's daily uniques with the distinct visitors
// the log holds, within uniquesTolerance. A day older than the daily
// series, when it is full, is not checked (the daily row counts its
// clicks); any other day of want not in got is missing.
func uniquesDiff(r *Result, off *[]string, code string, want map[int64]int64, got []DayCount) bool {
	ok := true
	in := make(map[int64]bool, len(got))
	first := int64(math.MaxInt64)
	for _, g := range got {
		d := unixDay(g.Day)
		in[d] = true
		first = min(first, d)
		w := want[d]
		n := int64(nonNegative(r, g.Uniques))
		r.Expected += uint64(w)
		r.Got += uint64(n)
		tol := uniquesTolerance(w)
		if g.Uniques >= 0 && n >= w-tol && n <= w+tol {
			continue
		}
		if n < w {
			r.Missing += uint64(w - n)
		} else {
			r.Extra += uint64(n - w)
		}
		ok = false
		*off = append(*off, fmt.Sprintf("%s %s want %d (±%d) got %d", code, dayName(d), w, tol, g.Uniques))
	}
	for d, w := range want {
		if in[d] || w == 0 || (len(got) >= MaxSeriesDays && d < first) {
			continue
		}
		ok = false
		r.Expected += uint64(w)
		r.Missing += uint64(w)
		*off = append(*off, fmt.Sprintf("%s %s want %d, not in the series", code, dayName(d), w))
	}
	return ok
}

// rows are the hourly, daily and uniques rows; unchecked is the number of
// links whose series were not computed (more than dimLinkLimit), and
// uniquesOff why the uniques were not, if they were not.
func (sc *seriesCheck) rows(unchecked int, uniquesOff string) (hours, days, uniques Result) {
	hours, days, uniques = sc.hours, sc.days, sc.uniques
	hours.Sink, days.Sink, uniques.Sink = SinkCounterHours, SinkCounterDays, SinkCounterUniques
	note := func(what, items string, off []string, before uint64, longest string) string {
		n := what
		if l := limitList(items, sortedCopy(off)); l != "" {
			n += "; " + l
		}
		if before > 0 {
			n += fmt.Sprintf("; %d clicks before the %s series (the run is longer) not checked", before, longest)
		}
		if unchecked > 0 {
			n = fmt.Sprintf("not checked: %d links, more than %d", unchecked, dimLinkLimit)
		}
		return n
	}
	hours.Note = note("by the hour of each click's own time (UTC), human and bot apart, with the final labels", "hours off (human/bot)", sc.offHours, sc.beforeHours,
		fmt.Sprintf("%d-hour", MaxSeriesHours))
	days.Note = note("by the UTC day of each click's own time, human and bot apart, with the final labels", "days off (human/bot)", sc.offDays, sc.beforeDays,
		fmt.Sprintf("%d-day", MaxSeriesDays))
	uniques.Note = fmt.Sprintf("distinct visitors by day of the clicks the redirect did not label bots; the estimate within %d + %.2f%% (%d standard errors of Redis' HyperLogLog)",
		uniquesSlack, 100*uniquesSigmas*hllStdErr, uniquesSigmas)
	if l := limitList("days off", sortedCopy(sc.offUniques)); l != "" {
		uniques.Note += "; " + l
	}
	if sc.beforeDays > 0 {
		uniques.Note += fmt.Sprintf("; days before the %d-day series not checked", MaxSeriesDays)
	}
	if uniquesOff != "" {
		uniques.Note = "not checked: " + uniquesOff
	}
	hours.judge()
	days.judge()
	uniques.judge()
	// A row that compared nothing is not passed: it could not have failed.
	if unchecked > 0 {
		hours.Status, days.Status = Skipped, Skipped
	}
	if uniquesOff != "" {
		uniques.Status = Skipped
	}
	return hours, days, uniques
}

func sortedCopy(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}
