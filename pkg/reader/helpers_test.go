package reader_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// setup starts NATS with the topology applied and CLICKS in n partitions.
func setup(t *testing.T, partitions int) (*testenv.NATS, jetstream.JetStream) {
	t.Helper()
	n := testenv.StartNATS(t)
	js := n.JetStream(t)
	o := topology.Defaults()
	o.Partitions = partitions
	if err := topology.Apply(t.Context(), js, o); err != nil {
		t.Fatal(err)
	}
	return n, js
}

// click builds the i-th click of a link; RequestID carries i so handlers can
// check order per link.
func click(code string, i int) events.Click {
	return events.Click{
		V: events.ClickVersion, ID: events.NewID(), Time: time.Now().UTC(),
		Code: code, Owner: "acme", Target: "https://example.com/" + code,
		Visitor: "v", RequestID: strconv.Itoa(i),
	}
}

// publish sends clicks for codes link0..link(links-1), perLink each,
// interleaved, and returns their IDs in publish order.
func publish(t *testing.T, js jetstream.JetStream, links, perLink, from int) []string {
	t.Helper()
	var ids []string
	for i := from; i < from+perLink; i++ {
		for l := range links {
			c := click(fmt.Sprintf("link%d", l), i)
			b, _ := json.Marshal(c)
			if _, err := js.PublishAsync(events.ClickSubject(c.Owner, c.Code), b, jetstream.WithMsgID(c.ID)); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, c.ID)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		t.Fatal("publish acks did not arrive")
	}
	return ids
}

// recorder is a handler that remembers what each member processed.
type recorder struct {
	mu sync.Mutex
	// seen counts handlings per event ID.
	seen map[string]int
	// firstOrder is, per link, the RequestIDs in the order first seen.
	firstOrder map[string][]int
	// byMember counts events handled per member.
	byMember map[string]int
	// owners is who holds each partition, from OnAssign and OnRevoke. Two
	// members can briefly both hold one (pinning lets only one pull).
	owners map[int]map[string]bool
	// fail, if set, is consulted before each batch.
	fail func(member string, batch []reader.Event) error
}

func newRecorder() *recorder {
	return &recorder{seen: map[string]int{}, firstOrder: map[string][]int{}, byMember: map[string]int{}, owners: map[int]map[string]bool{}}
}

func (r *recorder) handler(member string) reader.Handler {
	return func(_ context.Context, _ int, batch []reader.Event) (err error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		var failure error
		if r.fail != nil {
			if failure = r.fail(member, batch); failure != nil {
				// Events before a poison event count as done; a transient
				// failure means none of the batch is.
				var pe *reader.PoisonError
				if !errors.As(failure, &pe) {
					return failure
				}
				batch = batch[:pe.Index]
			}
		}
		defer func() { err = failure }()
		for _, e := range batch {
			if r.seen[e.Click.ID] == 0 {
				i, _ := strconv.Atoi(e.Click.RequestID)
				r.firstOrder[e.Click.Code] = append(r.firstOrder[e.Click.Code], i)
			}
			r.seen[e.Click.ID]++
			r.byMember[member]++
		}
		return err
	}
}

// track makes cfg report partition ownership to the recorder.
func (r *recorder) track(cfg reader.Config) reader.Config {
	cfg.OnAssign = func(_ context.Context, p int, _ uint64) error {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.owners[p] == nil {
			r.owners[p] = map[string]bool{}
		}
		r.owners[p][cfg.Member] = true
		return nil
	}
	cfg.OnRevoke = func(p int) {
		r.mu.Lock()
		defer r.mu.Unlock()
		delete(r.owners[p], cfg.Member)
	}
	return cfg
}

// settled reports whether each of the partitions has exactly one owner and
// no member owns more than bound.
func (r *recorder) settled(partitions, bound int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	load := map[string]int{}
	for p := range partitions {
		if len(r.owners[p]) != 1 {
			return false
		}
		for m := range r.owners[p] {
			load[m]++
		}
	}
	for _, n := range load {
		if n > bound {
			return false
		}
	}
	return true
}

