// Package visitor turns a request into the anonymised visitor fields of a
// click: the network prefix of the client address, a visitor identity that
// cannot be turned back into an address, the bot label, the country from an
// edge header, and bounded user agent and referrer. The country header, like
// the user agent and the referrer, is taken as the request carries it: a
// client that reaches the redirect directly can claim any country, so an
// edge in front (Cloudflare sets CF-IPCountry) should overwrite it.
//
// The identity is HMAC-SHA256(salt of the day, IP || 0 || user agent),
// truncated to 128 bits. The salt is 32 random bytes created by whichever
// instance first needs it that day (SET NX, so all instances share it) and
// expires after two days (Plausible's scheme): yesterday's identities cannot
// be linked to today's, and once a salt is gone no identity made with it can
// be recomputed from an address, even by us. Nothing derives the salt from a
// fixed secret.
//
// A click cannot be recorded without its day's salt, so the salt is never
// fetched at the moment it is first needed if that can be helped: in the
// last hour of a UTC day (SaltAhead) the first click starts fetching the
// next day's salt in the background, and at midnight every instance already
// holds it. Redis down or frozen across midnight then costs no click. Only an
// instance that could not reach Redis during that whole hour (or started
// after midnight with Redis away) needs Redis for its first click of a day;
// one fetch at a time goes to Redis, and every click waiting for it waits at
// most for that one fetch or its own context, not for a queue of them.
package visitor

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"
)

// SaltTTL is how long a day's salt lives in Redis: long enough to cover the
// whole day in every time zone's clock skew, short enough that it is gone a
// day later.
const SaltTTL = 48 * time.Hour

// SaltKey is the Redis key of the salt of a UTC day.
func SaltKey(day time.Time) string { return "snip:visitor:salt:" + day.UTC().Format(time.DateOnly) }

// SaltAhead is how long before a UTC day begins its salt is fetched.
const SaltAhead = time.Hour

// Identifier computes visitor identities with the daily salt.
type Identifier struct {
	rdb redis.UniversalClient
	cur atomic.Pointer[daySalt]
	// next is the following day's salt once fetched ahead (SaltAhead).
	next atomic.Pointer[daySalt]
	// aheadAt is the earliest click time (Unix seconds) at which another
	// ahead fetch may begin: aheadRetry after the last one began, which
	// bounds them to one at a time (a fetch ends within saltTimeout) and
	// spaces the retries of one that failed.
	aheadAt atomic.Int64

	mu       sync.Mutex // guards inflight
	inflight *saltFetch // the fetch of the current day's salt under way, if any
}

// saltFetch is one fetch of a day's salt; done closes when ds or err is set.
type saltFetch struct {
	day  int64
	done chan struct{}
	ds   *daySalt
	err  error
}

// saltTimeout bounds one salt fetch (SET NX and GET) when the caller's
// context does not: clicks wait for at most one such fetch.
const saltTimeout = 5 * time.Second

// aheadRetry is how long after an ahead fetch began the next may begin
// (longer than saltTimeout, so two never run at once).
const aheadRetry = time.Minute

type daySalt struct {
	day  int64     // Unix day number
	pool sync.Pool // of *hasher
}

// hasher is a keyed HMAC with its scratch space, pooled so that computing
// an identity allocates nothing.
type hasher struct {
	h   hash.Hash
	buf []byte
	sum [sha256.Size]byte
}

// NewIdentifier returns an identifier that keeps its salts in rdb.
func NewIdentifier(rdb redis.UniversalClient) *Identifier { return &Identifier{rdb: rdb} }

// AppendID appends the 32 hex characters of the visitor identity of (ip, ua)
// at time now to dst.
func (id *Identifier) AppendID(ctx context.Context, dst []byte, now time.Time, ip netip.Addr, ua string) ([]byte, error) {
	sec := now.Unix()
	day := sec / 86400
	ds := id.cur.Load()
	if ds == nil || ds.day != day {
		var err error
		if ds, err = id.salt(ctx, day); err != nil {
			return dst, err
		}
	}
	if sec%86400 >= 86400-int64(SaltAhead/time.Second) {
		id.fetchAhead(day+1, sec)
	}
	hs := ds.pool.Get().(*hasher)
	a := ip.As16()
	hs.buf = append(append(append(hs.buf[:0], a[:]...), 0), ua...)
	hs.h.Reset()
	_, _ = hs.h.Write(hs.buf)
	s := hs.h.Sum(hs.sum[:0])
	dst = hex.AppendEncode(dst, s[:16])
	ds.pool.Put(hs)
	return dst, nil
}

