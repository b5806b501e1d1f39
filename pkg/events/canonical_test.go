package events

import (
	stdjson "encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/segmentio/encoding/json"
)

// canonicalSeeds are clicks as Snip writes them (encoding/json of a Click,
// which the redirect's encoder matches byte for byte), and variations on the
// shape that the direct path must decline or read exactly as the general
// decoder does.
func canonicalSeeds(t testing.TB) [][]byte {
	base := Click{
		V: ClickVersion, ID: "01938a4c-7d2e-7b3f-9c1d-2e3f4a5b6c7d",
		Time: time.Date(2026, 12, 5, 2, 30, 1, 123456789, time.UTC),
		Code: "abc123", Owner: "acme", Target: "https://example.com/a?x=1",
		IPPrefix: "203.0.113.0/24", Visitor: "0123456789abcdef0123456789abcdef",
		UserAgent: "Mozilla/5.0 (X11; Linux x86_64) Chrome/120.0", Referrer: "news.ycombinator.com",
		Country: "DE", RequestID: "req-1", Bot: true,
	}
	variants := []func(c *Click){
		func(*Click) {},
		func(c *Click) {
			c.IPPrefix, c.UserAgent, c.Referrer, c.Country, c.RequestID, c.Bot = "", "", "", "", "", false
		},
		func(c *Click) { c.Target = "https://example.com/?a=1&b=<2>" },     // escaped by encoding/json
		func(c *Click) { c.UserAgent = "Mozilla/5.0 \"quoted\" \\ tab\t" }, // escapes
		func(c *Click) { c.Referrer = "https://bücher.example/ü" },         // UTF-8
		func(c *Click) { c.UserAgent = "bad \xff\xfe utf-8" },              // replaced by U+FFFD
		func(c *Click) { c.Time = time.Date(2026, 12, 5, 2, 30, 1, 0, time.UTC) },
		func(c *Click) { c.Time = time.Date(2026, 12, 5, 2, 30, 1, 0, time.FixedZone("x", 3600)) },
		func(c *Click) { c.ID = strings.ToUpper(c.ID) },
		func(c *Click) { c.V = 2 },
	}
	var out [][]byte
	for _, v := range variants {
		c := base
		v(&c)
		b, err := stdjson.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	full := string(out[0])
	for _, s := range []string{
		strings.Replace(full, `,"bot":true`, `,"bot":false`, 1),
		strings.Replace(full, `"v":1,`, `"v": 1,`, 1),
		strings.Replace(full, `"v":1,`, `"v":1.0,`, 1),
		strings.Replace(full, `"code":"abc123",`, ``, 1),
		strings.Replace(full, `"ua":`, `"UA":`, 1),
		strings.Replace(full, `,"country":"DE"`, ``, 1) + ` `,
		strings.Replace(full, `}`, `,"country":"FR"}`, 1),
		strings.Replace(full, `"ts":"`, `"ts":null,"x":"`, 1),
		strings.Replace(full, `"referrer":"news.ycombinator.com"`, `"referrer":null`, 1),
		strings.Replace(full, `"owner":"acme"`, `"owner":"ac\u006de"`, 1),
		strings.Replace(full, `"owner":"acme"`, `"owner":"ac`, 1),
		strings.Replace(full, `"ts":"2026`, `"ts":"\u0032026`, 1),
		full[:len(full)-1],
		full + `}`,
		`{"v":1,"id":"`,
		`{}`,
	} {
		out = append(out, []byte(s))
	}
	return out
}

// FuzzCanonicalClickMatchesDecoder: whatever the payload, decodeClick (the
// direct path, then the general decoder) gives the same click and the same
// error as the general decoder alone, sharing memory or not.
func FuzzCanonicalClickMatchesDecoder(f *testing.F) {
	for _, b := range canonicalSeeds(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, flags := range []json.ParseFlags{0, json.ZeroCopy} {
			var got, want Click
			gotErr := decodeClick(&got, data, flags)
			wantErr := decodeClickGeneral(&want, data, flags)
			if (gotErr == nil) != (wantErr == nil) || gotErr != nil && gotErr.Error() != wantErr.Error() {
				t.Fatalf("flags %d: decodeClick error %v, the general decoder's %v", flags, gotErr, wantErr)
			}
			if gotErr == nil && got != want {
				t.Fatalf("flags %d: decodeClick gave\n%+v\nthe general decoder\n%+v", flags, got, want)
			}
		}
	})
}

