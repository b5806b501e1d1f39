package netguard_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/netguard"
	"github.com/snipdev/snip/pkg/testenv"
)

func TestPolicy(t *testing.T) {
	t.Parallel()
	p := netguard.NewPolicy([]netip.Prefix{netip.MustParsePrefix("10.20.0.0/16")})
	tests := []struct {
		name    string
		ip      string
		allowed bool
	}{
		{"public_v4", "93.184.215.14", true},
		{"public_dns", "8.8.8.8", true},
		{"public_v6", "2606:4700:4700::1111", true},
		{"nat64_of_public", "64:ff9b::808:808", true},
		{"6to4_of_public", "2002:808:808::1", true},
		{"allow_listed", "10.20.30.40", true},
		{"private_not_allow_listed", "10.21.0.1", false},
		{"loopback", "127.0.0.1", false},
		{"unspecified", "0.0.0.0", false},
		{"metadata", "169.254.169.254", false},
		{"cgnat_alibaba_metadata", "100.100.100.200", false},
		{"private_172", "172.31.255.255", false},
		{"oracle_metadata", "192.0.0.192", false},
		{"benchmarking", "198.18.0.1", false},
		{"broadcast", "255.255.255.255", false},
		{"multicast", "239.1.1.1", false},
		{"unspecified_v6", "::", false},
		{"loopback_v6", "::1", false},
		{"mapped_private", "::ffff:10.0.0.1", false},
		{"mapped_loopback", "::ffff:127.0.0.1", false},
		{"mapped_metadata", "::ffff:169.254.169.254", false},
		{"mapped_allow_listed", "::ffff:10.20.0.1", true},
		{"compatible_loopback", "::127.0.0.1", false},
		{"compatible_private", "::10.0.0.1", false},
		{"compatible_metadata", "::169.254.169.254", false},
		{"compatible_public", "::8.8.8.8", false}, // deprecated form: refused whatever it embeds
		{"translated_loopback", "::ffff:0:127.0.0.1", false},
		{"aws_metadata_ula", "fd00:ec2::254", false},
		{"link_local_with_zone", "fe80::1%eth0", false},
		{"multicast_v6", "ff02::1", false},
		{"nat64_private", "64:ff9b::a00:1", false},
		{"nat64_loopback", "64:ff9b::7f00:1", false},
		{"nat64_metadata", "64:ff9b::a9fe:a9fe", false},
		{"local_nat64", "64:ff9b:1::808:808", false},
		{"6to4_loopback", "2002:7f00:1::1", false},
		{"6to4_private", "2002:c0a8:101::1", false},
		{"6to4_metadata", "2002:a9fe:a9fe::1", false},
		{"documentation", "2001:db8::1", false},
		{"teredo", "2001:0:4136:e378::1", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := p.Check(netip.MustParseAddr(tc.ip))
			if (err == nil) != tc.allowed {
				t.Errorf("Check(%s) = %v, want allowed=%v", tc.ip, err, tc.allowed)
			}
			if err != nil && !errors.Is(err, netguard.ErrRefused) {
				t.Errorf("Check(%s) = %v, want it to wrap ErrRefused", tc.ip, err)
			}
		})
	}
}

// hosts resolves names from a table that a test may change while it runs.
type hosts struct {
	mu sync.Mutex
	m  map[string][]netip.Addr
}

func (h *hosts) set(name string, ips ...string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil {
		h.m = map[string][]netip.Addr{}
	}
	h.m[name] = nil
	for _, ip := range ips {
		h.m[name] = append(h.m[name], netip.MustParseAddr(ip))
	}
}

