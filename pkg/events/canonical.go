package events

import (
	"strings"
	"unsafe"

	"github.com/segmentio/encoding/iso8601"
	"github.com/segmentio/encoding/json"
)

// Every click Snip writes has one shape: Click's fields in their declared
// order, omitempty fields left out, no whitespace (the redirect's
// hand-written encoder and encoding/json both write it). Every reader reads
// every click, so the general JSON decoder's cost (a pass over the payload
// to choose its fast paths, then a field-name lookup per key) was about a
// microsecond of each reader's work per event.
//
// parseCanonicalClick reads that shape directly, and nothing else: on any
// other input it returns false and decodeClick decodes the payload with the
// general decoder, as before. It never decides what a payload means on its
// own: a string with an escape or a byte outside printable ASCII is handed
// to the general decoder's string decoding, and the time to the same
// ISO 8601 parser the general decoder uses, so every payload decodes to the
// same Click either way (FuzzCanonicalClickMatchesDecoder holds it to that).

// canonicalClick is a cursor over one payload.
type canonicalClick struct {
	data  []byte
	s     string // data's bytes as a string: shared (zero copy) or one copy
	i     int
	flags json.ParseFlags
}

// parseCanonicalClick fills c from data if data is a click in the shape
// above and reports whether it was. With json.ZeroCopy in flags c's strings
// share data's memory; without it they share one copy of data, so a string
// kept keeps the whole copy. On false, c holds a partial decode the caller
// must discard.
func parseCanonicalClick(c *Click, data []byte, flags json.ParseFlags) bool {
	const head = `{"v":1,"id":`
	if len(data) <= len(head) || string(data[:len(head)]) != head || data[len(data)-1] != '}' {
		return false // not the shape, or another version: no copy made
	}
	p := canonicalClick{data: data, flags: flags, i: len(head)}
	if flags&json.ZeroCopy != 0 {
		p.s = unsafe.String(&data[0], len(data))
	} else {
		p.s = string(data)
	}
	c.V = ClickVersion
	ok := p.str(&c.ID) && p.literal(`,"ts":`) && p.time(c) &&
		p.literal(`,"code":`) && p.str(&c.Code) &&
		p.literal(`,"owner":`) && p.str(&c.Owner) &&
		p.literal(`,"target":`) && p.str(&c.Target) &&
		p.optional(`,"ip_prefix":`, &c.IPPrefix) &&
		p.literal(`,"visitor":`) && p.str(&c.Visitor) &&
		p.optional(`,"ua":`, &c.UserAgent) &&
		p.optional(`,"referrer":`, &c.Referrer) &&
		p.optional(`,"country":`, &c.Country) &&
		p.optional(`,"request_id":`, &c.RequestID)
	if !ok {
		return false
	}
	if p.literal(`,"bot":true`) {
		c.Bot = true
	}
	return p.i == len(p.s)-1 // only the closing brace is left
}

// literal consumes lit if the input continues with it.
func (p *canonicalClick) literal(lit string) bool {
	if len(p.s)-p.i < len(lit) || p.s[p.i:p.i+len(lit)] != lit {
		return false
	}
	p.i += len(lit)
	return true
}

// optional reads key and its string if the input continues with key; it is
// false only when key is there and its value cannot be read.
func (p *canonicalClick) optional(key string, into *string) bool {
	if !p.literal(key) {
		return true
	}
	return p.str(into)
}

// str reads a JSON string. One of printable ASCII without a backslash is
// taken as it stands; any other is decoded by the general decoder, which
// unescapes it and replaces invalid UTF-8 exactly as it would inside the
// whole payload.
func (p *canonicalClick) str(into *string) bool {
	if p.i >= len(p.s) || p.s[p.i] != '"' {
		return false
	}
	start := p.i + 1
	j := start
	for j < len(p.s) && plain[p.s[j]] {
		j++
	}
	if j == len(p.s) {
		return false
	}
	if p.s[j] != '"' {
		return p.general(into)
	}
	*into = p.s[start:j]
	p.i = j + 1
	return true
}

// plain marks the bytes a string can hold as they stand: printable ASCII
// but the quote and the backslash.
var plain = func() (t [256]bool) {
	for b := 0x20; b <= 0x7e; b++ {
		t[b] = b != '"' && b != '\\'
	}
	return t
}()

// general decodes the string at the cursor with the general decoder.
func (p *canonicalClick) general(into *string) bool {
	rest, err := json.Parse(p.data[p.i:], into, p.flags)
	if err != nil {
		return false
	}
	p.i = len(p.data) - len(rest)
	return true
}

// time reads the click's time as the general decoder does: the bytes between
// the quotes, parsed by iso8601.Parse.
func (p *canonicalClick) time(c *Click) bool {
	if p.i >= len(p.s) || p.s[p.i] != '"' {
		return false
	}
	start := p.i + 1
	n := strings.IndexByte(p.s[start:], '"')
	if n < 0 {
		return false
	}
	t, err := iso8601.Parse(p.s[start : start+n])
	if err != nil {
		return false
	}
	c.Time = t
	p.i = start + n + 1
	return true
}
