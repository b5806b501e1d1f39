package workload_test

import (
	"math"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/snipdev/snip/loadtest/internal/workload"
	"github.com/snipdev/snip/pkg/events"
)

// addrs compares addresses by value.
var addrs = cmp.Comparer(func(a, b netip.Addr) bool { return a == b })

func spec() workload.Spec {
	return workload.Spec{
		Seed: 42, Links: 100, ZipfS: 1, BotShare: 0.1, BurstShare: 0.05, BurstSize: 50,
		Visitors: 100_000, ProbeEvery: 1000, CountryShare: 0.9,
	}
}

func gen(t *testing.T, s workload.Spec) *workload.Generator {
	t.Helper()
	g, err := workload.New(s)
	if err != nil {
		t.Fatalf("new generator: %v", err)
	}
	return g
}

// tally counts n visits by kind and by link.
func tally(g *workload.Generator, n int) (kinds map[workload.Kind]int, links []int) {
	kinds = map[workload.Kind]int{}
	links = make([]int, g.NumLinks())
	for seq := range uint64(n) {
		v := g.Visit(seq)
		kinds[v.Kind]++
		links[v.Link]++
	}
	return kinds, links
}

func near(got, want, tol float64) bool { return math.Abs(got-want) <= tol*want }

func TestSameSeedSameTraffic(t *testing.T) {
	t.Parallel()
	a, b := gen(t, spec()), gen(t, spec())
	other := spec()
	other.Seed = 43
	c := gen(t, other)
	same := 0
	for seq := range uint64(10_000) {
		if diff := cmp.Diff(a.Visit(seq), b.Visit(seq), addrs); diff != "" {
			t.Fatalf("visit %d differs between generators with one seed (-a +b):\n%s", seq, diff)
		}
		if cmp.Equal(a.Visit(seq), c.Visit(seq), addrs) {
			same++
		}
	}
	// Bursts and probes sit at the same positions for any seed, but links,
	// identities and agents differ.
	if same > 100 {
		t.Errorf("%d of 10000 visits are equal across seeds 42 and 43; want the seed to change the traffic", same)
	}
	// Visit is a pure function of seq: the order of calls does not matter.
	if diff := cmp.Diff(a.Visit(5), gen(t, spec()).Visit(5), addrs); diff != "" {
		t.Errorf("visit 5 depends on the visits computed before it (-a +b):\n%s", diff)
	}
}

func TestZipfSkew(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		s     float64
		ratio map[int]float64 // want count(link 0) / count(link k)
	}{
		{name: "classic_zipf_halves_at_rank_2", s: 1, ratio: map[int]float64{1: 2, 9: 10}},
		{name: "steeper_exponent_is_more_skewed", s: 2, ratio: map[int]float64{1: 4, 2: 9}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := spec()
			s.ZipfS, s.BotShare, s.BurstShare, s.ProbeEvery = tc.s, 0, 0, 0
			_, links := tally(gen(t, s), 400_000)
			for k, want := range tc.ratio {
				got := float64(links[0]) / float64(links[k])
				if !near(got, want, 0.08) {
					t.Errorf("link 0 / link %d = %.2f (%d/%d), want %.1f within 8%%", k, got, links[0], links[k], want)
				}
			}
		})
	}
}

func TestViralLinkTakesItsShare(t *testing.T) {
	t.Parallel()
	s := spec()
	s.ViralShare, s.BotShare, s.BurstShare, s.ProbeEvery = 0.5, 0, 0, 0
	_, links := tally(gen(t, s), 200_000)
	if got := float64(links[0]) / 200_000; !near(got, 0.5, 0.02) {
		t.Errorf("viral link share %.3f, want 0.5", got)
	}
	// The rest is Zipf over the other links: link 1 is the most popular of them.
	if links[1] <= links[2] || links[2] <= links[10] {
		t.Errorf("links 1, 2, 10 got %d, %d, %d clicks; want Zipf order among the non-viral links", links[1], links[2], links[10])
	}
}

