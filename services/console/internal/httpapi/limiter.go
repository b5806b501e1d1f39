package httpapi

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// failures limits failed credential checks (the login form, a wrong
// "Authorization: Bearer" on /api/*) per client: a client may fail burst
// times, then once per every interval. A correct credential costs nothing, so
// one client's guessing never locks out another's correct login, and a
// client over its limit is refused before its credential is looked at, so
// guessing faster than the limit tells the guesser nothing.
//
// Clients are told apart by the connection's remote address (an IPv6 client
// by its /64, what one host usually holds), or behind trusted proxies by the
// address they forward. The table is bounded: when it is
// full, clients whose allowance has refilled are forgotten; if it is still
// full, clients not in it share one allowance until room is made. Looking
// for refilled clients reads the whole table, so it is done at most once per
// interval (an allowance refills no faster), not for every newcomer while
// the table is full.
type failures struct {
	every time.Duration
	burst int
	max   int
	// trusted are proxies whose X-Forwarded-For names the client.
	trusted []netip.Prefix

	mu       sync.Mutex
	clients  map[netip.Prefix]*rate.Limiter
	overflow *rate.Limiter
	// nextSweep is when the full table may next be read for refilled
	// clients; sweeps counts those reads (tests).
	nextSweep time.Time
	sweeps    int
}

func newFailures(every time.Duration, burst, maxClients int) *failures {
	return &failures{
		every: every, burst: burst, max: maxClients,
		clients:  make(map[netip.Prefix]*rate.Limiter),
		overflow: rate.NewLimiter(rate.Every(every), burst),
	}
}

// attempt is one credential check in progress.
type attempt struct {
	r  *rate.Reservation
	at time.Time
}

// succeeded gives back what the attempt took: a correct credential is free.
// (Cancelled at the time it was taken: rate restores nothing for a
// reservation whose time has passed.)
func (a attempt) succeeded() { a.r.CancelAt(a.at) }

// errLimited is a refusal for too many failed attempts from one client.
type errLimited struct{ wait time.Duration }

func (e errLimited) Error() string {
	return fmt.Sprintf("too many failed attempts from this address: wait %s", e.wait.Round(time.Second))
}

// begin starts a credential check for the client of r. It takes one failure
// from the client's allowance, which succeeded gives back; when none is left
// it returns errLimited with the time until there is one.
func (f *failures) begin(r *http.Request, now time.Time) (attempt, error) {
	lim := f.limiter(clientOf(r, f.trusted), now)
	res := lim.ReserveN(now, 1)
	if d := res.DelayFrom(now); d > 0 {
		res.CancelAt(now)
		return attempt{}, errLimited{wait: d}
	}
	return attempt{r: res, at: now}, nil
}

func (f *failures) limiter(client netip.Prefix, now time.Time) *rate.Limiter {
	f.mu.Lock()
	defer f.mu.Unlock()
	if l, ok := f.clients[client]; ok {
		return l
	}
	if len(f.clients) >= f.max && !now.Before(f.nextSweep) {
		f.sweeps++
		f.nextSweep = now.Add(f.every)
		for k, l := range f.clients {
			if l.TokensAt(now) >= float64(f.burst) {
				delete(f.clients, k)
			}
		}
	}
	if len(f.clients) >= f.max {
		return f.overflow
	}
	l := rate.NewLimiter(rate.Every(f.every), f.burst)
	f.clients[client] = l
	return l
}

// tracked is how many clients the table holds (tests and metrics).
func (f *failures) tracked() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.clients)
}

// clientOf is the client's address, /32 for IPv4, /64 for IPv6: the
// connection's peer, unless the peer is a trusted proxy; then the nearest
// address in X-Forwarded-For that is not a trusted proxy (the entries further
// left were written by the client, which may write anything).
func clientOf(r *http.Request, trusted []netip.Prefix) netip.Prefix {
	ip := clientAddr(r, trusted)
	if !ip.IsValid() {
		return netip.Prefix{}
	}
	bits := 32
	if ip.Is6() {
		bits = 64
	}
	p, _ := ip.Prefix(bits)
	return p
}

// clientAddr is the client's address, as clientOf finds it (the invalid
// Addr when the connection's is not an address): what the action log
// names besides the connection's peer.
func clientAddr(r *http.Request, trusted []netip.Prefix) netip.Addr {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}
	}
	ip = ip.Unmap()
	if isTrusted(ip, trusted) {
		hops := strings.Split(strings.Join(r.Header.Values("X-Forwarded-For"), ","), ",")
		for i := len(hops) - 1; i >= 0; i-- {
			hop, err := forwardedAddr(strings.TrimSpace(hops[i]))
			if err != nil {
				break
			}
			ip = hop.Unmap()
			if !isTrusted(ip, trusted) {
				break
			}
		}
	}
	return ip
}

// forwardedAddr is the address of an X-Forwarded-For entry: an address,
// or an address and port ("198.51.100.7:4711", "[2001:db8::7]:4711"), as
// some proxies (Azure's Application Gateway) write it. Read as garbage, the
// client would be the proxy, and every client behind it would share one
// allowance.
func forwardedAddr(s string) (netip.Addr, error) {
	if a, err := netip.ParseAddr(s); err == nil {
		return a, nil
	}
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return netip.Addr{}, err
	}
	return ap.Addr(), nil
}

func isTrusted(ip netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}
