package counter_test

import (
	"errors"
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/services/clickcounter/internal/counter"
)

func linkEvent(kind events.LinkEventKind, owner, code string) *events.LinkEvent {
	return &events.LinkEvent{V: events.LinkVersion, ID: events.NewID(), Kind: kind, Time: time.Now(), Code: code, Owner: owner, Target: "https://example.com/"}
}

func TestLinkStatsAnswersOnlyTheOwner(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := t.Context()
	now := time.Now()
	var s seqs
	created, deleted, lagging, recreated := codeIn(t, 0, 30), codeIn(t, 1, 31), codeIn(t, 2, 32), codeIn(t, 3, 33)
	for i, le := range []*events.LinkEvent{
		linkEvent(events.LinkCreated, "acme", created),
		linkEvent(events.LinkCreated, "acme", deleted),
		linkEvent(events.LinkDeleted, "acme", deleted),
		linkEvent(events.LinkCreated, "acme", recreated),
		linkEvent(events.LinkDeleted, "acme", recreated),
		linkEvent(events.LinkCreated, "globex", recreated),
	} {
		if err := e.c.ApplyLinkEvent(ctx, le, uint64(i+1)); err != nil {
			t.Fatal(err)
		}
	}
	// A redelivered older event changes nothing.
	if err := e.c.ApplyLinkEvent(ctx, linkEvent(events.LinkCreated, "acme", deleted), 2); err != nil {
		t.Fatal(err)
	}
	mustHandle(t, e.c, 2, s.events(2, click("acme", lagging, now)))
	mustHandle(t, e.c, 3, s.events(3, click("acme", recreated, now)))

	tests := []struct {
		name, owner, code string
		wantErr           error
		wantHuman         int64
	}{
		{name: "created_link_without_clicks_is_zero", owner: "acme", code: created},
		{name: "another_owners_link_is_not_found", owner: "globex", code: created, wantErr: counter.ErrLinkNotFound},
		{name: "deleted_link_is_not_found", owner: "acme", code: deleted, wantErr: counter.ErrLinkNotFound},
		{name: "link_LINKS_has_not_told_yet_is_served_from_its_clicks", owner: "acme", code: lagging, wantHuman: 1},
		{name: "and_not_to_another_owner", owner: "globex", code: lagging, wantErr: counter.ErrLinkNotFound},
		{name: "unknown_link_is_not_found", owner: "acme", code: "nope", wantErr: counter.ErrLinkNotFound},
		{name: "code_that_cannot_exist_is_not_found", owner: "acme", code: "a.b", wantErr: counter.ErrLinkNotFound},
		{name: "recreated_code_belongs_to_its_new_owner", owner: "globex", code: recreated},
		{name: "not_to_its_previous_owner", owner: "acme", code: recreated, wantErr: counter.ErrLinkNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := e.c.LinkStats(t.Context(), tc.owner, tc.code, counter.DefaultRange())
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("LinkStats error = %v, want %v", err, tc.wantErr)
			}
			if err == nil && (got.Totals.Human != tc.wantHuman || got.Totals.Bot != 0) {
				t.Fatalf("totals = %+v, want %d human", got.Totals, tc.wantHuman)
			}
		})
	}
}

func TestRangeValidation(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		r    counter.Range
		ok   bool
	}{
		{"default", counter.DefaultRange(), true},
		{"smallest", counter.Range{Hours: 1, Days: 1, Top: 1}, true},
		{"largest", counter.Range{Hours: counter.MaxHours, Days: counter.MaxDays, Top: counter.MaxTop}, true},
		{"no_hours", counter.Range{Hours: 0, Days: 1, Top: 1}, false},
		{"too_many_hours", counter.Range{Hours: counter.MaxHours + 1, Days: 1, Top: 1}, false},
		{"too_many_days", counter.Range{Hours: 1, Days: counter.MaxDays + 1, Top: 1}, false},
		{"negative_top", counter.Range{Hours: 1, Days: 1, Top: -1}, false},
		{"too_large_top", counter.Range{Hours: 1, Days: 1, Top: counter.MaxTop + 1}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.r.Validate()
			if tc.ok != (err == nil) || (err != nil && !errors.Is(err, counter.ErrInvalidRange)) {
				t.Fatalf("Validate(%+v) = %v, want ok=%v", tc.r, err, tc.ok)
			}
		})
	}
}

func TestReferrerHost(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"", counter.DirectReferrer},
		{"https://www.Example.com:8443/a?b", "example.com"},
		{"http://news.ycombinator.com/item?id=1", "news.ycombinator.com"},
		{"android-app://com.slack/", "com.slack"},
		{"not a url", counter.UnknownReferrer},
		{"/relative/path", counter.UnknownReferrer},
		{"%zz", counter.UnknownReferrer},
	}
	for _, tc := range tests {
		if got := counter.ReferrerHost(tc.in); got != tc.want {
			t.Errorf("ReferrerHost(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// A country is two ASCII letters or it is unknown: it is a part of the field
// a link's counts are kept under, so a separator or a multi-byte letter in
// it must not reach the store, whatever the click's publisher checked.
func TestCountryIsTwoASCIILettersOrUnknown(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, in, want string }{
		{"lowercase_code_is_uppercased", "de", "DE"},
		{"uppercase_code_is_kept", "US", "US"},
		{"mixed_case_code_is_uppercased", "gB", "GB"},
		{"empty_is_unknown", "", counter.UnknownCountry},
		{"three_letters_are_unknown", "XYZ", counter.UnknownCountry},
		{"one_letter_is_unknown", "D", counter.UnknownCountry},
		{"field_separator_is_unknown", "a|", counter.UnknownCountry},
		{"leading_separator_is_unknown", "|a", counter.UnknownCountry},
		{"digit_is_unknown", "D1", counter.UnknownCountry},
		{"space_is_unknown", "D ", counter.UnknownCountry},
		{"two_byte_letter_is_unknown", "é", counter.UnknownCountry},
		{"nul_bytes_are_unknown", "\x00\x00", counter.UnknownCountry},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := counter.CountryOf(tc.in); got != tc.want {
				t.Errorf("CountryOf(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestParseIDReadsTheUUIDv7(t *testing.T) {
	t.Parallel()
	before := time.Now().Truncate(time.Millisecond)
	id := events.NewID()
	m, err := counter.ParseID(id)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := events.IDTime(id)
	if !m.Time.Equal(want) || m.Time.Before(before) {
		t.Fatalf("ParseID(%s).Time = %s, want %s", id, m.Time, want)
	}
	if m.Bucket != want.UnixMilli()/20 {
		t.Fatalf("bucket = %d, want %d", m.Bucket, want.UnixMilli()/20)
	}
	for _, bad := range []string{"", "x", "0190a1b2-c3d4-7e5f-8a6b-7c8d9e0f1a2", "0190a1b2xc3d4-7e5f-8a6b-7c8d9e0f1a2b", "0190a1b2-c3d4-7e5f-8a6b-7c8d9e0f1a2g"} {
		if _, err := counter.ParseID(bad); err == nil {
			t.Errorf("ParseID(%q) succeeded", bad)
		}
	}
}
