package fraud_test

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/services/fraud/internal/fraud"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

const browser = "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0"

// clk describes one click of a scenario, at an offset from t0.
type clk struct {
	at      time.Duration
	code    string
	visitor string
	ua      string
	prefix  string
	bot     bool
}

// run judges the clicks in order (sequences 1..n) with rules r and returns
// the labelled sequences with their rule, and the alerts.
func run(t testing.TB, r fraud.Rules, clicks []clk) (labels map[uint64]string, alerts []events.FraudAlert) {
	t.Helper()
	d, err := fraud.NewDetector(r)
	if err != nil {
		t.Fatal(err)
	}
	p := d.NewPartition()
	labels = map[uint64]string{}
	for i, c := range clicks {
		j, ok := p.Judge(event(uint64(i+1), c))
		if !ok {
			t.Fatalf("event %d skipped", i+1)
		}
		for _, l := range j.Labels {
			if _, dup := labels[l.Seq]; dup {
				t.Fatalf("click %d labelled twice", l.Seq)
			}
			labels[l.Seq] = l.Rule
		}
		alerts = append(alerts, j.Alerts...)
	}
	return labels, alerts
}

// judgeLate judges clicks in order on a fresh partition of a detector with
// rules and returns each one's judgement. A click older than one before it
// comes late, as from an outbox backlog or a redrive: it is stored after
// the newest click before it.
func judgeLate(t testing.TB, r fraud.Rules, clicks []clk) []fraud.Judgement {
	t.Helper()
	d, err := fraud.NewDetector(r)
	if err != nil {
		t.Fatal(err)
	}
	p := d.NewPartition()
	var out []fraud.Judgement
	var newest time.Duration
	for i, c := range clicks {
		ev := event(uint64(i+1), c)
		if c.at < newest {
			ev.Stored = t0.Add(newest)
		}
		newest = max(newest, c.at)
		j, ok := p.Judge(ev)
		if !ok {
			t.Fatalf("event %d skipped", i+1)
		}
		out = append(out, j)
	}
	return out
}

func event(seq uint64, c clk) reader.Event {
	if c.code == "" {
		c.code = "abc"
	}
	if c.visitor == "" {
		c.visitor = fmt.Sprintf("v%d", seq)
	}
	if c.ua == "" {
		c.ua = browser
	}
	if c.prefix == "" {
		c.prefix = fmt.Sprintf("10.%d.%d.0/24", seq/256%256, seq%256)
	}
	at := t0.Add(c.at)
	return reader.Event{Seq: seq, Stored: at.Add(time.Millisecond), Click: events.Click{
		V: events.ClickVersion, ID: events.NewID(), Time: at, Code: c.code, Owner: "acme",
		Target: "https://example.com/", IPPrefix: c.prefix, Visitor: c.visitor, UserAgent: c.ua, Bot: c.bot,
	}}
}

// repeat returns n clicks of one visitor on one link, every step from start.
func repeat(n int, start, step time.Duration, c clk) []clk {
	out := make([]clk, n)
	for i := range out {
		out[i] = c
		out[i].at = start + time.Duration(i)*step
	}
	return out
}

func seqs(from, to uint64, rule string) map[uint64]string {
	m := map[uint64]string{}
	for s := from; s <= to; s++ {
		m[s] = rule
	}
	return m
}

// except returns m without the sequences given.
func except(m map[uint64]string, seqs ...uint64) map[uint64]string {
	for _, s := range seqs {
		delete(m, s)
	}
	return m
}

func burstRules() fraud.Rules {
	r := fraud.Defaults()
	r.VisitorWindow = 10 * time.Second
	r.VisitorThreshold = 3
	return r
}

func TestVisitorBurstThresholdEdges(t *testing.T) {
	t.Parallel()
	v := clk{visitor: "bot"}
	tests := []struct {
		name       string
		clicks     []clk
		wantLabels map[uint64]string
		wantAlerts int
	}{
		{name: "threshold_clicks_within_window_are_allowed", clicks: repeat(3, 0, time.Second, v), wantLabels: map[uint64]string{}},
		{name: "one_more_labels_the_whole_window", clicks: repeat(4, 0, time.Second, v),
			wantLabels: seqs(1, 4, fraud.RuleVisitorBurst), wantAlerts: 1},
		{name: "window_is_inclusive", clicks: repeat(4, 0, 10*time.Second/3, v),
			wantLabels: seqs(1, 4, fraud.RuleVisitorBurst), wantAlerts: 1},
		{name: "one_nanosecond_over_the_window_is_allowed", clicks: repeat(4, 0, 10*time.Second/3+1, v), wantLabels: map[uint64]string{}},
		{name: "burst_continues_one_alert_every_click_labelled", clicks: repeat(50, 0, 100*time.Millisecond, v),
			wantLabels: seqs(1, 50, fraud.RuleVisitorBurst), wantAlerts: 1},
		{name: "window_slides_slow_clicks_never_burst", clicks: repeat(40, 0, 4*time.Second, v), wantLabels: map[uint64]string{}},
		{name: "per_link_not_per_visitor", clicks: []clk{
			{visitor: "bot", code: "a"}, {visitor: "bot", code: "b"}, {visitor: "bot", code: "c"}, {visitor: "bot", code: "d"},
			{visitor: "bot", code: "a"}, {visitor: "bot", code: "b"},
		}, wantLabels: map[uint64]string{}},
		{name: "slow_start_then_burst_labels_only_the_window", clicks: append(repeat(2, 0, 20*time.Second, v),
			repeat(4, time.Minute, time.Second, v)...), wantLabels: seqs(3, 6, fraud.RuleVisitorBurst), wantAlerts: 1},
		{name: "new_alert_period_new_alert", clicks: append(repeat(4, 0, time.Second, v),
			repeat(4, time.Hour, time.Second, v)...), wantLabels: seqs(1, 8, fraud.RuleVisitorBurst), wantAlerts: 2},
		{name: "source_bots_are_not_counted", clicks: repeat(10, 0, time.Second, clk{visitor: "bot", bot: true, ua: "Slackbot 1.0"}),
			wantLabels: map[uint64]string{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			labels, alerts := run(t, burstRules(), tc.clicks)
			if d := cmp.Diff(tc.wantLabels, labels); d != "" {
				t.Errorf("labels (-want +got):\n%s", d)
			}
			if len(alerts) != tc.wantAlerts {
				t.Fatalf("alerts = %d, want %d: %+v", len(alerts), tc.wantAlerts, alerts)
			}
			for _, a := range alerts {
				if a.Rule != fraud.RuleVisitorBurst || a.Key != "bot" || a.Count != 4 || a.Threshold != 3 {
					t.Errorf("alert = %+v", a)
				}
			}
		})
	}
}

