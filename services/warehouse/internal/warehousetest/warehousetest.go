// Package warehousetest builds the click events and the expected numbers the
// warehouse's tests compare ClickHouse with. It is test support: only
// _test.go files import it.
package warehousetest

import (
	"fmt"
	"sort"
	"time"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
)

// Partitions is the CLICKS partition count the tests use.
const Partitions = 8

// Click returns a valid click of owner/code at t, with a fresh event ID.
// Everything else is derived from i, so a set of clicks has a known mix of
// visitors, bots and countries.
func Click(i int, owner, code string, t time.Time) events.Click {
	countries := []string{"DE", "US", "", "FR"}
	return events.Click{
		V:         events.ClickVersion,
		ID:        events.NewID(),
		Time:      t.UTC(),
		Code:      code,
		Owner:     owner,
		Target:    "https://example.com/" + code,
		IPPrefix:  fmt.Sprintf("203.0.%d.0/24", i%200),
		Visitor:   fmt.Sprintf("visitor-%02d", i%23),
		UserAgent: "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36",
		Referrer:  "https://news.example.org/",
		Country:   countries[i%len(countries)],
		RequestID: fmt.Sprintf("req-%d", i),
		Bot:       i%7 == 3,
	}
}

// Clicks returns n clicks spread over owners "acme" and "globex", ten links
// each, with times from start every step.
func Clicks(n int, start time.Time, step time.Duration) []events.Click {
	out := make([]events.Click, n)
	for i := range out {
		owner := []string{"acme", "globex"}[i%2]
		code := fmt.Sprintf("%s-l%d", owner[:1], (i/2)%10)
		out[i] = Click(i, owner, code, start.Add(time.Duration(i)*step))
	}
	return out
}

// Events wraps clicks as the reader runtime would hand them out: partition by
// link code, sequences from 1, stored at stored.
func Events(clicks []events.Click, stored time.Time) []reader.Event {
	out := make([]reader.Event, len(clicks))
	for i, c := range clicks {
		out[i] = reader.Event{
			Click:      c,
			Partition:  events.Partition(c.Code, Partitions),
			Seq:        uint64(i + 1),
			Stored:     stored,
			Deliveries: 1,
		}
	}
	return out
}

// ByPartition splits events by partition, keeping their order.
func ByPartition(evs []reader.Event) map[int][]reader.Event {
	out := map[int][]reader.Event{}
	for _, e := range evs {
		out[e.Partition] = append(out[e.Partition], e)
	}
	return out
}

// Hour is the expected rollup of one link in one hour.
type Hour struct {
	Owner, Code string
	Hour        time.Time
	Clicks      uint64
	BotClicks   uint64
	Visitors    uint64
}

// Hours computes, in Go, what the hourly rollup must say about clicks:
// distinct event IDs per (owner, code, hour), so duplicates in clicks do not
// count. Sorted by owner, code, hour.
func Hours(clicks []events.Click) []Hour {
	type key struct {
		owner, code string
		hour        time.Time
	}
	ids := map[key]map[string]bool{}
	bots := map[key]map[string]bool{}
	visitors := map[key]map[string]bool{}
	for _, c := range clicks {
		k := key{c.Owner, c.Code, c.Time.UTC().Truncate(time.Hour)}
		if ids[k] == nil {
			ids[k], bots[k], visitors[k] = map[string]bool{}, map[string]bool{}, map[string]bool{}
		}
		ids[k][c.ID] = true
		visitors[k][c.Visitor] = true
		if c.Bot {
			bots[k][c.ID] = true
		}
	}
	out := make([]Hour, 0, len(ids))
	for k := range ids {
		out = append(out, Hour{
			Owner: k.owner, Code: k.code, Hour: k.hour,
			Clicks: uint64(len(ids[k])), BotClicks: uint64(len(bots[k])), Visitors: uint64(len(visitors[k])),
		})
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Owner != b.Owner {
			return a.Owner < b.Owner
		}
		if a.Code != b.Code {
			return a.Code < b.Code
		}
		return a.Hour.Before(b.Hour)
	})
	return out
}

// Distinct counts the distinct event IDs among clicks.
func Distinct(clicks []events.Click) int {
	seen := map[string]bool{}
	for _, c := range clicks {
		seen[c.ID] = true
	}
	return len(seen)
}

// ClicksOf returns the clicks of evs.
func ClicksOf(evs []reader.Event) []events.Click {
	out := make([]events.Click, len(evs))
	for i, e := range evs {
		out[i] = e.Click
	}
	return out
}
