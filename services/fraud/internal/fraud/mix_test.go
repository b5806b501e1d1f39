package fraud_test

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/services/fraud/internal/fraud"
	"github.com/snipdev/snip/services/fraud/internal/traffic"
)

// mixSpec starts the traffic half a second before a minute ends: the
// detector's state then begins with almost nothing of the first minute seen.
func mixSpec() traffic.Spec {
	return traffic.Spec{Seed: 42, Start: t0.Add(59*time.Second + 500*time.Millisecond), Duration: 12 * time.Minute, HumanRate: 25, Links: 60, Owners: 3, Inject: true}
}

// judgeAll runs a fresh partition per partition over its events and returns
// every label (sequence -> rule) and every alert ID.
func judgeAll(t testing.TB, d *fraud.Detector, byPart map[int][]reader.Event) (map[uint64]string, []string) {
	t.Helper()
	labels := map[uint64]string{}
	var alerts []string
	for _, evs := range byPart {
		p := d.NewPartition()
		for _, ev := range evs {
			j, _ := p.Judge(ev)
			for _, l := range j.Labels {
				labels[l.Seq] = l.Rule
			}
			for _, a := range j.Alerts {
				alerts = append(alerts, a.ID)
			}
		}
	}
	slices.Sort(alerts)
	return labels, alerts
}

// TestGeneratedMix is the detector alone on the generated traffic; the
// service's TestGeneratedMixEndToEnd runs the same through NATS and Redis.
func TestGeneratedMix(t *testing.T) {
	t.Parallel()
	clicks := traffic.Generate(mixSpec())
	byPart, truth := traffic.Events(clicks, 8)
	d, err := fraud.NewDetector(fraud.Defaults())
	if err != nil {
		t.Fatal(err)
	}
	labels, alerts := judgeAll(t, d, byPart)
	flagged, total := map[string]int{}, map[string]int{}
	for i, c := range clicks {
		seq := uint64(i + 1)
		total[truth[seq]]++
		if _, ok := labels[seq]; ok || c.Bot {
			flagged[truth[seq]]++
		}
	}
	for _, pattern := range []string{traffic.PatternBurst, traffic.PatternScanner, traffic.PatternFlood, traffic.PatternPair, traffic.PatternPreview} {
		t.Logf("%-8s flagged %5d of %5d", pattern, flagged[pattern], total[pattern])
		if total[pattern] == 0 || flagged[pattern] != total[pattern] {
			t.Errorf("pattern %s: %d of %d clicks flagged, want all", pattern, flagged[pattern], total[pattern])
		}
	}
	share := float64(flagged[""]) / float64(total[""])
	t.Logf("people   flagged %5d of %5d (%.3f%%); %d alerts", flagged[""], total[""], 100*share, len(alerts))
	if share > 0.01 {
		t.Errorf("%.2f%% of people's clicks flagged, want at most 1%%", 100*share)
	}
}

// slowScanner is curl on one link every 4 minutes for an hour: 15 clicks,
// the 11th (40 minutes in) raises bot_agent, counting clicks far older than
// Memory.
func slowScanner() []traffic.Click {
	var out []traffic.Click
	for i := range 15 {
		out = append(out, traffic.Click{Pattern: traffic.PatternScanner, Click: events.Click{
			V: events.ClickVersion, ID: fmt.Sprintf("slow%d", i), Time: t0.Add(time.Minute + time.Duration(i)*4*time.Minute),
			Code: traffic.Code(11), Owner: "owner2", Target: "https://example.com/x", IPPrefix: fmt.Sprintf("192.0.2.%d/32", i),
			Visitor: fmt.Sprintf("slow%d", i), UserAgent: "curl/8.5.0",
		}})
	}
	return out
}

