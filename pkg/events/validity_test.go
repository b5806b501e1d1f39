package events_test

import (
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/snipdev/snip/pkg/events"
)

// idAt returns a UUIDv7 whose time is t.
func idAt(t time.Time) string {
	u := uuid.Must(uuid.NewV7())
	ms := uint64(t.UnixMilli())
	for i := range 6 {
		u[i] = byte(ms >> (40 - 8*i))
	}
	return u.String()
}

func TestReadClickIsTheOneRuleOfValidity(t *testing.T) {
	t.Parallel()
	const n = 8
	stored := time.Date(2026, 11, 30, 12, 0, 5, 0, time.UTC)
	base := validClick()
	base.ID = idAt(base.Time)
	stor := func(owner, code string) string {
		return strconv.Itoa(events.Partition(code, n)) + ".clicks." + owner + "." + code
	}
	other := strconv.Itoa((events.Partition(base.Code, n) + 1) % n)
	tests := []struct {
		name    string
		mutate  func(c *events.Click)
		subject string
		at      time.Time
		want    string // "" valid, else the reason
	}{
		{name: "valid_stored_click", subject: stor("acme", "abc123")},
		{name: "valid_click_at_the_relay", subject: "clicks.acme.abc123"},
		{name: "held_in_the_outbox_for_hours_is_valid", subject: stor("acme", "abc123"), at: stored.Add(6 * time.Hour)},
		{name: "unknown_version", mutate: func(c *events.Click) { c.V = 2 }, subject: stor("acme", "abc123"), want: events.ReasonUnknownVersion},
		{name: "missing_required_field", mutate: func(c *events.Click) { c.Owner = "" }, subject: stor("acme", "abc123"), want: events.ReasonMalformed},
		{name: "payload_code_hashes_to_another_partition", subject: other + ".clicks.acme.abc123", want: events.ReasonWrongPartition},
		{name: "subject_code_differs_from_payload", subject: stor("acme", "zzz"), want: events.ReasonSubjectMismatch},
		{name: "subject_owner_differs_from_payload", subject: stor("other", "abc123"), want: events.ReasonSubjectMismatch},
		{name: "relay_subject_owner_differs", subject: "clicks.other.abc123", want: events.ReasonSubjectMismatch},
		{name: "not_a_click_subject", subject: "links.created.abc123", want: events.ReasonSubjectMismatch},
		{name: "non_numeric_partition", subject: "x.clicks.acme.abc123", want: events.ReasonSubjectMismatch},
		{name: "click_dated_1999", mutate: func(c *events.Click) { c.Time = time.Date(1999, 1, 1, 0, 0, 0, 0, time.UTC) },
			subject: stor("acme", "abc123"), want: events.ReasonImplausibleTime},
		{name: "click_a_year_ahead", mutate: func(c *events.Click) { c.Time = stored.AddDate(1, 0, 0) },
			subject: stor("acme", "abc123"), want: events.ReasonImplausibleTime},
		{name: "event_id_dated_1999", mutate: func(c *events.Click) { c.ID = idAt(time.Date(1999, 1, 1, 0, 0, 0, 0, time.UTC)) },
			subject: stor("acme", "abc123"), want: events.ReasonImplausibleTime},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := base
			if tc.mutate != nil {
				tc.mutate(&c)
			}
			at := stored
			if !tc.at.IsZero() {
				at = tc.at
			}
			data, err := json.Marshal(c)
			if err != nil {
				t.Fatal(err)
			}
			got, err := events.ReadClick(data, tc.subject, n, at)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("ReadClick: %v, want valid", err)
				}
				if got.ID != c.ID {
					t.Fatalf("ReadClick returned %s, want %s", got.ID, c.ID)
				}
				return
			}
			if err == nil {
				t.Fatalf("ReadClick accepted it, want %s", tc.want)
			}
			if r := events.Reason(err); r != tc.want {
				t.Fatalf("reason %q (%v), want %q", r, err, tc.want)
			}
		})
	}
}
