package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/service"
	"github.com/snipdev/snip/pkg/service/servicetest"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/clickcounter/internal/counter"
)

var servers *testenv.Servers

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &servers, testenv.WithRedis())) }

const (
	testPartitions = 4
	acmeKey        = "snip_acmetestkey0123456789abcdef"
)

// system is one test's NATS and Redis database.
type system struct {
	nats     *testenv.NATS
	js       jetstream.JetStream
	rdb      *redis.Client
	redisURL string
}

func newSystem(tb testing.TB) *system {
	tb.Helper()
	n := testenv.StartNATS(tb)
	rdb, db := servers.Redis.NewDB(tb)
	return &system{nats: n, js: n.JetStream(tb), rdb: rdb, redisURL: servers.Redis.URL(db)}
}

// countedSystem starts a system with one member, publishes perLink clicks
// on each of links links and waits until the member has counted them.
func countedSystem(t *testing.T, links, perLink int) (*system, *instance, []events.Click) {
	t.Helper()
	s := newSystem(t)
	svc := s.start(t, "m1", nil)
	cs := s.publishClicks(t, codes(links), perLink, nil)
	waitTotals(t, svc.addr, totals(cs, 1))
	return s, svc, cs
}

// instance is one clickcounter running in-process.
type instance struct {
	*servicetest.Running
	addr string
}

// testConfig is a member's configuration: 4 partitions in memory, small
// batches, quick failover.
func (s *system) testConfig(member string) Config {
	return Config{
		Base: service.Base{HTTPAddr: "127.0.0.1:0", ShutdownTimeout: 2 * time.Second},
		NATS: service.NATS{URL: s.nats.URL}, Redis: service.Redis{URL: s.redisURL},
		Topology: service.Topology{ApplyTopology: true, Partitions: testPartitions, Replicas: 1,
			ClicksMaxAge: 168 * time.Hour, ClicksMaxBytes: -1, Storage: jetstream.MemoryStorage},
		Owners: service.Owners{BootstrapOwners: "acme:" + acmeKey},
		Member: member, BatchSize: 50, Linger: 20 * time.Millisecond, LeaseTTL: time.Second,
		DedupWindow: time.Minute,
	}
}

// start runs a counter member until the test ends (or stop).
func (s *system) start(tb testing.TB, member string, mutate func(*Config)) *instance {
	tb.Helper()
	cfg := s.testConfig(member)
	if mutate != nil {
		mutate(&cfg)
	}
	log := slog.New(slog.NewJSONHandler(testWriter{tb}, &slog.HandlerOptions{Level: slog.LevelInfo})).With("member", member)
	r := servicetest.Start(tb, func(ctx context.Context, ready func(string)) error {
		cfg.Ready = ready
		return run(ctx, log, cfg)
	})
	return &instance{Running: r, addr: r.Addr}
}

// stop stops the member as SIGTERM would and waits for its graceful
// shutdown, which must end without an error.
func (in *instance) stop(tb testing.TB) {
	tb.Helper()
	if err := in.Stop(); err != nil {
		tb.Errorf("service stopped with: %v", err)
	}
}

