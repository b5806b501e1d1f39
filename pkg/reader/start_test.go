package reader_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
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

// A group's Metadata is recorded on each consumer a member creates, and like
// Start it never changes one that exists: it is where a reader notes what
// its next start must know about how the group was made. The runtime's own
// keys are not overwritten.
func TestMetadataIsRecordedOnTheConsumersAMemberCreates(t *testing.T) {
	t.Parallel()
	const group = "g"
	n, js := setup(t, 2)
	s, err := js.Stream(t.Context(), events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	// Partition 0's consumer exists already, made without the note.
	if _, err := s.CreateConsumer(t.Context(), topology.GroupConsumerConfig(group, 0, topology.GroupConsumer{
		AckWait: time.Minute, PinnedTTL: time.Second, MaxAckPending: 1000, DeliverPolicy: jetstream.DeliverAllPolicy,
	})); err != nil {
		t.Fatal(err)
	}
	startMember(t, n, reader.Config{Group: group, Member: "m",
		Metadata: map[string]string{"note": "made-by-test", "snip.group": "other"}},
		func(context.Context, int, []reader.Event) error { return nil })

	metadata := func(p int) map[string]string {
		c, err := s.Consumer(t.Context(), topology.GroupConsumerName(group, p))
		if err != nil {
			return nil
		}
		return c.CachedInfo().Config.Metadata
	}
	testenv.WaitFor(t, 30*time.Second, "partition 1's consumer", func() bool { return metadata(1) != nil })
	tests := []struct {
		name      string
		partition int
		want      map[string]string
	}{
		{"created_consumer_carries_the_note", 1, map[string]string{"note": "made-by-test", "snip.group": group, "snip.partition": "1"}},
		{"existing_consumer_is_left_as_it_was", 0, map[string]string{"snip.group": group, "snip.partition": "0"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := map[string]string{}
			for k, v := range metadata(tc.partition) {
				if !strings.HasPrefix(k, "_nats.") { // the server's own
					got[k] = v
				}
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("metadata of partition %d's consumer (-want +got):\n%s", tc.partition, d)
			}
		})
	}
}
