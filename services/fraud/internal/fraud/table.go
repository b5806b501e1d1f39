package fraud

import (
	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// table is a capped map of per-key state with least-recently-active
// eviction and time expiry. Keys are touched in stream order, so the least
// recently used entry is the one whose last click is oldest, but for late
// clicks: expiry pops from that end until it meets a live entry, and
// eviction by the cap takes the quietest key, never one in the middle of a
// burst (a bursting key is by definition recently active).
//
// A late click (an outbox backlog, a redrive: it came late and is behind
// the partition's clock) older than its key's newest leaves the key where
// it is (getAt): moved to the most recent end without its lastAt moving,
// the key expired only after the keys touched before the late click (up to
// a window late), the cap evicting one of those first. Only such a click
// pays a second lookup (a peek first); a click on time, the rule, looks
// its key up once. A click on time a few milliseconds older than its key's
// newest (redirects' clocks and relays interleave) still moves it, holding
// its expiry back by those milliseconds.
type table[K comparable, V any] struct {
	lru      *simplelru.LRU[K, *V]
	lastAt   func(*V) int64
	evicted  uint64 // entries pushed out by the cap
	expired  uint64 // entries dropped because their windows ran out
	capacity int
}

func newTable[K comparable, V any](capacity int, lastAt func(*V) int64) *table[K, V] {
	lru, err := simplelru.NewLRU[K, *V](capacity, nil)
	if err != nil {
		// NewLRU fails only for a size < 1, which Rules.Validate refuses.
		panic("fraud: " + err.Error())
	}
	return &table[K, V]{lru: lru, lastAt: lastAt, capacity: capacity}
}

// getOwned returns the state of k, creating it if absent, and marks it
// the most recently active. k may share memory it must not keep (a string
// of a click decoded in place shares the whole message payload): a new
// entry is stored under own(k) (k itself when own is nil), so only a miss
// pays for a copy.
func (t *table[K, V]) getOwned(k K, own func(K) K) *V {
	if v, ok := t.lru.Get(k); ok {
		return v
	}
	if own != nil {
		k = own(k)
	}
	v := new(V)
	if t.lru.Add(k, v) {
		t.evicted++
	}
	return v
}

// getAt is getOwned for a click at event time at. One that came late
// (late: an outbox backlog, a redrive, behind the partition's clock) and
// is older than the key's newest click leaves the key where it is in the
// order: its lastAt does not move, so neither does its place among the
// keys expiry pops. Only a late click pays the peek.
func (t *table[K, V]) getAt(k K, own func(K) K, at int64, late bool) *V {
	if late {
		if v, ok := t.lru.Peek(k); ok && t.lastAt(v) > at {
			return v
		}
	}
	return t.getOwned(k, own)
}

// peek returns the state of k without marking it active.
func (t *table[K, V]) peek(k K) (*V, bool) { return t.lru.Peek(k) }

// expire drops the entries whose last activity is before cutoff.
func (t *table[K, V]) expire(cutoff int64) {
	for {
		_, v, ok := t.lru.GetOldest()
		if !ok || t.lastAt(v) >= cutoff {
			return
		}
		t.lru.RemoveOldest()
		t.expired++
	}
}

func (t *table[K, V]) len() int { return t.lru.Len() }
