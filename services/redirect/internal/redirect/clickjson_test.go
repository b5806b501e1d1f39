package redirect

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/snipdev/snip/pkg/events"
)

func toFields(c events.Click) clickFields {
	return clickFields{
		ID: []byte(c.ID), Time: c.Time, Code: c.Code, Owner: c.Owner, Target: c.Target,
		IPPrefix: []byte(c.IPPrefix), Visitor: []byte(c.Visitor), UserAgent: c.UserAgent,
		Referrer: c.Referrer, Country: c.Country, RequestID: c.RequestID, Bot: c.Bot,
	}
}

// TestAppendClickMatchesEncodingJSON: the hand-written encoder writes the
// same bytes as encoding/json for events.Click.
func TestAppendClickMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	full := events.Click{
		V: events.ClickVersion, ID: events.NewID(), Time: time.Date(2026, 11, 30, 12, 0, 0, 123456789, time.UTC),
		Code: "abc", Owner: "acme", Target: "https://example.com/?a=1&b=<2>", IPPrefix: "203.0.113.0/24",
		Visitor: "0123456789abcdef0123456789abcdef", UserAgent: "Mozilla/5.0 \"quoted\" \\ \t\n\x01 ü 日本 \u2028",
		Referrer: "https://ref.example/\xff\xfe", Country: "DE", RequestID: "req-1", Bot: true,
	}
	tests := []struct {
		name string
		c    events.Click
	}{
		{name: "every_field", c: full},
		{name: "omitempty_fields_left_out", c: events.Click{V: 1, ID: full.ID, Time: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Code: "x", Owner: "y", Target: "https://t/", Visitor: "v"}},
		{name: "time_in_another_zone_is_written_in_utc", c: events.Click{V: 1, ID: full.ID, Time: time.Date(2026, 1, 2, 3, 4, 5, 6000, time.FixedZone("X", 3600)).UTC(), Code: "x", Owner: "y", Target: "https://t/", Visitor: "v"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			want, err := json.Marshal(tc.c)
			if err != nil {
				t.Fatal(err)
			}
			f := toFields(tc.c)
			got := appendClick(nil, &f)
			if !bytes.Equal(got, want) {
				t.Fatalf("appendClick:\n got %s\nwant %s", got, want)
			}
		})
	}
}

// FuzzAppendClick: for any strings in the free-text fields, the encoder's
// output decodes (events.DecodeClick) to what encoding/json's round trip
// gives.
func FuzzAppendClick(f *testing.F) {
	f.Add("Mozilla/5.0", "https://ref.example/", "https://example.com/", "req-1")
	f.Add("\x00\x1f\"\\<>&\u2028\u2029", "\xff", "ü", "日本")
	f.Fuzz(func(t *testing.T, ua, ref, target, rid string) {
		c := events.Click{
			V: 1, ID: events.NewID(), Time: time.Date(2026, 11, 30, 12, 0, 0, 1, time.UTC), Code: "abc", Owner: "acme",
			Target: target, IPPrefix: "203.0.113.0/24", Visitor: "0123456789abcdef0123456789abcdef",
			UserAgent: ua, Referrer: ref, RequestID: rid,
		}
		std, _ := json.Marshal(c)
		want, err := events.DecodeClick(std)
		if err != nil {
			t.Fatalf("encoding/json output does not decode: %v", err)
		}
		f := toFields(c)
		got, err := events.DecodeClick(appendClick(nil, &f))
		if err != nil {
			t.Fatalf("appendClick output does not decode: %v\n%s", err, appendClick(nil, &f))
		}
		if d := cmp.Diff(want, got); d != "" {
			t.Fatalf("(-encoding/json +appendClick):\n%s", d)
		}
	})
}

func benchClick() events.Click {
	return events.Click{
		V: events.ClickVersion, ID: events.NewID(), Time: time.Now(), Code: "abc1234", Owner: "acme",
		Target: "https://example.com/some/landing/page?utm_source=newsletter", IPPrefix: "203.0.113.0/24",
		Visitor: "0123456789abcdef0123456789abcdef", UserAgent: "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36",
		Referrer: "https://news.example.com/", Country: "DE", RequestID: "b7f3c1d2e4a5f6071829",
	}
}

// BenchmarkEncodeClick compares the hand-written encoder with encoding/json.
func BenchmarkEncodeClick(b *testing.B) {
	c := benchClick()
	b.Run("appendClick", func(b *testing.B) {
		f := toFields(c)
		buf := make([]byte, 0, 1024)
		b.ReportAllocs()
		for b.Loop() {
			buf = appendClick(buf[:0], &f)
		}
	})
	b.Run("encoding_json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = json.Marshal(&c)
		}
	})
}
