// Package benchmix generates the click mix of the counter's benchmarks: a
// realistic one, because the cost of counting depends on how many distinct
// links, countries and referrers a batch holds.
//
// Links follow a Zipf law (s = 1.1) over 10,000 codes, so a few links are hot
// and most are a long tail. A link is usually shared in one place: 70% of its
// clicks come from its own referrer, 20% have none, the rest come from
// anywhere. Countries are skewed (a third from one country), 10% of clicks
// have none, and 5% are flagged as bots at the redirect.
package benchmix

import (
	"hash/fnv"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/snipdev/snip/pkg/events"
)

var (
	hosts     = []string{"https://t.co/x", "https://news.ycombinator.com/item", "https://www.google.com/", "https://www.reddit.com/r/golang", "https://example.org/blog", "https://mail.example.net/", "https://www.linkedin.com/feed", "https://lobste.rs/s/x"}
	countries = []string{"US", "US", "US", "US", "DE", "DE", "GB", "GB", "FR", "IN", "BR", "JP", "NL", "ES", "", ""}
)

// Links is the number of distinct link codes.
const Links = 10_000

// Mix draws clicks. It is not safe for concurrent use.
type Mix struct {
	r    *rand.Rand
	zipf *rand.Zipf
	hot  bool
}

// New returns a mix with a fixed seed, so runs are comparable.
func New() *Mix {
	r := rand.New(rand.NewPCG(1, 2))
	return &Mix{r: r, zipf: rand.NewZipf(r, 1.1, 1, Links-1)}
}

// NewHot returns a mix whose every click is on one link (HotCode): a viral
// link, all of whose clicks are in one partition. Referrers, countries,
// bots and visitors are drawn as by New.
func NewHot() *Mix {
	m := New()
	m.hot = true
	return m
}

// HotCode is the link of every click of a NewHot mix.
const HotCode = "viral"

// Click draws one click of owner at t, with a fresh event ID.
func (m *Mix) Click(owner string, t time.Time) events.Click {
	code := HotCode
	if !m.hot {
		code = "l" + strconv.FormatUint(m.zipf.Uint64(), 36)
	}
	ref := ""
	switch x := m.r.IntN(10); {
	case x < 7:
		h := fnv.New32a()
		_, _ = h.Write([]byte(code))
		ref = hosts[h.Sum32()%uint32(len(hosts))]
	case x < 9:
	default:
		ref = hosts[m.r.IntN(len(hosts))]
	}
	return events.Click{
		V: events.ClickVersion, ID: events.NewID(), Time: t, Code: code, Owner: owner,
		Target: "https://example.com/landing", IPPrefix: "203.0.113.0/24",
		Visitor:   strconv.FormatUint(m.r.Uint64()%50_000, 16),
		UserAgent: "Mozilla/5.0 (X11; Linux x86_64)", Referrer: ref,
		Country: countries[m.r.IntN(len(countries))], Bot: m.r.IntN(20) == 0, RequestID: "req",
	}
}