// ownersNow returns each partition's single owner ("" if none or several).
func (r *recorder) ownersNow(partitions int) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, partitions)
	for p := range partitions {
		if len(r.owners[p]) == 1 {
			for m := range r.owners[p] {
				out[p] = m
			}
		}
	}
	return out
}

// handledAll reports whether every one of ids was handled.
func (r *recorder) handledAll(ids []string) bool {
	return r.handledAny(ids) == len(ids)
}

// handledAny returns how many of ids were handled at least once.
func (r *recorder) handledAny(ids []string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, id := range ids {
		if r.seen[id] > 0 {
			n++
		}
	}
	return n
}

func (r *recorder) distinct() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.seen)
}

// check verifies every id was handled, each link's events were first seen in
// order with no gaps, and returns the number of extra (duplicate) handlings.
func (r *recorder) check(t *testing.T, ids []string, perLink int) (dups int) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range ids {
		switch n := r.seen[id]; {
		case n == 0:
			t.Errorf("event %s was never handled", id)
		case n > 1:
			dups += n - 1
		}
	}
	for code, order := range r.firstOrder {
		for i, v := range order {
			if v != i {
				t.Errorf("link %s: events first seen in order %v, want 0..%d in order", code, order, perLink-1)
				break
			}
		}
	}
	return dups
}

// member is a group member running in the test, on its own connection.
type member struct {
	id     string
	nc     *nats.Conn
	cancel context.CancelFunc
	done   chan error
}

func startMember(t *testing.T, n *testenv.NATS, cfg reader.Config, h reader.Handler) *member {
	t.Helper()
	return startMemberAt(t, n.URL, cfg, h)
}

// startMemberAt is startMember connected to NATS at url (a cutLine's).
func startMemberAt(t *testing.T, url string, cfg reader.Config, h reader.Handler) *member {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = time.Second
	}
	if cfg.Logger == nil && testing.Verbose() {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("t", t.Name())
	}
	cfg = reportLapses(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	m := &member{id: cfg.Member, nc: nc, cancel: cancel, done: make(chan error, 1)}
	go func() { m.done <- reader.Run(ctx, js, cfg, h) }()
	stopAll := stopTogether(t, cancel)
	t.Cleanup(func() { stopAll(); <-m.done; nc.Close() })
	return m
}

// testMembers holds, per test, the cancel of every member it started
// (a *memberStops under the test's *testing.T).
var testMembers sync.Map

type memberStops struct {
	mu      sync.Mutex
	cancels []context.CancelFunc
}

// stopTogether adds a member's cancel to its test's and returns what the
// member's cleanup calls before it waits for the member: cancel every
// member of the test. A member that stops waits for its pulls to end (up
// to LeaseTTL/2 for an idle one), so cleanups that each cancelled only
// their own member, one after another, waited that many times over (ten
// members, ten waits); told at once, the members drain side by side and
// each cleanup still waits for its own member to have left.
func stopTogether(t *testing.T, cancel context.CancelFunc) func() {
	t.Helper()
	v, loaded := testMembers.LoadOrStore(t, &memberStops{})
	if !loaded {
		// Registered before the first member's cleanup, so it runs after
		// every member's.
		t.Cleanup(func() { testMembers.Delete(t) })
	}
	s := v.(*memberStops)
	s.mu.Lock()
	s.cancels = append(s.cancels, cancel)
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, c := range s.cancels {
			c()
		}
	}
}

// createAgain creates cfg's consumer of CLICKS, one of the same name just
// deleted. Under load the server now and then fails such a create as the
// new consumer writes its state ("rename .../o.dat.tmp .../o.dat: no such
// file or directory", JSErrCodeConsumerCreate), seemingly the deleted
// one's files, in the same directory, still being removed; it registers
// nothing then. That create is made again; any other error fails the
// test.
func createAgain(t *testing.T, js jetstream.JetStream, cfg jetstream.ConsumerConfig) jetstream.Consumer {
	t.Helper()
	var c jetstream.Consumer
	var err error
	if !testenv.Poll(30*time.Second, func() bool {
		c, err = js.CreateConsumer(t.Context(), events.ClicksStream, cfg)
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeConsumerCreate {
			t.Logf("creating consumer %s again: %v; trying again", cfg.Durable, err)
			return false
		}
		return true
	}) || err != nil {
		t.Fatalf("create consumer %s again: %v", cfg.Durable, err)
	}
	return c
}