// TestALateClickMakesNoVisitorBurst: a click that comes in after clicks it
// is older than (an outbox backlog relayed after an outage, a dead-letter
// redrive) is judged by when it happened. It fires the burst rule only
// when the clicks it would label are within the window of each other, and
// it does not keep a real burst that follows from being caught at once.
func TestALateClickMakesNoVisitorBurst(t *testing.T) {
	t.Parallel()
	v := clk{visitor: "v"}
	at := func(d time.Duration) clk { c := v; c.at = d; return c }
	burst := func(seqs ...uint64) map[uint64]string {
		m := map[uint64]string{}
		for _, s := range seqs {
			m[s] = fraud.RuleVisitorBurst
		}
		return m
	}
	tests := []struct {
		name       string
		rules      fraud.Rules
		clicks     []clk
		wantLabels map[uint64]string
		// wantWindow is the one alert's window, as offsets from t0; nil:
		// no alert.
		wantWindow []time.Duration
	}{
		{name: "hours_late_after_clicks_spread_over_a_quarter_hour", rules: fraud.Defaults(),
			// 20 clicks of one person 50 s apart (no minute holds more
			// than 2), then one of two hours before them.
			clicks:     append(repeat(20, 0, 50*time.Second, v), at(-2*time.Hour)),
			wantLabels: burst()},
		{name: "late_within_the_window_of_the_newest_but_spanning_more", rules: burstRules(),
			// 0, 6, 12, then 3: no 10 s hold more than 3.
			clicks:     append(repeat(3, 0, 6*time.Second, v), at(3*time.Second)),
			wantLabels: burst()},
		{name: "late_and_completing_a_real_burst", rules: burstRules(),
			// 0, 4, 8, then 2: 4 within 8 s, whichever came last.
			clicks:     append(repeat(3, 0, 4*time.Second, v), at(2*time.Second)),
			wantLabels: burst(1, 2, 3, 4), wantWindow: []time.Duration{0, 8 * time.Second}},
		{name: "a_burst_after_a_late_click_is_caught_at_its_threshold", rules: burstRules(),
			// 0, 6, 12, 18, one an hour late, then 25, 26, 27, 28: 18,
			// 25, 26 and 27 are 4 within 10 s, caught at 27, 18 labelled.
			clicks: append(append(repeat(4, 0, 6*time.Second, v), at(-time.Hour)),
				repeat(4, 25*time.Second, time.Second, v)...),
			wantLabels: burst(4, 6, 7, 8, 9), wantWindow: []time.Duration{18 * time.Second, 27 * time.Second}},
		{name: "a_late_click_does_not_expire_a_burst_in_progress", rules: burstRules(),
			// 0, 3, 6, one an hour late, then 7: 4 within 7 s.
			clicks:     append(repeat(3, 0, 3*time.Second, v), at(-time.Hour), at(7*time.Second)),
			wantLabels: burst(1, 2, 3, 5), wantWindow: []time.Duration{0, 7 * time.Second}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			labels, alerts := run(t, tc.rules, tc.clicks)
			if d := cmp.Diff(tc.wantLabels, labels); d != "" {
				t.Errorf("labels (-want +got):\n%s", d)
			}
			if tc.wantWindow == nil {
				if len(alerts) != 0 {
					t.Fatalf("alerts = %+v, want none", alerts)
				}
				return
			}
			if len(alerts) != 1 {
				t.Fatalf("alerts = %+v, want one", alerts)
			}
			from, to := t0.Add(tc.wantWindow[0]), t0.Add(tc.wantWindow[1])
			if a := alerts[0]; !a.WindowStart.Equal(from) || !a.WindowEnd.Equal(to) || !a.Time.Equal(to) {
				t.Errorf("alert window %s-%s at %s, want %s-%s at its end", a.WindowStart.Format(time.TimeOnly),
					a.WindowEnd.Format(time.TimeOnly), a.Time.Format(time.TimeOnly), from.Format(time.TimeOnly), to.Format(time.TimeOnly))
			}
		})
	}
}

func TestAlertPayloadAndIDAreDeterministic(t *testing.T) {
	t.Parallel()
	clicks := repeat(4, 30*time.Minute, time.Second, clk{visitor: "bot", code: "abc"})
	_, a1 := run(t, burstRules(), clicks)
	_, a2 := run(t, burstRules(), clicks)
	if d := cmp.Diff(a1, a2); d != "" {
		t.Fatalf("two runs differ (-first +second):\n%s", d)
	}
	a := a1[0]
	want := fraud.AlertID(fraud.RuleVisitorBurst, "abc", "bot", t0)
	if a.ID != want || !a.Time.Equal(t0.Add(30*time.Minute+3*time.Second)) ||
		!a.WindowStart.Equal(t0.Add(30*time.Minute)) || a.V != events.FraudVersion || a.Owner != "acme" {
		t.Fatalf("alert = %+v, want ID %s", a, want)
	}
	// The ID is a valid Nats-Msg-Id for the contract, even with the longest code.
	a.Code = strings.Repeat("x", events.MaxTokenLen)
	a.ID = fraud.AlertID("unfurler_pair", a.Code, "203.0.113.0/24", t0)
	b, _ := jsonMarshal(a)
	if _, err := events.DecodeFraudAlert(b); err != nil {
		t.Fatalf("longest alert ID %q (%d chars): %v", a.ID, len(a.ID), err)
	}
}

func floodRules() fraud.Rules {
	r := fraud.Defaults()
	r.FloodFloor = 20
	r.FloodFactor = 10
	return r
}

