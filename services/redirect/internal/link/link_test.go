package link_test

import (
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/services/redirect/internal/link"
)

func TestValidateTarget(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		in      string
		want    string // normalised output when valid
		wantErr error
	}{
		{name: "https_is_accepted", in: "https://example.com/a?b=c#d", want: "https://example.com/a?b=c#d"},
		{name: "http_with_port_is_accepted", in: "http://example.com:8080/", want: "http://example.com:8080/"},
		{name: "scheme_and_host_are_lowercased", in: "HTTPS://Example.COM/Path", want: "https://example.com/Path"},
		{name: "ipv6_host_is_accepted", in: "https://[2001:db8::1]/", want: "https://[2001:db8::1]/"},
		{name: "empty_is_refused", in: "", wantErr: link.ErrInvalidTarget},
		{name: "javascript_scheme_is_refused", in: "javascript:alert(1)", wantErr: link.ErrInvalidTarget},
		{name: "javascript_scheme_mixed_case_is_refused", in: "JaVaScRiPt:alert(1)", wantErr: link.ErrInvalidTarget},
		{name: "data_scheme_is_refused", in: "data:text/html;base64,PHNjcmlwdD4=", wantErr: link.ErrInvalidTarget},
		{name: "file_scheme_is_refused", in: "file:///etc/passwd", wantErr: link.ErrInvalidTarget},
		{name: "ftp_scheme_is_refused", in: "ftp://example.com/", wantErr: link.ErrInvalidTarget},
		{name: "relative_url_is_refused", in: "/just/a/path", wantErr: link.ErrInvalidTarget},
		{name: "scheme_relative_url_is_refused", in: "//example.com/", wantErr: link.ErrInvalidTarget},
		{name: "missing_host_is_refused", in: "https:///path", wantErr: link.ErrInvalidTarget},
		{name: "single_slash_is_refused", in: "https:/example.com", wantErr: link.ErrInvalidTarget},
		{name: "opaque_is_refused", in: "https:example.com", wantErr: link.ErrInvalidTarget},
		{name: "credentials_are_refused", in: "https://user:pass@example.com/", wantErr: link.ErrInvalidTarget},
		{name: "phishing_userinfo_is_refused", in: "https://bank.example@evil.example/", wantErr: link.ErrInvalidTarget},
		{name: "space_is_refused", in: "https://example.com/a b", wantErr: link.ErrInvalidTarget},
		{name: "newline_is_refused", in: "https://example.com/\r\nSet-Cookie: x", wantErr: link.ErrInvalidTarget},
		{name: "nul_is_refused", in: "https://example.com/\x00", wantErr: link.ErrInvalidTarget},
		{name: "no_break_space_is_refused", in: "https://example.com/?q=a\u00a0b", wantErr: link.ErrInvalidTarget},
		{name: "ideographic_space_is_refused", in: "https://example.com/?q=a\u3000b", wantErr: link.ErrInvalidTarget},
		{name: "em_space_in_path_is_refused", in: "https://example.com/a\u2003b", wantErr: link.ErrInvalidTarget},
		{name: "zero_width_space_is_refused", in: "https://example.com/?q=a\u200bb", wantErr: link.ErrInvalidTarget},
		{name: "byte_order_mark_is_refused", in: "https://example.com/?q=\ufeff", wantErr: link.ErrInvalidTarget},
		{name: "right_to_left_override_is_refused", in: "https://example.com/?q=\u202emoc.live", wantErr: link.ErrInvalidTarget},
		{name: "bidi_isolate_is_refused", in: "https://example.com/?q=\u2067x\u2069", wantErr: link.ErrInvalidTarget},
		{name: "non_ascii_letters_are_accepted", in: "https://example.com/?q=caf\u00e9", want: "https://example.com/?q=caf\u00e9"},
		{name: "invalid_utf8_is_refused", in: "https://example.com/\xff", wantErr: link.ErrInvalidTarget},
		{name: "bad_port_is_refused", in: "https://example.com:99999/", wantErr: link.ErrInvalidTarget},
		{name: "non_numeric_port_is_refused", in: "https://example.com:http/", wantErr: link.ErrInvalidTarget},
		{name: "empty_port_is_refused", in: "https://example.com:/", wantErr: link.ErrInvalidTarget},
		{name: "backslash_host_is_refused", in: "https://evil.example\\@good.example/", wantErr: link.ErrInvalidTarget},
		// Go's parser lets these through in a host; RFC 3986 does not.
		{name: "less_than_in_host_is_refused", in: "https://a<b.example/", wantErr: link.ErrInvalidTarget},
		{name: "greater_than_in_host_is_refused", in: "https://a>b.example/", wantErr: link.ErrInvalidTarget},
		{name: "quote_in_host_is_refused", in: "https://a\"b.example/", wantErr: link.ErrInvalidTarget},
		{name: "script_tag_host_is_refused", in: "https://<script>.example/", wantErr: link.ErrInvalidTarget},
		{name: "closing_bracket_in_host_is_refused", in: "https://a]b.example/", wantErr: link.ErrInvalidTarget},
		{name: "ipv6_zone_is_refused", in: "https://[fe80::1%25eth0]/", wantErr: link.ErrInvalidTarget},
		{name: "sub_delims_and_unreserved_in_host_are_accepted", in: "https://a-b_c~d!$&'()*+,;=e.example/", want: "https://a-b_c~d!$&'()*+,;=e.example/"},
		{name: "non_ascii_host_is_accepted", in: "https://B\u00fccher.example/", want: "https://b%C3%BCcher.example/"},
		{name: "ipv4_host_is_accepted", in: "http://192.0.2.1:8080/", want: "http://192.0.2.1:8080/"},
		{name: "too_long_is_refused", in: "https://example.com/" + strings.Repeat("a", link.MaxTargetLen), wantErr: link.ErrInvalidTarget},
		{name: "longest_allowed_is_accepted", in: "https://example.com/" + strings.Repeat("a", link.MaxTargetLen-20), want: "https://example.com/" + strings.Repeat("a", link.MaxTargetLen-20)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := link.ValidateTarget(tc.in)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("ValidateTarget(%q) = %q, %v; want error %v", tc.in, got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ValidateTarget(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestValidateCode(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		in      string
		wantErr error
	}{
		{name: "letters_digits_dash_underscore_are_accepted", in: "My-link_2"},
		{name: "shortest_is_accepted", in: "abc"},
		{name: "longest_is_accepted", in: strings.Repeat("x", link.MaxCodeLen)},
		{name: "too_short_is_refused", in: "ab", wantErr: link.ErrInvalidCode},
		{name: "too_long_is_refused", in: strings.Repeat("x", link.MaxCodeLen+1), wantErr: link.ErrInvalidCode},
		{name: "dot_is_refused", in: "a.b.c", wantErr: link.ErrInvalidCode},
		{name: "wildcard_is_refused", in: "abc*", wantErr: link.ErrInvalidCode},
		{name: "gt_is_refused", in: "abc>", wantErr: link.ErrInvalidCode},
		{name: "slash_is_refused", in: "ab/c", wantErr: link.ErrInvalidCode},
		{name: "unicode_is_refused", in: "äbc", wantErr: link.ErrInvalidCode},
		{name: "space_is_refused", in: "ab c", wantErr: link.ErrInvalidCode},
		{name: "reserved_api_is_refused", in: "api", wantErr: link.ErrReservedCode},
		{name: "reserved_is_case_insensitive", in: "HealthZ", wantErr: link.ErrReservedCode},
		{name: "reserved_metrics_is_refused", in: "metrics", wantErr: link.ErrReservedCode},
		{name: "reserved_static_is_refused", in: "static", wantErr: link.ErrReservedCode},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := link.ValidateCode(tc.in)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("ValidateCode(%q) = %v, want %v", tc.in, err, tc.wantErr)
			}
		})
	}
}

