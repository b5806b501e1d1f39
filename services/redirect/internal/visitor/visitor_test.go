package visitor_test

import (
	"context"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/redirect/internal/visitor"
)

var servers *testenv.Servers

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &servers, testenv.WithRedis())) }

func TestAppendPrefix(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"203.0.113.77", "203.0.113.0/24"},
		{"::ffff:203.0.113.77", "203.0.113.0/24"},
		{"2001:db8:abcd:1234::1", "2001:db8:abcd::/48"},
		{"fe80::1%eth0", "fe80::/48"},
		{"", ""},
	}
	for _, tc := range tests {
		ip, _ := netip.ParseAddr(tc.in)
		if got := string(visitor.AppendPrefix(nil, ip)); got != tc.want {
			t.Errorf("AppendPrefix(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestCountry(t *testing.T) {
	t.Parallel()
	tests := map[string]string{"DE": "DE", "fr": "FR", "XX": "", "T1": "", "DEU": "", "": "", "d": "", "1A": "", "é": ""}
	for in, want := range tests {
		if got := visitor.Country(in); got != want {
			t.Errorf("Country(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestTruncateKeepsUTF8Whole(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		n    int
		want string
	}{
		{"hello", 10, "hello"}, {"hello", 3, "hel"}, {"häh", 2, "h"}, {"häh", 3, "hä"}, {"日本", 4, "日"},
	}
	for _, tc := range tests {
		if got := visitor.Truncate(tc.in, tc.n); got != tc.want {
			t.Errorf("Truncate(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

func TestIsBot(t *testing.T) {
	t.Parallel()
	tests := []struct {
		ua  string
		bot bool
	}{
		{"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36", false},
		{"Mozilla/5.0 (iPhone; CPU iPhone OS 17_4 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.4 Mobile/15E148 Safari/604.1", false},
		{"Mozilla/5.0 (Linux; Android 9; CUBOT X19) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/90.0 Mobile Safari/537.36", false},
		{"Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)", true},
		{"Slackbot-LinkExpanding 1.0 (+https://api.slack.com/robots)", true},
		{"Slackbot-LinkExpanding 1.0", true},
		{"Discordbot/2.0", true},
		{"facebookexternalhit/1.1", true},
		{"Twitterbot/1.0", true},
		{"WhatsApp/2.23.20.0", true},
		{"curl/8.4.0", true},
		{"python-requests/2.31.0", true},
		{"Go-http-client/1.1", true},
		{"Mozilla/5.0 (X11; Linux x86_64) HeadlessChrome/120.0.0.0", true},
		{"", true},
	}
	long := "Mozilla/5.0 (compatible; Examplebot/1.0; " + strings.Repeat("x", 600) + ")" // past the memo's length bound
	tests = append(tests, struct {
		ua  string
		bot bool
	}{long, true})
	// Twice each: the second answer comes from the memo (for all but the
	// long one), and must be the parse's.
	for range 2 {
		for _, tc := range tests {
			if got := visitor.IsBot(tc.ua); got != tc.bot {
				t.Errorf("IsBot(%q) = %v, want %v", tc.ua, got, tc.bot)
			}
			if got := visitor.ParseIsBot(tc.ua); got != tc.bot {
				t.Errorf("ParseIsBot(%q) = %v, want %v", tc.ua, got, tc.bot)
			}
		}
	}
}

// TestVisitorIdentityRotatesDailyAndIsShared: two instances on one Redis
// give the same identity for the same visitor on the same day (the salt is
// shared), another identity the next day (the salt rotates), and the salt
// expires within two days.
func TestVisitorIdentityRotatesDailyAndIsShared(t *testing.T) {
	t.Parallel()
	rdb, _ := servers.Redis.NewDB(t)
	a, b := visitor.NewIdentifier(rdb), visitor.NewIdentifier(rdb)
	ip := netip.MustParseAddr("203.0.113.7")
	day1 := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	id := func(v *visitor.Identifier, at time.Time, ip netip.Addr, ua string) string {
		t.Helper()
		out, err := v.AppendID(t.Context(), nil, at, ip, ua)
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	x := id(a, day1, ip, "UA")
	if len(x) != 32 {
		t.Fatalf("identity %q: want 32 hex characters", x)
	}
	if y := id(b, day1.Add(13*time.Hour), ip, "UA"); y != x {
		t.Fatalf("same visitor, same day, other instance: %s != %s", y, x)
	}
	if y := id(a, day1, ip, "UA2"); y == x {
		t.Fatal("another user agent gave the same identity")
	}
	if y := id(a, day1, netip.MustParseAddr("203.0.113.8"), "UA"); y == x {
		t.Fatal("another address gave the same identity")
	}
	if y := id(a, day1.Add(24*time.Hour), ip, "UA"); y == x {
		t.Fatal("the identity did not rotate the next day")
	}
	// Set at the salt's first use: it must outlive the day it salts, and be
	// gone within two days.
	ttl := rdb.TTL(t.Context(), visitor.SaltKey(day1)).Val()
	if ttl <= 24*time.Hour || ttl > 48*time.Hour {
		t.Fatalf("salt TTL %s, want (24h, 48h]", ttl)
	}
}

// TestNextDaysSaltIsFetchedAheadSoMidnightNeedsNoRedis: a click in the last
// hour of a UTC day makes the identifier fetch the next day's salt, so the
// first click after midnight gets its identity with Redis stopped, and the
// same identity another instance gets from the salt in Redis.
func TestNextDaysSaltIsFetchedAheadSoMidnightNeedsNoRedis(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	a := visitor.NewIdentifier(rdb)
	ip := netip.MustParseAddr("203.0.113.7")
	evening := time.Date(2026, 11, 30, 23, 10, 0, 0, time.UTC)
	midnight := evening.Truncate(24 * time.Hour).Add(24 * time.Hour)

	if _, err := a.AppendID(t.Context(), nil, evening.Add(-visitor.SaltAhead), ip, "UA"); err != nil {
		t.Fatal(err)
	}
	if got := a.AheadDay(); !got.IsZero() {
		t.Fatalf("a click before the last hour fetched the salt of %s ahead; want none yet", got)
	}
	if _, err := a.AppendID(t.Context(), nil, evening, ip, "UA"); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the next day's salt fetched ahead", func() bool { return a.AheadDay().Equal(midnight) })
	want, err := visitor.NewIdentifier(rdb).AppendID(t.Context(), nil, midnight.Add(time.Second), ip, "UA")
	if err != nil {
		t.Fatal(err)
	}

	srv.Stop()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	got, err := a.AppendID(ctx, nil, midnight.Add(time.Second), ip, "UA")
	if err != nil {
		t.Fatalf("first click after midnight with Redis stopped: %v; want the identity from the salt fetched ahead", err)
	}
	if string(got) != string(want) {
		t.Fatalf("identity after midnight %s; another instance got %s from the salt in Redis", got, want)
	}
}

// TestClicksWaitForOneSaltFetchNotAQueueOfThem: with Redis frozen, clicks
// that need a salt the identifier does not hold each wait for the one fetch
// under way or their own context, whichever ends first. (They used to take
// turns, each waiting for every earlier one's Redis timeout.)
func TestClicksWaitForOneSaltFetchNotAQueueOfThem(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	// A long read timeout, so a fetch that waits for Redis outlasts the
	// clicks' contexts by far.
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: 20 * time.Second})
	t.Cleanup(func() { _ = rdb.Close() })
	if err := rdb.Ping(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	id := visitor.NewIdentifier(rdb)
	srv.Pause()
	t.Cleanup(srv.Resume)

	const clicks, wait = 8, 200 * time.Millisecond
	took := make(chan time.Duration, clicks)
	for range clicks {
		go func() {
			ctx, cancel := context.WithTimeout(t.Context(), wait)
			defer cancel()
			start := time.Now()
			if _, err := id.AppendID(ctx, nil, time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC), netip.MustParseAddr("203.0.113.7"), "UA"); err == nil {
				t.Error("a click got an identity with Redis frozen and no salt held")
			}
			took <- time.Since(start)
		}()
	}
	for range clicks {
		// Far above the context's 200 ms for a loaded machine, far below
		// the 20 s a click waiting for another's fetch to time out takes.
		if d := <-took; d > 5*time.Second {
			t.Fatalf("a click waited %s for the salt with a context of %s", d, wait)
		}
	}

	srv.Resume()
	testenv.WaitFor(t, 30*time.Second, "an identity once Redis is back", func() bool {
		_, err := id.AppendID(t.Context(), nil, time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC), netip.MustParseAddr("203.0.113.7"), "UA")
		return err == nil
	})
}

// BenchmarkIsBot compares the answer from the memo (a user agent seen
// before, as most are) with the parse it saves.
func BenchmarkIsBot(b *testing.B) {
	ua := "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36"
	b.Run("memo", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			visitor.IsBot(ua)
		}
	})
	b.Run("parse", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			visitor.ParseIsBot(ua)
		}
	})
}