// crowd returns n clicks by distinct visitors on one link, spread evenly
// over span from start.
func crowd(n int, start, span time.Duration, code string) []clk {
	out := make([]clk, n)
	for i := range out {
		out[i] = clk{at: start + span*time.Duration(i)/time.Duration(n), code: code, visitor: fmt.Sprintf("%s-%d-%d", code, start, i)}
	}
	return out
}

// minutes returns perMinute[i] clicks by distinct visitors in minute i.
func minutes(code string, perMinute ...int) []clk {
	var out []clk
	for m, n := range perMinute {
		out = append(out, crowd(n, time.Duration(m)*time.Minute, time.Minute, code)...)
	}
	return out
}

func count(labels map[uint64]string, rule string) int {
	n := 0
	for _, r := range labels {
		if r == rule {
			n++
		}
	}
	return n
}

func TestLinkFloodThresholds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		clicks []clk
		// from is the index of the first click that must be labelled (the
		// flood and the window it fired in); -1 for none.
		from       int
		until      int // the first click after it that must not be; 0: the end
		wantAlerts int
	}{
		{name: "floor_clicks_in_a_window_are_allowed", clicks: crowd(20, 0, 50*time.Second, "l"), from: -1},
		{name: "floor_plus_one_labels_the_window", clicks: crowd(21, 0, 50*time.Second, "l"), from: 0, wantAlerts: 1},
		{name: "floor_plus_one_over_more_than_a_window_is_allowed", clicks: crowd(21, 0, 64*time.Second, "l"), from: -1},
		{name: "under_factor_times_baseline_is_allowed", clicks: minutes("l", 15, 15, 15, 15, 140), from: -1},
		{name: "over_factor_times_baseline_floods", clicks: minutes("l", 15, 15, 15, 15, 200), from: 60, wantAlerts: 1},
		{name: "organic_doubling_every_minute_is_not_a_flood", clicks: minutes("l", 10, 20, 40, 80, 160, 320, 640, 1280), from: -1},
		{name: "sustained_flood_stays_flagged", clicks: minutes("l", 5, 5, 5, 300, 300, 300, 300, 300), from: 15, wantAlerts: 1},
		{name: "baseline_decays_over_quiet_minutes", clicks: append(minutes("l", 15, 15, 15, 15),
			crowd(100, 30*time.Minute, time.Minute, "l")...), from: 60, wantAlerts: 1},
		{name: "without_the_quiet_minutes_the_same_clicks_are_allowed", clicks: append(minutes("l", 15, 15, 15, 15),
			crowd(100, 4*time.Minute, time.Minute, "l")...), from: -1},
		{name: "thirty_minutes_of_flood_become_the_baseline", clicks: minutes("l", slices.Repeat([]int{150}, 40)...),
			from: 0, until: 30 * 150, wantAlerts: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// A click on another link a minute earlier starts the state, so
			// link l is new when it appears (see TestStateStart...).
			labels, alerts := run(t, floodRules(), append([]clk{{at: -time.Minute, code: "other"}}, tc.clicks...))
			until := tc.until
			if until == 0 {
				until = len(tc.clicks)
			}
			for i := range tc.clicks {
				seq := uint64(i + 2)
				got := labels[seq]
				want := ""
				if tc.from >= 0 && i >= tc.from && i < until {
					want = fraud.RuleLinkFlood
				}
				// The window the rule fired in may reach a little before from.
				if tc.from >= 0 && i < tc.from && got != "" && i >= tc.from-20 {
					continue
				}
				if got != want {
					t.Fatalf("click %d (at %s) label %q, want %q (%d labels)", i, tc.clicks[i].at, got, want, len(labels))
				}
			}
			if len(alerts) != tc.wantAlerts {
				t.Fatalf("alerts = %d, want %d: %+v", len(alerts), tc.wantAlerts, alerts)
			}
		})
	}
}

func TestStateStartWarmsBusyLinksInsteadOfFlaggingThem(t *testing.T) {
	t.Parallel()
	d, _ := fraud.NewDetector(floodRules())
	// A member whose state begins (a first start, or the rebuild after a
	// takeover) where a link already gets 100 clicks a minute, over the
	// floor of 20: the link is not judged until a minute watched in full
	// sets its baseline, wherever in the minute the state began.
	for _, offset := range []time.Duration{0, 30 * time.Second, 59*time.Second + 500*time.Millisecond} {
		p := d.NewPartition()
		clicks := minutes("l", 100, 100, 100, 100)
		for i, c := range clicks {
			if c.at < offset {
				continue
			}
			if j, _ := p.Judge(event(uint64(i+1), c)); len(j.Labels) != 0 {
				t.Fatalf("state starting at %s: busy link flagged at %s", offset, c.at)
			}
		}
	}
	// A link that appears a window after the state began is new: judged by
	// the floor at once.
	p := d.NewPartition()
	clicks := append(minutes("quiet", 1), crowd(100, time.Minute, time.Minute, "l")...)
	flagged := 0
	for i, c := range clicks {
		j, _ := p.Judge(event(uint64(i+1), c))
		flagged += len(j.Labels)
	}
	if flagged != 100 {
		t.Fatalf("new link at 100 a minute: %d of 100 clicks flagged", flagged)
	}
}

