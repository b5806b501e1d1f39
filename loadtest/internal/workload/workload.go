package workload

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"net/netip"
	"sort"
	"strconv"
)

// Kind says who makes a click.
type Kind uint8

// Kinds of click.
const (
	// Human is a visitor from the pool, with a browser user agent.
	Human Kind = iota
	// Bot carries a known bot or tool user agent; the redirect labels it at
	// the source.
	Bot
	// Burst is one of BurstSize consecutive clicks by one identity on one
	// link, with a browser user agent: only fraud detection can tell.
	Burst
	// Probe is a click on the probe link, used to time click-to-counted.
	Probe
)

func (k Kind) String() string {
	switch k {
	case Human:
		return "human"
	case Bot:
		return "bot"
	case Burst:
		return "burst"
	case Probe:
		return "probe"
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Spec is the traffic model of a run. It is saved with the truth, so it must
// stay a plain value.
type Spec struct {
	// Seed makes the traffic reproducible: the same Spec gives the same
	// clicks in the same order.
	Seed uint64 `json:"seed"`
	// Links is the number of regular links (the probe link is extra).
	Links int `json:"links"`
	// ZipfS is the Zipf exponent of link popularity (> 0; 1 is classic Zipf,
	// larger is more skewed).
	ZipfS float64 `json:"zipf_s"`
	// ViralShare is the share of clicks that go to link 0, the viral link;
	// 0 leaves link 0 to the Zipf draw like the others.
	ViralShare float64 `json:"viral_share"`
	// BotShare is the share of all clicks made with a bot user agent.
	BotShare float64 `json:"bot_share"`
	// BurstShare is the share of all clicks that belong to bursts.
	BurstShare float64 `json:"burst_share"`
	// BurstSize is the number of clicks in one burst.
	BurstSize int `json:"burst_size"`
	// Visitors is the size of the human visitor pool.
	Visitors int `json:"visitors"`
	// ProbeEvery sends every ProbeEvery-th click (seq 0, ProbeEvery, ...) to
	// the probe link; 0 sends no probes.
	ProbeEvery int `json:"probe_every"`
	// CountryShare is the share of clicks that carry a country header.
	CountryShare float64 `json:"country_share"`
}

// DefaultVisitors returns a human pool size for a rate: a minute of traffic,
// at least 10,000. Fraud detection flags a visitor that clicks one link more
// than about 20 times a minute; with this pool a visitor clicks even a viral
// link that takes all the traffic about once a minute.
func DefaultVisitors(rate int) int { return max(10_000, rate*60) }

// DefaultProbeEvery returns a probe interval that sends about ten probes a
// second at rate.
func DefaultProbeEvery(rate int) int { return max(1, rate/10) }

// Validate checks the Spec's ranges.
func (s Spec) Validate() error {
	switch {
	case s.Links < 1 || s.Links > 10_000_000:
		return fmt.Errorf("links %d: want 1..10000000", s.Links)
	case !(s.ZipfS > 0) || s.ZipfS > 10:
		return fmt.Errorf("zipf exponent %v: want > 0 and <= 10", s.ZipfS)
	case !share(s.ViralShare) || !share(s.BotShare) || !share(s.BurstShare) || !share(s.CountryShare):
		return fmt.Errorf("shares (viral %v, bot %v, burst %v, country %v): each must be in [0, 1]", s.ViralShare, s.BotShare, s.BurstShare, s.CountryShare)
	case s.BotShare+s.BurstShare > 1:
		return fmt.Errorf("bot share %v + burst share %v: more than all clicks", s.BotShare, s.BurstShare)
	case s.BurstShare > 0 && s.BurstSize < 1:
		return fmt.Errorf("burst size %d: want >= 1 when there are bursts", s.BurstSize)
	case s.Visitors < 1:
		return fmt.Errorf("visitors %d: want >= 1", s.Visitors)
	case s.ProbeEvery < 0:
		return fmt.Errorf("probe every %d: want >= 0", s.ProbeEvery)
	}
	return nil
}

func share(f float64) bool { return f >= 0 && f <= 1 }

// Visit is one click as the generator wants it sent.
type Visit struct {
	Seq  uint64
	Kind Kind
	// Link is the link index: 0..Links-1 for regular links, Links for the
	// probe link.
	Link int
	// Burst is the burst number for Kind Burst, else -1.
	Burst int64
	// Identity is the visitor identity number: the same number is the same
	// address and user agent.
	Identity  uint64
	IP        netip.Addr
	UserAgent string
	Referrer  string
	// Country is an ISO code, or "" for a click without a country header.
	Country string
}

// Generator computes visits. It is safe for concurrent use.
type Generator struct {
	spec Spec
	// cdf is the cumulative Zipf distribution over the links drawn by Zipf
	// (all links, or all but the viral one).
	cdf []float64
	// zipfBase is the first link index the Zipf draw covers.
	zipfBase int
	// block is the number of clicks per burst slot: each block starts with
	// one burst of BurstSize clicks.
	block uint64
	// botCut is P(bot | not a burst or probe), as a uint64 threshold.
	botCut uint64
}

// New returns a generator for spec.
func New(spec Spec) (*Generator, error) {
	if err := spec.Validate(); err != nil {
		return nil, fmt.Errorf("workload spec: %w", err)
	}
	g := &Generator{spec: spec}
	n := spec.Links
	if spec.ViralShare > 0 && n > 1 {
		g.zipfBase = 1
		n--
	}
	g.cdf = make([]float64, n)
	sum := 0.0
	for i := range n {
		sum += 1 / math.Pow(float64(i+1), spec.ZipfS)
		g.cdf[i] = sum
	}
	for i := range g.cdf {
		g.cdf[i] /= sum
	}
	if spec.BurstShare > 0 {
		g.block = uint64(math.Round(float64(spec.BurstSize) / spec.BurstShare))
		g.block = max(g.block, uint64(spec.BurstSize))
	}
	pBot := 0.0
	if rest := 1 - spec.BurstShare; rest > 0 {
		pBot = min(1, spec.BotShare/rest)
	}
	g.botCut = probCut(pBot)
	return g, nil
}

// Spec returns the generator's spec.
func (g *Generator) Spec() Spec { return g.spec }

// ProbeLink is the index of the probe link.
func (g *Generator) ProbeLink() int { return g.spec.Links }

// NumLinks is the number of links to create: the regular ones and the probe.
func (g *Generator) NumLinks() int { return g.spec.Links + 1 }

// Visit returns click seq.
func (g *Generator) Visit(seq uint64) Visit {
	s := g.spec
	r := newRand(s.Seed, seq)
	v := Visit{Seq: seq, Burst: -1}
	switch {
	case s.ProbeEvery > 0 && seq%uint64(s.ProbeEvery) == 0:
		v.Kind = Probe
		v.Link = g.ProbeLink()
		// A fresh identity per probe: probes must never look like a burst.
		v.Identity = identityProbe | seq
		v.IP = humanIP(s.Seed, v.Identity)
		v.UserAgent = humanAgent(v.Identity)
	case g.block > 0 && seq%g.block < uint64(s.BurstSize):
		v.Kind = Burst
		v.Burst = int64(seq / g.block)
		br := newRand(s.Seed^burstSalt, uint64(v.Burst))
		v.Link = g.link(&br)
		v.Identity = identityBurst | uint64(v.Burst)
		v.IP = burstIP(uint64(v.Burst))
		v.UserAgent = humanAgent(v.Identity)
	case r.next() < g.botCut:
		v.Kind = Bot
		v.Link = g.link(&r)
		v.Identity = identityBot | r.next()%uint64(s.Visitors)
		v.IP = humanIP(s.Seed, v.Identity)
		v.UserAgent = BotAgents[r.next()%uint64(len(BotAgents))]
	default:
		v.Kind = Human
		v.Link = g.link(&r)
		v.Identity = r.next() % uint64(s.Visitors)
		v.IP = humanIP(s.Seed, v.Identity)
		v.UserAgent = humanAgent(v.Identity)
	}
	v.Referrer = pick(&r, referrers)
	if r.next() < probCut(s.CountryShare) {
		v.Country = pick(&r, countries)
	}
	return v
}

// link draws a regular link.
func (g *Generator) link(r *rng) int {
	if g.zipfBase == 1 && r.next() < probCut(g.spec.ViralShare) {
		return 0
	}
	u := r.float()
	i := sort.SearchFloat64s(g.cdf, u)
	if i >= len(g.cdf) {
		i = len(g.cdf) - 1
	}
	return g.zipfBase + i
}

// Identity number spaces: the top bits say which pool an identity is from,
// so a bot, a burst and a probe never share a human's identity.
const (
	identityBot   = 1 << 62
	identityBurst = 2 << 62
	identityProbe = 3 << 62
	burstSalt     = 0x6275727374 // "burst"
)

// VisitorHash is the anonymised visitor identity of a visit as the redirect
// would compute it: 32 hex characters. The load test makes its own (a hash
// of the seed and the identity), since it cannot know the redirect's daily
// salt; what matters to readers is that one identity has one value.
func (g *Generator) VisitorHash(v *Visit) string {
	r := newRand(g.spec.Seed^0x766973, v.Identity)
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], r.next())
	binary.BigEndian.PutUint64(b[8:], r.next())
	return hex.EncodeToString(b[:])
}

