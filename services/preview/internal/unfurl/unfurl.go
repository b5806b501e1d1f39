// Package unfurl reads the head of an HTML page and extracts what a link
// preview shows: title, description, image and site name.
//
// Open Graph (og:*) tags come first, Twitter card tags (twitter:*) second,
// and the plain <title> and <meta name="description"> last, which is the
// order link unfurlers (Slack, Discord, Dub, Shlink) use. The page's bytes are
// decoded with the charset the HTML standard's algorithm finds (byte order
// mark, Content-Type header, <meta charset> or http-equiv in the first 1024
// bytes, then UTF-8 detection, then windows-1252), so a page in windows-1251
// or Shift_JIS yields readable text. Parsing stops at </head> or <body>, so
// only the head of a page is ever decoded.
package unfurl

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"unicode/utf8"

	"golang.org/x/net/html"
	"golang.org/x/net/html/charset"
	"golang.org/x/text/transform"
)

// Limits on what is kept, in runes (bytes for Image). Pages put whole
// articles in descriptions; a preview shows a line or two.
const (
	MaxTitle       = 300
	MaxDescription = 1000
	MaxSiteName    = 200
	MaxImageURL    = 2048
)

// Preview is what a link preview shows. Empty fields were not found.
type Preview struct {
	Title       string
	Description string
	// Image is an absolute http(s) URL.
	Image    string
	SiteName string
}

// Parse reads an HTML document from r. contentType is the response's
// Content-Type header (its charset parameter is honoured); docURL is where
// the document was fetched from (after redirects), against which relative
// image URLs resolve. It returns an error only when reading r fails.
func Parse(r io.Reader, contentType string, docURL *url.URL) (Preview, error) {
	br := bufio.NewReaderSize(r, 1024)
	head, err := br.Peek(1024)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, bufio.ErrBufferFull) {
		return Preview{}, fmt.Errorf("read page: %w", err)
	}
	enc, _, _ := charset.DetermineEncoding(head, contentType)
	z := html.NewTokenizer(transform.NewReader(br, enc.NewDecoder()))
	d := doc{meta: map[string]string{}}
	if err := d.scan(z); err != nil {
		return Preview{}, fmt.Errorf("read page: %w", err)
	}
	return d.preview(docURL), nil
}

type doc struct {
	meta     map[string]string // lowercased property/name -> first content
	title    string
	hasTitle bool
	base     string
	imageSrc string // <link rel="image_src">
}

// scan walks the tokens of the head. Foreign content (<svg>, <math>) has its
// own <title> elements, which are not the document's.
func (d *doc) scan(z *html.Tokenizer) error {
	foreign := 0
	for {
		tt := z.Next()
		switch tt {
		case html.ErrorToken:
			if errors.Is(z.Err(), io.EOF) {
				return nil
			}
			return z.Err()
		case html.EndTagToken:
			name, _ := z.TagName()
			switch string(name) {
			case "head":
				return nil
			case "svg", "math":
				if foreign > 0 {
					foreign--
				}
			}
		case html.StartTagToken, html.SelfClosingTagToken:
			name, hasAttr := z.TagName()
			attrs := map[string]string{}
			for hasAttr {
				var k, v []byte
				k, v, hasAttr = z.TagAttr()
				key := string(k) // the tokenizer lowercases attribute names
				if _, dup := attrs[key]; !dup {
					attrs[key] = string(v)
				}
			}
			switch string(name) {
			case "body":
				return nil
			case "svg", "math":
				if tt == html.StartTagToken {
					foreign++
				}
			case "meta":
				d.addMeta(attrs)
			case "base":
				if d.base == "" {
					d.base = attrs["href"]
				}
			case "link":
				if d.imageSrc == "" && hasToken(attrs["rel"], "image_src") {
					d.imageSrc = attrs["href"]
				}
			case "title":
				if foreign == 0 && tt == html.StartTagToken && !d.hasTitle {
					// <title> is raw text: the next token is all of it.
					if z.Next() == html.TextToken {
						d.title = string(z.Text())
					}
					d.hasTitle = true
				}
			}
		}
	}
}

func (d *doc) addMeta(attrs map[string]string) {
	content, ok := attrs["content"]
	if !ok {
		return
	}
	for _, k := range []string{"property", "name", "itemprop"} {
		if key := strings.ToLower(strings.TrimSpace(attrs[k])); key != "" {
			if _, seen := d.meta[key]; !seen && strings.TrimSpace(content) != "" {
				d.meta[key] = content
			}
		}
	}
}

func (d *doc) first(keys ...string) string {
	for _, k := range keys {
		if v := clean(d.meta[k]); v != "" {
			return v
		}
	}
	return ""
}

func (d *doc) preview(docURL *url.URL) Preview {
	title := d.first("og:title", "twitter:title")
	if title == "" {
		title = clean(d.title)
	}
	base := docURL
	if d.base != "" && docURL != nil {
		if b, err := docURL.Parse(strings.TrimSpace(d.base)); err == nil && (b.Scheme == "http" || b.Scheme == "https") {
			base = b
		}
	}
	image := ""
	for _, raw := range []string{
		d.meta["og:image"], d.meta["og:image:url"], d.meta["og:image:secure_url"],
		d.meta["twitter:image"], d.meta["twitter:image:src"], d.imageSrc,
	} {
		if image = absolute(base, raw); image != "" {
			break
		}
	}
	return Preview{
		Title:       truncate(title, MaxTitle),
		Description: truncate(d.first("og:description", "twitter:description", "description"), MaxDescription),
		Image:       image,
		SiteName:    truncate(d.first("og:site_name", "application-name"), MaxSiteName),
	}
}

// absolute resolves ref against base and keeps it only if it is an http(s)
// URL of sensible length: data: and javascript: images are dropped.
func absolute(base *url.URL, ref string) string {
	ref = strings.TrimSpace(ref)
	if ref == "" {
		return ""
	}
	u, err := url.Parse(ref)
	if err != nil {
		return ""
	}
	if base != nil {
		u = base.ResolveReference(u)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
		return ""
	}
	s := u.String()
	if len(s) > MaxImageURL {
		return ""
	}
	return s
}

// clean makes text displayable: valid UTF-8, whitespace runs collapsed to
// one space, no control characters.
func clean(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.Map(func(r rune) rune {
		if r < ' ' && r != '\t' && r != '\n' && r != '\r' {
			return -1
		}
		return r
	}, s)
	return strings.Join(strings.Fields(s), " ")
}

func truncate(s string, runes int) string {
	if utf8.RuneCountInString(s) <= runes {
		return s
	}
	i := 0
	for n := 0; n < runes; n++ {
		_, size := utf8.DecodeRuneInString(s[i:])
		i += size
	}
	return strings.TrimSpace(s[:i])
}

func hasToken(list, token string) bool {
	for _, f := range strings.Fields(strings.ToLower(list)) {
		if f == token {
			return true
		}
	}
	return false
}