func TestBotAgents(t *testing.T) {
	t.Parallel()
	tests := []struct {
		ua   string
		want fraud.AgentClass
	}{
		{browser, fraud.ClassBrowser},
		{"Mozilla/5.0 (Linux; Android 9; CUBOT X19) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Mobile Safari/537.36", fraud.ClassBrowser},
		{"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Teams/24295.605.3225.8804 Chrome/120.0 Electron/28.2.10 Safari/537.36", fraud.ClassBrowser},
		{"Slackbot-LinkExpanding 1.0 (+https://api.slack.com/robots)", fraud.ClassUnfurler},
		{"facebookexternalhit/1.1 Facebot Twitterbot/1.0", fraud.ClassUnfurler},
		{"http.rb/5.1.1 (Mastodon/4.2.0; +https://mastodon.social/)", fraud.ClassUnfurler},
		{"python-requests/2.32.3", fraud.ClassTool},
		{"curl/8.5.0", fraud.ClassTool},
		{"Go-http-client/1.1", fraud.ClassTool},
		{"Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) HeadlessChrome/120.0.0.0 Safari/537.36", fraud.ClassHeadless},
		{"Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)", fraud.ClassCrawler},
		{"Mozilla/5.0 (compatible; SomeNewBot/0.1; +https://example.org/bot)", fraud.ClassCrawler},
		{"UptimeRobot/2.0; http://www.uptimerobot.com/", fraud.ClassMonitor},
		{"", fraud.ClassEmpty},
		{"   ", fraud.ClassEmpty},
	}
	for _, tc := range tests {
		if got := fraud.Classify(tc.ua).Class; got != tc.want {
			t.Errorf("Classify(%q) = %q, want %q", tc.ua, got, tc.want)
		}
	}

	r := fraud.Defaults()
	r.LabelAlertThreshold = 2
	t.Run("labels_unlabelled_bots_and_alerts_on_tools", func(t *testing.T) {
		t.Parallel()
		tool := repeat(3, 0, 5*time.Second, clk{ua: "curl/8.5.0"})
		for i := range tool {
			tool[i].visitor = fmt.Sprintf("t%d", i)
		}
		labels, alerts := run(t, r, tool)
		if d := cmp.Diff(seqs(1, 3, fraud.RuleBotAgent), labels); d != "" {
			t.Errorf("labels (-want +got):\n%s", d)
		}
		if len(alerts) != 1 || alerts[0].Key != "curl" || alerts[0].Count != 3 || alerts[0].Threshold != 2 {
			t.Fatalf("alerts = %+v, want one for curl", alerts)
		}
	})
	t.Run("unfurlers_are_labelled_not_alerted_and_source_bots_not_relabelled", func(t *testing.T) {
		t.Parallel()
		var clicks []clk
		for i := range 5 {
			clicks = append(clicks, clk{at: time.Duration(i) * time.Second, ua: "Slackbot-LinkExpanding 1.0", visitor: fmt.Sprintf("s%d", i)})
			clicks = append(clicks, clk{at: time.Duration(i) * time.Second, ua: "curl/8.5.0", bot: true, visitor: fmt.Sprintf("c%d", i)})
		}
		labels, alerts := run(t, r, clicks)
		if d := cmp.Diff(map[uint64]string{1: fraud.RuleBotAgent, 3: fraud.RuleBotAgent, 5: fraud.RuleBotAgent, 7: fraud.RuleBotAgent, 9: fraud.RuleBotAgent}, labels); d != "" {
			t.Errorf("labels (-want +got):\n%s", d)
		}
		// Source-labelled curl clicks still count towards the tool alert.
		if len(alerts) != 1 || alerts[0].Key != "curl" {
			t.Fatalf("alerts = %+v, want one for curl", alerts)
		}
	})
}