func TestShares(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name               string
		bot, burst         float64
		probeEvery         int
		wantBot, wantBurst float64
	}{
		{name: "no_bots", bot: 0, burst: 0, wantBot: 0, wantBurst: 0},
		{name: "bot_share_alone", bot: 0.2, burst: 0, wantBot: 0.2, wantBurst: 0},
		{name: "bots_and_bursts", bot: 0.1, burst: 0.05, wantBot: 0.1, wantBurst: 0.05},
		{name: "all_bots", bot: 1, burst: 0, wantBot: 1, wantBurst: 0},
	}
	const n = 200_000
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := spec()
			s.BotShare, s.BurstShare, s.ProbeEvery = tc.bot, tc.burst, 0
			kinds, _ := tally(gen(t, s), n)
			if got := float64(kinds[workload.Bot]) / n; math.Abs(got-tc.wantBot) > 0.005 {
				t.Errorf("bot share %.4f, want %.3f", got, tc.wantBot)
			}
			if got := float64(kinds[workload.Burst]) / n; math.Abs(got-tc.wantBurst) > 0.002 {
				t.Errorf("burst share %.4f, want %.3f", got, tc.wantBurst)
			}
		})
	}
}

func TestBurstIsOneIdentityOnOneLink(t *testing.T) {
	t.Parallel()
	s := spec()
	s.ProbeEvery = 0
	g := gen(t, s)
	bursts := map[int64][]workload.Visit{}
	for seq := range uint64(20_000) {
		if v := g.Visit(seq); v.Kind == workload.Burst {
			bursts[v.Burst] = append(bursts[v.Burst], v)
		}
	}
	if len(bursts) != 20 {
		t.Fatalf("%d bursts in 20000 clicks at 5%% in bursts of 50, want 20", len(bursts))
	}
	identities := map[uint64]bool{}
	for b, vs := range bursts {
		if len(vs) != s.BurstSize {
			t.Errorf("burst %d has %d clicks, want %d", b, len(vs), s.BurstSize)
		}
		first := vs[0]
		for i, v := range vs {
			if v.Seq != first.Seq+uint64(i) {
				t.Errorf("burst %d: click %d has seq %d, want consecutive from %d", b, i, v.Seq, first.Seq)
			}
			if v.Link != first.Link || v.IP != first.IP || v.UserAgent != first.UserAgent || v.Identity != first.Identity {
				t.Errorf("burst %d: click %d is (link %d, %s, %q), want (link %d, %s, %q)", b, i, v.Link, v.IP, v.UserAgent, first.Link, first.IP, first.UserAgent)
			}
			if strings.Contains(strings.ToLower(v.UserAgent), "bot") {
				t.Errorf("burst %d has a bot user agent %q; bursts must look human", b, v.UserAgent)
			}
		}
		if identities[first.Identity] {
			t.Errorf("burst %d reuses another burst's identity", b)
		}
		identities[first.Identity] = true
	}
}

func TestProbesGoToTheProbeLinkOnly(t *testing.T) {
	t.Parallel()
	g := gen(t, spec())
	for seq := range uint64(10_000) {
		v := g.Visit(seq)
		isProbe := seq%1000 == 0
		if (v.Kind == workload.Probe) != isProbe || (v.Link == g.ProbeLink()) != isProbe {
			t.Fatalf("visit %d: kind %s link %d; want probe on link %d exactly every 1000th click", seq, v.Kind, v.Link, g.ProbeLink())
		}
	}
}