// salt returns the salt of day: the next day's fetched ahead, or one fetch
// from Redis shared by every caller that needs it meanwhile. A caller waits
// for that fetch or for its own ctx, whichever ends first.
func (id *Identifier) salt(ctx context.Context, day int64) (*daySalt, error) {
	if ds := id.next.Load(); ds != nil && ds.day == day {
		id.promote(ds)
		return ds, nil
	}
	id.mu.Lock()
	if ds := id.cur.Load(); ds != nil && ds.day == day {
		id.mu.Unlock()
		return ds, nil
	}
	f := id.inflight
	if f == nil || f.day != day {
		f = &saltFetch{day: day, done: make(chan struct{})}
		id.inflight = f
		go id.fetch(f)
	}
	id.mu.Unlock()
	select {
	case <-f.done:
		return f.ds, f.err
	case <-ctx.Done():
		return nil, fmt.Errorf("visitor salt: %w", ctx.Err())
	}
}

// fetch runs f: the day's salt from Redis, made the current one on
// success. A failed fetch is forgotten, so the next click tries again.
func (id *Identifier) fetch(f *saltFetch) {
	ctx, cancel := context.WithTimeout(context.Background(), saltTimeout)
	defer cancel()
	f.ds, f.err = id.load(ctx, f.day)
	id.mu.Lock()
	if f.err == nil {
		id.promote(f.ds)
	}
	if id.inflight == f {
		id.inflight = nil
	}
	id.mu.Unlock()
	close(f.done)
}

// promote makes ds the current salt unless a later day's is. (A click
// stamped just before midnight may come after one stamped just after: it
// gets its own day's salt but does not make it current again.)
func (id *Identifier) promote(ds *daySalt) {
	for {
		cur := id.cur.Load()
		if cur != nil && cur.day >= ds.day {
			return
		}
		if id.cur.CompareAndSwap(cur, ds) {
			return
		}
	}
}

// fetchAhead starts fetching the salt of day (the next one) in the
// background unless it is held, or a fetch began less than aheadRetry ago
// (sec is the clicks' clock, Unix seconds).
func (id *Identifier) fetchAhead(day, sec int64) {
	if ds := id.next.Load(); ds != nil && ds.day == day {
		return
	}
	at := id.aheadAt.Load()
	if sec < at || !id.aheadAt.CompareAndSwap(at, sec+int64(aheadRetry/time.Second)) {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), saltTimeout)
		defer cancel()
		if ds, err := id.load(ctx, day); err == nil {
			id.next.Store(ds)
		}
	}()
}

// load reads the salt of day from Redis, creating it if no instance has.
func (id *Identifier) load(ctx context.Context, day int64) (*daySalt, error) {
	key := SaltKey(time.Unix(day*86400, 0))
	var fresh [32]byte
	_, _ = rand.Read(fresh[:])
	// SET NX GET would do it in one call, but needs Redis 7; two calls are
	// as safe: whoever wins SET NX, everyone reads the winner's salt.
	if err := id.rdb.SetNX(ctx, key, hex.EncodeToString(fresh[:]), SaltTTL).Err(); err != nil {
		return nil, fmt.Errorf("visitor salt: %w", err)
	}
	v, err := id.rdb.Get(ctx, key).Result()
	if err != nil {
		return nil, fmt.Errorf("visitor salt: %w", err)
	}
	key2, err := hex.DecodeString(v)
	if err != nil || len(key2) < 16 {
		return nil, fmt.Errorf("visitor salt %s is malformed", key)
	}
	ds := &daySalt{day: day}
	ds.pool.New = func() any { return &hasher{h: hmac.New(sha256.New, key2), buf: make([]byte, 0, 256)} }
	return ds, nil
}

// AppendPrefix appends the anonymised network of ip: /24 for IPv4 (and
// IPv4-mapped IPv6), /48 for IPv6, e.g. "203.0.113.0/24". An invalid address
// appends nothing.
func AppendPrefix(dst []byte, ip netip.Addr) []byte {
	if !ip.IsValid() {
		return dst
	}
	ip = ip.Unmap()
	bits := 48
	if ip.Is4() {
		bits = 24
	}
	p, err := ip.WithZone("").Prefix(bits)
	if err != nil {
		return dst
	}
	return p.AppendTo(dst)
}

// Country returns an ISO 3166-1 alpha-2 code from an edge header value
// (CF-IPCountry, X-Country), uppercased, or "" unless it is exactly two
// ASCII letters (Cloudflare's "XX" and "T1" stay out: T1 has a digit, and
// XX means unknown).
func Country(v string) string {
	if len(v) != 2 {
		return ""
	}
	a, b := upper(v[0]), upper(v[1])
	if a < 'A' || a > 'Z' || b < 'A' || b > 'Z' || (a == 'X' && b == 'X') {
		return ""
	}
	if a == v[0] && b == v[1] {
		return v
	}
	return string([]byte{a, b})
}

func upper(c byte) byte {
	if c >= 'a' && c <= 'z' {
		return c - ('a' - 'A')
	}
	return c
}

// Truncate shortens s to at most n bytes without splitting a UTF-8
// sequence.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