func TestListedNetworks(t *testing.T) {
	t.Parallel()
	nets, err := fraud.ParseNetworks(strings.NewReader("# datacenters\n203.0.0.0/16, 198.51.100.0/24\n2001:db8::/32\n\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.MustParsePrefix("203.0.0.0/16"), netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("2001:db8::/32")}
	if d := cmp.Diff(want, nets, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); d != "" {
		t.Fatalf("parsed (-want +got):\n%s", d)
	}
	for _, bad := range []string{"203.0.113.0/28", "2001:db8::/64", "not-a-cidr", "10.0.0.1"} {
		if _, err := fraud.ParseNetworks(strings.NewReader(bad)); err == nil {
			t.Errorf("ParseNetworks(%q) accepted", bad)
		}
	}
	r := fraud.Defaults()
	r.ListedNetworks = nets
	r.LabelAlertThreshold = 1
	tests := []struct {
		prefix string
		listed bool
	}{
		{"203.0.113.0/24", true}, {"203.1.113.0/24", false}, {"198.51.100.0/24", true}, {"198.51.101.0/24", false},
		{"2001:db8:1::/48", true}, {"2001:db9::/48", false}, {"", false}, {"garbage", false},
	}
	for _, tc := range tests {
		labels, _ := run(t, r, []clk{{prefix: tc.prefix}})
		if got := labels[1] == fraud.RuleListedNetwork; got != tc.listed {
			t.Errorf("prefix %q listed = %v, want %v", tc.prefix, got, tc.listed)
		}
	}
	_, alerts := run(t, r, []clk{{prefix: "203.0.1.0/24"}, {prefix: "203.0.2.0/24", at: time.Second}})
	if len(alerts) != 1 || alerts[0].Key != "203.0.0.0/16" || alerts[0].Rule != fraud.RuleListedNetwork {
		t.Fatalf("alerts = %+v", alerts)
	}
}

func TestUnfurlerPair(t *testing.T) {
	t.Parallel()
	const p = "198.51.100.0/24"
	unfurl := clk{ua: "Twitterbot/1.0", prefix: p, bot: true}
	at := func(c clk, d time.Duration) clk { c.at = d; return c }
	tests := []struct {
		name   string
		clicks []clk
		want   map[uint64]string
	}{
		{name: "browser_fetch_after_unfurler_is_paired", clicks: []clk{at(unfurl, 0), {at: time.Second, prefix: p}, {at: 2 * time.Second, prefix: p}},
			want: map[uint64]string{2: fraud.RuleUnfurlerPair, 3: fraud.RuleUnfurlerPair}},
		{name: "browser_fetch_before_unfurler_is_paired", clicks: []clk{{prefix: p}, at(unfurl, 1500*time.Millisecond)},
			want: map[uint64]string{1: fraud.RuleUnfurlerPair}},
		{name: "outside_pair_window_is_a_person", clicks: []clk{{prefix: p}, at(unfurl, 2*time.Second+1), {at: 4*time.Second + 2, prefix: p}},
			want: map[uint64]string{}},
		{name: "other_prefix_is_a_person", clicks: []clk{at(unfurl, 0), {at: time.Second, prefix: "198.51.101.0/24"}},
			want: map[uint64]string{}},
		{name: "other_link_is_a_person", clicks: []clk{at(unfurl, 0), {at: time.Second, prefix: p, code: "other"}},
			want: map[uint64]string{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			labels, _ := run(t, fraud.Defaults(), tc.clicks)
			if d := cmp.Diff(tc.want, labels); d != "" {
				t.Errorf("labels (-want +got):\n%s", d)
			}
		})
	}
}

// TestALateClickKeepsALinksAndAPairsState: a click that comes in after
// clicks it is older than (an outbox backlog, a redrive), here by a quarter
// of an hour, more than the state's ten minutes of memory, does not move
// back the time the link's or the (link, prefix)'s state expires by, nor
// when the unfurler last fetched: the next click is judged with the state
// it belongs to, not as a new link's or prefix's.
func TestALateClickKeepsALinksAndAPairsState(t *testing.T) {
	t.Parallel()
	const p = "198.51.100.0/24"
	unfurl := clk{ua: "Twitterbot/1.0", prefix: p, bot: true}
	at := func(c clk, d time.Duration) clk { c.at = d; return c }
	flood := append([]clk{{code: "other"}}, crowd(30, 30*time.Minute, 30*time.Second, "l")...)
	tests := []struct {
		name   string
		rules  fraud.Rules
		clicks []clk
		want   map[uint64]string
		alerts int
	}{
		{name: "a_flood_in_progress_goes_on_being_labelled", rules: floodRules(),
			// 30 clicks within 30 s (floor 20), one of 15 min before
			// them (in no window with them: not labelled, see
			// TestALateClickOfLongAgoIsLeftOutOfTheFloodWindow), then one
			// more.
			clicks: append(flood, clk{at: 15 * time.Minute, code: "l"}, clk{at: 30*time.Minute + 30*time.Second, code: "l"}),
			want:   except(seqs(2, 33, fraud.RuleLinkFlood), 32), alerts: 1},
		{name: "browser_fetches_before_an_unfurler_are_paired", rules: fraud.Defaults(),
			// Browser-agent fetches at 0 and 1 s, one of 15 min before,
			// the unfurler at 1.5 s.
			clicks: []clk{{at: 30 * time.Minute, prefix: p}, {at: 30*time.Minute + time.Second, prefix: p}, {at: 15 * time.Minute, prefix: p},
				at(unfurl, 30*time.Minute+1500*time.Millisecond)},
			want: map[uint64]string{1: fraud.RuleUnfurlerPair, 2: fraud.RuleUnfurlerPair}},
		{name: "a_browser_fetch_after_an_unfurler_is_paired", rules: fraud.Defaults(),
			// The unfurler, one of 15 min before, a browser-agent fetch
			// a second after the first.
			clicks: []clk{at(unfurl, 30*time.Minute), at(unfurl, 15*time.Minute), {at: 30*time.Minute + time.Second, prefix: p}},
			want:   map[uint64]string{3: fraud.RuleUnfurlerPair}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			labels := map[uint64]string{}
			var alerts []events.FraudAlert
			for _, j := range judgeLate(t, tc.rules, tc.clicks) {
				for _, l := range j.Labels {
					labels[l.Seq] = l.Rule
				}
				alerts = append(alerts, j.Alerts...)
			}
			if d := cmp.Diff(tc.want, labels); d != "" {
				t.Errorf("labels (-want +got):\n%s", d)
			}
			if len(alerts) != tc.alerts {
				t.Errorf("alerts = %+v, want %d", alerts, tc.alerts)
			}
		})
	}
}

// TestALateClickIsPairedOnlyWithinThePairWindow: unfurler_pair labels a
// browser-agent click within PairWindow of an unfurler's, before or after
// it, by the clicks' own times. A click come late (an outbox backlog, a
// redrive), older than clicks of its prefix already judged, is paired only
// that way too: a late browser-agent fetch a quarter of an hour before the
// unfurler is a person's, and a late unfurler neither labels the browser-
// agent fetches of a quarter of an hour after it nor takes them away from
// the unfurler of their own time.
func TestALateClickIsPairedOnlyWithinThePairWindow(t *testing.T) {
	t.Parallel()
	const p = "198.51.100.0/24"
	const m30 = 30 * time.Minute
	unfurl := clk{ua: "Twitterbot/1.0", prefix: p, bot: true}
	at := func(c clk, d time.Duration) clk { c.at = d; return c }
	fetch := func(d time.Duration) clk { return clk{at: d, prefix: p} }
	tests := []struct {
		name   string
		clicks []clk
		want   map[uint64]string // click: "rule by the event that labelled it"
	}{
		{name: "a_late_fetch_long_before_the_unfurler_is_a_person",
			clicks: []clk{at(unfurl, m30), fetch(15 * time.Minute)},
			want:   map[uint64]string{}},
		{name: "a_late_fetch_just_before_the_unfurler_is_paired",
			clicks: []clk{at(unfurl, m30), fetch(m30 - 2*time.Second)},
			want:   map[uint64]string{2: "unfurler_pair by 2"}},
		{name: "a_late_unfurler_leaves_later_fetches_to_their_unfurler",
			// Fetches at 30:00 and 30:00.5, an unfurler of 15:00 late,
			// the fetches' unfurler at 30:01.5.
			clicks: []clk{fetch(m30), fetch(m30 + 500*time.Millisecond), at(unfurl, 15*time.Minute), at(unfurl, m30+1500*time.Millisecond)},
			want:   map[uint64]string{1: "unfurler_pair by 4", 2: "unfurler_pair by 4"}},
		{name: "a_late_unfurler_pairs_the_late_fetches_of_its_time",
			// A fetch at 30:00, one of 15:00 late and its unfurler at
			// 15:01, then the first fetch's unfurler at 30:01.
			clicks: []clk{fetch(m30), fetch(15 * time.Minute), at(unfurl, 15*time.Minute+time.Second), at(unfurl, m30+time.Second)},
			want:   map[uint64]string{2: "unfurler_pair by 3", 1: "unfurler_pair by 4"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			labels := map[uint64]string{}
			for _, j := range judgeLate(t, fraud.Defaults(), tc.clicks) {
				for _, l := range j.Labels {
					labels[l.Seq] = fmt.Sprintf("%s by %d", l.Rule, j.Seq)
				}
			}
			if d := cmp.Diff(tc.want, labels); d != "" {
				t.Errorf("labels (-want +got):\n%s", d)
			}
		})
	}
}

// TestALateClickOfLongAgoIsLeftOutOfTheFloodWindow: a click of a link
// come late (an outbox backlog, a redrive) by more than the flood window
// behind the link's newest click is in no window with the clicks the state
// holds: it completes no flood of theirs, and a flood of theirs does not
// label it. One late by less than the window is judged with them.
func TestALateClickOfLongAgoIsLeftOutOfTheFloodWindow(t *testing.T) {
	t.Parallel()
	const m30 = 30 * time.Minute
	// A click on another link starts the state, then 20 clicks on l from
	// 30:00, one every 1.5 s: the floor (20), no flood.
	twenty := slices.Clip(append([]clk{{code: "other"}}, crowd(20, m30, 30*time.Second, "l")...))
	tests := []struct {
		name   string
		clicks []clk
		want   map[uint64]string
		alerts int
	}{
		{name: "a_click_of_a_quarter_of_an_hour_before_completes_no_flood",
			clicks: append(twenty, clk{at: 15 * time.Minute, code: "l", visitor: "late"}),
			want:   map[uint64]string{}},
		{name: "a_click_of_hours_before_is_not_labelled_by_a_flood",
			// 10 more clicks from 30:30 flood the link (from the first,
			// the 21st within a minute); a click of 10:00 comes late in
			// the middle of them.
			clicks: slices.Concat(twenty, crowd(5, m30+30*time.Second, 5*time.Second, "l"),
				[]clk{{at: 10 * time.Minute, code: "l", visitor: "late"}}, crowd(5, m30+35*time.Second, 5*time.Second, "l")),
			want: except(seqs(2, 32, fraud.RuleLinkFlood), 27), alerts: 1},
		{name: "a_click_late_by_less_than_the_window_is_judged_with_the_rest",
			// 29:45: within a minute of every one of the 20.
			clicks: append(twenty, clk{at: m30 - 15*time.Second, code: "l", visitor: "late"}),
			want:   seqs(2, 22, fraud.RuleLinkFlood), alerts: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			labels := map[uint64]string{}
			var alerts []events.FraudAlert
			for _, j := range judgeLate(t, floodRules(), tc.clicks) {
				for _, l := range j.Labels {
					labels[l.Seq] = l.Rule
				}
				alerts = append(alerts, j.Alerts...)
			}
			if d := cmp.Diff(tc.want, labels); d != "" {
				t.Errorf("labels (-want +got):\n%s", d)
			}
			if len(alerts) != tc.alerts {
				t.Errorf("alerts = %+v, want %d", alerts, tc.alerts)
			}
		})
	}
}

