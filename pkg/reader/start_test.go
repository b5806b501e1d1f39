package reader_test

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/reader"
)

// TestParseStart: one way to say where a new group starts, in code or in
// configuration, for every reader; each Start reads back as it was written
// and becomes the consumers' deliver policy.
func TestParseStart(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 6, 0, 0, 0, time.UTC)
	at := time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name       string
		in         string
		wantPolicy jetstream.DeliverPolicy
		wantFrom   time.Time // zero: no start time
	}{
		{"oldest", "oldest", jetstream.DeliverAllPolicy, time.Time{}},
		{"new", "new", jetstream.DeliverNewPolicy, time.Time{}},
		{"last_three_days", "72h0m0s", jetstream.DeliverByStartTimePolicy, now.Add(-72 * time.Hour)},
		{"a_time", at.Format(time.RFC3339Nano), jetstream.DeliverByStartTimePolicy, at},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, err := reader.ParseStart(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if got := s.String(); got != tc.in {
				t.Errorf("String() = %q, want %q", got, tc.in)
			}
			var u reader.Start
			if err := u.UnmarshalText([]byte(tc.in)); err != nil || u != s {
				t.Errorf("UnmarshalText = %v, %v; want %v", u, err, s)
			}
			policy, from := reader.DeliverFrom(reader.Config{Group: "g", Start: s}, now)
			if policy != tc.wantPolicy {
				t.Errorf("deliver policy %v, want %v", policy, tc.wantPolicy)
			}
			switch {
			case tc.wantFrom.IsZero() && from != nil:
				t.Errorf("start time %v, want none", *from)
			case !tc.wantFrom.IsZero() && (from == nil || !from.Equal(tc.wantFrom)):
				t.Errorf("start time %v, want %v", from, tc.wantFrom)
			}
		})
	}
}

func TestParseStartRefusesNonsense(t *testing.T) {
	t.Parallel()
	for _, in := range []string{"", "yesterday", "-1h", "0s", "OLDEST"} {
		if _, err := reader.ParseStart(in); !errors.Is(err, reader.ErrBadConfig) {
			t.Errorf("ParseStart(%q) = %v, want ErrBadConfig", in, err)
		}
	}
}
