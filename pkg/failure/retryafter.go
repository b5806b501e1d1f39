package failure

import (
	"errors"
	"math"
	"net/http"
	"strconv"
	"time"
)

// maxRetryAfterSeconds is the most seconds a time.Duration holds.
const maxRetryAfterSeconds = int64(math.MaxInt64 / time.Second)

// RetryAfterHeader is the delay an HTTP Retry-After header asks for at now:
// delay seconds or an HTTP date; 0 for none, a date past, or garbage. More
// seconds than a time.Duration holds (the other side's garbage) are the
// longest delay, which the caller caps: multiplied by a second they would
// wrap around, to a negative delay or to a short one. The preview worker's
// fetch and the webhooks sender read their receivers' answers with it.
func RetryAfterHeader(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil || errors.Is(err, strconv.ErrRange) {
		switch {
		case s < 0:
			return 0
		case s > maxRetryAfterSeconds:
			s = maxRetryAfterSeconds
		}
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}
