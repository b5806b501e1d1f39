package scenario

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
)

// The parts the scenarios are built from: real clicks, published the way the
// redirect service's relay publishes them, read by pkg/reader groups.

const owner = "lesson"

// newClick is the i-th click of a link; RequestID carries i so readers can
// check order per link.
func newClick(code string, i int) events.Click {
	return events.Click{
		V: events.ClickVersion, ID: events.NewID(), Time: time.Now().UTC(),
		Code: code, Owner: owner, Target: "https://example.com/" + code,
		Visitor: "v", RequestID: strconv.Itoa(i),
	}
}

// indexOf returns the i a click was built with.
func indexOf(c events.Click) int {
	i, _ := strconv.Atoi(c.RequestID)
	return i
}

// publishClick publishes c to CLICKS asynchronously with its ID as
// Nats-Msg-Id, as the outbox relay does.
func publishClick(js jetstream.JetStream, c events.Click) (jetstream.PubAckFuture, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("encode click: %w", err)
	}
	// A producer that runs ahead of the acks waits for room rather than
	// failing: the scenarios measure flow, not the client's window.
	f, err := js.PublishAsync(events.ClickSubject(c.Owner, c.Code), b, jetstream.WithMsgID(c.ID), jetstream.WithStallWait(30*time.Second))
	if err != nil {
		return nil, fmt.Errorf("publish click: %w", err)
	}
	return f, nil
}

// waitPublished waits for every outstanding async publish of js.
func waitPublished(ctx context.Context, js jetstream.JetStream) error {
	select {
	case <-js.PublishAsyncComplete():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(60 * time.Second):
		return fmt.Errorf("publish acks did not arrive within 60s")
	}
}

// counterTotal sums the counter name over its labels in reg (0 where no
// sample of it was taken).
func counterTotal(reg *prometheus.Registry, name string) (float64, error) {
	mfs, err := reg.Gather()
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", name, err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			n += m.GetCounter().GetValue()
		}
	}
	return n, nil
}

// codes returns n link codes.
func codes(n int) []string {
	c := make([]string, n)
	for i := range c {
		c[i] = "link" + strconv.Itoa(i)
	}
	return c
}

// member is one running pkg/reader group member.
type member struct {
	name   string
	cancel context.CancelFunc
	done   chan error
}

// stop leaves the group gracefully and waits for Run to return.
func (m *member) stop() error {
	m.cancel()
	return <-m.done
}

// waitGroupIdle waits until group has a consumer on each of the stream's
// partitions and none has an event pending or unacknowledged: what the
// group has handled of what the stream holds is then all it will handle (a
// second delivery would first show as pending or unacknowledged). A count
// checked after a fixed wait instead would only hope that a late one had
// shown.
func waitGroupIdle(ctx context.Context, js jetstream.JetStream, group string, partitions int, timeout time.Duration) error {
	return waitFor(ctx, timeout, "group "+group+" to have nothing pending", func() (bool, error) {
		lag, err := reader.Lag(ctx, js, group)
		if err != nil || len(lag) != partitions {
			return false, err
		}
		for _, l := range lag {
			if l.Pending != 0 || l.AckPending != 0 {
				return false, nil
			}
		}
		return true, nil
	})
}

// groupConfig is a member's configuration: production defaults, with a short
// lease and linger so the lessons do not wait on timers meant for hosts that
// come and go. The lease is at JetStream's one-second minimum at every speed.
func groupConfig(group, name string) reader.Config {
	return reader.Config{
		Group:        group,
		Member:       name,
		LeaseTTL:     time.Second,
		AckWait:      10 * time.Second,
		Linger:       20 * time.Millisecond,
		DrainTimeout: 10 * time.Second,
		Start:        reader.StartAtOldest(),
	}
}

// startMember runs reader.Run on its own connection, as a separate process
// would.
func (e *Env) startMember(ctx context.Context, cfg reader.Config, h reader.Handler) (*member, error) {
	js, err := e.Connect(cfg.Group + "-" + cfg.Member)
	if err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = e.log // the run's Options.Log; the runtime names the group and member
	}
	ctx, cancel := context.WithCancel(ctx)
	m := &member{name: cfg.Member, cancel: cancel, done: make(chan error, 1)}
	go func() { m.done <- reader.Run(ctx, js, cfg, h) }()
	return m, nil
}

// limiter paces work at a lesson-time rate, converted to real time. Its
// burst is 50 ms of work, so coarse sleeps do not lower the average rate.
func (e *Env) limiter(perSecond float64) *rate.Limiter {
	r := e.Rate(perSecond)
	return rate.NewLimiter(rate.Limit(r), max(1, int(r/20)))
}

// tally counts handled events per link and checks their order: a click of a
// link is out of order when its index is lower than one handled before it.
type tally struct {
	mu       sync.Mutex
	seen     map[string]int // handlings per event ID
	last     map[string]int // highest index handled per link
	handled  int
	dups     int
	disorder int
	byMember map[string]int
}

func newTally() *tally {
	return &tally{seen: map[string]int{}, last: map[string]int{}, byMember: map[string]int{}}
}

func (t *tally) add(memberName string, c events.Click) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.seen[c.ID]++
	if t.seen[c.ID] > 1 {
		t.dups++
		return
	}
	t.handled++
	t.byMember[memberName]++
	i := indexOf(c)
	if l, ok := t.last[c.Code]; ok && i < l {
		t.disorder++
	}
	t.last[c.Code] = max(t.last[c.Code], i)
}

func (t *tally) counts() (handled, dups, disorder int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.handled, t.dups, t.disorder
}

// waitMembers waits until group has n live members: n heartbeat leases in
// the members bucket, the view every member computes its partitions from.
func waitMembers(ctx context.Context, js jetstream.JetStream, group string, n int) error {
	return waitFor(ctx, 60*time.Second, fmt.Sprintf("%d members in group %s", n, group), func() (bool, error) {
		ms, err := reader.Members(ctx, js, group)
		return len(ms) == n, err
	})
}

// waitSettled waits until the group is at rest: settled by its leases
// (reader.Settled: each partition held by one member, and the assignment
// the members compute keeps it so), with the same holders for a full
// second, three heartbeats of the scenarios' 1 s lease, so that every
// member's view of the leases has caught up. Traffic started before that
// can be handled partly by a member that hands its partition on a moment
// later.
func waitSettled(ctx context.Context, js jetstream.JetStream, group string, partitions int) error {
	var rest reader.RestWatch
	return waitFor(ctx, 60*time.Second, fmt.Sprintf("group %s at rest on its %d partitions", group, partitions), func() (bool, error) {
		ms, err := reader.Members(ctx, js, group)
		if err != nil {
			return false, err
		}
		return rest.Observe(group, partitions, ms, time.Now()) >= time.Second, nil
	})
}
