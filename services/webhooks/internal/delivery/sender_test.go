package delivery

import (
	"encoding/json"
	"log/slog"
	"strings"
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

// TestEncodeBody: the body is the events as queued, and the webhook-id
// names that body for that endpoint: the same events give the same ID (a
// retry), other events between the same first and last (a replay's order)
// or another endpoint give another.
func TestEncodeBody(t *testing.T) {
	t.Parallel()
	ts := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a := redisstore.Event{ID: "e1", Type: "click", Time: ts, Data: json.RawMessage(`{"code":"a1"}`)}
	b := redisstore.Event{ID: "e2", Type: "fraud_alert", Time: ts, Data: json.RawMessage(`{"rule":"burst"}`)}
	c := redisstore.Event{ID: "e3", Type: "click", Time: ts, Data: json.RawMessage(`{"code":"c3"}`)}
	body, id, err := EncodeBody("ep_1", []redisstore.Event{a})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"events":[{"id":"e1","type":"click","timestamp":"2026-01-01T00:00:00Z","data":{"code":"a1"}}]}`
	if diff := cmp.Diff(want, string(body)); diff != "" {
		t.Errorf("body (-want +got):\n%s", diff)
	}
	if id != WebhookID("ep_1", body) || !strings.HasPrefix(id, "msg_") || len(id) != len("msg_")+32 {
		t.Errorf("webhook-id %q, want msg_ and 32 hex digits of the body's hash", id)
	}
	ids := map[string]string{}
	for name, tc := range map[string]struct {
		ep  string
		evs []redisstore.Event
	}{
		"a":            {"ep_1", []redisstore.Event{a}},
		"a,c":          {"ep_1", []redisstore.Event{a, c}},
		"a,b,c":        {"ep_1", []redisstore.Event{a, b, c}},
		"a,c,b":        {"ep_1", []redisstore.Event{a, c, b}},
		"a,c other ep": {"ep_2", []redisstore.Event{a, c}},
	} {
		_, id, err := EncodeBody(tc.ep, tc.evs)
		if err != nil {
			t.Fatal(err)
		}
		if _, again, _ := EncodeBody(tc.ep, tc.evs); again != id {
			t.Errorf("%s: webhook-id %q, then %q for the same batch", name, id, again)
		}
		if other, ok := ids[id]; ok {
			t.Errorf("webhook-id %q names %s and %s", id, other, name)
		}
		ids[id] = name
	}
}
