package fetch

import (
	"fmt"
	"net/netip"
)

// blocked are the ranges a preview fetch must never connect to: everything
// that is not the public internet (IANA's special-purpose registries, RFC
// 6890 and successors), which is where internal services and cloud metadata
// endpoints live.
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
	"::/128",          // unspecified
	"::1/128",         // loopback
	"::ffff:0:0/96",   // IPv4-mapped (unmapped and checked as IPv4 before this list)
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

// Policy decides which addresses a fetch may connect to: every public
// address, and the blocked ones only when an allow-listed range contains them.
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
