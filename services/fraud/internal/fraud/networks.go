package fraud

import (
	"bufio"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
)

// Anonymisation prefixes of Click.IPPrefix: the redirect truncates IPv4 to a
// /24 and IPv6 to a /48 (pkg/events.Click).
const (
	clickPrefixBitsV4 = 24
	clickPrefixBitsV6 = 48
)

// ParseNetworks reads CIDRs, one per line or separated by commas; blank
// lines and '#' comments are ignored. A click's network is only known to its
// anonymised prefix, so a listed range must be at least as wide as that
// (/24 or wider for IPv4, /48 or wider for IPv6): a narrower one could never
// be told apart from its neighbours, and is refused rather than silently
// matching nothing or everything.
func ParseNetworks(r io.Reader) ([]netip.Prefix, error) {
	var out []netip.Prefix
	sc := bufio.NewScanner(r)
	line := 0
	for sc.Scan() {
		line++
		text, _, _ := strings.Cut(sc.Text(), "#")
		for _, f := range strings.Split(text, ",") {
			f = strings.TrimSpace(f)
			if f == "" {
				continue
			}
			p, err := netip.ParsePrefix(f)
			if err != nil {
				return nil, fmt.Errorf("line %d: %q: %w", line, f, ErrBadNetwork)
			}
			p = p.Masked()
			if (p.Addr().Is4() && p.Bits() > clickPrefixBitsV4) || (p.Addr().Is6() && p.Bits() > clickPrefixBitsV6) {
				return nil, fmt.Errorf("line %d: %s is narrower than a click's anonymised prefix (/%d, /%d): %w",
					line, p, clickPrefixBitsV4, clickPrefixBitsV6, ErrBadNetwork)
			}
			out = append(out, p)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read networks: %w", err)
	}
	return out, nil
}

// networks matches a click's prefix against the listed ranges with one map
// lookup per distinct listed prefix length (at most 25 for IPv4, 49 for
// IPv6, a handful in practice), whatever the size of the list.
type networks struct {
	bits []int // distinct lengths, longest first
	set  map[netip.Prefix]struct{}
}

func newNetworks(list []netip.Prefix) networks {
	n := networks{set: make(map[netip.Prefix]struct{}, len(list))}
	for _, p := range list {
		p = p.Masked()
		n.set[p] = struct{}{}
		if !slices.Contains(n.bits, p.Bits()) {
			n.bits = append(n.bits, p.Bits())
		}
	}
	slices.Sort(n.bits)
	slices.Reverse(n.bits)
	return n
}

// match returns the listed range that contains the click's prefix (the
// narrowest if several do), or false.
func (n networks) match(clickPrefix string) (netip.Prefix, bool) {
	if len(n.set) == 0 || clickPrefix == "" {
		return netip.Prefix{}, false
	}
	cp, err := netip.ParsePrefix(clickPrefix)
	if err != nil {
		return netip.Prefix{}, false
	}
	for _, b := range n.bits {
		if b > cp.Bits() {
			continue // a range narrower than the click's prefix cannot contain it
		}
		p, err := cp.Addr().Prefix(b)
		if err != nil {
			continue // an IPv6 length on an IPv4 address
		}
		if _, ok := n.set[p]; ok {
			return p, true
		}
	}
	return netip.Prefix{}, false
}
