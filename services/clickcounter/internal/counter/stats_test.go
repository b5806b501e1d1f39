package counter_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
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

// A deleted link's counts are never read again (its code is never created
// again), so they expire once no click of it can be counted any more:
// CLICKS retention and DeletedLinkHorizon after the deletion. A late click
// (redirected before the deletion, counted after) keeps the expiry, also
// for a link nothing of which was counted before; a recount after the
// deletion gives its generation's counts of the link the expiry when it
// switches; a deletion learnt past that time drops the counts at once.
func TestADeletedLinksCountsExpire(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); e.c.RunJanitor(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	const p = 1
	counted, quiet, old := codeIn(t, p, 50), codeIn(t, p, 51), codeIn(t, p, 52)
	now := time.Now().UTC()
	var s seqs
	b1 := s.events(p, click("acme", counted, now), click("acme", counted, now), click("acme", old, now))
	e.clicks.store(b1...)
	mustHandle(t, e.c, p, b1)

	del := []*events.LinkEvent{linkEvent(events.LinkDeleted, "acme", counted), linkEvent(events.LinkDeleted, "acme", quiet)}
	for i, le := range del {
		if err := e.c.ApplyLinkEvent(t.Context(), le, uint64(i+1)); err != nil {
			t.Fatal(err)
		}
	}
	horizon := 7*24*time.Hour + counter.DeletedLinkHorizon
	expires := func(g int, code string) {
		t.Helper()
		key := fmt.Sprintf("cc:{p1}:g%d:l:acme:%s", g, code)
		ttl, err := e.rdb.TTL(t.Context(), key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ttl < horizon-time.Minute || ttl > horizon {
			t.Errorf("%s: TTL %v, want about %v (CLICKS retention and the horizon after the deletion)", key, ttl, horizon)
		}
	}
	expires(1, counted)
	expires(1, quiet)

	b2 := s.events(p, click("acme", counted, now), click("acme", quiet, now)) // late clicks
	e.clicks.store(b2...)
	mustHandle(t, e.c, p, b2)
	expires(1, counted)
	expires(1, quiet)
	if got := stats(t, e.c, "acme", old).Totals; got != (counter.Pair{Human: 1}) {
		t.Fatalf("a link not deleted: totals %+v, want 1 human", got)
	}

	e.first.Store(b1[0].Seq)
	if err := e.c.OnRewind(t.Context(), p, reader.RewindInfo{ID: events.NewID(), From: b1[0].Seq, Until: s.n, Requested: now, MovesBack: true}); err != nil {
		t.Fatal(err)
	}
	mustHandle(t, e.c, p, b1)
	mustHandle(t, e.c, p, b2)
	testenv.WaitFor(t, 5*time.Second, "the janitor to drop generation 1 after the switch", func() bool {
		return len(testenv.Keys(t, e.rdb, "cc:{p1}:g1:*")) == 0
	})
	testenv.WaitFor(t, 5*time.Second, "the janitor to give generation 2's counts of the deleted links their expiry", func() bool {
		return e.rdb.TTL(t.Context(), "cc:{p1}:g2:l:acme:"+quiet).Val() > 0
	})
	expires(2, counted)
	expires(2, quiet)

	// A deletion learnt past its horizon (LINKS read late) drops the counts.
	gone := linkEvent(events.LinkDeleted, "acme", old)
	gone.Time = now.Add(-horizon - time.Hour)
	if err := e.c.ApplyLinkEvent(t.Context(), gone, 3); err != nil {
		t.Fatal(err)
	}
	if n := e.rdb.Exists(t.Context(), "cc:{p1}:g2:l:acme:"+old).Val(); n != 0 {
		t.Errorf("the counts of a link deleted longer ago than the horizon are still there")
	}
	if n := e.rdb.ZCard(t.Context(), "cc:{p1}:deleted").Val(); n != 2 {
		t.Errorf("the partition's deleted set holds %d links, want the 2 within their horizon", n)
	}
}
