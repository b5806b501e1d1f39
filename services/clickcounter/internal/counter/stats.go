package counter

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/snipdev/snip/pkg/events"
)

// Range bounds of a stats query.
const (
	MaxHours     = 48
	MaxDays      = 30
	MaxTop       = 100
	DefaultHours = 48
	DefaultDays  = 30
	DefaultTop   = 10
)

// Range says how much of a link's history a stats query returns.
type Range struct {
	// Hours is the length of the hourly series, ending with the current hour.
	Hours int
	// Days is the length of the daily series, ending today (UTC).
	Days int
	// Top is how many countries and referrers to list.
	Top int
}

// DefaultRange is the whole of what the counter keeps.
func DefaultRange() Range { return Range{Hours: DefaultHours, Days: DefaultDays, Top: DefaultTop} }

// Validate checks the range against what the counter keeps.
func (r Range) Validate() error {
	switch {
	case r.Hours < 1 || r.Hours > MaxHours:
		return fmt.Errorf("hours %d: want 1..%d: %w", r.Hours, MaxHours, ErrInvalidRange)
	case r.Days < 1 || r.Days > MaxDays:
		return fmt.Errorf("days %d: want 1..%d: %w", r.Days, MaxDays, ErrInvalidRange)
	case r.Top < 1 || r.Top > MaxTop:
		return fmt.Errorf("top %d: want 1..%d: %w", r.Top, MaxTop, ErrInvalidRange)
	}
	return nil
}

// Stats are one link's counts as the stats API returns them.
type Stats struct {
	Code  string `json:"code"`
	Owner string `json:"owner"`
	// Totals are all clicks counted, human and bot apart.
	Totals       Pair        `json:"totals"`
	Hourly       []HourStat  `json:"hourly"`
	Daily        []DayStat   `json:"daily"`
	TopCountries []Dimension `json:"top_countries"`
	TopReferrers []Dimension `json:"top_referrers"`
	AsOf         AsOf        `json:"as_of"`
}

// HourStat is one hour of the hourly series.
type HourStat struct {
	Hour time.Time `json:"hour"`
	Pair
}

// DayStat is one day of the daily series.
type DayStat struct {
	Day string `json:"day"`
	Pair
	// Uniques is the estimated number of distinct visitors among the day's
	// clicks the redirect did not flag as bots (a HyperLogLog, ±0.81%). It
	// can exceed Human: a fraud verdict moves a click from human to bot, but
	// the estimate cannot forget the visitor it already saw.
	Uniques int64 `json:"uniques"`
}

// Dimension is one country or referrer host with its counts.
type Dimension struct {
	Name string `json:"name"`
	Pair
}

// AsOf says how fresh the numbers are: the counter's position in the
// link's CLICKS partition.
type AsOf struct {
	Partition int `json:"partition"`
	// Seq is the last CLICKS sequence the numbers include.
	Seq uint64 `json:"seq"`
	// Stored is when that event was stored; zero if none was counted.
	Stored     *time.Time `json:"stored,omitempty"`
	Generation int64      `json:"generation"`
	// Recount is set while a recount runs: these numbers are the previous
	// generation's, frozen, until the new one catches up.
	Recount *Recount `json:"recount,omitempty"`
}

// Recount is the progress of a running recount.
type Recount struct {
	Generation int64  `json:"generation"`
	Seq        uint64 `json:"seq"`
	Until      uint64 `json:"until"`
}

// LinkStats returns the stats of the link code for the owner asking.
// It returns ErrLinkNotFound for codes that do not exist, were deleted, or
// belong to another owner, and ErrInvalidRange for a bad range.
func (c *Counter) LinkStats(ctx context.Context, owner, code string, r Range) (*Stats, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	if !events.ValidToken(code) {
		return nil, fmt.Errorf("link %q: %w", code, ErrLinkNotFound)
	}
	info, known, err := c.store.Link(ctx, code)
	if err != nil {
		return nil, fmt.Errorf("link stats %q: %w", code, err)
	}
	if known && (info.Deleted || info.Owner != owner) {
		return nil, fmt.Errorf("link %q: %w", code, ErrLinkNotFound)
	}
	now := c.now().UTC()
	hourNow := now.Truncate(time.Hour)
	today := DayOf(now)
	want := map[Day]bool{}
	for i := range r.Days {
		want[today-Day(i)] = true
	}
	for i := range r.Hours {
		want[DayOf(hourNow.Add(-time.Duration(i)*time.Hour))] = true
	}
	days := make([]Day, 0, len(want))
	for d := range want {
		days = append(days, d)
	}
	sort.Slice(days, func(i, j int) bool { return days[i] < days[j] })

	p := events.Partition(code, c.n)
	ref := LinkRef{Owner: owner, Code: code}
	snap, err := c.store.ReadStats(ctx, p, ref, days)
	if err != nil {
		return nil, fmt.Errorf("link stats %q: %w", code, err)
	}
	// A link LINKS has not told us about yet (its consumer lags) is still
	// served if this owner's clicks on it were counted.
	if !known && !snap.Exists {
		return nil, fmt.Errorf("link %q: %w", code, ErrLinkNotFound)
	}
	s := &Stats{
		Code: code, Owner: owner, Totals: snap.Total,
		Hourly:       make([]HourStat, 0, r.Hours),
		Daily:        make([]DayStat, 0, r.Days),
		TopCountries: top(snap.Countries, r.Top),
		TopReferrers: top(snap.Referrers, r.Top),
		AsOf:         AsOf{Partition: p, Seq: snap.Read.Seq, Generation: snap.State.Read},
	}
	if !snap.Read.Stored.IsZero() {
		t := snap.Read.Stored
		s.AsOf.Stored = &t
	}
	if snap.State.Recounting() {
		s.AsOf.Recount = &Recount{Generation: snap.State.Write, Seq: snap.Write.Seq, Until: snap.State.Until}
	}
	for i := r.Hours - 1; i >= 0; i-- {
		h := hourNow.Add(-time.Duration(i) * time.Hour)
		s.Hourly = append(s.Hourly, HourStat{Hour: h, Pair: snap.Days[DayOf(h)].Hours[h.Hour()]})
	}
	for i := r.Days - 1; i >= 0; i-- {
		d := today - Day(i)
		dc := snap.Days[d]
		s.Daily = append(s.Daily, DayStat{Day: d.String(), Pair: dc.Total, Uniques: dc.Uniques})
	}
	return s, nil
}

// top ranks dimension values by human clicks, then bot clicks, then name.
func top(m map[string]Pair, n int) []Dimension {
	out := make([]Dimension, 0, len(m))
	for k, p := range m {
		if p.Human == 0 && p.Bot == 0 {
			continue
		}
		out = append(out, Dimension{Name: k, Pair: p})
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Human != b.Human {
			return a.Human > b.Human
		}
		if a.Bot != b.Bot {
			return a.Bot > b.Bot
		}
		return a.Name < b.Name
	})
	if len(out) > n {
		out = out[:n]
	}
	return out
}

// DayKeep is how long a link's per-day counts (with their hours and unique
// visitors) are kept after the day ends: the daily series' MaxDays, and a
// little more so the oldest day shown is always complete.
const DayKeep = (MaxDays + 2) * 24 * time.Hour
