package link

import (
	"crypto/rand"
	"fmt"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Limits on what an owner may create.
const (
	// MaxTargetLen is the longest target URL accepted. Browsers cope with far
	// longer URLs, but every click event carries the target, and 2 KiB keeps
	// a click well under CLICKS' 16 KiB message limit.
	MaxTargetLen = 2048
	// MinCodeLen and MaxCodeLen bound custom codes.
	MinCodeLen = 3
	MaxCodeLen = 32
	// GeneratedCodeLen is the length of a random code: 62^7 ≈ 3.5e12 codes,
	// so collisions are rare and retried (see linkstore.Create).
	GeneratedCodeLen = 7
)

// Link is a short link as the redirect service keeps it.
type Link struct {
	Code    string
	Owner   string
	Target  string
	Created time.Time
}

// reserved are codes that name, or may one day name, the service's own
// paths. They are compared case-insensitively so "API" cannot be taken to
// confuse readers of a link either.
var reserved = map[string]bool{
	"api": true, "healthz": true, "readyz": true, "livez": true, "metrics": true,
	"static": true, "assets": true, "admin": true, "login": true, "logout": true,
	"debug": true, "pprof": true, "docs": true, "www": true, "app": true,
	"console": true, "status": true, "health": true, "ready": true, "well-known": true,
	"favicon": true, "robots": true, "sitemap": true, "links": true, "new": true,
}

// IsReserved reports whether code is a reserved word, ignoring case.
func IsReserved(code string) bool {
	if len(code) > 16 {
		return false
	}
	var b [16]byte
	for i := 0; i < len(code); i++ {
		c := code[i]
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		b[i] = c
	}
	return reserved[string(b[:len(code)])]
}

// ValidateCode checks a custom code: MinCodeLen..MaxCodeLen characters from
// letters, digits, '-' and '_' (a subset of events.ValidToken, so the code
// is safe as a NATS subject token), and not a reserved word.
func ValidateCode(code string) error {
	if n := len(code); n < MinCodeLen || n > MaxCodeLen {
		return fmt.Errorf("%w: must be %d to %d characters, got %d", ErrInvalidCode, MinCodeLen, MaxCodeLen, n)
	}
	for i := 0; i < len(code); i++ {
		if !codeChar(code[i]) {
			return fmt.Errorf("%w: character %q at position %d; use letters, digits, '-' or '_'", ErrInvalidCode, rune(code[i]), i)
		}
	}
	if IsReserved(code) {
		return fmt.Errorf("%w: %q is used by the service itself", ErrReservedCode, code)
	}
	return nil
}

// ParseCode checks a code taken from a request path before any lookup: any
// code the service could have issued passes, anything else is refused
// without touching Redis. Generated codes follow the custom-code length
// rules too, so one check covers both. Reserved words pass (they are simply
// never found).
func ParseCode(s string) (string, bool) {
	if len(s) < MinCodeLen || len(s) > MaxCodeLen {
		return "", false
	}
	for i := 0; i < len(s); i++ {
		if !codeChar(s[i]) {
			return "", false
		}
	}
	return s, true
}

func codeChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

const alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// NewCode returns a random code of GeneratedCodeLen characters from
// crypto/rand, uniformly over [0-9A-Za-z] (rejection sampling: bytes >= 248
// are redrawn so no character is favoured). It never returns a reserved word:
// healthz, metrics, console, favicon and sitemap are 7 characters long too,
// and such a draw is drawn again.
func NewCode() string {
	for {
		if c := newCode(); !IsReserved(c) {
			return c
		}
	}
}

func newCode() string {
	var out [GeneratedCodeLen]byte
	var buf [GeneratedCodeLen * 2]byte
	n := 0
	for n < len(out) {
		_, _ = rand.Read(buf[:]) // never fails (crypto/rand panics instead)
		for _, b := range buf {
			if b >= 248 { // 248 = 4*62
				continue
			}
			out[n] = alphabet[b%62]
			n++
			if n == len(out) {
				break
			}
		}
	}
	return string(out[:])
}

// ValidateTarget checks a target URL and returns it normalised (scheme and
// host lowercased, as url.URL.String writes it). Rules, each with the reason:
//   - at most MaxTargetLen bytes, valid UTF-8, no whitespace (Unicode's
//     too) or control characters, invisible or bidirectional controls
//     included (they hide what a link really points to);
//   - absolute, scheme http or https only (javascript:, data:, file:, ...
//     are refused: a shortener must not launder script URLs);
//   - a host is required, and its port, if any, is a number 1-65535;
//   - the host is an IPv6 literal in brackets, or a name of the characters
//     RFC 3986 allows in one (letters, digits, "-._~" and "!$&'()*+,;=";
//     letters beyond ASCII too, an internationalised name as browsers take
//     it), without "%" escapes, empty labels or a leading dot: Go's parser
//     lets '<', '>', '"' and ']' through in a host, which no browser or
//     resolver takes as one;
//   - no user:password@ part (credentials in links leak, and
//     "https://bank.com@evil.example" is a classic phishing trick).
func ValidateTarget(raw string) (string, error) {
	switch {
	case raw == "":
		return "", fmt.Errorf("%w: empty", ErrInvalidTarget)
	case len(raw) > MaxTargetLen:
		return "", fmt.Errorf("%w: %d bytes, the limit is %d", ErrInvalidTarget, len(raw), MaxTargetLen)
	case !utf8.ValidString(raw):
		return "", fmt.Errorf("%w: not valid UTF-8", ErrInvalidTarget)
	}
	for _, r := range raw {
		if hides(r) {
			return "", fmt.Errorf("%w: contains whitespace or a control character (%U)", ErrInvalidTarget, r)
		}
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrInvalidTarget, unwrapURLError(err))
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		if u.Scheme == "" {
			return "", fmt.Errorf("%w: not absolute; start it with https:// or http://", ErrInvalidTarget)
		}
		return "", fmt.Errorf("%w: scheme %q is not allowed; use http or https", ErrInvalidTarget, u.Scheme)
	case u.Opaque != "":
		return "", fmt.Errorf("%w: expected scheme://host/...", ErrInvalidTarget)
	case u.User != nil:
		return "", fmt.Errorf("%w: credentials (user:password@) are not allowed in a target", ErrInvalidTarget)
	case u.Hostname() == "":
		return "", fmt.Errorf("%w: no host", ErrInvalidTarget)
	}
	if p := u.Port(); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return "", fmt.Errorf("%w: port %q", ErrInvalidTarget, p)
		}
	} else if strings.HasSuffix(u.Host, ":") {
		return "", fmt.Errorf("%w: empty port", ErrInvalidTarget)
	}
	if h := u.Hostname(); strings.Contains(h, "..") || strings.HasPrefix(h, ".") || strings.ContainsAny(h, "\\%") {
		return "", fmt.Errorf("%w: malformed host %q", ErrInvalidTarget, h)
	}
	if err := checkHost(u.Host, u.Hostname()); err != nil {
		return "", fmt.Errorf("%w: %v", ErrInvalidTarget, err)
	}
	u.Host = strings.ToLower(u.Host)
	out := u.String()
	if len(out) > MaxTargetLen {
		return "", fmt.Errorf("%w: %d bytes once normalised, the limit is %d", ErrInvalidTarget, len(out), MaxTargetLen)
	}
	return out, nil
}