// TestCanonicalClicksTakeTheDirectPath: the clicks Snip writes are read by
// the direct path (not only decoded right by the fallback), and a shape it
// does not know is declined.
func TestCanonicalClicksTakeTheDirectPath(t *testing.T) {
	seeds := canonicalSeeds(t)
	// The first seed sets every field of Click, so a field added to Click
	// and not to the direct parser makes it decline, and this test fail.
	var full Click
	if err := stdjson.Unmarshal(seeds[0], &full); err != nil {
		t.Fatal(err)
	}
	v := reflect.ValueOf(full)
	for i := range v.NumField() {
		if v.Field(i).IsZero() {
			t.Errorf("the first seed leaves Click.%s unset: set it in canonicalSeeds", v.Type().Field(i).Name)
		}
	}
	for i, b := range seeds[:9] { // the encoded variants but the unknown version
		var c Click
		if !parseCanonicalClick(&c, b, json.ZeroCopy) {
			t.Errorf("seed %d, %s: not read by the direct path", i, b)
		}
	}
	if !strings.HasPrefix(string(seeds[9]), `{"v":2,`) {
		t.Fatalf("seed 9 is %s, want the version 2 variant", seeds[9])
	}
	for _, s := range []string{
		strings.Replace(string(seeds[0]), `,"bot":true`, `,"bot":false`, 1),
		strings.Replace(string(seeds[0]), `"v":1,`, `"v": 1,`, 1),
		strings.Replace(string(seeds[0]), `}`, `,"country":"FR"}`, 1),
		string(seeds[9]), // a version 2: the last of the encoded variants
	} {
		var c Click
		if parseCanonicalClick(&c, []byte(s), json.ZeroCopy) {
			t.Errorf("%s: read by the direct path", s)
		}
	}
}

// TestDirectPathSharesOrCopies: shared, the strings point into the payload;
// copied, changing the payload afterwards changes nothing read.
func TestDirectPathSharesOrCopies(t *testing.T) {
	b := canonicalSeeds(t)[0]
	var shared, copied Click
	if !parseCanonicalClick(&shared, b, json.ZeroCopy) || !parseCanonicalClick(&copied, b, 0) {
		t.Fatal("not read by the direct path")
	}
	i := strings.Index(string(b), `"acme"`) + 1
	b[i] = 'X'
	if shared.Owner != "Xcme" {
		t.Errorf("shared: owner %q after the payload changed, want Xcme", shared.Owner)
	}
	if copied.Owner != "acme" {
		t.Errorf("copied: owner %q after the payload changed, want acme", copied.Owner)
	}
}

// FuzzValidIDAgreesWithUUIDParse: validID accepts exactly the 36-character
// IDs uuid.Parse reads as version 7.
func FuzzValidIDAgreesWithUUIDParse(f *testing.F) {
	for _, s := range []string{
		NewID(), strings.ToUpper(NewID()), "3b241101-e2bb-4255-8caf-4136c566a962",
		"01938a4c-7d2e-7b3f-9c1d-2e3f4a5b6c7", "01938a4c-7d2e-7b3f-9c1d-2e3f4a5b6c7g",
		"01938a4c+7d2e-7b3f-9c1d-2e3f4a5b6c7d", "{01938a4c-7d2e-7b3f-9c1d-2e3f4a5b6c7}",
		"urn:uuid:01938a4c-7d2e-7b3f-9c1d-2e3f4a5b6c7d", "01938a4c7d2e7b3f9c1d2e3f4a5b6c7d", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		u, err := uuid.Parse(id)
		want := err == nil && u.Version() == 7 && len(id) == 36
		if got := validID(id); got != want {
			t.Fatalf("validID(%q) = %v, uuid.Parse says %v", id, got, want)
		}
	})
}
