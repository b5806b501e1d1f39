package redirect

import (
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/snipdev/snip/pkg/events"
)

// clickFields are the parts of a click, some already encoded, as the hot
// path has them. AppendClick writes them as the JSON of events.Click.
type clickFields struct {
	ID        []byte // 36-byte UUIDv7 text
	Time      time.Time
	Code      string
	Owner     string
	Target    string
	IPPrefix  []byte
	Visitor   []byte
	UserAgent string
	Referrer  string
	Country   string
	RequestID string
	Bot       bool
}

// AppendClick appends the JSON of one click, exactly as encoding/json would
// write events.Click (same field names, omitempty, RFC 3339 time with
// nanoseconds, invalid UTF-8 as U+FFFD), without reflection or allocation.
// TestAppendClickMatchesEncodingJSON and FuzzAppendClick hold it to that.
func appendClick(b []byte, c *clickFields) []byte {
	b = append(b, `{"v":`...)
	b = strconv.AppendInt(b, events.ClickVersion, 10)
	b = append(b, `,"id":"`...)
	b = append(b, c.ID...)
	b = append(b, `","ts":"`...)
	b = c.Time.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","code":`...)
	b = appendString(b, c.Code)
	b = append(b, `,"owner":`...)
	b = appendString(b, c.Owner)
	b = append(b, `,"target":`...)
	b = appendString(b, c.Target)
	if len(c.IPPrefix) > 0 {
		b = append(b, `,"ip_prefix":"`...)
		b = append(b, c.IPPrefix...) // digits, dots, colons, slash: nothing to escape
		b = append(b, '"')
	}
	b = append(b, `,"visitor":"`...)
	b = append(b, c.Visitor...) // hex
	b = append(b, '"')
	if c.UserAgent != "" {
		b = append(b, `,"ua":`...)
		b = appendString(b, c.UserAgent)
	}
	if c.Referrer != "" {
		b = append(b, `,"referrer":`...)
		b = appendString(b, c.Referrer)
	}
	if c.Country != "" {
		b = append(b, `,"country":`...)
		b = appendString(b, c.Country)
	}
	if c.RequestID != "" {
		b = append(b, `,"request_id":`...)
		b = appendString(b, c.RequestID)
	}
	if c.Bot {
		b = append(b, `,"bot":true`...)
	}
	return append(b, '}')
}

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string the way encoding/json does with
// HTML escaping on: '<', '>', '&', U+2028 and U+2029 as \u escapes, invalid
// UTF-8 as \ufffd.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i++
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
