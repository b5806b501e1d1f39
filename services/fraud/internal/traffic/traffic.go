// Package traffic generates click traffic for the fraud detector's tests and
// benchmarks: people on a realistic mix of links, and injected bots of every
// pattern the detector knows, from a seeded random source so a run can be
// repeated exactly. Each click comes with the truth: the pattern that made
// it, or "" for a person.
package traffic

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
)

// Injected patterns, the truth of bot clicks.
const (
	PatternBurst   = "burst"   // one visitor clicking one link thousands of times
	PatternScanner = "scanner" // a script with a tool user agent across links
	PatternFlood   = "flood"   // many identities flooding one link
	PatternPair    = "pair"    // an unfurler's browser-agent second fetch
	PatternPreview = "preview" // the unfurler's own fetch (a bot agent)
)

// Spec describes the traffic.
type Spec struct {
	Seed  uint64
	Start time.Time
	// Duration of the human traffic.
	Duration time.Duration
	// HumanRate is people's clicks per second over all links.
	HumanRate float64
	// Links and Owners: link codes are spread over owners.
	Links, Owners int
	// Inject adds one instance of each bot pattern (and an office behind a
	// NAT and a link going viral organically, which must not be flagged).
	Inject bool
}

// Click is a generated click and what made it.
type Click struct {
	events.Click
	// Pattern is the injected pattern, "" for a person.
	Pattern string
}

// Browser user agents people send.
var browsers = []string{
	"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36",
	"Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.1 Safari/605.1.15",
	"Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.1 Mobile/15E148 Safari/604.1",
	"Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Mobile Safari/537.36",
	"Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0",
	"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36 Edg/131.0.0.0",
	"Mozilla/5.0 (Linux; Android 9; CUBOT X19) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0.0.0 Mobile Safari/537.36",
}

var (
	countries = []string{"US", "DE", "GB", "FR", "IN", "BR", "JP", "", "NL", "CA"}
	referrers = []string{"", "", "https://twitter.com/", "https://www.linkedin.com/", "https://news.ycombinator.com/", "https://mail.google.com/"}
)

// Generate returns the clicks of spec in time order.
func Generate(spec Spec) []Click {
	g := &gen{spec: spec, rng: rand.New(rand.NewPCG(spec.Seed, spec.Seed^0x9e3779b97f4a7c15))}
	g.humans()
	if spec.Inject {
		g.office()
		g.viral()
		g.trickle()
		g.burst()
		g.scanner()
		g.flood()
		g.pairs()
	}
	slices.SortStableFunc(g.out, func(a, b Click) int { return a.Time.Compare(b.Time) })
	for i := range g.out {
		g.out[i].ID = g.id(g.out[i].Time)
	}
	return g.out
}

type gen struct {
	spec Spec
	rng  *rand.Rand
	out  []Click
}

// Code is the code of link i; Owner the owner of link i.
func Code(i int) string           { return "lnk" + strconv.Itoa(i) }
func (g *gen) owner(i int) string { return "owner" + strconv.Itoa(i%max(g.spec.Owners, 1)) }

// Well-known links of the injected patterns.
const (
	BurstLink = 1 // a popular link
	FloodLink = 7
	ViralLink = 3
)

func (g *gen) add(at time.Time, link int, visitor, ua, prefix, pattern string, bot bool) {
	g.out = append(g.out, Click{Pattern: pattern, Click: events.Click{
		V: events.ClickVersion, Time: at.UTC(), Code: Code(link), Owner: g.owner(link),
		Target: "https://example.com/" + Code(link), IPPrefix: prefix, Visitor: visitor, UserAgent: ua,
		Referrer: referrers[g.rng.IntN(len(referrers))], Country: countries[g.rng.IntN(len(countries))],
		RequestID: strconv.FormatUint(g.rng.Uint64(), 36), Bot: bot,
	}})
}

// id makes a UUIDv7 for time at from the seeded source, so a run repeats
// its IDs too.
func (g *gen) id(at time.Time) string {
	var u uuid.UUID
	ms := uint64(at.UnixMilli())
	for i := range 6 {
		u[i] = byte(ms >> (40 - 8*i))
	}
	for i, r := 6, g.rng.Uint64(); i < 14; i, r = i+1, r>>8 {
		u[i] = byte(r)
	}
	r := g.rng.Uint32()
	u[14], u[15] = byte(r), byte(r>>8)
	u[6] = (u[6] & 0x0f) | 0x70 // version 7
	u[8] = (u[8] & 0x3f) | 0x80 // RFC 4122 variant
	return u.String()
}

func (g *gen) visitor() string { return fmt.Sprintf("%032x", g.rng.Uint64()) }

func (g *gen) prefix() string {
	return fmt.Sprintf("%d.%d.%d.0/24", 11+g.rng.IntN(180), g.rng.IntN(256), g.rng.IntN(256))
}

// zipfLink picks links with a Zipf-like skew: a few hot links, a long tail.
func (g *gen) zipfLink() int {
	n := max(g.spec.Links, 1)
	u := g.rng.Float64()
	return min(int(math.Pow(float64(n)+1, u))-1, n-1)
}

// humans: Poisson arrivals of people; each person clicks a link one to
// three times a few seconds apart (a re-open), with a browser agent.
func (g *gen) humans() {
	if g.spec.HumanRate <= 0 {
		return
	}
	t := g.spec.Start
	end := g.spec.Start.Add(g.spec.Duration)
	for {
		t = t.Add(time.Duration(g.rng.ExpFloat64() / g.spec.HumanRate * float64(time.Second)))
		if !t.Before(end) {
			return
		}
		link := g.zipfLink()
		if g.spec.Inject && (link == FloodLink || link == ViralLink) {
			link = (link + 1) % max(g.spec.Links, 1)
		}
		v, ua, p := g.visitor(), browsers[g.rng.IntN(len(browsers))], g.prefix()
		at, n := t, 1
		if f := g.rng.Float64(); f < 0.05 {
			n = 3
		} else if f < 0.25 {
			n = 2
		}
		for range n {
			g.add(at, link, v, ua, p, "", false)
			at = at.Add(time.Duration(2+g.rng.IntN(20)) * time.Second)
		}
	}
}

