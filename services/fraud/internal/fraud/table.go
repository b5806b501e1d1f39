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
// A late click (an outbox backlog, a redrive) moves its key to the most
// recent end without moving its lastAt forward (lastAt never moves back).
// That key then expires after the keys touched before the late click, at
// most as long after its own time as it had been quiet when the click
// came, and the cap may evict one of those before it. This decides nothing
// differently that matters: a state kept past its expiry is judged as the
// same key's fresh one would be, up to remembering its last alert period and
// baseline (a flood threshold at least the floor), and the cap bounds the
// memory either way. Ordering by lastAt instead would cost a second lookup
// per click and table.
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

// get returns the state of k, creating it if absent, and marks it the most
// recently active.
func (t *table[K, V]) get(k K) *V { return t.getOwned(k, nil) }

// getOwned is get for a key that may share memory it must not keep (a
// string of a click decoded in place shares the whole message payload):
// a new entry is stored under own(k) (k itself when own is nil), so only a
// miss pays for a copy.
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