// checkHost checks a host as RFC 3986 has it (host is u.Host, hostname
// u.Hostname()): an IP literal is an IPv6 address in brackets, without a
// zone; a name holds only unreserved characters and sub-delims, and any
// letter beyond ASCII (UTF-8, which url.Parse keeps as it is).
func checkHost(host, hostname string) error {
	if strings.HasPrefix(host, "[") {
		if a, err := netip.ParseAddr(hostname); err != nil || !a.Is6() || a.Zone() != "" {
			return fmt.Errorf("host %q is not an IPv6 address", hostname)
		}
		return nil
	}
	for i := 0; i < len(hostname); i++ {
		c := hostname[i]
		switch {
		case c >= utf8.RuneSelf: // part of a letter beyond ASCII
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("-._~!$&'()*+,;=", c) >= 0:
		default:
			return fmt.Errorf("host %q: %q is not allowed in a host name", hostname, c)
		}
	}
	return nil
}

// hides reports whether r may hide what a target points to: ASCII
// controls and space, C1 controls, any Unicode white space (no-break,
// em and ideographic spaces, the line and paragraph separators, which a
// query string keeps as they are), the invisible zero width space and
// byte order mark, and the bidirectional embeddings, overrides and
// isolates, which make text display in another order than it reads.
func hides(r rune) bool {
	switch {
	case r <= ' ', r == 0x7f, r >= 0x80 && r <= 0x9f, unicode.IsSpace(r):
		return true
	case r == '\u200b', r == '\ufeff', r >= '\u202a' && r <= '\u202e', r >= '\u2066' && r <= '\u2069':
		return true
	}
	return false
}

func unwrapURLError(err error) error {
	if ue, ok := err.(*url.Error); ok {
		return ue.Err
	}
	return err
}