// TestALateBurstOfAnEarlierPeriodRaisesNoAlertAgain: a flood and a
// visitor's burst go on across the hour, alerted in both hours (the flood)
// or in the second (the burst, first caught there); then clicks of the
// minute before the hour come in late (an outbox backlog, a redrive) and
// make a window of the first hour fire, then the hour's clicks go on. Each
// alert is raised once, and every label names an alert raised.
func TestALateBurstOfAnEarlierPeriodRaisesNoAlertAgain(t *testing.T) {
	t.Parallel()
	const hour = 60 * time.Minute
	v := clk{visitor: "v"}
	vat := func(d time.Duration) clk { c := v; c.at = d; return c }
	tests := []struct {
		name   string
		rules  fraud.Rules
		clicks []clk
		want   []string // the alert IDs, in order
	}{
		{name: "link_flood", rules: floodRules(),
			// 30 clicks from 12:59:00, one a second (the flood fires at
			// the 21st), 10 from 13:00:00, one of 12:59:45 late, one more.
			clicks: slices.Concat([]clk{{code: "other"}}, crowd(30, hour-time.Minute, 30*time.Second, "l"),
				crowd(10, hour, 10*time.Second, "l"), []clk{{at: hour - 15*time.Second, code: "l", visitor: "late"}},
				[]clk{{at: hour + 10*time.Second, code: "l", visitor: "next"}}),
			want: []string{fraud.AlertID(fraud.RuleLinkFlood, "l", "", t0), fraud.AlertID(fraud.RuleLinkFlood, "l", "", t0.Add(hour))}},
		{name: "visitor_burst", rules: burstRules(),
			// 12:59:55, :56, :57 and 13:00:01 fire (4 within 10 s), then
			// 12:59:52, :53, :54 and :58 late (4 within 10 s of the first
			// hour), then 13:00:02.
			clicks: slices.Concat([]clk{vat(hour - 5*time.Second), vat(hour - 4*time.Second), vat(hour - 3*time.Second), vat(hour + time.Second)},
				[]clk{vat(hour - 8*time.Second), vat(hour - 7*time.Second), vat(hour - 6*time.Second), vat(hour - 2*time.Second)},
				[]clk{vat(hour + 2*time.Second)}),
			want: []string{fraud.AlertID(fraud.RuleVisitorBurst, "abc", "v", t0.Add(hour))}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var got []string
			labels := map[uint64]string{}
			for _, j := range judgeLate(t, tc.rules, tc.clicks) {
				for _, a := range j.Alerts {
					got = append(got, a.ID)
				}
				for _, l := range j.Labels {
					labels[l.Seq] = l.AlertID
				}
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("alerts raised (-want +got):\n%s", d)
			}
			for seq, id := range labels {
				if !slices.Contains(got, id) {
					t.Errorf("click %d labelled with alert %s, never raised", seq, id)
				}
			}
			if len(labels) == 0 {
				t.Error("nothing labelled")
			}
		})
	}
}

