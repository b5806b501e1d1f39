package outbox

import (
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestLate: the one rule the relay and the redirect both apply to an entry's
// stream ID (Redis's clock) and validity (the writer's clock).
func TestLate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		streamID string
		until    int64
		want     bool
	}{
		{name: "stored_before_its_validity_is_relayed", streamID: "1700000000999-0", until: 1700000001000, want: false},
		{name: "stored_at_its_validity_is_relayed", streamID: "1700000001000-7", until: 1700000001000, want: false},
		{name: "stored_a_millisecond_late_is_dropped", streamID: "1700000001001-0", until: 1700000001000, want: true},
		{name: "no_validity_is_never_late", streamID: "1800000000000-0", until: 0, want: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e, err := parseEntry(redis.XMessage{ID: tc.streamID, Values: map[string]any{
				fieldID: "0190f5e2-0000-7000-8000-000000000000", fieldSubject: "clicks.acme.abc", fieldData: "{}",
			}})
			if err != nil {
				t.Fatal(err)
			}
			e.Until = tc.until
			if got := e.late(); got != tc.want {
				t.Fatalf("late(%s, until %d) = %v, want %v", tc.streamID, tc.until, got, tc.want)
			}
		})
	}
}

// TestEntryWithMalformedValidityIsParked: an until field that is not a
// positive number makes the entry malformed (parked, never published as if
// it had no validity).
func TestEntryWithMalformedValidityIsParked(t *testing.T) {
	t.Parallel()
	for _, until := range []string{"", "soon", "-5", "0"} {
		_, err := parseEntry(redis.XMessage{ID: "1-0", Values: map[string]any{
			fieldID: "x", fieldSubject: "clicks.acme.abc", fieldData: "{}", fieldUntil: until,
		}})
		if err == nil {
			t.Fatalf("until %q parsed without error", until)
		}
	}
}
