package counter

import (
	"iter"
	"net/url"
	"strings"
	"time"

	"github.com/snipdev/snip/pkg/events"
)

// Label is how a click is counted: as a human or as a bot.
type Label byte

// Labels. The byte is what the store writes.
const (
	Human Label = 'h'
	Bot   Label = 'b'
)

// LabelOf returns Bot for true and Human for false.
func LabelOf(bot bool) Label {
	if bot {
		return Bot
	}
	return Human
}

// String returns "human" or "bot".
func (l Label) String() string {
	if l == Bot {
		return "bot"
	}
	return "human"
}

// LinkRef names a link's counts. Counts are keyed by owner and code, so a
// code deleted and created again by another owner never inherits counts.
type LinkRef struct {
	Owner string
	Code  string
}

// Pair is a human and a bot count.
type Pair struct {
	Human int64 `json:"human"`
	Bot   int64 `json:"bot"`
}

// Add adds n to the count of label l.
func (p *Pair) Add(l Label, n int64) {
	if l == Bot {
		p.Bot += n
	} else {
		p.Human += n
	}
}

// Get returns the count of label l.
func (p Pair) Get(l Label) int64 {
	if l == Bot {
		return p.Bot
	}
	return p.Human
}

// Day is a UTC calendar day, counted from the Unix epoch.
type Day int32

// DayOf returns the UTC day of t.
func DayOf(t time.Time) Day {
	return Day(t.UTC().Unix() / 86400)
}

// Start returns midnight UTC of d.
func (d Day) Start() time.Time { return time.Unix(int64(d)*86400, 0).UTC() }

// End returns midnight UTC of the day after d.
func (d Day) End() time.Time { return d.Start().Add(24 * time.Hour) }

// String formats d as 2006-01-02.
func (d Day) String() string { return d.Start().Format(time.DateOnly) }

// Key formats d as 20060102, the form used in store keys.
func (d Day) Key() string { return d.Start().Format("20060102") }

// Dimension values used when a click lacks one.
const (
	// UnknownCountry stands for a click without a country header.
	UnknownCountry = "unknown"
	// DirectReferrer stands for a click without a Referer header.
	DirectReferrer = "(direct)"
	// UnknownReferrer stands for a Referer that is not a URL with a host.
	UnknownReferrer = "(unknown)"
	// OtherReferrer collects the referrers of a link beyond MaxCombosPerLink,
	// so a link's counts stay bounded.
	OtherReferrer = "(other)"
)

// MaxCombosPerLink bounds the distinct (label, country, referrer) counts kept
// per link. Clicks that would add another are counted under OtherReferrer
// with their label and country, so totals and countries stay exact and only
// the long tail of referrers is folded.
const MaxCombosPerLink = 512

// Combo is one (country, referrer host) a link's clicks are counted under.
// A link's total, top countries and top referrers are sums over its combos:
// one increment per click counts all three.
type Combo struct {
	Country  string
	Referrer string
}

// CountryOf is the country dimension of a click: the ISO code, uppercased,
// or UnknownCountry for anything that is not two ASCII letters. The redirect
// sends only such codes, but the counter does not rely on it: the country is
// a part of the (label, country, referrer) field a link's counts are kept
// under, and a separator in it ("a|") would move the click to another
// referrer when the field is read back.
func CountryOf(country string) string {
	if len(country) != 2 || !asciiLetter(country[0]) || !asciiLetter(country[1]) {
		return UnknownCountry
	}
	return strings.ToUpper(country)
}

