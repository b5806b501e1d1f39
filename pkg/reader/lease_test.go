package reader_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// cutLine is a TCP path to NATS that a test can cut (every connection
// through it closed, new ones closed as they come) and mend, as a network
// that partitions a member from NATS would.
type cutLine struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	conns  []net.Conn
}

func newCutLine(t *testing.T, natsURL string) *cutLine {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &cutLine{ln: ln, target: strings.TrimPrefix(natsURL, "nats://")}
	t.Cleanup(func() { _ = ln.Close(); l.setCut(true) })
	go l.serve()
	return l
}

func (l *cutLine) url() string { return "nats://" + l.ln.Addr().String() }

func (l *cutLine) serve() {
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return
		}
		l.mu.Lock()
		if l.cut {
			l.mu.Unlock()
			_ = c.Close()
			continue
		}
		s, err := net.Dial("tcp", l.target)
		if err != nil {
			l.mu.Unlock()
			_ = c.Close()
			continue
		}
		l.conns = append(l.conns, c, s)
		l.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			_, _ = io.Copy(dst, src)
			_ = dst.Close()
			_ = src.Close()
		}
		go pipe(s, c)
		go pipe(c, s)
	}
}

// setCut cuts the line (true) or mends it (false).
func (l *cutLine) setCut(cut bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cut = cut
	if cut {
		for _, c := range l.conns {
			_ = c.Close()
		}
		l.conns = nil
	}
}

// ownership follows who holds a partition by OnAssign and OnRevoke, and
// notes every batch handled by a member that does not hold it by the
// latest OnAssign: state rebuilt at an older OnAssign misses what the
// later owner handled.
type ownership struct {
	mu         sync.Mutex
	latest     int            // the number of OnAssign calls so far
	holds      map[string]int // the OnAssign (its number) each member holds by; 0: none
	assigns    map[string]int
	revokes    map[string]int
	handled    map[uint64]bool
	violations []string
	// holdAt, if set, is a sequence whose batch the handler holds, once
	// handed it, until held is closed.
	holdAt uint64
	held   chan struct{}
}

func newOwnership() *ownership {
	return &ownership{holds: map[string]int{}, assigns: map[string]int{}, revokes: map[string]int{}, handled: map[uint64]bool{}}
}

func (o *ownership) config(member string) reader.Config {
	return reader.Config{
		Group: "g", Member: member, BatchSize: 10,
		OnAssign: func(context.Context, int, uint64) error {
			o.mu.Lock()
			defer o.mu.Unlock()
			o.latest++
			o.holds[member] = o.latest
			o.assigns[member]++
			return nil
		},
		OnRevoke: func(int) {
			o.mu.Lock()
			defer o.mu.Unlock()
			o.holds[member] = 0
			o.revokes[member]++
		},
	}
}

func (o *ownership) handler(member string) reader.Handler {
	return func(_ context.Context, _ int, batch []reader.Event) error {
		o.mu.Lock()
		if h := o.holds[member]; h != o.latest {
			o.violations = append(o.violations, fmt.Sprintf("%s handled %d-%d by OnAssign %d, the latest being %d",
				member, batch[0].Seq, batch[len(batch)-1].Seq, h, o.latest))
		}
		hold := o.holdAt != 0 && batch[0].Seq == o.holdAt
		if hold {
			o.holdAt = 0
		}
		o.mu.Unlock()
		if hold {
			<-o.held
		}
		o.mu.Lock()
		defer o.mu.Unlock()
		for _, e := range batch {
			o.handled[e.Seq] = true
		}
		return nil
	}
}

func (o *ownership) count(m map[string]int, member string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return m[member]
}

func (o *ownership) handledUpTo(last int) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	for s := 1; s <= last; s++ {
		if !o.handled[uint64(s)] {
			return false
		}
	}
	return true
}