func TestEvictionBounds(t *testing.T) {
	t.Parallel()
	r := burstRules()
	r.MaxIdentities = 100
	d, err := fraud.NewDetector(r)
	if err != nil {
		t.Fatal(err)
	}
	p := d.NewPartition()
	seq := uint64(0)
	judge := func(c clk) fraud.Judgement {
		seq++
		j, _ := p.Judge(event(seq, c))
		return j
	}
	// 1000 distinct visitors within one second: the cap holds, the
	// least recently active are evicted.
	for i := range 1000 {
		judge(clk{at: time.Duration(i) * time.Millisecond, visitor: fmt.Sprintf("h%d", i)})
	}
	if s := p.Stats(); s.Identities != 100 || s.Evicted < 900 {
		t.Fatalf("after 1000 visitors: %+v, want 100 identities and >= 900 evicted", s)
	}
	// A bursting visitor among a crowd that overflows the cap every second
	// stays tracked (it is always recently active) and is caught.
	labelled := 0
	for i := range 400 {
		at := 2*time.Second + time.Duration(i)*5*time.Millisecond
		labelled += len(judge(clk{at: at, visitor: "bot"}).Labels)
		for k := range 50 {
			judge(clk{at: at, visitor: fmt.Sprintf("c%d-%d", i, k)})
		}
	}
	if labelled != 400 {
		t.Fatalf("burst under eviction pressure: %d of 400 clicks labelled", labelled)
	}
	// Windows expire with event time: one click a window later leaves one identity.
	judge(clk{at: time.Hour, visitor: "late"})
	if s := p.Stats(); s.Identities != 1 || s.Pairs != 1 || s.Labelled != 0 {
		t.Fatalf("after a quiet hour: %+v, want 1 identity, 1 pair, no labels held", s)
	}
	// The links' and the pairs' caps hold the same way: 1000 clicks on as
	// many links, each from its own network, within one second.
	r.MaxLinks, r.MaxPairs = 50, 70
	if d, err = fraud.NewDetector(r); err != nil {
		t.Fatal(err)
	}
	p, seq = d.NewPartition(), 0
	for i := range 1000 {
		judge(clk{at: time.Duration(i) * time.Millisecond, code: fmt.Sprintf("l%d", i)})
	}
	if s := p.Stats(); s.Identities != 100 || s.Links != 50 || s.Pairs != 70 {
		t.Fatalf("after 1000 links: %+v, want 100 identities, 50 links, 70 pairs (the caps)", s)
	}
}

func TestRedeliveryIsSkipped(t *testing.T) {
	t.Parallel()
	d, _ := fraud.NewDetector(burstRules())
	p := d.NewPartition()
	if _, ok := p.Judge(event(5, clk{})); !ok {
		t.Fatal("first event skipped")
	}
	for _, seq := range []uint64{5, 4} {
		if _, ok := p.Judge(event(seq, clk{})); ok {
			t.Errorf("sequence %d judged again", seq)
		}
	}
	if p.Last() != 5 {
		t.Fatalf("Last = %d", p.Last())
	}
}

func TestClockSkewIsClamped(t *testing.T) {
	t.Parallel()
	r := burstRules()
	d, _ := fraud.NewDetector(r)
	p := d.NewPartition()
	ev := event(1, clk{})
	ev.Click.Time = ev.Stored.Add(24 * time.Hour) // a redirect with a wrong clock
	j, _ := p.Judge(ev)
	if want := ev.Stored.Add(r.MaxClockSkew); !j.At.Equal(want) {
		t.Fatalf("At = %s, want %s", j.At, want)
	}
}

func TestRulesValidate(t *testing.T) {
	t.Parallel()
	mut := []func(*fraud.Rules){
		func(r *fraud.Rules) { r.VisitorWindow = 0 },
		func(r *fraud.Rules) { r.VisitorThreshold = 0 },
		func(r *fraud.Rules) { r.FloodFactor = 0.5 },
		func(r *fraud.Rules) { r.FloodFloor = 0 },
		func(r *fraud.Rules) { r.FloodHalfLife = 0 },
		func(r *fraud.Rules) { r.AlertPeriod = time.Millisecond },
		func(r *fraud.Rules) { r.MaxIdentities = 0 },
		func(r *fraud.Rules) { r.PairWindow = -1 },
	}
	for i, m := range mut {
		r := fraud.Defaults()
		m(&r)
		if _, err := fraud.NewDetector(r); err == nil {
			t.Errorf("mutation %d accepted", i)
		}
	}
	if err := fraud.Defaults().Validate(); err != nil {
		t.Fatal(err)
	}
}

var _ = slices.Sort[[]int]

// TestALateClickOfAnEarlierPeriodLeavesTheCurrentCountAlone: curl clicks a
// link 9 times in the hour from 12:00, then a curl click of 11:59 comes in
// late (an outbox backlog, a redrive), then 2 more curl clicks of the
// current hour: 11 in the hour, so the hour's bot_agent alert is raised.
// The late click belongs to an earlier alert period; counting it must not
// start the current period's counter again.
func TestALateClickOfAnEarlierPeriodLeavesTheCurrentCountAlone(t *testing.T) {
	t.Parallel()
	r := fraud.Defaults()
	d, err := fraud.NewDetector(r)
	if err != nil {
		t.Fatal(err)
	}
	p := d.NewPartition()
	curl := func(seq uint64, at time.Duration) reader.Event {
		return event(seq, clk{at: at, ua: "curl/8.5.0", visitor: fmt.Sprintf("c%d", seq)})
	}
	var evs []reader.Event
	for i := range 9 {
		evs = append(evs, curl(uint64(i+1), time.Duration(i)*time.Minute))
	}
	late := curl(10, -30*time.Second)
	late.Stored = t0.Add(8*time.Minute + 30*time.Second)
	evs = append(evs, late, curl(11, 9*time.Minute), curl(12, 10*time.Minute))
	var alerts []events.FraudAlert
	for _, ev := range evs {
		j, ok := p.Judge(ev)
		if !ok {
			t.Fatalf("event %d skipped", ev.Seq)
		}
		alerts = append(alerts, j.Alerts...)
	}
	want := fraud.AlertID(fraud.RuleBotAgent, "abc", "curl", t0)
	var ids []string
	for _, a := range alerts {
		ids = append(ids, a.ID)
	}
	if !slices.Contains(ids, want) {
		t.Fatalf("alerts %v, want %s (11 curl clicks in the hour from %s)", ids, want, t0.Format(time.TimeOnly))
	}
	// The counter the store keeps for the hour is the hour's count too.
	for _, c := range p.Counts(nil) {
		if c.Period.Equal(t0) && c.N != 11 {
			t.Fatalf("stored counter of the hour = %d, want 11", c.N)
		}
	}
}

