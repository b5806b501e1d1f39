package visitor

import "time"

// ParseIsBot is IsBot without its memo, for tests and benchmarks.
var ParseIsBot = parseIsBot

// AheadDay is the day whose salt the identifier fetched ahead (0 if none),
// as a time at its midnight UTC.
func (id *Identifier) AheadDay() time.Time {
	ds := id.next.Load()
	if ds == nil {
		return time.Time{}
	}
	return time.Unix(ds.day*86400, 0).UTC()
}
