package httpapi

import (
	"net/netip"
	"testing"
)

func TestParseInetAton(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"127.0.0.1":    "127.0.0.1",
		"127.1":        "127.0.0.1",
		"127.0.1":      "127.0.0.1",
		"2130706433":   "127.0.0.1",
		"0x7f000001":   "127.0.0.1",
		"0x7f.0.0.1":   "127.0.0.1",
		"0177.0.0.1":   "127.0.0.1",
		"0177.0x0.0.1": "127.0.0.1",
		"10.0x10000":   "10.1.0.0",
	} {
		got, ok := parseInetAton(in)
		if !ok || got != netip.MustParseAddr(want) {
			t.Errorf("parseInetAton(%q) = %v %v, want %s", in, got, ok, want)
		}
	}
	for _, in := range []string{"example.com", "1.2.3.4.5", "256.0.0.1", "1..2", "09.0.0.1", "0x", "4294967296", "1.2.3.256", "1_0"} {
		if got, ok := parseInetAton(in); ok {
			t.Errorf("parseInetAton(%q) = %v, want not an address", in, got)
		}
	}
}

func TestParseHostPort(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in, scheme string
		want       hostPort
	}{
		{"Example.COM.", "https", hostPort{"example.com", 443}},
		{"example.com:08080", "http", hostPort{"example.com", 8080}},
		{"[::1]:80", "https", hostPort{"::1", 80}},
		{"example.com", "http", hostPort{"example.com", 80}},
		{"example.com:99999", "http", hostPort{"example.com", 0}},
	} {
		if got := parseHostPort(c.in, c.scheme); got != c.want {
			t.Errorf("parseHostPort(%q, %q) = %+v, want %+v", c.in, c.scheme, got, c.want)
		}
	}
}
