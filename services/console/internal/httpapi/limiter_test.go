package httpapi

import (
	"errors"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"
)

// The table of clients stays bounded: clients whose allowance has refilled
// are forgotten to make room, and when none has, newcomers share one
// allowance rather than growing the table.
func TestFailuresTableIsBounded(t *testing.T) {
	t.Parallel()
	f := newFailures(time.Minute, 2, 2)
	now := time.Now()
	r := func(addr string) error {
		q := httptest.NewRequest("POST", "/login", nil)
		q.RemoteAddr = addr
		_, err := f.begin(q, now)
		return err
	}
	for _, a := range []string{"192.0.2.1:1", "192.0.2.2:1"} {
		if err := r(a); err != nil {
			t.Fatal(err)
		}
	}
	// Full, and both clients have spent: a third and a fourth share the
	// overflow allowance (burst 2).
	if err := r("192.0.2.3:1"); err != nil {
		t.Fatal(err)
	}
	if err := r("192.0.2.4:1"); err != nil {
		t.Fatal(err)
	}
	if err := r("192.0.2.5:1"); !errors.As(err, new(errLimited)) {
		t.Errorf("fifth client with the table full and the overflow spent: %v, want errLimited", err)
	}
	if n := f.tracked(); n != 2 {
		t.Errorf("tracked %d clients, want at most 2", n)
	}
	// A minute later both have refilled and are forgotten for newcomers.
	now = now.Add(2 * time.Minute)
	if err := r("192.0.2.6:1"); err != nil {
		t.Fatal(err)
	}
	if n := f.tracked(); n != 1 {
		t.Errorf("tracked %d clients after the refilled were forgotten, want 1", n)
	}
}

// While the table is full of clients that have not refilled, newcomers do
// not each read the whole table under the lock: it is read at most once per
// interval, the soonest an allowance can refill.
func TestAFullTableIsSweptOncePerInterval(t *testing.T) {
	t.Parallel()
	const clients = 100
	f := newFailures(time.Minute, 2, clients)
	now := time.Now()
	r := func(i int, at time.Time) error {
		q := httptest.NewRequest("POST", "/login", nil)
		q.RemoteAddr = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), 1).String()
		_, err := f.begin(q, at)
		return err
	}
	for i := range clients {
		if err := r(i, now); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 1000 { // a guesser spread over more addresses than the table holds
		_ = r(clients+i, now.Add(time.Duration(i)*time.Millisecond))
	}
	if f.sweeps != 1 {
		t.Errorf("the full table was read %d times for 1000 newcomers within a second, want once", f.sweeps)
	}
	// A minute on, the first clients have refilled: the next sweep makes
	// room, and a newcomer gets its own allowance again.
	if err := r(1<<20, now.Add(time.Minute+time.Second)); err != nil {
		t.Fatal(err)
	}
	if f.sweeps != 2 || f.tracked() != 1 {
		t.Errorf("after a minute: %d sweeps, %d clients tracked; want 2 and the newcomer alone", f.sweeps, f.tracked())
	}
}

// IPv6 clients are told apart by /64; IPv4-mapped addresses are IPv4.
func TestClientOf(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]string{
		"192.0.2.1:443":              "192.0.2.1/32",
		"[2001:db8:1:2:3:4:5:6]:443": "2001:db8:1:2::/64",
		"[::ffff:192.0.2.1]:443":     "192.0.2.1/32",
	} {
		q := httptest.NewRequest("GET", "/", nil)
		q.RemoteAddr = addr
		if got := clientOf(q, nil).String(); got != want {
			t.Errorf("clientOf(%s) = %s, want %s", addr, got, want)
		}
	}
}

// Correct credentials cost nothing, however many and however fast.
func TestSucceededGivesTheAttemptBack(t *testing.T) {
	t.Parallel()
	f := newFailures(time.Hour, 2, 10)
	q := httptest.NewRequest("POST", "/login", nil)
	q.RemoteAddr = "192.0.2.1:1"
	now := time.Now()
	for i := range 100 {
		a, err := f.begin(q, now.Add(time.Duration(i)*time.Millisecond))
		if err != nil {
			t.Fatalf("correct attempt %d: %v", i+1, err)
		}
		a.succeeded()
	}
	for i := range 2 {
		if _, err := f.begin(q, now); err != nil {
			t.Fatalf("failure %d within the burst: %v", i+1, err)
		}
	}
	if _, err := f.begin(q, now); !errors.As(err, new(errLimited)) {
		t.Errorf("third failure: %v, want errLimited", err)
	}
}

// Behind a trusted proxy the client is the nearest forwarded address that is
// not a trusted proxy; from anyone else X-Forwarded-For is ignored.
func TestClientOfBehindTrustedProxies(t *testing.T) {
	t.Parallel()
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	for _, c := range []struct{ remote, xff, want string }{
		{"10.0.0.1:1", "198.51.100.7", "198.51.100.7/32"},
		{"10.0.0.1:1", "203.0.113.9, 198.51.100.7, 10.0.0.2", "198.51.100.7/32"},
		{"192.0.2.1:1", "198.51.100.7", "192.0.2.1/32"},
		{"10.0.0.1:1", "", "10.0.0.1/32"},
		{"10.0.0.1:1", "junk, 198.51.100.7", "198.51.100.7/32"},
		// Some proxies (Azure's Application Gateway) forward the client's
		// port too: it is still the client, not the proxy.
		{"10.0.0.1:1", "198.51.100.7:4711", "198.51.100.7/32"},
		{"10.0.0.1:1", "[2001:db8:1:2::7]:4711, 10.0.0.2", "2001:db8:1:2::/64"},
	} {
		q := httptest.NewRequest("GET", "/", nil)
		q.RemoteAddr = c.remote
		if c.xff != "" {
			q.Header.Set("X-Forwarded-For", c.xff)
		}
		if got := clientOf(q, trusted).String(); got != c.want {
			t.Errorf("clientOf(%s, XFF %q) = %s, want %s", c.remote, c.xff, got, c.want)
		}
	}
}