// reportLapses makes a test that fails say so where the member of cfg
// counted lease lapses (snip_reader_lease_lapses_total): a member whose
// heartbeat was not stored for a lease TTL (a machine starved of CPU, with
// the 1s lease most tests run with) gives its partitions up and takes them
// afresh, which undoes what a test set up and fails it on an assertion
// that names something else. cfg's Metrics is a registry of its own unless
// the test set one.
func reportLapses(t *testing.T, cfg reader.Config) reader.Config {
	t.Helper()
	if cfg.Metrics == nil {
		cfg.Metrics = prometheus.NewRegistry()
	}
	g, ok := cfg.Metrics.(prometheus.Gatherer)
	if !ok {
		return cfg
	}
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		if n := lapsesCounted(t, g); n > 0 {
			t.Errorf("member %s counted %g lease lapses (snip_reader_lease_lapses_total): no heartbeat of its stored for its LeaseTTL (%s), it gave its partitions up and took them afresh, which may be what failed the test",
				cfg.Member, n, cfg.LeaseTTL)
		}
	})
	return cfg
}

// stop leaves the group gracefully and waits.
func (m *member) stop(t *testing.T) {
	t.Helper()
	m.cancel()
	select {
	case err := <-m.done:
		if err != nil {
			t.Errorf("member %s: Run returned %v", m.id, err)
		}
		m.done <- nil // for the cleanup
	case <-time.After(60 * time.Second):
		t.Fatalf("member %s did not stop", m.id)
	}
}

// crash kills the member's connection first, so it can neither ack nor
// unpin nor say goodbye: to the group it is a process that died.
func (m *member) crash() {
	m.nc.Close()
	m.cancel()
}

// ackRefusingServer is NATS with two users: "admin" (the test) and
// "member" (the group's members), whose acks of a consumer the test can
// refuse and allow again, as an ack lost in a NATS hiccup would be.
type ackRefusingServer struct {
	srv  *server.Server
	opts server.Options
	url  string
	js   jetstream.JetStream // admin's
	log  *violations
}

