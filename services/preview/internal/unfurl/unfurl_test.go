package unfurl_test

import (
	"errors"
	"io"
	"net/url"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/text/encoding"
	"golang.org/x/text/encoding/charmap"
	"golang.org/x/text/encoding/japanese"

	"github.com/snipdev/snip/services/preview/internal/unfurl"
)

func encode(t *testing.T, e encoding.Encoding, s string) string {
	t.Helper()
	b, err := e.NewEncoder().String(s)
	if err != nil {
		t.Fatalf("encode %q: %v", s, err)
	}
	return b
}

func TestParse(t *testing.T) {
	t.Parallel()
	const ru = "Привет, мир"
	const ja = "こんにちは世界"
	tests := []struct {
		name        string
		page        string
		contentType string
		url         string
		want        unfurl.Preview
	}{
		{
			name: "open_graph_wins",
			page: `<html><head><title>Plain</title>
				<meta name="description" content="plain desc">
				<meta name="twitter:title" content="Tweet title">
				<meta property="og:title" content="OG title">
				<meta property="og:description" content="OG desc">
				<meta property="og:image" content="https://cdn.example.com/a.png">
				<meta name="twitter:image" content="https://cdn.example.com/t.png">
				<meta property="og:site_name" content="Example">
				</head><body></body></html>`,
			want: unfurl.Preview{Title: "OG title", Description: "OG desc", Image: "https://cdn.example.com/a.png", SiteName: "Example"},
		},
		{
			name: "twitter_card_second",
			page: `<head><title>Plain</title><meta name="twitter:title" content="Tweet title">
				<meta name="twitter:description" content="Tweet desc"><meta name="twitter:image:src" content="/t.png"></head>`,
			want: unfurl.Preview{Title: "Tweet title", Description: "Tweet desc", Image: "https://example.com/t.png"},
		},
		{
			name: "title_and_meta_description_last",
			page: `<!doctype html><html><head><title>  A &amp; B
				</title><meta name="Description" content="  spaced   out  "><meta name="application-name" content="App"></head></html>`,
			want: unfurl.Preview{Title: "A & B", Description: "spaced out", SiteName: "App"},
		},
		{
			name: "relative_image_resolves_against_the_final_url",
			page: `<head><meta property="og:image" content="../img/x.png?a=1&amp;b=2"></head>`,
			url:  "https://example.com/blog/post/",
			want: unfurl.Preview{Image: "https://example.com/blog/img/x.png?a=1&b=2"},
		},
		{
			name: "base_href_changes_the_base",
			page: `<head><base href="https://static.example.net/assets/"><meta property="og:image" content="x.png"></head>`,
			want: unfurl.Preview{Image: "https://static.example.net/assets/x.png"},
		},
		{
			name: "protocol_relative_image",
			page: `<head><meta property="og:image" content="//cdn.example.com/x.png"></head>`,
			url:  "http://example.com/",
			want: unfurl.Preview{Image: "http://cdn.example.com/x.png"},
		},
		{
			name: "data_and_javascript_images_are_dropped_for_the_next_candidate",
			page: `<head><meta property="og:image" content="data:image/png;base64,AAAA">
				<meta property="og:image:url" content="javascript:alert(1)"><link rel="image_src" href="/fallback.png"></head>`,
			want: unfurl.Preview{Image: "https://example.com/fallback.png"},
		},
		{
			name: "uppercase_tags_and_og_in_name_attribute",
			page: `<HEAD><META NAME="OG:TITLE" CONTENT="Shouting"><TITLE>quiet</TITLE></HEAD>`,
			want: unfurl.Preview{Title: "Shouting"},
		},
		{
			name:        "windows_1251_declared_in_header",
			page:        encode(t, charmap.Windows1251, `<head><title>`+ru+`</title></head>`),
			contentType: "text/html; charset=windows-1251",
			want:        unfurl.Preview{Title: ru},
		},
		{
			name:        "windows_1251_declared_in_meta_charset",
			page:        encode(t, charmap.Windows1251, `<head><meta charset="windows-1251"><title>`+ru+`</title></head>`),
			contentType: "text/html",
			want:        unfurl.Preview{Title: ru},
		},
		{
			name:        "windows_1251_declared_in_http_equiv",
			page:        encode(t, charmap.Windows1251, `<head><meta http-equiv="Content-Type" content="text/html; charset=windows-1251"><meta name="description" content="`+ru+`"></head>`),
			contentType: "text/html",
			want:        unfurl.Preview{Description: ru},
		},
		{
			name:        "header_charset_wins_over_a_wrong_meta",
			page:        encode(t, charmap.Windows1251, `<head><meta charset="utf-8"><title>`+ru+`</title></head>`),
			contentType: "text/html; charset=cp1251",
			want:        unfurl.Preview{Title: ru},
		},
		{
			name:        "shift_jis_in_meta",
			page:        encode(t, japanese.ShiftJIS, `<head><meta charset="shift_jis"><title>`+ja+`</title></head>`),
			contentType: "text/html",
			want:        unfurl.Preview{Title: ja},
		},
		{
			name:        "undeclared_utf8_is_detected",
			page:        `<head><title>` + ru + `</title></head>`,
			contentType: "text/html",
			want:        unfurl.Preview{Title: ru},
		},
		{
			name:        "undeclared_8bit_is_windows_1252",
			page:        "<head><title>caf\xe9</title></head>",
			contentType: "text/html",
			want:        unfurl.Preview{Title: "café"},
		},
		{
			name:        "unknown_charset_label_falls_back_to_detection",
			page:        `<head><title>` + ru + `</title></head>`,
			contentType: "text/html; charset=klingon",
			want:        unfurl.Preview{Title: ru},
		},
		{
			name: "utf8_bom",
			page: "\xef\xbb\xbf<head><title>" + ru + "</title></head>",
			want: unfurl.Preview{Title: ru},
		},
		{
			name: "malformed_markup_still_yields_what_is_there",
			page: `<html><head><title>Broken<meta property="og:description" content="unclosed`,
			want: unfurl.Preview{Title: "Broken<meta property=\"og:description\" content=\"unclosed"},
		},
		{
			name: "unclosed_attribute_quote",
			page: `<head><meta property="og:title" content="Fine"><meta name="description" content="never ends`,
			want: unfurl.Preview{Title: "Fine"},
		},
		{
			name: "svg_title_in_head_is_not_the_document_title",
			page: `<head><svg><title>icon</title></svg><title>Real</title></head>`,
			want: unfurl.Preview{Title: "Real"},
		},
		{
			name: "nothing_after_the_head_is_read",
			page: `<head><title>Head</title></head><body><meta property="og:title" content="Body"><svg><title>x</title></svg>`,
			want: unfurl.Preview{Title: "Head"},
		},
		{
			name: "scripts_in_the_head_are_skipped_whole",
			page: `<head><script>var s = "</head><body><title>no</title>";</script><title>Yes</title></head>`,
			want: unfurl.Preview{Title: "Yes"},
		},
		{
			name: "control_characters_and_invalid_bytes_are_cleaned",
			page: "<head><meta charset=utf-8><title>a\x01b\xffc</title></head>",
			want: unfurl.Preview{Title: "ab\uFFFDc"},
		},
		{
			name: "long_title_is_truncated",
			page: `<head><title>` + strings.Repeat("я", 400) + `</title></head>`,
			want: unfurl.Preview{Title: strings.Repeat("я", unfurl.MaxTitle)},
		},
		{
			name: "long_description_and_site_name_are_truncated",
			page: `<head><meta name="description" content="` + strings.Repeat("д", 1500) + `"><meta property="og:site_name" content="` + strings.Repeat("s", 500) + `"></head>`,
			want: unfurl.Preview{Description: strings.Repeat("д", unfurl.MaxDescription), SiteName: strings.Repeat("s", unfurl.MaxSiteName)},
		},
		{
			name: "overlong_or_credentialed_images_are_dropped_for_the_next_candidate",
			page: `<head><meta property="og:image" content="https://cdn.example.com/` + strings.Repeat("i", 2100) + `.png">
				<meta property="og:image:url" content="https://user:pw@cdn.example.com/a.png"><meta name="twitter:image" content="/ok.png"></head>`,
			want: unfurl.Preview{Image: "https://example.com/ok.png"},
		},
		{
			name: "empty_document",
			page: ``,
			want: unfurl.Preview{},
		},
		{
			name: "not_html_at_all",
			page: "\x00\x01\x02binary garbage",
			want: unfurl.Preview{},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			u := tc.url
			if u == "" {
				u = "https://example.com/page"
			}
			base, _ := url.Parse(u)
			ct := tc.contentType
			if ct == "" {
				ct = "text/html"
			}
			got, err := unfurl.Parse(strings.NewReader(tc.page), ct, base)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Fatalf("preview (-want +got):\n%s", d)
			}
		})
	}
}

type failingReader struct {
	data string
	err  error
}

func (f *failingReader) Read(p []byte) (int, error) {
	if f.data == "" {
		return 0, f.err
	}
	n := copy(p, f.data)
	f.data = f.data[n:]
	return n, nil
}

func TestParseReportsReadErrors(t *testing.T) {
	t.Parallel()
	boom := errors.New("connection reset")
	tests := []struct {
		name string
		data string
	}{
		{"before_the_first_kilobyte", "<head><title>x"},
		{"after_the_first_kilobyte", "<head>" + strings.Repeat("<!-- pad -->", 200) + "<title>x"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := unfurl.Parse(&failingReader{data: tc.data, err: boom}, "text/html", nil)
			if !errors.Is(err, boom) {
				t.Fatalf("Parse = %v, want the read error", err)
			}
		})
	}
}

var _ io.Reader = (*failingReader)(nil)