func TestNewCodeIsAValidCode(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 10000 {
		c := link.NewCode()
		if err := link.ValidateCode(c); err != nil {
			t.Fatalf("NewCode() = %q: %v", c, err)
		}
		if len(c) != link.GeneratedCodeLen {
			t.Fatalf("NewCode() = %q, want %d characters", c, link.GeneratedCodeLen)
		}
		if seen[c] {
			t.Fatalf("NewCode() repeated %q within 10000 draws", c)
		}
		seen[c] = true
	}
}

// FuzzValidateTarget checks the properties every accepted target has, on
// whatever input: the output is an absolute http(s) URL with a host and no
// credentials, within the length limit, and validating it again returns it
// unchanged. Seeds are in testdata/fuzz/FuzzValidateTarget and run in every
// `go test`.
func FuzzValidateTarget(f *testing.F) {
	for _, s := range []string{"https://example.com/", "javascript:alert(1)", "http://a:1/", "https://u@h/", "HTTP://X.Y/%zz"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		out, err := link.ValidateTarget(in)
		if err != nil {
			if !errors.Is(err, link.ErrInvalidTarget) {
				t.Fatalf("error %v does not wrap ErrInvalidTarget", err)
			}
			return
		}
		u, err := url.Parse(out)
		if err != nil {
			t.Fatalf("accepted %q, normalised to unparsable %q: %v", in, out, err)
		}
		if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || len(out) > link.MaxTargetLen {
			t.Fatalf("accepted %q as %q: scheme %q host %q user %v", in, out, u.Scheme, u.Host, u.User)
		}
		again, err := link.ValidateTarget(out)
		if err != nil || again != out {
			t.Fatalf("not idempotent: %q -> %q -> %q, %v", in, out, again, err)
		}
	})
}

// FuzzParseCode checks that every code a request path can carry past
// ParseCode is a safe NATS subject token, and that ValidateCode accepts a
// code only if ParseCode would find it again.
func FuzzParseCode(f *testing.F) {
	for _, s := range []string{"abc", "ab", "a.b", "api", "x>y", "ÄÖÜ", "abc_DEF-123"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		code, ok := link.ParseCode(in)
		if ok && (!events.ValidToken(code) || code != in) {
			t.Fatalf("ParseCode(%q) = %q, true: not a subject token", in, code)
		}
		if err := link.ValidateCode(in); err == nil && !ok {
			t.Fatalf("ValidateCode accepts %q but ParseCode refuses it", in)
		}
	})
}
