// Package netguard keeps outbound HTTP requests that a user chose the target
// of (a link preview, an owner's webhook endpoint) from becoming a way into
// the network Snip runs in (server-side request forgery).
//
// The decision is taken on the address actually being connected to, at dial
// time: Dialer resolves the host itself and a net.Dialer Control function
// checks every resolved address against a Policy after resolution and
// before connect(2). A name checked when an endpoint was created may resolve
// elsewhere when it is used (DNS rebinding, or a record changed since), so a
// check on the name alone would protect nothing. CheckHost is the early,
// friendly check (for a clear error at creation time); the dial check is
// the one that protects.
//
// Policy refuses everything that is not the public internet, including IPv6
// forms that carry a private IPv4 address: IPv4-mapped (::ffff:0:0/96),
// IPv4-compatible (::/96, deprecated), IPv4-translated (::ffff:0:0:0/96),
// NAT64 (64:ff9b::/96) and 6to4 (2002::/16).
package netguard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"
)

// Expected failures. Both are permanent: asking again gives the same answer
// (until DNS changes).
var (
	// ErrRefused: the host is or resolves to an address the policy refuses
	// (private, loopback, link-local, metadata, ...). No connection was made.
	ErrRefused = errors.New("address refused")
	// ErrNoSuchHost: DNS says the host does not exist.
	ErrNoSuchHost = errors.New("no such host")
)

// blocked are the ranges an outbound request must never connect to:
// everything that is not the public internet (IANA's special-purpose
// registries, RFC 6890 and successors), which is where internal services and
// cloud metadata endpoints live.
var blocked = mustPrefixes(
	// IPv4
	"0.0.0.0/8",       // "this network", incl. the unspecified 0.0.0.0
	"10.0.0.0/8",      // private
	"100.64.0.0/10",   // carrier-grade NAT (also Alibaba's metadata 100.100.100.200)
	"127.0.0.0/8",     // loopback
	"169.254.0.0/16",  // link-local (cloud metadata 169.254.169.254)
	"172.16.0.0/12",   // private
	"192.0.0.0/24",    // IETF protocol assignments (Oracle metadata 192.0.0.192)
	"192.0.2.0/24",    // TEST-NET-1
	"192.88.99.0/24",  // 6to4 relay anycast
	"192.168.0.0/16",  // private
	"198.18.0.0/15",   // benchmarking
	"198.51.100.0/24", // TEST-NET-2
	"203.0.113.0/24",  // TEST-NET-3
	"224.0.0.0/4",     // multicast
	"240.0.0.0/4",     // reserved, incl. broadcast 255.255.255.255
	// IPv6
	"::/96",           // unspecified, loopback, and IPv4-compatible ::a.b.c.d (deprecated; some stacks route them to the IPv4 address)
	"::ffff:0:0/96",   // IPv4-mapped (unmapped and checked as IPv4 before this list)
	"::ffff:0:0:0/96", // IPv4-translated (SIIT)
	"64:ff9b:1::/48",  // local-use NAT64
	"100::/64",        // discard-only
	"2001::/23",       // IETF protocol assignments, incl. Teredo 2001::/32
	"2001:db8::/32",   // documentation
	"fc00::/7",        // unique local (AWS metadata fd00:ec2::254)
	"fe80::/10",       // link-local
	"fec0::/10",       // site-local (deprecated)
	"ff00::/8",        // multicast
)

// Embedded IPv4: these IPv6 ranges carry an IPv4 address that is what the
// packets finally reach, so that address is checked too.
var (
	nat64     = netip.MustParsePrefix("64:ff9b::/96") // well-known NAT64: v4 in the last 32 bits
	sixToFour = netip.MustParsePrefix("2002::/16")    // 6to4: v4 in bits 16..47
)

func mustPrefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

// Policy decides which addresses may be connected to: every public address,
// and the blocked ones only when an allow-listed range contains them. The
// zero Policy allows only public addresses.
type Policy struct {
	allow []netip.Prefix
}

// NewPolicy returns the policy with the given allow-list (for example a
// trusted internal range, or 127.0.0.1/32 in tests).
func NewPolicy(allow []netip.Prefix) Policy {
	return Policy{allow: allow}
}

