package httpapi

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/snipdev/snip/services/redirect/internal/link"
)

// A target that leads back to this service makes a redirect loop (two links
// pointing at each other count a click per hop until the client gives up).
// Host names are only one spelling of an address: localhost, [::1],
// 127.0.0.1:08080, 0x7f.1, a DNS name that resolves to the server. So the
// check compares what the target resolves to, address and port, with where
// this service answers:
//
//   - the port the request came in on, at any loopback, unspecified or
//     local interface address (a service listening on :8080 answers
//     http://127.1:8080/ and http://[::ffff:127.0.0.1]:8080/ alike);
//   - the public URL's and the request Host's addresses and ports (behind a
//     proxy or load balancer, that is the way in).
//
// The public URL's host name is refused at any port (an http:// link to an
// https:// shortener comes back through its redirect to https), the request
// Host's at its port. A target whose name does not resolve (yet)
// is accepted: only what resolves now can be compared. A name that resolves
// to this service only later (DNS changes) is not caught; the loop then
// costs clicks, not correctness.

// DNS answers (and failures) are cached for a minute per name, so creating
// many links to one site costs one lookup.

// loopResolveTimeout bounds the DNS lookups of one check.
const loopResolveTimeout = 2 * time.Second

// checkLoop refuses targets that point back at this service.
func (a *API) checkLoop(c echo.Context, target string) error {
	u, err := url.Parse(target)
	if err != nil {
		return nil // ValidateTarget has refused it already
	}
	r := c.Request()
	ctx, cancel := context.WithTimeout(r.Context(), loopResolveTimeout)
	defer cancel()

	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	t := parseHostPort(u.Host, u.Scheme)
	ways := []hostPort{parseHostPort(r.Host, scheme)}
	if t.host == ways[0].host && t.port == ways[0].port {
		return fmt.Errorf("%w: it points at this shortener (%s)", link.ErrInvalidTarget, r.Host)
	}
	if a.PublicURL != "" {
		if pu, err := url.Parse(a.PublicURL); err == nil && pu.Host != "" {
			w := parseHostPort(pu.Host, pu.Scheme)
			if t.host == w.host { // the public name, at any port
				return fmt.Errorf("%w: it points at this shortener (%s)", link.ErrInvalidTarget, w.host)
			}
			ways = append(ways, w)
		}
	}
	if t.port == 0 {
		return nil
	}

	addrs := a.resolveCached(ctx, t.host)
	if len(addrs) == 0 {
		return nil
	}
	var local netip.AddrPort
	if la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		local, _ = netip.ParseAddrPort(la.String())
	}
	var ifaces []netip.Addr
	for _, ad := range addrs {
		if t.port == local.Port() {
			if ad.IsLoopback() || ad.IsUnspecified() || ad == local.Addr().Unmap() {
				return a.loop(u)
			}
			if ifaces == nil {
				ifaces = interfaceAddrs()
			}
			for _, ia := range ifaces {
				if ad == ia {
					return a.loop(u)
				}
			}
		}
		for _, w := range ways {
			if w.port != t.port {
				continue
			}
			for _, wa := range a.resolveCached(ctx, w.host) {
				if ad == wa {
					return a.loop(u)
				}
			}
		}
	}
	return nil
}

func (a *API) loop(u *url.URL) error {
	return fmt.Errorf("%w: %s leads back to this shortener (same address and port)", link.ErrInvalidTarget, u.Host)
}

// hostPort is a host name (lowercased, without a trailing dot or IPv6
// brackets) and a port (the scheme's default when none is given; 0 when
// unknown or not a port).
type hostPort struct {
	host string
	port uint16
}

func parseHostPort(hostport, scheme string) hostPort {
	host, port := hostport, ""
	if h, p, err := net.SplitHostPort(hostport); err == nil {
		host, port = h, p
	}
	host = strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	hp := hostPort{host: host}
	switch {
	case port != "":
		// Base 10 with leading zeros, as clients read it: ":08080" is 8080.
		if n, err := strconv.ParseUint(port, 10, 16); err == nil {
			hp.port = uint16(n)
		}
	case strings.EqualFold(scheme, "https"):
		hp.port = 443
	case strings.EqualFold(scheme, "http"):
		hp.port = 80
	}
	return hp
}