func (h *hosts) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if ips, ok := h.m[host]; ok {
		return ips, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// listen returns a local port whose accepted connections are counted.
func listen(t *testing.T) (port string, accepted *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted = new(atomic.Int64)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	_, port, _ = net.SplitHostPort(ln.Addr().String())
	return port, accepted
}

func TestDialRefusesBeforeConnecting(t *testing.T) {
	t.Parallel()
	port, accepted := listen(t)
	h := &hosts{}
	h.set("public.example", "127.0.0.1")
	h.set("mixed.example", "10.1.2.3", "127.0.0.1")
	h.set("compatible.example", "::127.0.0.1")
	h.set("mapped.example", "::ffff:127.0.0.1")
	h.set("nat64.example", "64:ff9b::7f00:1")
	d := netguard.NewDialer(netguard.Policy{}, h, time.Second)
	tests := []struct {
		name, host string
	}{
		{"loopback", "127.0.0.1"},
		{"loopback_v6", "::1"},
		{"compatible_loopback_literal", "::127.0.0.1"},
		{"mapped_loopback_literal", "::ffff:127.0.0.1"},
		{"translated_loopback_literal", "::ffff:0:127.0.0.1"},
		{"nat64_loopback_literal", "64:ff9b::7f00:1"},
		{"6to4_loopback_literal", "2002:7f00:1::1"},
		{"metadata", "169.254.169.254"},
		{"private", "192.168.1.1"},
		{"name_to_loopback", "public.example"},
		{"name_to_private_and_loopback", "mixed.example"},
		{"name_to_compatible_loopback", "compatible.example"},
		{"name_to_mapped_loopback", "mapped.example"},
		{"name_to_nat64_loopback", "nat64.example"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			conn, err := d.DialContext(t.Context(), "tcp", net.JoinHostPort(tc.host, port))
			if err == nil {
				conn.Close()
			}
			if !errors.Is(err, netguard.ErrRefused) {
				t.Fatalf("DialContext(%s) = %v, want ErrRefused", tc.host, err)
			}
			if d := time.Since(start); d > 500*time.Millisecond {
				t.Errorf("refusal took %s; was a connection attempted?", d)
			}
			if err := d.CheckHost(t.Context(), tc.host); !errors.Is(err, netguard.ErrRefused) {
				t.Errorf("CheckHost(%s) = %v, want ErrRefused", tc.host, err)
			}
		})
	}
	t.Cleanup(func() {
		if n := accepted.Load(); n != 0 {
			t.Errorf("the local listener accepted %d connections, want 0", n)
		}
	})
}

// TestDialDecidesOnTheAddressAtDialTime: a name that passed CheckHost when a
// target was configured and resolves to loopback later is refused when used.
func TestDialDecidesOnTheAddressAtDialTime(t *testing.T) {
	t.Parallel()
	port, accepted := listen(t)
	h := &hosts{}
	h.set("rebind.example", "93.184.215.14")
	d := netguard.NewDialer(netguard.Policy{}, h, time.Second)
	if err := d.CheckHost(t.Context(), "rebind.example"); err != nil {
		t.Fatalf("CheckHost(public) = %v, want nil", err)
	}
	h.set("rebind.example", "127.0.0.1")
	_, err := d.DialContext(t.Context(), "tcp", net.JoinHostPort("rebind.example", port))
	if !errors.Is(err, netguard.ErrRefused) {
		t.Fatalf("DialContext after rebinding = %v, want ErrRefused", err)
	}
	if n := accepted.Load(); n != 0 {
		t.Errorf("accepted %d connections, want 0", n)
	}
}

func TestDialAllowListedAndUnknown(t *testing.T) {
	t.Parallel()
	port, accepted := listen(t)
	h := &hosts{}
	h.set("local.test", "127.0.0.1")
	d := netguard.NewDialer(netguard.NewPolicy([]netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}), h, time.Second)
	conn, err := d.DialContext(t.Context(), "tcp", net.JoinHostPort("local.test", port))
	if err != nil {
		t.Fatalf("DialContext(allow-listed) = %v", err)
	}
	conn.Close()
	testenv.WaitFor(t, 5*time.Second, "the allow-listed connection accepted", func() bool { return accepted.Load() == 1 })
	if _, err := d.DialContext(t.Context(), "tcp", net.JoinHostPort("127.0.0.2", port)); !errors.Is(err, netguard.ErrRefused) {
		t.Errorf("DialContext(127.0.0.2, outside the allow-list) = %v, want ErrRefused", err)
	}
	if _, err := d.DialContext(t.Context(), "tcp", net.JoinHostPort("nowhere.test", port)); !errors.Is(err, netguard.ErrNoSuchHost) {
		t.Errorf("DialContext(unknown name) = %v, want ErrNoSuchHost", err)
	}
	if err := d.CheckHost(t.Context(), "nowhere.test"); !errors.Is(err, netguard.ErrNoSuchHost) {
		t.Errorf("CheckHost(unknown name) = %v, want ErrNoSuchHost", err)
	}
}
