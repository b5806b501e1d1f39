package fraud

import (
	"fmt"
	"math"
	"net/netip"
	"time"
)

// Rule names, as they appear in FraudAlert.Rule, FraudVerdict.Rule, metrics
// and the flagged-share breakdown.
const (
	// RuleVisitorBurst: one visitor identity clicked one link more than
	// VisitorThreshold times within VisitorWindow.
	RuleVisitorBurst = "visitor_burst"
	// RuleLinkFlood: one link got more human-looking clicks within
	// FloodWindow than max(FloodFloor, FloodFactor x its own baseline).
	RuleLinkFlood = "link_flood"
	// RuleBotAgent: the user agent is a known bot, tool, scanner or preview
	// unfurler that the redirect did not already label.
	RuleBotAgent = "bot_agent"
	// RuleUnfurlerPair: a browser-looking click came from the same network
	// prefix as a preview unfurler's click on the same link, within
	// PairWindow: the unfurler's second fetch (the HEAD-then-GET pattern).
	RuleUnfurlerPair = "unfurler_pair"
	// RuleListedNetwork: the click came from a configured network (e.g. a
	// datacenter range).
	RuleListedNetwork = "listed_network"
	// RuleSourceBot is not a rule of this service: it names clicks the
	// redirect labelled bot itself (Click.Bot), in the flagged-share counts.
	RuleSourceBot = "source_bot"
)

// Rules are the detector's thresholds. Every threshold is the most a rule
// allows: it fires when a count goes above it. Defaults() explains each value.
type Rules struct {
	// VisitorWindow and VisitorThreshold: more than VisitorThreshold clicks by
	// one visitor on one link within any VisitorWindow is a burst.
	VisitorWindow    time.Duration
	VisitorThreshold int

	// FloodWindow, FloodFloor, FloodFactor, FloodHalfLife: a link floods when
	// its human-looking clicks in the last FloodWindow exceed
	// max(FloodFloor, FloodFactor x baseline), where the baseline is an
	// exponentially weighted moving average of the link's clicks per
	// FloodWindow with half-life FloodHalfLife. Flood periods do not feed
	// the baseline, so a sustained flood stays flagged.
	FloodWindow   time.Duration
	FloodFloor    int
	FloodFactor   float64
	FloodHalfLife time.Duration
	// FloodAdoptAfter: a link that has flooded in every FloodWindow for this
	// long takes its current level as its new baseline. A launch (a link in
	// a newsletter to a million readers) looks like a flood to any rule that
	// only sees rates; this bounds how long its clicks are labelled.
	FloodAdoptAfter time.Duration

	// PairWindow: a browser-looking click within PairWindow of an unfurler's
	// click from the same network prefix on the same link is the unfurler's.
	PairWindow time.Duration

	// LabelAlertThreshold and AlertPeriod: per-click rules (bot_agent,
	// unfurler_pair, listed_network) label every click they match, and raise
	// one alert per link, rule and key per AlertPeriod once more than
	// LabelAlertThreshold clicks were labelled in it. Burst and flood rules
	// raise at most one alert per link, rule and key per AlertPeriod too.
	LabelAlertThreshold int
	AlertPeriod         time.Duration

	// MaxIdentities, MaxLinks and MaxPairs cap the tracked (link, visitor),
	// link and (link, network prefix) states per partition; past the cap the
	// least recently active is evicted.
	MaxIdentities int
	MaxLinks      int
	MaxPairs      int

	// MaxClockSkew bounds how far after its storage time a click's own
	// timestamp may be; later timestamps are clamped, so one redirect with a
	// wrong clock cannot push the detector's clock into the future.
	MaxClockSkew time.Duration

	// ListedNetworks are the CIDRs of RuleListedNetwork.
	ListedNetworks []netip.Prefix
}