// testWriter sends logs to t.Log, so they show only on failure.
type testWriter struct{ tb testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.tb.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// publishClicks publishes n clicks on each code, and returns them.
func (s *system) publishClicks(tb testing.TB, codes []string, n int, mutate func(*events.Click)) []events.Click {
	tb.Helper()
	var out []events.Click
	for i := range n {
		for _, code := range codes {
			c := events.Click{V: events.ClickVersion, ID: events.NewID(), Time: time.Now().UTC(), Code: code, Owner: "acme",
				Target: "https://example.com/", Visitor: fmt.Sprintf("visitor-%d", i%7), Country: "NL", Referrer: "https://t.co/x"}
			if mutate != nil {
				mutate(&c)
			}
			s.publish(tb, c, c.ID)
			out = append(out, c)
		}
	}
	return out
}

// publish stores a click with the given Nats-Msg-Id.
func (s *system) publish(tb testing.TB, c events.Click, msgID string) uint64 {
	tb.Helper()
	b, err := json.Marshal(c)
	if err != nil {
		tb.Fatal(err)
	}
	ack, err := s.js.Publish(tb.Context(), events.ClickSubject(c.Owner, c.Code), b, jetstream.WithMsgID(msgID))
	if err != nil {
		tb.Fatalf("publish click: %v", err)
	}
	if ack.Duplicate {
		tb.Fatalf("publish click %s: JetStream dropped it as a duplicate", c.ID)
	}
	return ack.Sequence
}

// statsOf GETs a link's stats as acme; ok is false on 404.
func statsOf(tb testing.TB, addr, code string) (s counter.Stats, ok bool) {
	tb.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/api/links/"+code+"/stats?hours=1&days=1", nil)
	req.Header.Set("Authorization", "Bearer "+acmeKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatalf("GET stats: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return s, false
	default:
		tb.Fatalf("GET stats %s: %d %s", code, resp.StatusCode, body)
	}
	if err := json.Unmarshal(body, &s); err != nil {
		tb.Fatalf("decode stats: %v: %s", err, body)
	}
	return s, true
}

// waitTotals waits until every code's totals are as wanted.
func waitTotals(tb testing.TB, addr string, want map[string]counter.Pair) {
	tb.Helper()
	var last map[string]counter.Pair
	defer func() {
		if tb.Failed() {
			tb.Logf("last totals seen: %v, want %v", last, want)
		}
	}()
	testenv.WaitFor(tb, 60*time.Second, "the counts", func() bool {
		last = map[string]counter.Pair{}
		for code := range want {
			s, _ := statsOf(tb, addr, code)
			last[code] = s.Totals
		}
		for code, p := range want {
			if last[code] != p {
				return false
			}
		}
		return true
	})
}

// metricValue reads one sample from /metrics, e.g.
// `snip_clickcounter_duplicates_total{kind="watermark"}`; 0 if absent.
func metricValue(tb testing.TB, addr, sample string) float64 {
	tb.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if rest, ok := strings.CutPrefix(line, sample+" "); ok {
			var v float64
			fmt.Sscan(rest, &v)
			return v
		}
	}
	return 0
}

// codes returns n link codes spread over the partitions.
func codes(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("link%d", i)
	}
	return out
}

func totals(cs []events.Click, weight int64) map[string]counter.Pair {
	out := map[string]counter.Pair{}
	for _, c := range cs {
		p := out[c.Code]
		p.Add(counter.LabelOf(c.Bot), weight)
		out[c.Code] = p
	}
	return out
}

// killDialer dials NATS until killed; then it closes the connections it
// made and refuses new ones: the member is cut off as by a crash.
type killDialer struct {
	mu    sync.Mutex
	conns []net.Conn
	dead  bool
}

func (d *killDialer) Dial(network, address string) (net.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dead {
		return nil, errors.New("killed")
	}
	c, err := net.Dial(network, address)
	if err == nil {
		d.conns = append(d.conns, c)
	}
	return c, err
}

func (d *killDialer) kill() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dead = true
	for _, c := range d.conns {
		_ = c.Close()
	}
}

// A member dies after its batch is in Redis and before the ack reaches
// JetStream. The next owner gets the batch again; the watermark skips it.
func TestKilledBetweenWriteAndAckCountsExactly(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	dialer := &killDialer{}
	written := make(chan struct{})
	var once sync.Once
	s.start(t, "doomed", func(c *Config) {
		c.NATS.Options = []nats.Option{nats.SetCustomDialer(dialer)}
		c.Hooks.AfterWrite = func(ctx context.Context, p int, seq uint64) error {
			hang := false
			once.Do(func() { hang = true; close(written) })
			if hang {
				<-ctx.Done() // never acks: the process is "dead" from here
				return ctx.Err()
			}
			return nil
		}
	})
	cs := s.publishClicks(t, codes(8), 30, nil)
	select {
	case <-written:
	case <-time.After(60 * time.Second):
		t.Fatal("the doomed member never wrote a batch")
	}
	dialer.kill()
	heir := s.start(t, "heir", nil)
	waitTotals(t, heir.addr, totals(cs, 1))
	// The dead member's batch came again to the heir and was skipped.
	testenv.WaitFor(t, 30*time.Second, "the heir to skip the dead member's batch by watermark", func() bool {
		return metricValue(t, heir.addr, `snip_clickcounter_duplicates_total{kind="watermark"}`) >= 1
	})
	waitTotals(t, heir.addr, totals(cs, 1))
}

