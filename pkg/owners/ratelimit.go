package owners

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Limit allows an owner Max calls of one action per Window, counted in Redis
// so that every instance of a service shares the count. Counting is by owner,
// over all of its keys: rotating a key does not reset it.
//
// The window is fixed (it starts at multiples of Window), so an owner can
// make up to 2*Max calls across a window boundary; what it cannot do is keep
// up more than Max per Window.
type Limit struct {
	rdb    redis.UniversalClient
	action string
	Max    int
	Window time.Duration
}

// NewLimit counts action (e.g. "links.create") for each owner; max <= 0
// means no limit.
func NewLimit(rdb redis.UniversalClient, action string, max int, window time.Duration) *Limit {
	return &Limit{rdb: rdb, action: action, Max: max, Window: window}
}

// incrWithExpiry counts one call in the window's key and sets its expiry on
// the first.
var incrWithExpiry = redis.NewScript(`
local n = redis.call("INCR", KEYS[1])
if n == 1 then redis.call("PEXPIRE", KEYS[1], ARGV[1]) end
return n`)

// Allow counts one call of the owner at now. When the owner is over its
// limit it returns false and how long until the window ends (Retry-After).
func (l *Limit) Allow(ctx context.Context, owner string, now time.Time) (bool, time.Duration, error) {
	if l == nil || l.Max <= 0 || l.Window <= 0 {
		return true, 0, nil
	}
	start := now.Truncate(l.Window)
	key := fmt.Sprintf("snip:ratelimit:%s:%s:%d", l.action, owner, start.UnixMilli())
	n, err := incrWithExpiry.Run(ctx, l.rdb, []string{key}, (l.Window + time.Second).Milliseconds()).Int64()
	if err != nil {
		return false, 0, fmt.Errorf("rate limit %s: %w", l.action, err)
	}
	if n > int64(l.Max) {
		return false, start.Add(l.Window).Sub(now), nil
	}
	return true, 0, nil
}