// IPPrefix is the anonymised network of the visit's address, the /24, as
// the redirect writes it into a click.
func IPPrefix(ip netip.Addr) string {
	p, err := ip.Prefix(24)
	if err != nil {
		return ""
	}
	return p.String()
}

// humanIP maps an identity to a public-looking IPv4 address: first octet
// 1..223 except 10 and 127, so no address is loopback, multicast or in the
// private 10/8 range. Bursts use 198.18.0.0/15 (burstIP), which this never
// returns.
func humanIP(seed, identity uint64) netip.Addr {
	r := newRand(seed^0x6970, identity)
	for {
		x := uint32(r.next())
		a := byte(x >> 24)
		if a == 0 || a == 10 || a == 127 || a >= 224 || (a == 198 && byte(x>>16)&0xfe == 18) {
			continue
		}
		return netip.AddrFrom4([4]byte{a, byte(x >> 16), byte(x >> 8), byte(x)})
	}
}

// burstIP is the address of burst b: one per burst, from the benchmarking
// range 198.18.0.0/15 (RFC 2544), so bursts are easy to pick out in the
// warehouse.
func burstIP(b uint64) netip.Addr {
	x := uint32(b % (1 << 17))
	return netip.AddrFrom4([4]byte{198, 18 + byte(x>>16), byte(x >> 8), byte(x)})
}