func newAckRefusingServer(t *testing.T, partitions int) *ackRefusingServer {
	t.Helper()
	s := &ackRefusingServer{opts: testenv.NATSOptions(server.RANDOM_PORT, filepath.Join(t.TempDir(), "jetstream")), log: &violations{}}
	s.opts.Users = memberUsers()
	srv, err := testenv.RunNATSServer(s.opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	srv.SetLoggerV2(s.log, false, false, false)
	s.srv, s.url = srv, "nats://"+srv.Addr().String()
	nc, err := nats.Connect(s.url, nats.UserInfo("admin", "admin"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	s.js, _ = jetstream.New(nc)
	o := topology.Defaults()
	o.Partitions = partitions
	if err := topology.Apply(t.Context(), s.js, o); err != nil {
		t.Fatal(err)
	}
	return s
}

func memberUsers(deny ...string) []*server.User {
	return []*server.User{
		{Username: "admin", Password: "admin"},
		{Username: "member", Password: "member", Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: deny},
		}},
	}
}

// ackSubjects are the subjects the acks of a consumer of CLICKS go to.
func ackSubjects(consumer string) string {
	return "$JS.ACK." + events.ClicksStream + "." + consumer + ".>"
}

// refuseAcks makes the server refuse the member's acks of consumer (none:
// allow them all again).
func (s *ackRefusingServer) refuseAcks(t *testing.T, consumer string) {
	if consumer == "" {
		s.refuse(t)
	} else {
		s.refuse(t, ackSubjects(consumer))
	}
}

// refuse makes the server refuse the member's publishes to subjects, and
// allow the rest (none: allow them all again).
func (s *ackRefusingServer) refuse(t *testing.T, subjects ...string) {
	o := s.opts
	o.Users = memberUsers(subjects...)
	if err := s.srv.ReloadOptions(&o); err != nil {
		t.Error(err)
	}
}

// ackRefusingLeaseTTL is the LeaseTTL of an ackRefusingServer's member
// unless the test sets one. Those tests set one member's partition up with
// care (an ack lost, a delivery dropped, a consumer created again under
// its owner, a rewind held in OnRewind), which a lease lapse undoes: the
// member gives the partition up and takes it afresh from the consumer's
// ack floor. With a 1s lease (a heartbeat every 333ms, each given 333ms)
// a machine starved of CPU made that happen. None of those tests is about
// the lease and none fails a member over: with 3s, an idle pull waits 1.5s
// and a pin nobody renews lasts 3s, well inside each of their waits (30s
// and longer).
const ackRefusingLeaseTTL = 3 * time.Second

// ackRefusingAckTimeout is the AckTimeout of an ackRefusingServer's member
// unless the test sets one. An ack the server refuses is never answered,
// nor is one sent to a consumer created again under its owner: the member
// waits AckTimeout for the answer, each time, which with the default (10s)
// made these tests sit idle for most of their time. 2s stays well above
// an answered ack's round trip on a machine starved of CPU, which matters
// where an owner must ack the last event it handled again (ackHandled):
// an answer later than AckTimeout counts as an ack lost.
const ackRefusingAckTimeout = 2 * time.Second

// member runs a member of cfg connected as the member user until the test
// ends (with a lease of ackRefusingLeaseTTL and an ack timeout of
// ackRefusingAckTimeout unless cfg sets them).
func (s *ackRefusingServer) member(t *testing.T, cfg reader.Config, h reader.Handler) {
	t.Helper()
	nc, err := nats.Connect(s.url, nats.UserInfo("member", "member"), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = ackRefusingLeaseTTL
	}
	if cfg.AckTimeout == 0 {
		cfg.AckTimeout = ackRefusingAckTimeout
	}
	if cfg.Logger == nil && testing.Verbose() {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("t", t.Name())
	}
	cfg = reportLapses(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- reader.Run(ctx, js, cfg, h) }()
	stopAll := stopTogether(t, cancel)
	t.Cleanup(func() { stopAll(); <-done; nc.Close() })
}

// firstBatchHeld is a handler that counts the events it is handed and holds
// its first batch until release is closed, so that the owner's next batch
// is fetched ahead while the first is handled.
type firstBatchHeld struct {
	release chan struct{}
	mu      sync.Mutex
	blocked uint64 // the last event of the batch held
	handed  map[uint64]int
}

func newFirstBatchHeld() *firstBatchHeld {
	return &firstBatchHeld{release: make(chan struct{}), handed: map[uint64]int{}}
}

func (h *firstBatchHeld) handle(ctx context.Context, _ int, b []reader.Event) error {
	h.mu.Lock()
	for _, ev := range b {
		h.handed[ev.Seq]++
	}
	first := h.blocked == 0
	if first {
		h.blocked = b[len(b)-1].Seq
	}
	h.mu.Unlock()
	if first {
		select {
		case <-h.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// fetchedAhead waits until consumer has delivered events past the batch
// held, with no pull waiting: the owner's next batch fetched, waiting for
// the handler. It returns the consumer's info then; Delivered.Stream is
// the last event the consumer delivered. How many events each batch holds
// is the runtime's to say: a fetch takes what arrives within Linger, which
// on a machine starved of CPU is less than a batch though more are
// stored, so neither batch need be full.
func (h *firstBatchHeld) fetchedAhead(t *testing.T, js jetstream.JetStream, consumer string) *jetstream.ConsumerInfo {
	t.Helper()
	var info *jetstream.ConsumerInfo
	var blocked uint64
	if !testenv.Poll(30*time.Second, func() bool {
		h.mu.Lock()
		blocked = h.blocked
		h.mu.Unlock()
		c, err := js.Consumer(t.Context(), events.ClicksStream, consumer)
		if err != nil || blocked == 0 {
			return false
		}
		info = c.CachedInfo()
		return info.Delivered.Stream > blocked && info.NumWaiting == 0
	}) {
		var delivered uint64
		var waiting int
		if info != nil {
			delivered, waiting = info.Delivered.Stream, info.NumWaiting
		}
		t.Fatalf("timed out after 30s waiting for the next batch fetched while the first is handled, no pull waiting: the batch held ends at %d, the consumer delivered up to %d, %d pulls waiting",
			blocked, delivered, waiting)
	}
	return info
}
