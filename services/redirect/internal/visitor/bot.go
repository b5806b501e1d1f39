package visitor

import (
	"strings"

	"github.com/maypok86/otter/v2"
	useragent "github.com/medama-io/go-useragent"
)

// parser is built once: go-useragent loads its trie at construction and then
// parses without allocating.
var parser = useragent.NewParser()

// IsBot labels a user agent as a bot, crawler, link unfurler or HTTP
// library, at the source. Bots are labelled, never dropped: readers decide
// what to count. go-useragent (medama-io, maintained for Medama analytics)
// knows the common crawlers, unfurlers (Slack, WhatsApp, Telegram, Twitter,
// Facebook) and libraries (curl, python-requests, Go-http-client); a short
// list of substrings catches the self-declared rest ("Discordbot/2.0").
// An empty user agent is a script, so it is a bot too.
//
// The answer depends on the string alone, and real traffic repeats a few
// thousand strings, so it is remembered for the user agents seen most
// (otter's W-TinyLFU keeps the frequent ones): a lookup costs a fraction
// of a parse. Bounded: memoSize strings of at most memoMaxLen bytes.
func IsBot(ua string) bool {
	if len(ua) > memoMaxLen {
		return parseIsBot(ua)
	}
	if bot, ok := memo.GetIfPresent(ua); ok {
		return bot
	}
	bot := parseIsBot(ua)
	memo.Set(strings.Clone(ua), bot) // not a view into a request's buffers
	return bot
}

const (
	memoSize   = 10_000
	memoMaxLen = 512
)

// memo is IsBot's memory of its answers (no expiry: an answer never
// changes, and without one otter runs no goroutine).
var memo = otter.Must(&otter.Options[string, bool]{MaximumSize: memoSize})

// parseIsBot is IsBot without the memo.
func parseIsBot(ua string) bool {
	if ua == "" {
		return true
	}
	if parser.Parse(ua).IsBot() {
		return true
	}
	return wordEndsInBot(ua) || containsFold(ua, "crawler") || containsFold(ua, "spider") ||
		containsFold(ua, "headless") || containsFold(ua, "preview")
}

// wordEndsInBot finds a word ending in "bot" ("Slackbot-LinkExpanding",
// "Discordbot/2.0", "Twitterbot"), except Cubot, a phone maker.
func wordEndsInBot(s string) bool {
	for i := 0; i+3 <= len(s); i++ {
		if lower(s[i]) != 'b' || lower(s[i+1]) != 'o' || lower(s[i+2]) != 't' {
			continue
		}
		if i+3 < len(s) && isLetter(s[i+3]) {
			continue // "bottle", "Botswana"
		}
		if i >= 2 && lower(s[i-2]) == 'c' && lower(s[i-1]) == 'u' && (i == 2 || !isLetter(s[i-3])) {
			continue
		}
		return true
	}
	return false
}

func isLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

// containsFold reports whether s contains sub (lowercase ASCII) ignoring
// ASCII case, without allocating.
func containsFold(s, sub string) bool {
	c0 := sub[0]
	for i := 0; i+len(sub) <= len(s); i++ {
		if lower(s[i]) != c0 {
			continue
		}
		j := 1
		for j < len(sub) && lower(s[i+j]) == sub[j] {
			j++
		}
		if j == len(sub) {
			return true
		}
	}
	return false
}

func lower(c byte) byte {
	if c >= 'A' && c <= 'Z' {
		return c + ('a' - 'A')
	}
	return c
}