func humanAgent(identity uint64) string {
	r := newRand(0x7561, identity)
	return pick(&r, browserAgents)
}

// weighted is a value with a weight out of the table's total.
type weighted struct {
	value  string
	weight int
}

func pick(r *rng, t []weighted) string {
	total := 0
	for _, w := range t {
		total += w.weight
	}
	n := int(r.next() % uint64(total))
	for _, w := range t {
		if n < w.weight {
			return w.value
		}
		n -= w.weight
	}
	return t[len(t)-1].value
}

// probCut turns a probability into a threshold for a uniform uint64.
func probCut(p float64) uint64 {
	switch {
	case p <= 0:
		return 0
	case p >= 1:
		return math.MaxUint64
	}
	return uint64(p * (1 << 63) * 2)
}

// rng is SplitMix64 seeded with (seed, seq): tiny, fast, allocation-free and
// good enough for traffic shapes (it passes BigCrush). Every visit gets its
// own stream, which is what makes Visit independent of send order.
type rng struct{ s uint64 }

func newRand(seed, seq uint64) rng {
	r := rng{s: seed ^ (seq * 0x9e3779b97f4a7c15)}
	r.next()
	return r
}

func (r *rng) next() uint64 {
	r.s += 0x9e3779b97f4a7c15
	z := r.s
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// float returns a uniform float64 in [0, 1).
func (r *rng) float() float64 { return float64(r.next()>>11) / (1 << 53) }