// Check returns nil if ip may be connected to, or an error wrapping
// ErrRefused that names the address.
func (p Policy) Check(ip netip.Addr) error {
	ip = ip.WithZone("")
	if ip.Is4In6() {
		ip = ip.Unmap()
	}
	for _, a := range p.allow {
		if a.Contains(ip) {
			return nil
		}
	}
	if !ip.IsValid() {
		return fmt.Errorf("invalid address: %w", ErrRefused)
	}
	for _, b := range blocked {
		if b.Contains(ip) {
			return fmt.Errorf("%s is in %s: %w", ip, b, ErrRefused)
		}
	}
	if v4, ok := embeddedV4(ip); ok {
		if err := p.Check(v4); err != nil {
			return fmt.Errorf("%s embeds %w", ip, err)
		}
	}
	return nil
}

func embeddedV4(ip netip.Addr) (netip.Addr, bool) {
	b := ip.As16()
	switch {
	case !ip.Is6():
		return netip.Addr{}, false
	case nat64.Contains(ip):
		return netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]}), true
	case sixToFour.Contains(ip):
		return netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]}), true
	}
	return netip.Addr{}, false
}

// Resolver looks up a host's addresses. *net.Resolver implements it; tests
// pass one that maps public-looking names to local addresses.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Dialer connects only to addresses its Policy allows. It is safe for
// concurrent use; pass its DialContext to http.Transport (with Proxy nil: a
// proxy would make the connected address meaningless).
type Dialer struct {
	policy   Policy
	resolver Resolver
	dialer   *net.Dialer
}

// NewDialer returns a Dialer that resolves names with resolver (nil means
// net.DefaultResolver) and bounds each connect by connectTimeout.
func NewDialer(policy Policy, resolver Resolver, connectTimeout time.Duration) *Dialer {
	if resolver == nil {
		resolver = net.DefaultResolver
	}
	return &Dialer{
		policy:   policy,
		resolver: resolver,
		dialer: &net.Dialer{
			Timeout:   connectTimeout,
			KeepAlive: 30 * time.Second,
			Control: func(network, address string, _ syscall.RawConn) error {
				return control(policy, network, address)
			},
		},
	}
}

// control is the net.Dialer Control function: it runs on the resolved
// address of every connection attempt, before connect(2).
func control(p Policy, network, address string) error {
	switch network {
	case "tcp4", "tcp6":
	default:
		return fmt.Errorf("network %s: %w", network, ErrRefused)
	}
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("address %q: %w", address, ErrRefused)
	}
	return p.Check(ap.Addr())
}

// DialContext resolves addr's host and connects to its addresses in turn;
// each is vetted just before connect(2). When every address fails, the error
// reports a real connection failure in preference to a refusal (a host with
// one public and one private address is reachable).
func (d *Dialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	ips, err := d.lookup(ctx, host)
	if err != nil {
		return nil, err
	}
	var firstErr error
	for _, ip := range ips {
		conn, err := d.dialer.DialContext(ctx, network, net.JoinHostPort(ip.Unmap().String(), port))
		if err == nil {
			return conn, nil
		}
		if firstErr == nil || errors.Is(firstErr, ErrRefused) && !errors.Is(err, ErrRefused) {
			firstErr = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil, firstErr
}

func (d *Dialer) lookup(ctx context.Context, host string) ([]netip.Addr, error) {
	if ip, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{ip}, nil
	}
	ips, err := d.resolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		var dnsErr *net.DNSError
		if errors.As(err, &dnsErr) && dnsErr.IsNotFound {
			return nil, fmt.Errorf("resolve %s: %w", host, ErrNoSuchHost)
		}
		return nil, fmt.Errorf("resolve %s: %w", host, err)
	}
	if len(ips) == 0 {
		return nil, fmt.Errorf("resolve %s: %w", host, ErrNoSuchHost)
	}
	return ips, nil
}

// CheckHost resolves host and returns an error wrapping ErrRefused if any of
// its addresses is refused, ErrNoSuchHost if it does not exist. It is the
// early check that gives a clear answer when a target is configured; it does
// not replace the dial-time check, since DNS may answer differently later.
func (d *Dialer) CheckHost(ctx context.Context, host string) error {
	ips, err := d.lookup(ctx, host)
	if err != nil {
		return err
	}
	for _, ip := range ips {
		if err := d.policy.Check(ip); err != nil {
			return fmt.Errorf("host %s: %w", host, err)
		}
	}
	return nil
}