// A member cut off from NATS sees nothing of the bucket, its own lease's
// lapse included, so it cannot wait to see it: once its lease may have
// lapsed by its own clock (no heartbeat stored for a lease TTL) it gives
// its partitions up (OnRevoke), as the member that takes them over
// meanwhile expects, and hands its handler nothing more: here the cut
// comes while its handler holds a batch (11-20) and the next (21-30) was
// fetched ahead; the other member takes the partition over from the ack
// floor (10). Back on NATS, the member does not go on with a partition it
// held before the cut: whatever it holds again it takes afresh (OnAssign,
// after the other's), so no batch is handled by state that misses the
// events the other member handled meanwhile. The member cut off here
// ranks first for the partition, so a claim of it kept from before the
// cut would win it back.
func TestAMemberCutOffFromNATSGivesItsPartitionsUpAndTakesThemOnlyAfresh(t *testing.T) {
	t.Parallel()
	n, js := setup(t, 1)
	a, b := "a", "b"
	if reader.Assign("g", 1, []string{a, b})[0] != a {
		a, b = b, a
	}
	o := newOwnership()
	line := newCutLine(t, n.URL)
	cfgA, regA := o.config(a), prometheus.NewRegistry()
	cfgA.Metrics = regA
	startMemberAt(t, line.url(), cfgA, o.handler(a))
	publish(t, js, 1, 10, 0)
	testenv.WaitFor(t, 30*time.Second, "the first member handling the first 10 events", func() bool {
		return o.handledUpTo(10)
	})
	startMember(t, n, o.config(b), o.handler(b))
	kv, err := js.KeyValue(t.Context(), topology.MembersBucket)
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the second member's lease", func() bool {
		_, err := kv.Get(t.Context(), "g.members."+b)
		return err == nil
	})

	o.mu.Lock()
	o.holdAt, o.held = 11, make(chan struct{})
	o.mu.Unlock()
	publish(t, js, 1, 20, 10)
	name := topology.GroupConsumerName("g", 0)
	testenv.WaitFor(t, 30*time.Second, "events 11-20 held in the handler, 21-30 fetched ahead", func() bool {
		c, err := js.Consumer(t.Context(), events.ClicksStream, name)
		o.mu.Lock()
		defer o.mu.Unlock()
		return err == nil && o.holdAt == 0 && c.CachedInfo().Delivered.Stream == 30
	})

	line.setCut(true)
	cut := time.Now()
	testenv.WaitFor(t, 30*time.Second, "the other member taking the partition over and handling 11-30", func() bool {
		return o.count(o.assigns, b) == 1 && o.handledUpTo(30)
	})
	took := time.Since(cut)
	close(o.held)
	// The member cut off gives it up once its handler returns, no batch
	// handed to it after the cut but the one it held.
	if !testenv.Poll(5*time.Second, func() bool { return o.count(o.revokes, a) == 1 }) {
		t.Errorf("the member cut off from NATS still holds the partition %s after the cut, the other member having taken it over after %s",
			time.Since(cut).Round(time.Millisecond), took.Round(time.Millisecond))
	}

	line.setCut(false)
	mended := time.Now()
	testenv.WaitFor(t, 30*time.Second, "the member cut off writing its lease again", func() bool {
		e, err := kv.Get(t.Context(), "g.members."+a)
		return err == nil && e.Created().After(mended)
	})
	// The heartbeat stored after the lapse is counted (the member hears
	// that it was stored a moment after the lease shows).
	testenv.WaitFor(t, 30*time.Second, "the lapse counted", func() bool { return lapsesCounted(t, regA) >= 1 })
	publish(t, js, 1, 10, 30)
	testenv.WaitFor(t, 30*time.Second, "every event handled with the member back on NATS", func() bool {
		return o.handledUpTo(40)
	})
	// Long enough for a claim from before the cut to have won the
	// partition back and handled with it.
	publish(t, js, 1, 10, 40)
	testenv.WaitFor(t, 30*time.Second, "the last 10 events handled", func() bool {
		return o.handledUpTo(50)
	})
	if n := lapsesCounted(t, regA); n != 1 {
		t.Errorf("snip_reader_lease_lapses_total %g after one lapse, want 1", n)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, v := range o.violations {
		t.Errorf("a batch handled by a member that does not hold the partition by its latest OnAssign: %s", v)
	}
}

