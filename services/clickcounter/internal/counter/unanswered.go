package counter

import (
	"math/rand/v2"
	"strconv"
)

// A write whose answer is lost (a timeout after Redis ran the script, a
// connection cut) may have landed or not; the counter cannot know until
// it reads the partition's state again. Every write carries a token,
// which the batch script records beside the watermark it moves (one more
// field in the HSET it makes anyway: no other command, no round trip). The
// counter keeps, per partition, its last write whose answer was lost,
// with what that write would have added to the metrics; the next time it
// reads the partition's state (before its next write, which it makes
// only after reading the state again; or when it takes the partition
// back), it settles it: its token beside the watermark means the write
// landed, and nothing has moved the watermark since, so no member has
// counted its events in the metrics: this member counts them, once. Any
// other token (or none) means it did not land, or landed and another write
// came after it, a member that took the partition over meanwhile, which
// cannot tell either; it is dropped uncounted rather than risk counting
// it twice.

// unanswered is a write of a partition whose answer was lost, and what it
// adds to the metrics if it landed.
type unanswered struct {
	token string
	// expect is the state the write was made against.
	expect       State
	human, bot   int
	dupWM, dupID int
	// missed is how many of its events the store had lost (countMissed).
	missed int
}

// newToken returns a write's token: 64 random bits, which no other write
// of any member draws in practice.
func newToken() string { return strconv.FormatUint(rand.Uint64(), 36) }

// lostAnswer records that partition p's write u (its token, and what it
// adds to the metrics if it landed) was not answered. It replaces any
// earlier one: the counter reads the state again before its next write
// (hasUnanswered), which settles it.
func (c *Counter) lostAnswer(p int, u unanswered) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.unanswered[p] = u
}

// hasUnanswered reports whether partition p has a write whose answer was
// lost and which no state read since has settled.
func (c *Counter) hasUnanswered(p int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.unanswered[p]
	return ok
}

// settle settles partition p's write whose answer was lost, if any,
// against the state st just read from the store: if its token is beside
// the watermark, the write landed and is counted in the metrics now (and
// the switch of a recount it made). It reports whether that write switched
// a recount. The caller holds no lock.
func (c *Counter) settle(p int, st State) (switched bool) {
	c.mu.Lock()
	u, ok := c.unanswered[p]
	delete(c.unanswered, p)
	c.mu.Unlock()
	if !ok || st.Token != u.token || st.Write != u.expect.Write {
		return false
	}
	c.m.duplicates.WithLabelValues("watermark").Add(float64(u.dupWM))
	c.m.duplicates.WithLabelValues("event_id").Add(float64(u.dupID))
	c.m.counted.WithLabelValues(Human.String()).Add(float64(u.human))
	c.m.counted.WithLabelValues(Bot.String()).Add(float64(u.bot))
	c.m.missed.WithLabelValues("read").Add(float64(u.missed))
	// Nothing moved the watermark after this write, and the write moved it
	// from where the recount was running: if the reads are on the write
	// generation now, this write switched them.
	if !u.expect.Recounting() || st.Read != u.expect.Write {
		return false
	}
	c.log.Info("recount caught up; the new generation now serves reads (the switching write's answer was lost, found landed when the partition's state was read again)",
		"partition", p, "generation", st.Write, "previous", u.expect.Read, "seq", st.WM)
	c.m.recounts.WithLabelValues("finished").Inc()
	c.requestCleanup(p)
	return true
}
