package reader

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// rewindOwner is partition 0's worker of a member of group "g", built by
// hand on a NATS of its own with CLICKS in one partition holding three
// events, and a rewind of the group from sequence 1 requested: no control
// loop, no heartbeat and no watch of the group run, so the test says what
// the member has seen of the bucket (m.rewind) and whether its lease
// lives (m.leaseUntil: held for an hour until the test ends it).
type rewindOwner struct {
	w   *worker
	kv  jetstream.KeyValue
	req rewindRequest // as stored
}

func newRewindOwner(t *testing.T, cfg Config) *rewindOwner {
	t.Helper()
	ctx := t.Context()
	n := testenv.StartNATS(t)
	js := n.JetStream(t)
	o := topology.Defaults()
	o.Partitions = 1
	if err := topology.Apply(ctx, js, o); err != nil {
		t.Fatal(err)
	}
	cfg.Group = "g"
	cfg, err := cfg.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	m := &member{cfg: cfg, js: js, log: cfg.Logger, met: newMetrics(nil), instance: newInstance(),
		hard: ctx, clock: time.Now()}
	m.leaseUntil.Store(int64(time.Hour))
	if err := m.trySetup(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		c := events.Click{V: events.ClickVersion, ID: events.NewID(), Time: time.Now().UTC(), Code: "link",
			Owner: "acme", Target: "https://example.com/", Visitor: "v", RequestID: strconv.Itoa(i)}
		b, _ := json.Marshal(c)
		if _, err := js.Publish(ctx, events.ClickSubject(c.Owner, c.Code), b); err != nil {
			t.Fatal(err)
		}
	}
	id, err := Rewind(ctx, js, cfg.Group, FromSeq(1))
	if err != nil {
		t.Fatal(err)
	}
	req, err := readRewind(ctx, m.kv, cfg.Group)
	if err != nil || req.ID != id {
		t.Fatalf("read the rewind request %s: %+v, %v", id, req, err)
	}
	return &rewindOwner{w: newWorker(m, 0), kv: m.kv, req: req}
}

// recorded is the rewind partition 0 recorded done ("" for none).
func (o *rewindOwner) recorded(t *testing.T) string {
	t.Helper()
	e, err := o.kv.Get(t.Context(), rewoundKey("g", 0))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(e.Value())
}

// A member whose watch of the group has not yet delivered a rewind request
// when it takes a partition over (it lags behind the previous owner, which
// carried the request out and recorded it) reads the partition's record all
// the same: once the request reaches it, it is done, not to be replayed a
// second time (the click counter would count the partition again). Before,
// a takeover read the record only once the member had seen a request.
func TestATakeoverBeforeTheRewindRequestReachesTheMemberDoesNotReplayItAgain(t *testing.T) {
	t.Parallel()
	var told atomic.Int32
	o := newRewindOwner(t, Config{OnRewind: func(context.Context, int, RewindInfo) error {
		told.Add(1)
		return nil
	}})
	// The previous owner carried the rewind out and recorded it.
	if _, err := o.kv.Put(t.Context(), rewoundKey("g", 0), []byte(o.req.ID)); err != nil {
		t.Fatal(err)
	}
	w := o.w
	if w.m.rewind.Load() != nil {
		t.Fatal("the member has seen the request before the takeover")
	}
	if err := w.acquire(); err != nil {
		t.Fatal(err)
	}
	w.m.rewind.Store(&o.req) // the watch delivers the request now
	if err := w.maybeRewind(); err != nil {
		t.Fatal(err)
	}
	if n := told.Load(); n != 0 || w.pendingRewind() != nil {
		t.Errorf("the new owner carried rewind %s out again (OnRewind told %d times), which the previous owner had recorded done",
			o.req.ID, n)
	}
}

// A member whose lease may have lapsed while OnRewind ran (a rebuild that
// outlasted its heartbeats, or a member cut off from NATS) moves nothing
// back and records nothing: another member may hold the partition by now
// (the control loop gives it up only at its next tick), and has the rewind
// to carry out itself. Before, the lapsed owner reset the consumer under
// that owner and recorded the rewind done in its place.
func TestAnOwnerWhoseLeaseLapsedDuringOnRewindLeavesTheRewindToTheNextOwner(t *testing.T) {
	t.Parallel()
	var w *worker
	o := newRewindOwner(t, Config{OnRewind: func(context.Context, int, RewindInfo) error {
		// The lease lived until now: no heartbeat was stored since.
		w.m.leaseUntil.Store(int64(time.Since(w.m.clock)))
		return nil
	}})
	w = o.w
	if err := w.acquire(); err != nil {
		t.Fatal(err)
	}
	// The owner handled and acked the partition's three events.
	b, err := w.cons.Fetch(3, jetstream.FetchPriorityGroup(topology.PriorityGroup), jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var last jetstream.Msg
	for msg := range b.Messages() {
		last = msg
	}
	if last == nil {
		t.Fatalf("fetched nothing: %v", b.Error())
	}
	if err := last.DoubleAck(t.Context()); err != nil {
		t.Fatal(err)
	}
	w.m.rewind.Store(&o.req)
	if err := w.maybeRewind(); !errors.Is(err, errReleased) {
		t.Errorf("the rewind of a lapsed owner ended with %v, want it given up (%v)", err, errReleased)
	}
	if id := o.recorded(t); id != "" {
		t.Errorf("the lapsed owner recorded rewind %s done", id)
	}
	info, err := w.cons.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if info.AckFloor.Stream != 3 || info.NumPending != 0 {
		t.Errorf("the lapsed owner moved the consumer: ack floor %d, %d pending; want 3, none",
			info.AckFloor.Stream, info.NumPending)
	}
}