// Redis loses writes the counter acked: a master died before its replica
// had them, and the replica took over (played by restoring a snapshot taken
// before them). The counter's next write finds the store behind it, asks
// the runtime for the partition's events again from the first it lost
// (reader.Replay) and counts them before the new ones.
func TestARedisThatLostAckedWritesIsCaughtUpFromClicks(t *testing.T) {
	t.Parallel()
	s, svc, before := countedSystem(t, 6, 5)
	snap := testenv.SnapshotRedis(t, s.rdb)
	lost := s.publishClicks(t, codes(6), 4, nil)
	waitTotals(t, svc.addr, totals(append(before, lost...), 1))
	snap.Restore(t, s.rdb)
	after := s.publishClicks(t, codes(6), 3, nil)
	waitTotals(t, svc.addr, totals(append(append(before, lost...), after...), 1))
	// The counter counts the missed events after the write that makes the
	// totals visible, so the metric may come a moment after them.
	testenv.WaitFor(t, 30*time.Second, fmt.Sprintf("missed_events_total{result=read} = %d (the lost writes' events)", len(lost)), func() bool {
		return metricValue(t, svc.addr, `snip_clickcounter_missed_events_total{result="read"}`) == float64(len(lost))
	})
}

// Redis loses everything the counter wrote (a Redis without persistence
// restarted, a new one): every partition is counted again from the oldest
// event CLICKS holds, exactly once, and counting goes on.
func TestARedisThatLostEverythingIsRecountedFromClicks(t *testing.T) {
	t.Parallel()
	s, svc, before := countedSystem(t, 6, 300)
	// Every key of the counter's (the owners' API keys stay: they are
	// another service's, and the test reads the counts with one).
	keys, err := s.rdb.Keys(t.Context(), "cc:*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("the counter's keys: %v, %v", keys, err)
	}
	if err := s.rdb.Del(t.Context(), keys...).Err(); err != nil {
		t.Fatal(err)
	}
	after := s.publishClicks(t, codes(6), 2, nil)
	waitTotals(t, svc.addr, totals(append(before, after...), 1))
	// The counter counts the missed events after the write that makes the
	// totals visible, so the metric may come a moment after them.
	testenv.WaitFor(t, 30*time.Second, fmt.Sprintf("missed_events_total{result=read} = %d (every event before the loss)", len(before)), func() bool {
		return metricValue(t, svc.addr, `snip_clickcounter_missed_events_total{result="read"}`) == float64(len(before))
	})
}

// The handler fails after writing (the runtime retries the same batch), and
// a click is stored twice under two sequences: each is counted once.
func TestRedeliveryAndDuplicatePublishCountOnce(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	var once sync.Once
	svc := s.start(t, "m1", func(c *Config) {
		c.Hooks.AfterWrite = func(context.Context, int, uint64) error {
			fail := false
			once.Do(func() { fail = true })
			if fail {
				return errors.New("lost the ack")
			}
			return nil
		}
	})
	cs := s.publishClicks(t, codes(3), 10, nil)
	waitTotals(t, svc.addr, totals(cs, 1))
	// The relay's retry after JetStream's duplicate window: same event, new
	// Nats-Msg-Id (so JetStream stores it again).
	again := cs[4]
	s.publish(t, again, "retry-"+again.ID)
	// Something after it on its link (so in its partition, behind it): once
	// that is counted, the copy was handled, and the totals below cover it.
	more := s.publishClicks(t, []string{again.Code}, 1, nil)
	want := totals(append(cs, more...), 1)
	waitTotals(t, svc.addr, want)
	testenv.WaitFor(t, 30*time.Second, "the retried batch to be skipped by watermark", func() bool {
		return metricValue(t, svc.addr, `snip_clickcounter_duplicates_total{kind="watermark"}`) >= 1
	})
	testenv.WaitFor(t, 30*time.Second, "the stored-twice event to be skipped by ID", func() bool {
		return metricValue(t, svc.addr, `snip_clickcounter_duplicates_total{kind="event_id"}`) >= 1
	})
}