func TestHumanVisitorsKeepTheirIdentity(t *testing.T) {
	t.Parallel()
	s := spec()
	s.Visitors = 50
	g := gen(t, s)
	seen := map[uint64]workload.Visit{}
	for seq := range uint64(5_000) {
		v := g.Visit(seq)
		if v.Kind != workload.Human {
			continue
		}
		if w, ok := seen[v.Identity]; ok && (w.IP != v.IP || w.UserAgent != v.UserAgent || g.VisitorHash(&w) != g.VisitorHash(&v)) {
			t.Fatalf("identity %d appears as (%s, %q) and (%s, %q)", v.Identity, w.IP, w.UserAgent, v.IP, v.UserAgent)
		}
		seen[v.Identity] = v
		if a := v.IP.As4(); a[0] == 10 || a[0] == 127 || a[0] == 0 || a[0] >= 224 {
			t.Fatalf("visit %d has address %s; want a public-looking address", seq, v.IP)
		}
	}
	if len(seen) > 50 {
		t.Errorf("%d human identities from a pool of 50", len(seen))
	}
}

func TestSpecValidation(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		change func(*workload.Spec)
	}{
		{name: "no_links", change: func(s *workload.Spec) { s.Links = 0 }},
		{name: "zero_exponent", change: func(s *workload.Spec) { s.ZipfS = 0 }},
		{name: "share_over_one", change: func(s *workload.Spec) { s.ViralShare = 1.5 }},
		{name: "bots_and_bursts_over_all", change: func(s *workload.Spec) { s.BotShare, s.BurstShare = 0.7, 0.4 }},
		{name: "bursts_of_nothing", change: func(s *workload.Spec) { s.BurstSize = 0 }},
		{name: "no_visitors", change: func(s *workload.Spec) { s.Visitors = 0 }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := spec()
			tc.change(&s)
			if _, err := workload.New(s); err == nil {
				t.Errorf("New accepted %+v", s)
			}
		})
	}
}

func TestIDsRoundTrip(t *testing.T) {
	t.Parallel()
	tag, other := workload.Tag(0x2_dead_beef), workload.Tag(0x1_2345_6789)
	at := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	for _, seq := range []uint64{0, 1, 99_999, 1<<workload.SeqBits - 1} {
		id := tag.EventID(seq, at)
		c := events.Click{V: events.ClickVersion, ID: id, Time: at, Code: tag.LinkCode(3), Owner: "demo", Visitor: "x"}
		if err := c.Validate(); err != nil {
			t.Errorf("event id %s of seq %d is not a valid click ID: %v", id, seq, err)
		}
		if got, err := events.IDTime(id); err != nil || !got.Equal(at) {
			t.Errorf("IDTime(%s) = %v, %v; want %v", id, got, err, at)
		}
		if got, ok := tag.ParseEventID(id); !ok || got != seq {
			t.Errorf("ParseEventID(%s) = %d, %v; want %d", id, got, ok, seq)
		}
		if _, ok := other.ParseEventID(id); ok {
			t.Errorf("another run's tag accepted event id %s", id)
		}
		if got, ok := tag.ParseRequestID(tag.RequestID(seq)); !ok || got != seq {
			t.Errorf("ParseRequestID(RequestID(%d)) = %d, %v", seq, got, ok)
		}
		if _, ok := other.ParseRequestID(tag.RequestID(seq)); ok {
			t.Errorf("another run's tag accepted request id %s", tag.RequestID(seq))
		}
	}
	if _, ok := tag.ParseEventID(events.NewID()); ok {
		t.Error("a random UUIDv7 parsed as one of the run's event IDs")
	}
	maxTag := workload.Tag(1<<workload.TagBits - 1)
	for _, code := range []string{tag.LinkCode(0), maxTag.LinkCode(10_000_000)} {
		if !events.ValidToken(code) || len(code) < 3 || len(code) > 32 {
			t.Errorf("link code %q is not a 3..32 character subject token", code)
		}
	}
	if got, ok := workload.ParseTag(maxTag.String()); !ok || got != maxTag {
		t.Errorf("ParseTag(%q) = %v, %v", maxTag.String(), got, ok)
	}
}
