package fraud_test

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/services/fraud/internal/fraud"
	"github.com/snipdev/snip/services/fraud/internal/traffic"
)

// BenchmarkMemoryPerMillionIdentities feeds one partition's state a million
// distinct visitors on 1,000 links within 59 seconds (so no window expires)
// with the identity cap raised, and reports the live heap the state holds:
// every table, not only the identities (the links' flood windows hold every
// click of the last minute too). Run:
//
//	go test -run '^$' -bench MemoryPerMillionIdentities -benchtime 1x ./internal/fraud/
func BenchmarkMemoryPerMillionIdentities(b *testing.B) {
	const n = 1_000_000
	r := fraud.Defaults()
	r.MaxIdentities = n
	d, err := fraud.NewDetector(r)
	if err != nil {
		b.Fatal(err)
	}
	for range b.N {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		p := d.NewPartition()
		for i := range n {
			at := t0.Add(time.Duration(i) * 59 * time.Second / n)
			p.Judge(reader.Event{Seq: uint64(i + 1), Stored: at, Click: events.Click{
				V: 1, Time: at, Code: fmt.Sprintf("lnk%d", i%1000), Owner: "acme",
				IPPrefix: fmt.Sprintf("10.%d.%d.0/24", i>>8&255, i&255), Visitor: fmt.Sprintf("%032x", i),
				UserAgent: "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0",
			}})
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		s := p.Stats()
		if s.Identities != n {
			b.Fatalf("tracked %d identities, want %d", s.Identities, n)
		}
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "MiB/M-identities")
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "B/identity")
		b.ReportMetric(float64(s.Pairs), "pairs")
		runtime.KeepAlive(p)
	}
}

// BenchmarkJudge is the detector alone on generated traffic: events per
// second one partition's state judges, without NATS or Redis.
func BenchmarkJudge(b *testing.B) {
	clicks := traffic.Generate(traffic.Spec{Seed: 7, Start: t0, Duration: 10 * time.Minute, HumanRate: 500, Links: 2000, Owners: 10, Inject: true})
	byPart, _ := traffic.Events(clicks, 1)
	evs := byPart[0]
	d, _ := fraud.NewDetector(fraud.Defaults())
	b.ResetTimer()
	done := 0
	for range b.N {
		p := d.NewPartition()
		for _, ev := range evs {
			p.Judge(ev)
		}
		done += len(evs)
	}
	b.ReportMetric(float64(done)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkFloodedLinkJudged is one link flooded by many visitors, as the
// load test's viral link is: after 61 s of a quiet link (so the state is
// older than one flood window and a new link is judged against the floor),
// a new link gets 2,000 clicks a second for 60 s, every one labelled while
// the flood window fills up to 120,000 clicks. The cost per click must not
// grow with the window (it did: each click scanned the whole window for
// what was not yet labelled).
func BenchmarkFloodedLinkJudged(b *testing.B) {
	const rate, secs = 2000, 60
	var evs []reader.Event
	add := func(at time.Time, code, visitor string) {
		evs = append(evs, reader.Event{Seq: uint64(len(evs) + 1), Stored: at, Deliveries: 1, Click: events.Click{
			V: events.ClickVersion, ID: events.NewID(), Time: at, Code: code, Owner: "acme",
			Target: "https://example.com/", Visitor: visitor, IPPrefix: "198.51.100.0/24",
			UserAgent: "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0", Country: "NL",
		}})
	}
	for i := range 61 {
		add(t0.Add(time.Duration(i)*time.Second), "quiet", fmt.Sprintf("q%d", i))
	}
	start := t0.Add(61 * time.Second)
	for i := range rate * secs {
		add(start.Add(time.Duration(i)*time.Second/rate), "viral", fmt.Sprintf("v%d", i%50_000))
	}
	d, _ := fraud.NewDetector(fraud.Defaults())
	b.ResetTimer()
	labels := 0
	for range b.N {
		p := d.NewPartition()
		for _, ev := range evs {
			j, _ := p.Judge(ev)
			labels += len(j.Labels)
		}
	}
	if labels < rate*secs/2 {
		b.Fatalf("%d labels a run: the flood was not judged one", labels/b.N)
	}
	b.ReportMetric(float64(len(evs)*b.N)/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(labels)/float64(b.N), "labels/run")
}