// office: 18 people behind one NAT with the same browser open one link
// within a minute: one identity, 18 clicks, under the burst threshold.
func (g *gen) office() {
	v, p := g.visitor(), g.prefix()
	at := g.spec.Start.Add(g.spec.Duration / 5)
	for range 18 {
		g.add(at, 2, v, browsers[0], p, "", false)
		at = at.Add(time.Duration(1+g.rng.IntN(3)) * time.Second)
	}
}

// viral: a link people share that goes from 10 clicks a minute to 640,
// doubling every two minutes: organic growth the flood rule must let by.
func (g *gen) viral() {
	start := g.spec.Start
	for m := 0; m < int(g.spec.Duration/time.Minute); m++ {
		n := min(640, int(10*math.Pow(2, float64(m)/2)))
		for range n {
			at := start.Add(time.Duration(m)*time.Minute + time.Duration(g.rng.Int64N(int64(time.Minute))))
			g.add(at, ViralLink, g.visitor(), browsers[g.rng.IntN(len(browsers))], g.prefix(), "", false)
		}
	}
}

// trickle: people on the flood link before, during and after its flood, 3
// a minute: its baseline.
func (g *gen) trickle() {
	start := g.spec.Start
	for m := 0; m < int(g.spec.Duration/time.Minute); m++ {
		for range 3 {
			at := start.Add(time.Duration(m)*time.Minute + time.Duration(g.rng.Int64N(int64(time.Minute))))
			g.add(at, FloodLink, g.visitor(), browsers[g.rng.IntN(len(browsers))], g.prefix(), "", false)
		}
	}
}

// burst: one visitor clicks one link 1500 times in two minutes.
func (g *gen) burst() {
	v, p := g.visitor(), g.prefix()
	at := g.spec.Start.Add(g.spec.Duration / 3)
	for range 1500 {
		g.add(at, BurstLink, v, browsers[1], p, PatternBurst, false)
		at = at.Add(80 * time.Millisecond)
	}
}

// scanner: a script with a tool agent the redirect did not label walks 8
// links, 15 hits each, from rotating addresses (so no visitor bursts).
func (g *gen) scanner() {
	at := g.spec.Start.Add(g.spec.Duration / 4)
	for i := range 120 {
		g.add(at, 20+i%8, g.visitor(), "python-requests/2.32.3", g.prefix(), PatternScanner, false)
		at = at.Add(700 * time.Millisecond)
	}
}

// flood: 1200 identities, three clicks each, on one link within two minutes.
func (g *gen) flood() {
	start := g.spec.Start.Add(g.spec.Duration / 2)
	for range 1200 {
		v, ua, p := g.visitor(), browsers[g.rng.IntN(len(browsers))], g.prefix()
		for range 3 {
			at := start.Add(time.Duration(g.rng.Int64N(int64(2 * time.Minute))))
			g.add(at, FloodLink, v, ua, p, PatternFlood, false)
		}
	}
}

// pairs: an unfurler fetches 20 links with its agent (labelled bot at the
// source) and, within a second, again with browser agents from its prefix.
func (g *gen) pairs() {
	p := "198.51.100.0/24"
	at := g.spec.Start.Add(g.spec.Duration / 6)
	for i := range 20 {
		link := 30 + i
		g.add(at, link, g.visitor(), "Twitterbot/1.0", p, PatternPreview, true)
		for k := range 2 {
			g.add(at.Add(time.Duration(200+300*k)*time.Millisecond), link, g.visitor(), browsers[k], p, PatternPair, false)
		}
		at = at.Add(20 * time.Second)
	}
}

// Truth counts the clicks of each pattern ("" for people).
func Truth(clicks []Click) map[string]int {
	m := map[string]int{}
	for _, c := range clicks {
		m[c.Pattern]++
	}
	return m
}

// Events numbers the clicks as CLICKS would store them (one stream sequence
// across partitions, stored a few milliseconds after the click) and returns
// each partition's events in order, and the truth of each sequence.
func Events(clicks []Click, partitions int) (byPartition map[int][]reader.Event, truth map[uint64]string) {
	byPartition, truth = map[int][]reader.Event{}, make(map[uint64]string, len(clicks))
	for i, c := range clicks {
		seq := uint64(i + 1)
		p := events.Partition(c.Code, partitions)
		byPartition[p] = append(byPartition[p], reader.Event{
			Click: c.Click, Partition: p, Seq: seq, Stored: c.Time.Add(5 * time.Millisecond), Deliveries: 1,
		})
		truth[seq] = c.Pattern
	}
	return byPartition, truth
}

// Burst returns n clicks by one visitor on one link, step apart from at,
// with a browser agent: a bot hammering a link.
func Burst(at time.Time, n int, step time.Duration, code, owner, visitor string) []Click {
	out := make([]Click, n)
	for i := range out {
		out[i] = Click{Pattern: PatternBurst, Click: events.Click{
			V: events.ClickVersion, ID: events.NewID(), Time: at.Add(time.Duration(i) * step).UTC(),
			Code: code, Owner: owner, Target: "https://example.com/" + code, IPPrefix: "203.0.113.0/24",
			Visitor: visitor, UserAgent: browsers[4],
		}}
	}
	return out
}
