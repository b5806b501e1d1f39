package counter_test

import (
	"context"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/clickcounter/internal/counter"
	"github.com/snipdev/snip/services/clickcounter/internal/redisstore"
)

var servers *testenv.Servers

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &servers, testenv.WithRedis())) }

// partitions is the partition count of every test counter.
const partitions = 4

// fakeClicks is a hand-written fake of counter.Clicks: every partition's
// oldest sequence is first, and the stream holds what a test put in log.
type fakeClicks struct {
	first *atomic.Uint64
	mu    sync.Mutex
	log   []reader.Event
	// reads counts NextSeq calls.
	reads atomic.Int64
}

func (f *fakeClicks) FirstSeq(context.Context, int) (uint64, error) { return f.first.Load(), nil }

func (f *fakeClicks) NextSeq(_ context.Context, p int, from uint64) (uint64, error) {
	f.reads.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, e := range f.log {
		if e.Seq >= from && e.Partition == p {
			return e.Seq, nil
		}
	}
	return 0, nil
}

// store puts events in the fake stream, as CLICKS stored them.
func (f *fakeClicks) store(evs ...reader.Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log = append(f.log, evs...)
}

// from returns partition p's events stored from sequence seq through until.
func (f *fakeClicks) from(p int, seq, until uint64) []reader.Event {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []reader.Event
	for _, e := range f.log {
		if e.Partition == p && e.Seq >= seq && e.Seq <= until {
			out = append(out, e)
		}
	}
	return out
}

// env is one test's counter on its own Redis database.
type env struct {
	c     *counter.Counter
	rdb   *redis.Client
	store *redisstore.Store
	reg   *prometheus.Registry
	// first is what the fake CLICKS reports as every partition's oldest sequence.
	first atomic.Uint64
	// clicks is the fake CLICKS every counter of the env reads.
	clicks *fakeClicks
}

type option func(*counter.Options)

func withWindow(d time.Duration) option { return func(o *counter.Options) { o.DedupWindow = d } }
func withHooks(h counter.Hooks) option  { return func(o *counter.Options) { o.Hooks = h } }
func withStore(s counter.Store) option  { return func(o *counter.Options) { o.Store = s } }
func withNow(now func() time.Time) option {
	return func(o *counter.Options) { o.Now = now }
}

func newEnv(tb testing.TB, opts ...option) *env {
	tb.Helper()
	rdb, _ := servers.Redis.NewDB(tb)
	e := &env{rdb: rdb, store: redisstore.New(rdb), reg: prometheus.NewRegistry()}
	e.first.Store(1)
	e.clicks = &fakeClicks{first: &e.first}
	e.c = e.newCounter(tb, e.reg, opts...)
	return e
}

// newCounter builds another counter (another member) on the same database.
func (e *env) newCounter(tb testing.TB, reg prometheus.Registerer, opts ...option) *counter.Counter {
	tb.Helper()
	o := counter.Options{
		Store:        e.store,
		Clicks:       e.clicks,
		Partitions:   partitions,
		DedupWindow:  time.Minute,
		ClicksMaxAge: 7 * 24 * time.Hour,
		Metrics:      reg,
	}
	for _, f := range opts {
		f(&o)
	}
	c, err := counter.New(o)
	if err != nil {
		tb.Fatalf("new counter: %v", err)
	}
	return c
}

// codeIn returns a link code that hashes to partition p, distinct per i.
func codeIn(tb testing.TB, p, i int) string {
	tb.Helper()
	for n := 0; n < 100000; n++ {
		code := "l" + itoa(i) + "x" + itoa(n)
		if events.Partition(code, partitions) == p {
			return code
		}
	}
	tb.Fatalf("no code for partition %d", p)
	return ""
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

// click returns a valid click on owner's code at t.
func click(owner, code string, t time.Time) events.Click {
	return events.Click{
		V: events.ClickVersion, ID: events.NewID(), Time: t, Code: code, Owner: owner,
		Target: "https://example.com/", Visitor: "v-" + events.NewID()[24:], Country: "DE",
		Referrer: "https://news.example.org/item?id=1",
	}
}

// seqs hands out increasing stream sequences, as CLICKS does.
type seqs struct{ n uint64 }

func (s *seqs) event(p int, c events.Click) reader.Event {
	s.n += 3 // other partitions' events interleave
	return reader.Event{Click: c, Partition: p, Seq: s.n, Stored: c.Time, Deliveries: 1}
}

func (s *seqs) events(p int, cs ...events.Click) []reader.Event {
	out := make([]reader.Event, len(cs))
	for i, c := range cs {
		out[i] = s.event(p, c)
	}
	return out
}

func mustHandle(tb testing.TB, c *counter.Counter, p int, batch []reader.Event) {
	tb.Helper()
	if err := c.HandleBatch(tb.Context(), p, batch); err != nil {
		tb.Fatalf("HandleBatch(partition %d, %d events): %v", p, len(batch), err)
	}
}

func stats(tb testing.TB, c *counter.Counter, owner, code string) *counter.Stats {
	tb.Helper()
	s, err := c.LinkStats(tb.Context(), owner, code, counter.DefaultRange())
	if err != nil {
		tb.Fatalf("LinkStats(%s, %s): %v", owner, code, err)
	}
	return s
}

// metric returns the value of a counter or gauge with the given labels, 0
// if there is no such series.
func metric(tb testing.TB, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	tb.Helper()
	v, _ := series(tb, reg, name, labels)
	return v
}

// series is metric that also says whether the series exists.
func series(tb testing.TB, reg *prometheus.Registry, name string, labels map[string]string) (float64, bool) {
	tb.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for k, v := range labels {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == k && lp.GetValue() == v {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			if m.Counter != nil {
				return m.Counter.GetValue(), true
			}
			return m.Gauge.GetValue(), true
		}
	}
	return 0, false
}
