package redisstore

import (
	"fmt"
	"strings"
	"testing"
	"unsafe"

	"github.com/snipdev/snip/services/clickcounter/internal/counter"
)

// Every key a batch or a verdict touches carries the partition's hash tag,
// so the scripts work on Redis Cluster (one slot per partition).
func TestPartitionKeysShareTheHashTag(t *testing.T) {
	t.Parallel()
	ref := counter.LinkRef{Owner: "acme", Code: "abc"}
	for _, k := range []string{
		metaKey(3), posKey(3, 2), linkKey(3, 2, ref), dayKey(3, 2, ref, 20000),
		uvKey(3, 2, ref, 20000), idKey(3, 2, 123), labelKey(3, 20000),
	} {
		open, close := strings.IndexByte(k, '{'), strings.IndexByte(k, '}')
		if open < 0 || close < open || k[open+1:close] != "p3" {
			t.Errorf("key %q: hash tag is not {p3}", k)
		}
	}
}

func TestComboFieldRoundTrip(t *testing.T) {
	t.Parallel()
	tests := []struct {
		l             counter.Label
		country, host string
	}{
		{counter.Human, "DE", "news.example.org"},
		{counter.Bot, counter.UnknownCountry, counter.DirectReferrer},
		{counter.Human, "US", counter.OtherReferrer},
	}
	for _, tc := range tests {
		f := comboField(tc.l, tc.country, tc.host)
		l, country, host, ok := parseComboField(f)
		if !ok || l != tc.l || country != tc.country || host != tc.host {
			t.Errorf("parse(%q) = %c %q %q %v", f, l, country, host, ok)
		}
	}
	for _, bad := range []string{"", "h", "x|DE|a", "h|DE", "hDE|a"} {
		if _, _, _, ok := parseComboField(bad); ok {
			t.Errorf("parse(%q) accepted", bad)
		}
	}
}

// linkDay cuts a link's key and its day's two keys from one string, each
// the same as link, day and uv make it alone, in one allocation.
func TestLinkDayKeysAreTheKeysInOneAllocation(t *testing.T) {
	gk := genKeys(genPrefix(3, 7))
	ref := counter.LinkRef{Owner: "acme", Code: "abc123"}
	day := counter.Day(20428).Key()
	for _, c := range []struct{ link, uv bool }{{true, true}, {true, false}, {false, true}, {false, false}} {
		lk, dk, uk := gk.linkDay(ref, day, c.link, c.uv)
		wantL, wantU := "", ""
		if c.link {
			wantL = gk.link(ref)
		}
		if c.uv {
			wantU = gk.uv(ref, day)
		}
		if lk != wantL || dk != gk.day(ref, day) || uk != wantU {
			t.Errorf("linkDay(link %v, uv %v) = %q, %q, %q; want %q, %q, %q", c.link, c.uv, lk, dk, uk, wantL, gk.day(ref, day), wantU)
		}
	}
	if n := testing.AllocsPerRun(100, func() { gk.linkDay(ref, day, true, true) }); n != 1 {
		t.Errorf("%.0f allocations for a link's and its day's keys, want 1", n)
	}
}

// A batch's link fields come from a cache kept across the batches built in
// the same args: the same field as comboField makes, with no allocation
// once cached, and a key that holds the field's own strings, not the
// click's (which may be the memory of a message long gone); the cache
// starts over past maxCachedFields.
func TestLinkFieldsAreCachedOnTheirOwnStrings(t *testing.T) {
	a := &args{}
	msg := []byte("DEnews.ycombinator.com")
	country, host := string(msg[:2]), string(msg[2:])
	f := a.field(counter.Bot, country, host)
	if want := comboField(counter.Bot, country, host); f != want {
		t.Fatalf("field %q, want %q", f, want)
	}
	if n := testing.AllocsPerRun(100, func() { a.field(counter.Bot, country, host) }); n != 0 {
		t.Errorf("%.0f allocations for a cached field, want 0", n)
	}
	within := func(sub, s string) bool {
		p, b := uintptr(unsafe.Pointer(unsafe.StringData(sub))), uintptr(unsafe.Pointer(unsafe.StringData(s)))
		return p >= b && p+uintptr(len(sub)) <= b+uintptr(len(s))
	}
	for k, v := range a.fields {
		if !within(k.country, v) || !within(k.host, v) {
			t.Errorf("cache key %+v does not point into its field %q", k, v)
		}
	}
	if g := a.field(counter.Human, country, host); g != comboField(counter.Human, country, host) || g == f {
		t.Errorf("human field %q next to the bot's %q", g, f)
	}
	for i := range maxCachedFields + 10 {
		a.field(counter.Human, "US", fmt.Sprintf("h%d.example", i))
	}
	if len(a.fields) > maxCachedFields {
		t.Errorf("%d fields cached, want at most %d", len(a.fields), maxCachedFields)
	}
}
