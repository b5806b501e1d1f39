package oracle

import (
	"net/url"
	"strings"
)

// The names the counter's stats API gives a click's country and referrer
// (the counter's documented dimensions, repeated here so the oracle reads
// the API as any owner would, not the counter's code).
const (
	unknownCountry  = "unknown"
	directReferrer  = "(direct)"
	unknownReferrer = "(unknown)"
)

// countryDim is the country a click is counted under: its ISO code, upper
// case, or "unknown" without one.
func countryDim(country string) string {
	if len(country) != 2 {
		return unknownCountry
	}
	return strings.ToUpper(country)
}

// referrerDim is the referrer a click is counted under: the Referer's host,
// lower case, without port or a leading "www.", "(direct)" without a
// Referer and "(unknown)" for one without a host.
func referrerDim(referrer string) string {
	if referrer == "" {
		return directReferrer
	}
	u, err := url.Parse(referrer)
	if err != nil || u.Hostname() == "" {
		return unknownReferrer
	}
	h := strings.TrimPrefix(strings.ToLower(u.Hostname()), "www.")
	if h == "" {
		return unknownReferrer
	}
	return h
}

// add counts one click, bot or human, under k: a name, an hour or a day.
func add[K comparable](m map[K]Pair, k K, bot bool) {
	p := m[k]
	if bot {
		p.Bot++
	} else {
		p.Human++
	}
	m[k] = p
}