// lapsesCounted is a member's snip_reader_lease_lapses_total.
func lapsesCounted(t *testing.T, reg prometheus.Gatherer) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() == "snip_reader_lease_lapses_total" {
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

// slowLine is a TCP path to NATS that delays what the server sends by a
// delay the test sets (what the client sends goes at once), as a loaded
// host or a slow NATS delays answers: the server has what the client sent
// in time, the client hears back late.
type slowLine struct {
	ln     net.Listener
	target string
	delay  atomic.Int64
	mu     sync.Mutex
	conns  []net.Conn
}

func newSlowLine(t *testing.T, natsURL string) *slowLine {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &slowLine{ln: ln, target: strings.TrimPrefix(natsURL, "nats://")}
	t.Cleanup(func() {
		_ = ln.Close()
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, c := range l.conns {
			_ = c.Close()
		}
	})
	go l.serve()
	return l
}

func (l *slowLine) url() string { return "nats://" + l.ln.Addr().String() }

func (l *slowLine) setDelay(d time.Duration) { l.delay.Store(int64(d)) }

func (l *slowLine) serve() {
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", l.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		l.mu.Lock()
		l.conns = append(l.conns, c, s)
		l.mu.Unlock()
		go func() {
			_, _ = io.Copy(s, c)
			_ = s.Close()
			_ = c.Close()
		}()
		// Server to client: each chunk read is written delay after it
		// arrived, in order.
		type chunk struct {
			due  time.Time
			data []byte
		}
		q := make(chan chunk, 4096)
		go func() {
			defer close(q)
			for {
				buf := make([]byte, 32*1024)
				n, err := s.Read(buf)
				if n > 0 {
					q <- chunk{time.Now().Add(time.Duration(l.delay.Load())), buf[:n]}
				}
				if err != nil {
					return
				}
			}
		}()
		go func() {
			defer func() { _ = c.Close(); _ = s.Close() }()
			for ch := range q {
				time.Sleep(time.Until(ch.due))
				if _, err := c.Write(ch.data); err != nil {
					return
				}
			}
		}()
	}
}