// Defaults returns the rules the service runs with unless configured.
//
//   - Visitor burst, 20 clicks per minute. A person re-opens a link a few
//     times at most; a visitor identity is a hash of IP and user agent, so
//     an office behind one NAT with one browser build shares it, and 20 a
//     minute leaves room for that. A bot "clicking thousands of times"
//     crosses it within seconds.
//   - Link flood, over max(120, 10 x baseline) per minute, baseline half-life
//     2 minutes. Organic virality ramps: even traffic doubling every minute
//     keeps the last minute under 4.5 x the baseline (a steady ratio of
//     (r-1+a)/a for growth r and smoothing a = 0.29), so 10 x leaves room; a
//     botnet switched on jumps tens of times in one minute. The floor keeps
//     quiet links (baseline ~0) from flooding at their first hundred clicks.
//     A link that floods for 30 minutes without a break is taken at its word:
//     that level becomes its baseline (the alert and the labels stand).
//   - Unfurler pair, 2 seconds: a preview service's fetches are machine-timed
//     (Dub #2309: X fetches once with its bot agent and again with browser
//     agents at once); a person tapping a preview takes longer.
//   - Labelled-click alerts after 10 per hour per link, rule and key: one
//     Slack unfurl is not news, a script hitting a link is.
func Defaults() Rules {
	return Rules{
		VisitorWindow:       time.Minute,
		VisitorThreshold:    20,
		FloodWindow:         time.Minute,
		FloodFloor:          120,
		FloodFactor:         10,
		FloodHalfLife:       2 * time.Minute,
		FloodAdoptAfter:     30 * time.Minute,
		PairWindow:          2 * time.Second,
		LabelAlertThreshold: 10,
		AlertPeriod:         time.Hour,
		MaxIdentities:       200_000,
		MaxLinks:            100_000,
		MaxPairs:            100_000,
		MaxClockSkew:        time.Minute,
	}
}

// Validate checks every field.
func (r Rules) Validate() error {
	switch {
	case r.VisitorWindow <= 0:
		return fmt.Errorf("visitor window %s: want > 0: %w", r.VisitorWindow, ErrBadRules)
	case r.VisitorThreshold < 1 || r.VisitorThreshold > 10_000:
		return fmt.Errorf("visitor threshold %d: want 1..10000: %w", r.VisitorThreshold, ErrBadRules)
	case r.FloodWindow <= 0:
		return fmt.Errorf("flood window %s: want > 0: %w", r.FloodWindow, ErrBadRules)
	case r.FloodFloor < 1:
		return fmt.Errorf("flood floor %d: want >= 1: %w", r.FloodFloor, ErrBadRules)
	case r.FloodFactor < 1 || math.IsInf(r.FloodFactor, 0) || math.IsNaN(r.FloodFactor):
		return fmt.Errorf("flood factor %v: want >= 1: %w", r.FloodFactor, ErrBadRules)
	case r.FloodHalfLife <= 0:
		return fmt.Errorf("flood half-life %s: want > 0: %w", r.FloodHalfLife, ErrBadRules)
	case r.FloodAdoptAfter < r.FloodWindow:
		return fmt.Errorf("flood adopt-after %s: want >= flood window %s: %w", r.FloodAdoptAfter, r.FloodWindow, ErrBadRules)
	case r.PairWindow <= 0:
		return fmt.Errorf("pair window %s: want > 0: %w", r.PairWindow, ErrBadRules)
	case r.LabelAlertThreshold < 0:
		return fmt.Errorf("label alert threshold %d: want >= 0: %w", r.LabelAlertThreshold, ErrBadRules)
	case r.AlertPeriod < time.Second:
		return fmt.Errorf("alert period %s: want >= 1s: %w", r.AlertPeriod, ErrBadRules)
	case r.MaxIdentities < 1 || r.MaxLinks < 1 || r.MaxPairs < 1:
		return fmt.Errorf("caps %d/%d/%d: want >= 1: %w", r.MaxIdentities, r.MaxLinks, r.MaxPairs, ErrBadRules)
	case r.MaxClockSkew < 0:
		return fmt.Errorf("max clock skew %s: want >= 0: %w", r.MaxClockSkew, ErrBadRules)
	}
	return nil
}

// Reach is how far back in event time a rule can label clicks: the longest
// of the windows. A member that takes a partition over must rebuild at least
// this much of the log to judge the next event as the previous owner would.
func (r Rules) Reach() time.Duration {
	return max(r.VisitorWindow, r.FloodWindow, r.PairWindow)
}

// floodAlpha is the baseline's smoothing per FloodWindow for its half-life.
func (r Rules) floodAlpha() float64 {
	return 1 - math.Pow(2, -float64(r.FloodWindow)/float64(r.FloodHalfLife))
}
