package delivery

import (
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/snipdev/snip/services/webhooks/internal/redisstore"
)

func TestNextDelay(t *testing.T) {
	t.Parallel()
	s := &Sender{cfg: SenderConfig{Schedule: []time.Duration{time.Second, 10 * time.Second, time.Minute}, Jitter: 0.2}, log: slog.New(slog.DiscardHandler)}
	tests := []struct {
		name       string
		attempt    int
		retryAfter time.Duration
		lo, hi     time.Duration
	}{
		{"first_retry", 1, 0, 800 * time.Millisecond, 1200 * time.Millisecond},
		{"second_retry", 2, 0, 8 * time.Second, 12 * time.Second},
		{"last_wait_repeats", 9, 0, 48 * time.Second, 72 * time.Second},
		{"retry_after_wins", 1, 30 * time.Second, 30 * time.Second, 30 * time.Second},
		{"retry_after_capped_at_the_longest_wait", 1, 5 * time.Hour, time.Minute, time.Minute},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for range 100 {
				if d := s.nextDelay(tc.attempt, tc.retryAfter); d < tc.lo || d > tc.hi {
					t.Fatalf("nextDelay(%d, %s) = %s, want in [%s, %s]", tc.attempt, tc.retryAfter, d, tc.lo, tc.hi)
				}
			}
		})
	}
}

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
		{"garbage", "soon", 0},
		{"absent", "", 0},
	}
	for _, tc := range tests {
		if got := retryAfter(tc.v, now); got != tc.want {
			t.Errorf("%s: retryAfter(%q) = %s, want %s", tc.name, tc.v, got, tc.want)
		}
	}
}

func TestEncodeBody(t *testing.T) {
	t.Parallel()
	ts := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a := redisstore.Event{ID: "e1", Type: "click", Time: ts, Data: json.RawMessage(`{"code":"a1"}`)}
	b := redisstore.Event{ID: "e2", Type: "fraud_alert", Time: ts, Data: json.RawMessage(`{"rule":"burst"}`)}
	body, id, err := EncodeBody([]redisstore.Event{a})
	if err != nil {
		t.Fatal(err)
	}
	if id != "e1" {
		t.Errorf("one event's webhook-id %q, want the event ID", id)
	}
	want := `{"events":[{"id":"e1","type":"click","timestamp":"2026-01-01T00:00:00Z","data":{"code":"a1"}}]}`
	if diff := cmp.Diff(want, string(body)); diff != "" {
		t.Errorf("body (-want +got):\n%s", diff)
	}
	if _, id, _ := EncodeBody([]redisstore.Event{a, b}); id != "batch_e1_e2" {
		t.Errorf("batch webhook-id %q, want batch_e1_e2", id)
	}
}