// A member whose heartbeats are answered late, later than LeaseTTL/3 but
// well within the lease (a loaded host, a slow NATS), holds its lease: the
// server stored each write when it came, and the lease lives from its
// sending. The member counts no lapse and keeps its partition; it goes on
// with it once the answers come in time again.
func TestAMemberWhoseHeartbeatsAreAnsweredLateButWithinTheLeaseKeepsItsPartitions(t *testing.T) {
	t.Parallel()
	n, js := setup(t, 1)
	const ttl, delay = 3 * time.Second, 1500 * time.Millisecond // TTL/3 < delay < TTL
	o := newOwnership()
	line := newSlowLine(t, n.URL)
	cfg, reg := o.config("a"), prometheus.NewRegistry()
	cfg.LeaseTTL, cfg.Metrics = ttl, reg
	startMemberAt(t, line.url(), cfg, o.handler("a"))
	publish(t, js, 1, 10, 0)
	testenv.WaitFor(t, 30*time.Second, "the member handling the first 10 events", func() bool {
		return o.handledUpTo(10)
	})
	kv, err := js.KeyValue(t.Context(), topology.MembersBucket)
	if err != nil {
		t.Fatal(err)
	}
	revision := func() uint64 {
		e, err := kv.Get(t.Context(), "g.members.a")
		if err != nil {
			return 0
		}
		return e.Revision()
	}

	line.setDelay(delay)
	slowed, from := time.Now(), revision()
	// Three lease TTLs of heartbeats (one every TTL/3) stored while the
	// answers come late: a member that gave up on them would have lapsed
	// by its own clock a lease TTL after the slowing, and given the
	// partition up within a second more.
	testenv.WaitFor(t, 60*time.Second, "nine heartbeats stored with their answers delayed", func() bool {
		return revision() >= from+9
	})
	held := time.Since(slowed)
	if r := o.count(o.revokes, "a"); r != 0 {
		t.Errorf("the member gave its partition up %d times in %s of heartbeats answered %s late (lease TTL %s), want none",
			r, held.Round(time.Millisecond), delay, ttl)
	}

	line.setDelay(0)
	publish(t, js, 1, 10, 10)
	testenv.WaitFor(t, 30*time.Second, "the next 10 events handled", func() bool {
		return o.handledUpTo(20)
	})
	if a := o.count(o.assigns, "a"); a != 1 {
		t.Errorf("the member took the partition %d times, want once", a)
	}
	if n := lapsesCounted(t, reg); n != 0 {
		t.Errorf("snip_reader_lease_lapses_total %g with heartbeats answered %s late (lease TTL %s), want 0", n, delay, ttl)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, v := range o.violations {
		t.Errorf("a batch handled by a member that does not hold the partition by its latest OnAssign: %s", v)
	}
}

// A heartbeat answered only after the lease it would have extended ended
// extends nothing: the member cannot tell when the server stored it. With
// every answer that late, the member's lease lapses by its own clock (the
// server may in fact have kept it): it gives its partition up, and the
// late answers neither take it back nor count a lapse each. Once an answer
// comes within its lease again, the member counts one lapse and takes the
// partition afresh.
func TestAMemberWhoseHeartbeatsAreAnsweredAfterTheLeaseGivesItsPartitionsUp(t *testing.T) {
	t.Parallel()
	n, js := setup(t, 1)
	const ttl, delay = 3 * time.Second, 4500 * time.Millisecond // > TTL
	o := newOwnership()
	line := newSlowLine(t, n.URL)
	cfg, reg := o.config("a"), prometheus.NewRegistry()
	cfg.LeaseTTL, cfg.Metrics = ttl, reg
	startMemberAt(t, line.url(), cfg, o.handler("a"))
	publish(t, js, 1, 10, 0)
	testenv.WaitFor(t, 30*time.Second, "the member handling the first 10 events", func() bool {
		return o.handledUpTo(10)
	})
	kv, err := js.KeyValue(t.Context(), topology.MembersBucket)
	if err != nil {
		t.Fatal(err)
	}
	revision := func() uint64 {
		e, err := kv.Get(t.Context(), "g.members.a")
		if err != nil {
			return 0
		}
		return e.Revision()
	}

	line.setDelay(delay)
	testenv.WaitFor(t, 30*time.Second, "the member giving its partition up", func() bool {
		return o.count(o.revokes, "a") == 1
	})
	// Answers of heartbeats sent after the slowing come in meanwhile,
	// each after its lease.
	from := revision()
	testenv.WaitFor(t, 60*time.Second, "six more heartbeats stored", func() bool {
		return revision() >= from+6
	})
	if n := lapsesCounted(t, reg); n != 0 {
		t.Errorf("snip_reader_lease_lapses_total %g with every answer after its lease, want 0 (no lease held again)", n)
	}
	if a := o.count(o.assigns, "a"); a != 1 {
		t.Errorf("the member took the partition %d times with every answer after its lease, want once (before)", a)
	}

	line.setDelay(0)
	testenv.WaitFor(t, 60*time.Second, "the member taking the partition afresh", func() bool {
		return o.count(o.assigns, "a") == 2
	})
	publish(t, js, 1, 10, 10)
	testenv.WaitFor(t, 30*time.Second, "the next 10 events handled", func() bool {
		return o.handledUpTo(20)
	})
	if n := lapsesCounted(t, reg); n != 1 {
		t.Errorf("snip_reader_lease_lapses_total %g after one lapse, want 1", n)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, v := range o.violations {
		t.Errorf("a batch handled by a member that does not hold the partition by its latest OnAssign: %s", v)
	}
}
