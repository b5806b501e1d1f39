package events_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/snipdev/snip/pkg/events"
)

func validClick() events.Click {
	return events.Click{
		V:        events.ClickVersion,
		ID:       events.NewID(),
		Time:     time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC),
		Code:     "abc123",
		Owner:    "acme",
		Target:   "https://example.com/",
		IPPrefix: "203.0.113.0/24",
		Visitor:  "0123456789abcdef0123456789abcdef",
		Country:  "DE",
	}
}

func TestDecodeClick(t *testing.T) {
	t.Parallel()
	ok := validClick()
	tests := []struct {
		name    string
		mutate  func(m map[string]any)
		raw     string
		wantErr error
	}{
		{name: "valid_click_round_trips", mutate: func(map[string]any) {}},
		{name: "future_version_is_unknown", mutate: func(m map[string]any) { m["v"] = 2 }, wantErr: events.ErrUnknownVersion},
		{name: "missing_version_is_malformed", mutate: func(m map[string]any) { delete(m, "v") }, wantErr: events.ErrMalformed},
		{name: "not_json_is_malformed", raw: "{not json", wantErr: events.ErrMalformed},
		{name: "uuid_v4_id_is_malformed", mutate: func(m map[string]any) { m["id"] = "3b241101-e2bb-4255-8caf-4136c566a962" }, wantErr: events.ErrMalformed},
		{name: "code_with_dot_is_malformed", mutate: func(m map[string]any) { m["code"] = "a.b" }, wantErr: events.ErrMalformed},
		{name: "empty_owner_is_malformed", mutate: func(m map[string]any) { m["owner"] = "" }, wantErr: events.ErrMalformed},
		{name: "three_letter_country_is_malformed", mutate: func(m map[string]any) { m["country"] = "DEU" }, wantErr: events.ErrMalformed},
		{name: "missing_time_is_malformed", mutate: func(m map[string]any) { delete(m, "ts") }, wantErr: events.ErrMalformed},
		{name: "wrong_type_is_malformed", mutate: func(m map[string]any) { m["code"] = 7 }, wantErr: events.ErrMalformed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			data := []byte(tc.raw)
			if tc.mutate != nil {
				b, _ := json.Marshal(ok)
				var m map[string]any
				_ = json.Unmarshal(b, &m)
				tc.mutate(m)
				data, _ = json.Marshal(m)
			}
			got, err := events.DecodeClick(data)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("DecodeClick error = %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("DecodeClick: %v", err)
			}
			if d := cmp.Diff(ok, got); d != "" {
				t.Fatalf("round trip (-want +got):\n%s", d)
			}
		})
	}
}

func TestValidToken(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want bool
	}{
		{"abc", true}, {"A-b_9", true}, {"", false}, {"a.b", false}, {"a*", false},
		{"a>", false}, {"a b", false}, {"ü", false}, {string(make([]byte, 65)), false},
	}
	for _, tc := range tests {
		if got := events.ValidToken(tc.in); got != tc.want {
			t.Errorf("ValidToken(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestIDTimeIsCreationTime(t *testing.T) {
	t.Parallel()
	before := time.Now().Truncate(time.Millisecond)
	id := events.NewID()
	after := time.Now()
	got, err := events.IDTime(id)
	if err != nil {
		t.Fatal(err)
	}
	if got.Before(before) || got.After(after) {
		t.Fatalf("IDTime = %s, want within [%s, %s]", got, before, after)
	}
}

func TestPartitionOf(t *testing.T) {
	t.Parallel()
	tests := map[string]int{"3.clicks.a.b": 3, "12.clicks.a.b": 12, "clicks.a.b": -1, "x.clicks": -1, "": -1, "-1.c": -1}
	for in, want := range tests {
		if got := events.PartitionOf(in); got != want {
			t.Errorf("PartitionOf(%q) = %d, want %d", in, got, want)
		}
	}
}

func FuzzDecodeClick(f *testing.F) {
	b, _ := json.Marshal(validClick())
	f.Add(b)
	f.Add([]byte(`{"v":1}`))
	f.Add([]byte(`{"v":2,"id":"x"}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := events.DecodeClick(data)
		// DecodeClick uses a faster JSON decoder than encoding/json (the
		// readers' hottest path); it must accept and read exactly what
		// encoding/json would.
		var std events.Click
		stdOK := json.Unmarshal(data, &std) == nil && std.V == events.ClickVersion && std.Validate() == nil
		if stdOK != (err == nil) {
			t.Fatalf("encoding/json accepts: %v; DecodeClick: %v", stdOK, err)
		}
		if stdOK {
			if d := cmp.Diff(std, c); d != "" {
				t.Fatalf("DecodeClick differs from encoding/json (-std +ours):\n%s", d)
			}
		}
		if err != nil {
			if !errors.Is(err, events.ErrMalformed) && !errors.Is(err, events.ErrUnknownVersion) {
				t.Fatalf("error %v wraps neither ErrMalformed nor ErrUnknownVersion", err)
			}
			return
		}
		// Anything accepted must survive a round trip unchanged.
		again, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		c2, err := events.DecodeClick(again)
		if err != nil {
			t.Fatalf("re-decoding an accepted click: %v", err)
		}
		if d := cmp.Diff(c, c2); d != "" {
			t.Fatalf("round trip (-first +second):\n%s", d)
		}
	})
}