// The clicks every reader parks (events.ReadClick) are parked by the counter
// too and counted by none: a payload code that differs from its subject's
// (and hashes to another partition), a click dated 1999, and a subject owner
// that differs from the payload owner.
func TestInvalidClicksAreParkedAndNotCounted(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	svc := s.start(t, "m1", nil)
	cs := s.publishClicks(t, codes(2), 5, nil)
	pub := func(subject string, c events.Click) {
		t.Helper()
		b, _ := json.Marshal(c)
		if _, err := s.js.Publish(t.Context(), subject, b, jetstream.WithMsgID(c.ID)); err != nil {
			t.Fatal(err)
		}
	}
	base := cs[0]
	mismatch := base
	mismatch.ID = events.NewID()
	for mismatch.Code = base.Code + "x"; events.Partition(mismatch.Code, testPartitions) == events.Partition(base.Code, testPartitions); {
		mismatch.Code += "x"
	}
	pub(events.ClickSubject(base.Owner, base.Code), mismatch)
	old := base
	old.ID, old.Time = events.NewID(), time.Date(1999, 6, 1, 0, 0, 0, 0, time.UTC)
	pub(events.ClickSubject(base.Owner, base.Code), old)
	owner := base
	owner.ID = events.NewID()
	pub(events.ClickSubject("mallory", base.Code), owner)
	more := s.publishClicks(t, codes(2), 1, nil) // after them, so the partitions went past them

	waitTotals(t, svc.addr, totals(append(cs, more...), 1))
	testenv.WaitFor(t, 30*time.Second, "the 3 invalid clicks parked", func() bool {
		return metricValue(t, svc.addr, `snip_reader_parked_total{group="click-counter",reason="subject_mismatch"}`) == 2 &&
			metricValue(t, svc.addr, `snip_reader_parked_total{group="click-counter",reason="implausible_time"}`) == 1
	})
	if st, ok := statsOf(t, svc.addr, mismatch.Code); ok && st.Totals != (counter.Pair{}) {
		t.Errorf("the mismatched click's code %s has counts %+v", mismatch.Code, st.Totals)
	}
}

// A CLICKS whose age limit was lifted by hand (MaxAge 0) is refused at
// start with what to do, not with the counter's internal check.
func TestACLICKSWithoutAnAgeLimitIsRefusedWithWhatToDo(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	cfg := s.testConfig("m1")
	if err := topology.Apply(t.Context(), s.js, cfg.Topology.Options()); err != nil {
		t.Fatal(err)
	}
	stream, err := s.js.Stream(t.Context(), events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	sc := stream.CachedInfo().Config
	sc.MaxAge, sc.MaxMsgs = 0, 1_000_000
	if _, err := s.js.UpdateStream(t.Context(), sc); err != nil {
		t.Fatal(err)
	}
	cfg.ApplyTopology = false
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	err = run(ctx, slog.New(slog.NewJSONHandler(testWriter{t}, nil)), cfg)
	if err == nil || !strings.Contains(err.Error(), "CLICKS has no age limit") || !strings.Contains(err.Error(), "SNIP_CLICKS_MAX_AGE") {
		t.Fatalf("start on a CLICKS without an age limit: %v, want the refusal naming SNIP_CLICKS_MAX_AGE", err)
	}
}