func asciiLetter(b byte) bool { return 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' }

// ReferrerHost is the referrer dimension of a click: the host of the Referer
// header, lowercased, without port or a leading "www.".
func ReferrerHost(referrer string) string {
	if referrer == "" {
		return DirectReferrer
	}
	u, err := url.Parse(referrer)
	if err != nil || u.Hostname() == "" {
		return UnknownReferrer
	}
	h := strings.ToLower(u.Hostname())
	h = strings.TrimPrefix(h, "www.")
	if h == "" || len(h) > 253 {
		return UnknownReferrer
	}
	return h
}

// Delta is what a batch adds to the counts of one partition.
//
// It is kept flat, in a few slices and maps of the whole batch rather than
// maps per link and per day: a batch of the spread mix touches hundreds of
// links, and a map or two of their own per link and day cost more than the
// counting. A link's combos, days and a day's visitors are chained through
// the batch's slices (Combos, Days, Visitors iterate them). Reset empties a
// delta for the next batch and keeps what it allocated.
//
// The strings a delta holds are the clicks' own (they may share the memory
// of the messages the clicks were read from): a delta is valid as long as
// its batch's clicks are.
type Delta struct {
	// Links are the batch's links, in the order of their first click.
	Links []LinkDelta

	combos   []comboDelta
	days     []DayDelta
	visitors []visitorEntry

	linkIdx  map[LinkRef]int32
	comboIdx map[comboKey]int32
	dayIdx   map[dayKey]int32
	seen     map[visitorKey]struct{}

	// hosts caches ReferrerHost for the batch's Referer values: a batch
	// holds few distinct ones, and parsing a URL costs more than a lookup.
	hosts map[string]string
}

// LinkDelta is what a batch adds to one link: its combos and its days,
// read through Delta.Combos and Delta.Days.
type LinkDelta struct {
	Ref LinkRef
	// combo, day: 1 + the index of the link's last combo and day in the
	// batch's slices (0: none), each chained to the one before.
	combo, day int32
	// lastDay is 1 + the index of the day the link's previous click was
	// on: most clicks of a batch fall on the day before them.
	lastDay int32
}

// DayDelta is what a batch adds to one link on one UTC day.
type DayDelta struct {
	Day   Day
	Total Pair
	Hours [24]Pair
	// NumVisitors is how many distinct visitor hashes the day's clicks
	// that the redirect did not flag as bots have (Delta.Visitors lists
	// them), for the unique-visitor count.
	NumVisitors int
	visitor     int32 // 1 + the index of the last one, chained
	next        int32 // 1 + the index of the link's day before this one
}

type comboDelta struct {
	Combo
	Pair
	next int32
}

type visitorEntry struct {
	v    string
	next int32
}

type comboKey struct {
	link int32
	Combo
}

type dayKey struct {
	link int32
	day  Day
}

type visitorKey struct {
	day int32
	v   string
}

// maxCachedHosts bounds a delta's cache of referrer hosts.
const maxCachedHosts = 1000

// NewDelta returns an empty delta. It allocates its maps on its first Add.
func NewDelta() *Delta { return &Delta{} }

// Reset empties d, keeping its slices and maps for the next batch.
func (d *Delta) Reset() {
	clear(d.Links)
	d.Links = d.Links[:0]
	clear(d.combos)
	d.combos = d.combos[:0]
	d.days = d.days[:0]
	clear(d.visitors)
	d.visitors = d.visitors[:0]
	clear(d.linkIdx)
	clear(d.comboIdx)
	clear(d.dayIdx)
	clear(d.seen)
	clear(d.hosts)
}

// Empty reports whether the delta adds nothing.
func (d *Delta) Empty() bool { return len(d.Links) == 0 }

// Combos yields what the batch adds to each (country, referrer) of link l.
func (d *Delta) Combos(l *LinkDelta) iter.Seq2[Combo, Pair] {
	return func(yield func(Combo, Pair) bool) {
		for i := l.combo; i != 0; {
			c := &d.combos[i-1]
			if !yield(c.Combo, c.Pair) {
				return
			}
			i = c.next
		}
	}
}

// Days yields what the batch adds to link l on each day.
func (d *Delta) Days(l *LinkDelta) iter.Seq[*DayDelta] {
	return func(yield func(*DayDelta) bool) {
		for i := l.day; i != 0; {
			dd := &d.days[i-1]
			if !yield(dd) {
				return
			}
			i = dd.next
		}
	}
}

// Visitors yields the distinct visitor hashes of dd (dd.NumVisitors).
func (d *Delta) Visitors(dd *DayDelta) iter.Seq[string] {
	return func(yield func(string) bool) {
		for i := dd.visitor; i != 0; {
			v := &d.visitors[i-1]
			if !yield(v.v) {
				return
			}
			i = v.next
		}
	}
}

// Add counts one click n times under label l.
func (d *Delta) Add(c *events.Click, l Label, n int64) {
	if d.linkIdx == nil {
		d.linkIdx = map[LinkRef]int32{}
		d.comboIdx = map[comboKey]int32{}
		d.dayIdx = map[dayKey]int32{}
		d.seen = map[visitorKey]struct{}{}
		d.hosts = map[string]string{}
	}
	ref := LinkRef{Owner: c.Owner, Code: c.Code}
	li, ok := d.linkIdx[ref]
	if !ok {
		d.Links = append(d.Links, LinkDelta{Ref: ref})
		li = int32(len(d.Links) - 1)
		d.linkIdx[ref] = li
	}
	ld := &d.Links[li]
	host, ok := d.hosts[c.Referrer]
	if !ok {
		host = ReferrerHost(c.Referrer)
		if len(d.hosts) < maxCachedHosts {
			d.hosts[c.Referrer] = host
		}
	}
	ck := comboKey{link: li, Combo: Combo{Country: CountryOf(c.Country), Referrer: host}}
	ci, ok := d.comboIdx[ck]
	if !ok {
		d.combos = append(d.combos, comboDelta{Combo: ck.Combo, next: ld.combo})
		ci = int32(len(d.combos) - 1)
		ld.combo = ci + 1
		d.comboIdx[ck] = ci
	}
	d.combos[ci].Add(l, n)
	t := c.Time.UTC()
	day := DayOf(t)
	var di int32
	if ld.lastDay != 0 && d.days[ld.lastDay-1].Day == day {
		di = ld.lastDay - 1
	} else {
		dk := dayKey{link: li, day: day}
		if di, ok = d.dayIdx[dk]; !ok {
			d.days = append(d.days, DayDelta{Day: day, next: ld.day})
			di = int32(len(d.days) - 1)
			ld.day = di + 1
			d.dayIdx[dk] = di
		}
		ld.lastDay = di + 1
	}
	dd := &d.days[di]
	dd.Total.Add(l, n)
	dd.Hours[t.Hour()].Add(l, n)
	if !c.Bot && c.Visitor != "" {
		// One hash of the key, not a lookup and then an insert: most of a
		// batch's visitors are new to their link and day.
		before := len(d.seen)
		d.seen[visitorKey{day: di, v: c.Visitor}] = struct{}{}
		if len(d.seen) > before {
			d.visitors = append(d.visitors, visitorEntry{v: c.Visitor, next: dd.visitor})
			dd.visitor = int32(len(d.visitors))
			dd.NumVisitors++
		}
	}
}
