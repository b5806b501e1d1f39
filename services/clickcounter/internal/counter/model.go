package counter

import (
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
type Delta struct {
	Links map[LinkRef]*LinkDelta
	// hosts caches ReferrerHost for the batch's Referer values: a batch
	// holds few distinct ones, and parsing a URL costs more than a lookup.
	hosts map[string]string
}

// LinkDelta is what a batch adds to one link.
type LinkDelta struct {
	Combos map[Combo]Pair
	Days   map[Day]*DayDelta
}

// DayDelta is what a batch adds to one link on one UTC day.
type DayDelta struct {
	Total Pair
	Hours [24]Pair
	// Visitors are the distinct visitor hashes of the day's clicks that the
	// redirect did not flag as bots, for the unique-visitor count.
	Visitors map[string]struct{}
}

// maxCachedHosts bounds a delta's cache of referrer hosts.
const maxCachedHosts = 1000

// NewDelta returns an empty delta.
func NewDelta() *Delta { return &Delta{Links: map[LinkRef]*LinkDelta{}} }

// Empty reports whether the delta adds nothing.
func (d *Delta) Empty() bool { return len(d.Links) == 0 }

// Add counts one click n times under label l.
func (d *Delta) Add(c *events.Click, l Label, n int64) {
	ref := LinkRef{Owner: c.Owner, Code: c.Code}
	ld := d.Links[ref]
	if ld == nil {
		ld = &LinkDelta{Combos: map[Combo]Pair{}, Days: map[Day]*DayDelta{}}
		d.Links[ref] = ld
	}
	host, ok := d.hosts[c.Referrer]
	if !ok {
		host = ReferrerHost(c.Referrer)
		if d.hosts == nil {
			d.hosts = map[string]string{}
		}
		if len(d.hosts) < maxCachedHosts {
			d.hosts[c.Referrer] = host
		}
	}
	combo := Combo{Country: CountryOf(c.Country), Referrer: host}
	p := ld.Combos[combo]
	p.Add(l, n)
	ld.Combos[combo] = p
	t := c.Time.UTC()
	day := DayOf(t)
	dd := ld.Days[day]
	if dd == nil {
		dd = &DayDelta{Visitors: map[string]struct{}{}}
		ld.Days[day] = dd
	}
	dd.Total.Add(l, n)
	dd.Hours[t.Hour()].Add(l, n)
	if !c.Bot && c.Visitor != "" {
		dd.Visitors[c.Visitor] = struct{}{}
	}
}
