package fraud

import (
	"cmp"
	"encoding/hex"
	"slices"
	"time"

	"github.com/snipdev/snip/pkg/reader"
)

// The per-click rules alert once more than LabelAlertThreshold clicks were
// labelled in an alert period (an hour by default), far longer than the
// Memory a rebuild reads back from the log (ten minutes). Their counters
// are therefore kept in the store too: each batch's write carries the
// counters the batch changed, as of the batch's last event, next to the
// partition's high-water mark, and a rebuilt state takes them back from
// the store (RestoreCounts) before it judges the first event after that
// mark. Replaying the log for an hour at takeover would take minutes on a
// busy partition; reading one hash takes one round trip.

// Count is one label counter as the store keeps it: how many clicks one
// per-click rule labelled on one link with one key in one alert period.
type Count struct {
	// Period is the start of the counter's alert period.
	Period time.Time
	// Key names the rule, link and key (a digest, in hex).
	Key string
	// N is the count; 0 for a counter the state no longer holds (evicted by
	// the cap).
	N int
	// LastAt is the event time of the counter's latest click.
	LastAt time.Time
	// Mark is the partition's high-water mark when the store wrote the
	// counter: of two values of one counter the later write is the one the
	// state had last.
	Mark uint64
}

// Counts appends to dst the label counters judged since the last
// CountsStored, as they are now, in key order.
func (p *Partition) Counts(dst []Count) []Count {
	ap := int64(p.d.rules.AlertPeriod)
	start := len(dst)
	for k, period := range p.touched {
		c := Count{Key: hex.EncodeToString(k[:])}
		if lc, ok := p.counts.peek(k); ok {
			period = lc.period
			c.N, c.LastAt = lc.count, time.Unix(0, lc.lastAt)
		}
		c.Period = time.Unix(0, (period-1)*ap)
		dst = append(dst, c)
	}
	slices.SortFunc(dst[start:], func(a, b Count) int { return cmp.Compare(a.Key, b.Key) })
	return dst
}

// CountsStored says the store has the counters Counts returned.
func (p *Partition) CountsStored() { clear(p.touched) }

// CountPeriods returns the starts of the alert periods whose stored counters
// RestoreCounts needs before the state judges next: the period of the
// state's clock after next, and the one before (a click whose time is
// slightly behind the clock still counts in it).
func (p *Partition) CountPeriods(next reader.Event) []time.Time {
	ap := int64(p.d.rules.AlertPeriod)
	cur := max(p.clock, p.eventTime(next).UnixNano()) / ap
	return []time.Time{time.Unix(0, (cur-1)*ap), time.Unix(0, cur*ap)}
}

// RestoreCounts sets the label counters from the store's, as of the
// partition's high-water mark, which must be the last event the state was
// fed or judged: the stored counts include the events the rebuild replayed,
// so they replace what the replay counted, never add to it. A counter past
// LabelAlertThreshold is marked alerted (its alert was raised when it
// crossed). Counters the state has of a later period than the store's, or
// that the store does not have, are left as they are; stored ones that
// expired at the state's clock are dropped.
func (p *Partition) RestoreCounts(cs []Count) {
	r := &p.d.rules
	ap := int64(r.AlertPeriod)
	latest := make(map[stateKey]Count, len(cs))
	for _, c := range cs {
		var k stateKey
		if n, err := hex.Decode(k[:], []byte(c.Key)); err != nil || n != len(k) {
			continue
		}
		if prev, ok := latest[k]; ok && prev.Mark >= c.Mark {
			continue
		}
		latest[k] = c
	}
	set := func(lc *labelCount, c Count) {
		period := c.Period.UnixNano() / ap
		if lc.period > period+1 {
			return // the state has a later period
		}
		lc.period, lc.count, lc.lastAt, lc.alertedIn = period+1, c.N, c.LastAt.UnixNano(), 0
		if c.N > r.LabelAlertThreshold {
			lc.alertedIn = period + 1
		}
	}
	// Counters the state does not hold go in by their last click, among
	// those it does (kept in their order): the table stays ordered by
	// activity, for its expiry and its cap.
	type entry struct {
		k  stateKey
		lc *labelCount
	}
	old := p.counts
	var added []entry
	cutoff := p.clock - ap
	for k, c := range latest {
		if _, ok := old.peek(k); ok || c.N == 0 || c.LastAt.UnixNano() < cutoff {
			continue
		}
		lc := new(labelCount)
		set(lc, c)
		added = append(added, entry{k, lc})
	}
	slices.SortFunc(added, func(a, b entry) int { return cmp.Compare(a.lc.lastAt, b.lc.lastAt) })
	next := newTable[stateKey](old.capacity, old.lastAt)
	next.evicted, next.expired = old.evicted, old.expired
	add := func(e entry) {
		if next.lru.Add(e.k, e.lc) {
			next.evicted++
		}
	}
	i := 0
	for _, k := range old.lru.Keys() {
		lc, _ := old.peek(k)
		if c, ok := latest[k]; ok {
			set(lc, c)
		}
		for i < len(added) && added[i].lc.lastAt <= lc.lastAt {
			add(added[i])
			i++
		}
		add(entry{k, lc})
	}
	for ; i < len(added); i++ {
		add(added[i])
	}
	p.counts = next
}