// TestALateClickKeepsItsLabelCounter: curl clicks a link 8 times from
// 12:50, a curl click of 12:01 comes in late, a person clicks another link
// at 13:05, then curl clicks of 12:58 and 12:59 come in late too: 11 in the
// hour from 12:00, its bot_agent alert raised. The counter expires an alert
// period after its newest click (12:57), not after the late one's (12:01,
// which the clock at 13:05 is more than an hour past).
func TestALateClickKeepsItsLabelCounter(t *testing.T) {
	t.Parallel()
	d, err := fraud.NewDetector(fraud.Defaults())
	if err != nil {
		t.Fatal(err)
	}
	p := d.NewPartition()
	seq := uint64(0)
	click := func(at, stored time.Duration, c clk) reader.Event {
		seq++
		c.at = at
		ev := event(seq, c)
		ev.Stored = t0.Add(stored)
		return ev
	}
	curl := func(at, stored time.Duration) reader.Event {
		return click(at, stored, clk{ua: "curl/8.5.0", visitor: fmt.Sprintf("c%d", seq+1)})
	}
	var evs []reader.Event
	for i := range 8 {
		at := 50*time.Minute + time.Duration(i)*time.Minute
		evs = append(evs, curl(at, at))
	}
	evs = append(evs, curl(time.Minute, 57*time.Minute),
		click(65*time.Minute, 65*time.Minute, clk{code: "other"}),
		curl(58*time.Minute, 65*time.Minute), curl(59*time.Minute, 65*time.Minute))
	var ids []string
	for _, ev := range evs {
		j, ok := p.Judge(ev)
		if !ok {
			t.Fatalf("event %d skipped", ev.Seq)
		}
		for _, a := range j.Alerts {
			ids = append(ids, a.ID)
		}
	}
	if want := fraud.AlertID(fraud.RuleBotAgent, "abc", "curl", t0); !slices.Equal(ids, []string{want}) {
		t.Fatalf("alerts %v, want %s (11 curl clicks in the hour from %s)", ids, want, t0.Format(time.TimeOnly))
	}
}

// TestALateFirstClickOfALinkLongAfterTheStartLeavesItJudged: a state
// watching since 12:00 sees, at 12:30, a link's first click come late
// (of 11:55: an outbox backlog, a redrive), then 300 clicks a minute on it
// (floor 20). The state has watched that link for half an hour: it is a
// new link, judged by the floor at once, as without the late click, not
// one whose history the state did not see (left unjudged until a minute
// watched in full, whose flood would then become its baseline).
func TestALateFirstClickOfALinkLongAfterTheStartLeavesItJudged(t *testing.T) {
	t.Parallel()
	clicks := []clk{
		{at: 0, code: "other"},
		{at: 30 * time.Minute, code: "other"},
		{at: -5 * time.Minute, code: "l"}, // late: stored at 12:30
	}
	clicks = append(clicks, crowd(900, 30*time.Minute+time.Second, 3*time.Minute, "l")...)
	flagged := 0
	for _, j := range judgeLate(t, floodRules(), clicks) {
		for _, l := range j.Labels {
			if l.Rule == fraud.RuleLinkFlood {
				flagged++
			}
		}
	}
	if flagged < 800 {
		t.Fatalf("a link flooded at 300 a minute after a late first click: %d of 900 clicks labelled link_flood, want all from the 21st", flagged)
	}
}

// TestAStateBegunByALateClickStillWarmsBusyLinks: the first event a state
// sees (a first start, a replay, the rebuild after a takeover) can be a
// click come late, an hour old (an outbox backlog relayed after an outage,
// a redrive). The state still begins where the stream is, not an hour
// before: a link already getting 100 clicks a minute, over the floor of 20,
// has a history the state did not see and is not judged until a minute
// watched in full sets its baseline, as without the late click.
func TestAStateBegunByALateClickStillWarmsBusyLinks(t *testing.T) {
	t.Parallel()
	d, _ := fraud.NewDetector(floodRules())
	p := d.NewPartition()
	late := event(1, clk{at: -time.Hour, code: "old"})
	late.Stored = t0
	if _, ok := p.Judge(late); !ok {
		t.Fatal("late click skipped")
	}
	flagged := 0
	for i, c := range minutes("l", 100, 100, 100, 100) {
		j, _ := p.Judge(event(uint64(i+2), c))
		flagged += len(j.Labels)
	}
	if flagged != 0 {
		t.Fatalf("busy link after a late first click: %d of 400 clicks flagged, want 0", flagged)
	}
}

// TestALateClickLeavesItsKeyWhereItExpires: visitor A clicks link a at
// 12:00:00 and visitor B link b at 12:00:30; a click of A of 11:59:50 comes
// late (stored at 12:00:30: an outbox backlog, a redrive), older than A's
// newest, so A's state expires by 12:00:00 still. At 12:01:01 A is a
// window (1 min) quiet and expires; B does not. Before, the late click moved
// A to the recent end of the table's order without moving its expiry time:
// expiry, which pops from the other end, stopped at B, and A stayed until B
// expired too (up to a window longer).
func TestALateClickLeavesItsKeyWhereItExpires(t *testing.T) {
	t.Parallel()
	d, err := fraud.NewDetector(fraud.Defaults())
	if err != nil {
		t.Fatal(err)
	}
	p := d.NewPartition()
	a := clk{at: 0, code: "a", visitor: "A"}
	b := clk{at: 30 * time.Second, code: "b", visitor: "B"}
	late := event(3, clk{at: -10 * time.Second, code: "a", visitor: "A"})
	late.Stored = t0.Add(30 * time.Second)
	for _, ev := range []reader.Event{event(1, a), event(2, b), late, event(4, clk{at: 61 * time.Second, code: "c", visitor: "C"})} {
		if _, ok := p.Judge(ev); !ok {
			t.Fatalf("event %d skipped", ev.Seq)
		}
	}
	if got := p.Stats().Identities; got != 2 {
		t.Fatalf("identities at 12:01:01: %d, want 2 (B and C; A quiet since 12:00:00, a window)", got)
	}
}
