package failure_test

import (
	"math"
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/failure"
)

func TestRetryAfterHeader(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name, v string
		want    time.Duration
	}{
		{"seconds", "120", 2 * time.Minute},
		{"http_date", "Thu, 01 Jan 2026 00:00:30 GMT", 30 * time.Second},
		{"past_date", "Wed, 31 Dec 2025 23:00:00 GMT", 0},
		{"negative", "-5", 0},
		// More seconds than a time.Duration holds: multiplied by a second
		// they wrapped around, here to 290ms, and the webhooks sender tried
		// again that soon instead of after the schedule's longest wait.
		{"seconds_beyond_a_duration", "18446744074", math.MaxInt64 / time.Second * time.Second},
		{"seconds_beyond_int64", "99999999999999999999", math.MaxInt64 / time.Second * time.Second},
		{"negative_beyond_int64", "-99999999999999999999", 0},
		{"garbage", "soon", 0},
		{"absent", "", 0},
	}
	for _, tc := range tests {
		if got := failure.RetryAfterHeader(tc.v, now); got != tc.want {
			t.Errorf("%s: RetryAfterHeader(%q) = %s, want %s", tc.name, tc.v, got, tc.want)
		}
	}
}