// resolve returns the addresses host names: an IP literal in any spelling a
// client accepts (IPv6, dotted IPv4, and the inet_aton forms 127.1,
// 2130706433, 0x7f.0.0.1, 0177.0.0.1), or what DNS answers. IPv4-mapped
// IPv6 addresses are returned as IPv4.
func resolve(ctx context.Context, host string) []netip.Addr {
	if host == "" {
		return nil
	}
	if a, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{a.Unmap()}
	}
	if a, ok := parseInetAton(host); ok {
		return []netip.Addr{a}
	}
	found, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil
	}
	out := make([]netip.Addr, len(found))
	for i, a := range found {
		out[i] = a.Unmap()
	}
	return out
}

// parseInetAton reads an IPv4 address as inet_aton does (and so curl and
// browsers): one to four parts, each decimal, octal (leading 0) or hex
// (leading 0x); the last part fills the bytes that remain.
func parseInetAton(s string) (netip.Addr, bool) {
	parts := strings.Split(s, ".")
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	vals := make([]uint64, len(parts))
	for i, p := range parts {
		if p == "" {
			return netip.Addr{}, false
		}
		base := 10
		switch {
		case len(p) > 2 && (p[:2] == "0x" || p[:2] == "0X"):
			p, base = p[2:], 16
		case len(p) > 1 && p[0] == '0':
			p, base = p[1:], 8
		}
		v, err := strconv.ParseUint(p, base, 32)
		if err != nil {
			return netip.Addr{}, false
		}
		vals[i] = v
	}
	var ip uint64
	for i, v := range vals[:len(vals)-1] {
		if v > 0xff {
			return netip.Addr{}, false
		}
		ip |= v << (24 - 8*i)
	}
	last := vals[len(vals)-1]
	if last >= 1<<(8*(5-len(vals))) {
		return netip.Addr{}, false
	}
	ip |= last
	return netip.AddrFrom4([4]byte{byte(ip >> 24), byte(ip >> 16), byte(ip >> 8), byte(ip)}), true
}

// resolveCache remembers what names resolved to (or that they did not) for
// a minute, so creating many links to one site costs one lookup, not one
// each. Bounded: when full it starts afresh.
type resolveCache struct {
	mu      sync.Mutex
	entries map[string]resolved
}

type resolved struct {
	addrs   []netip.Addr
	expires time.Time
}

const (
	resolveCacheTTL  = time.Minute
	resolveCacheSize = 4096
)

func (a *API) resolveCached(ctx context.Context, host string) []netip.Addr {
	if _, err := netip.ParseAddr(host); err == nil || host == "" {
		return resolve(ctx, host) // literals cost nothing
	}
	a.resolvedOnce.Do(func() { a.resolved = &resolveCache{entries: map[string]resolved{}} })
	c, now := a.resolved, time.Now()
	c.mu.Lock()
	e, ok := c.entries[host]
	c.mu.Unlock()
	if ok && now.Before(e.expires) {
		return e.addrs
	}
	addrs := resolve(ctx, host)
	if ctx.Err() != nil {
		return addrs // a lookup cut short says nothing about the name
	}
	c.mu.Lock()
	if len(c.entries) >= resolveCacheSize {
		clear(c.entries)
	}
	c.entries[host] = resolved{addrs: addrs, expires: now.Add(resolveCacheTTL)}
	c.mu.Unlock()
	return addrs
}

// interfaceAddrs are this machine's addresses.
func interfaceAddrs() []netip.Addr {
	as, err := net.InterfaceAddrs()
	if err != nil {
		return []netip.Addr{}
	}
	out := make([]netip.Addr, 0, len(as))
	for _, a := range as {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, p.Addr().Unmap())
		}
	}
	return out
}