// TestRebuildJudgesLikeAnUninterruptedMember takes each partition over in
// the middle of the run (and, where the partition has events then, 30
// minutes in, long after Memory): the new owner feeds the last Memory of the
// log, takes the label counters the uninterrupted member had stored as of
// the takeover (as the store hands them back), then judges the rest. Every
// label it gives after the takeover is one the uninterrupted member gave;
// every alert ID it raises is one the uninterrupted member raised (a
// takeover creates no new alert), and every alert the uninterrupted member
// raised after the takeover it raises too (a takeover loses none, also
// those that count clicks older than Memory: the slow scanner's alert, after
// the late takeover of its partition, whose presence the test checks).
func TestRebuildJudgesLikeAnUninterruptedMember(t *testing.T) {
	t.Parallel()
	clicks := append(traffic.Generate(mixSpec()), slowScanner()...)
	slices.SortStableFunc(clicks, func(a, b traffic.Click) int { return a.Time.Compare(b.Time) })
	byPart, _ := traffic.Events(clicks, 8)
	d, err := fraud.NewDetector(fraud.Defaults())
	if err != nil {
		t.Fatal(err)
	}
	want, wantAlerts := judgeAll(t, d, byPart)

	late, beyondMemory := 0, 0
	for part, evs := range byPart {
		cuts := []int{len(evs) / 3, len(evs) / 2, 2 * len(evs) / 3}
		lateCut := -1
		if i := slices.IndexFunc(evs, func(ev reader.Event) bool { return !ev.Click.Time.Before(t0.Add(30 * time.Minute)) }); i > 0 {
			cuts = append(cuts, i)
			lateCut = i
			late++
		}
		// The uninterrupted member, its counters stored after every event
		// (the store keeps the latest value per period and counter), and
		// the alerts it raises from each cut on.
		stored := map[string]fraud.Count{}
		snapshots := map[int][]fraud.Count{}
		alertsFrom := map[int]map[string]events.FraudAlert{}
		u := d.NewPartition()
		for i, ev := range evs {
			if slices.Contains(cuts, i) {
				snapshots[i] = slices.Collect(maps.Values(stored))
				alertsFrom[i] = map[string]events.FraudAlert{}
			}
			j, _ := u.Judge(ev)
			for _, a := range j.Alerts {
				for _, m := range alertsFrom {
					m[a.ID] = a
				}
			}
			for _, c := range u.Counts(nil) {
				c.Mark = ev.Seq
				stored[c.Period.String()+c.Key] = c
			}
			u.CountsStored()
		}

		for _, cut := range cuts {
			resume := evs[cut].Seq
			from := evs[cut-1].Stored.Add(-d.Memory()).Truncate(d.Rules().FloodWindow)
			p := d.NewPartition()
			for _, ev := range evs[:cut] {
				if !ev.Stored.Before(from) {
					p.Feed(ev)
				}
			}
			periods := p.CountPeriods(evs[cut])
			var counts []fraud.Count
			for _, c := range snapshots[cut] {
				if slices.ContainsFunc(periods, c.Period.Equal) {
					counts = append(counts, c)
				}
			}
			p.RestoreCounts(counts)
			got := map[uint64]string{}
			gotAlerts := map[string]bool{}
			for _, ev := range evs[cut:] {
				j, _ := p.Judge(ev)
				for _, l := range j.Labels {
					got[l.Seq] = l.Rule
				}
				for _, a := range j.Alerts {
					gotAlerts[a.ID] = true
					if _, ok := slices.BinarySearch(wantAlerts, a.ID); !ok {
						t.Errorf("partition %d cut at %d: new alert %s", part, resume, a.ID)
					}
				}
			}
			for id, a := range alertsFrom[cut] {
				if !gotAlerts[id] {
					t.Errorf("partition %d cut at %d: alert %s, raised after the cut by the uninterrupted member, is missing", part, resume, id)
				}
				if cut == lateCut && a.WindowStart.Before(from) {
					beyondMemory++
				}
			}
			wantAfter := map[uint64]string{}
			for _, ev := range evs {
				if r, ok := want[ev.Seq]; ok && mustAgree(got, ev.Seq, resume) {
					wantAfter[ev.Seq] = r
				}
			}
			if d := cmp.Diff(wantAfter, got); d != "" {
				t.Errorf("partition %d taken over at %d: labels after the takeover (-uninterrupted +rebuilt):\n%s", part, resume, d)
			}
		}
	}
	if late == 0 {
		t.Fatal("no partition taken over after 30 minutes")
	}
	if beyondMemory == 0 {
		t.Fatal("no alert raised after a takeover 30 minutes in counts clicks from before the rebuilt Memory: nothing checks that such alerts survive a takeover")
	}
}

// mustAgree says whether the rebuilt member must give the uninterrupted
// member's label of a click: every click at or after the takeover; a click
// before it only if the rebuilt member labelled it too (from a window that
// spans the takeover), when the rule must agree.
func mustAgree(got map[uint64]string, seq, resume uint64) bool {
	if seq >= resume {
		return true
	}
	_, ok := got[seq]
	return ok
}
