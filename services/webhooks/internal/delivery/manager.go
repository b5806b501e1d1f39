package delivery

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/snipdev/snip/services/webhooks/internal/redisstore"
)

// Manager runs one sender goroutine per endpoint whose lease this instance
// holds. Leases spread endpoints over instances and hand an endpoint over
// when its instance dies (after LeaseTTL). Each sender runs under a token
// of its own, which the scan that started it took the lease with
// (redisstore.Leases): the sender's writes are made only while the lease
// still holds it, so a sender whose lease passed to another, however late
// its write reaches Redis, changes nothing of the endpoint's state. Its
// scan, which sees every endpoint, also drops a deleted endpoint's metric
// series in this instance.
type Manager struct {
	store    *redisstore.Store
	sender   *Sender
	instance string
	leaseTTL time.Duration
	log      *slog.Logger

	// StopWait bounds how long a stop waits for the senders' attempts in
	// flight to finish and be recorded (the service's ShutdownTimeout);
	// then they are cancelled. Zero: 5 s.
	StopWait time.Duration

	mu      sync.Mutex
	running map[string]*run
}

type run struct {
	// cancel stops the sender at once, its attempt in flight included
	// (the sender's post context); the end of Run's ctx only tells it to
	// start no other attempt.
	cancel context.CancelFunc
	wake   chan struct{}
	done   chan struct{}
	lease  *lease
	// token is the lease's value as the scan took it for this sender
	// (redisstore.Leases): renewals extend the lease only while it holds
	// it, and the sender's writes are made only while it does.
	token string
}

// lease is how long a sender may go on sending: until its endpoint's lease
// expires at the latest, as this instance knows it. Its deadline is the
// time the last renewal that succeeded was sent (taken before the command
// went out, so Redis set the expiry later than that) plus the TTL, less
// leaseMargin. Once it passes without a renewal the lease may have lapsed
// in Redis and another instance may hold it: the sender starts no POST
// from then on, the one in flight is cancelled, and the manager stops it
// (Manager.lapse); only a scan that takes the lease again starts a sender.
// Nothing else would stop a sender whose instance cannot reach Redis: its
// renewals fail, and a failed renewal stops nothing.
type lease struct {
	mu     sync.Mutex
	until  time.Time
	lapsed bool
	timer  *time.Timer // Manager.lapse at until
}

// leaseMargin is how much sooner than the lease's TTL after a renewal was
// sent a sender stops: for the rate of this machine's clock against
// Redis' (and Redis' expiry in whole milliseconds).
func leaseMargin(ttl time.Duration) time.Duration { return ttl / 100 }

// held reports whether the lease's deadline is still ahead.
func (l *lease) held() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.lapsed && time.Now().Before(l.until)
}

// extend moves the deadline to until if that is later, unless it already
// passed: a lapsed lease is given up for good.
func (l *lease) extend(until time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lapsed || !until.After(l.until) {
		return
	}
	l.until = until
	l.timer.Reset(time.Until(until))
}

// NewManager returns a Manager for instance.
func NewManager(store *redisstore.Store, sender *Sender, instance string, leaseTTL time.Duration, log *slog.Logger) *Manager {
	return &Manager{store: store, sender: sender, instance: instance, leaseTTL: leaseTTL, log: log, running: map[string]*run{}}
}

// Wake tells endpoint id's sender, if it runs here, that events were queued.
func (m *Manager) Wake(id string) {
	m.mu.Lock()
	r := m.running[id]
	m.mu.Unlock()
	if r != nil {
		select {
		case r.wake <- struct{}{}:
		default:
		}
	}
}

// Run scans every LeaseTTL/3: it takes the leases of the endpoints no
// instance holds, starts a sender for each endpoint whose lease it holds
// and stops the senders of endpoints deleted or whose lease holds another
// sender's token.
// Meanwhile it renews the leases of the endpoints it sends for every
// LeaseTTL/10, all in one round trip, and stops the sender of an endpoint
// whose lease went unrenewed for its TTL (see lease). Until ctx ends; then
// it stops every sender and gives the leases back: each sender starts no
// other attempt, and the one in flight finishes and is recorded, within
// StopWait (the leases renewed meanwhile), so that a batch delivered as the
// service stops is not sent again by the next sender.
func (m *Manager) Run(ctx context.Context) error {
	// The renewals outlive ctx: they go on while stopAll waits for the
	// attempts in flight.
	rctx, stopRenewing := context.WithCancel(context.WithoutCancel(ctx))
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		m.renew(rctx)
	}()
	t := time.NewTicker(m.leaseTTL / 3)
	defer t.Stop()
	for {
		m.scan(ctx)
		select {
		case <-ctx.Done():
			m.stop(stopRenewing, renewed)
			return nil
		case <-t.C:
		}
	}
}

// renew extends the leases of the endpoints this instance sends for every
// LeaseTTL/10, until ctx ends, moves their senders' deadlines (lease) and
// stops the sender of one whose lease no longer holds its token (another
// sender's, or none: it lapsed, and only a scan takes it again, for a new
// sender). A renewal that fails
// stops nothing (the lease still runs for most of its TTL) and is tried
// again at the next tick; should they fail until the deadline, the lease's
// timer stops the sender (Manager.lapse).
//
// The lease must not lapse while its sender runs: another instance would
// take it and send the same queue alongside it. When only the scan renewed
// it, every third of the lease, two failed scans in a row left the next
// renewal due as the lease ran out, and three (Redis refusing the instance
// for a little over two thirds of the lease) let it lapse. Coming a tenth of the lease
// apart, the first renewal after Redis was out of reach for less than
// about nine tenths of it still finds it, as for a replay's lease
// (Replayer.renew); a renewal is cheap (the endpoints running here, one
// script each, one pipeline), unlike the scan, which reads every endpoint.
func (m *Manager) renew(ctx context.Context) {
	t := time.NewTicker(m.leaseTTL / 10)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		m.mu.Lock()
		runs := maps.Clone(m.running)
		m.mu.Unlock()
		if len(runs) == 0 {
			continue
		}
		ids := slices.Collect(maps.Keys(runs))
		tokens := make(map[string]string, len(runs))
		for id, r := range runs {
			tokens[id] = r.token
		}
		sent := time.Now()
		held, err := m.store.Leases(ctx, ids, tokens, m.instance, m.leaseTTL)
		for id, r := range runs {
			if _, ok := held[id]; ok {
				r.lease.extend(m.deadline(sent))
			}
		}
		if err != nil {
			if ctx.Err() == nil {
				m.log.Warn("webhooks: renew leases", "endpoints", len(ids), "renewed", len(held), "err", err)
			}
			continue
		}
		m.mu.Lock()
		for id, r := range runs {
			if _, ok := held[id]; !ok && m.running[id] == r {
				r.cancel() // another sender has it now
				delete(m.running, id)
			}
		}
		m.mu.Unlock()
	}
}

func (m *Manager) scan(ctx context.Context) {
	// Endpoints with series here before the listing: each existed before
	// it, so one the listing lacks was deleted (an endpoint created since
	// may have series already, and is not among these).
	noted := m.sender.metrics.noted()
	all, err := m.store.All(ctx)
	if err != nil {
		m.log.Warn("webhooks: list endpoints", "err", err)
		return
	}
	// Every lease in one round trip (Store.Leases): the last endpoint's is
	// renewed as soon as the first's, however many this instance holds.
	ids := make([]string, len(all))
	for i, e := range all {
		ids[i] = e.ID
	}
	// The senders running here renew their leases under their tokens; the
	// other endpoints' leases are taken under new ones.
	m.mu.Lock()
	runs := maps.Clone(m.running)
	m.mu.Unlock()
	tokens := make(map[string]string, len(runs))
	for id, r := range runs {
		tokens[id] = r.token
	}
	sent := time.Now()
	held, lerr := m.store.Leases(ctx, ids, tokens, m.instance, m.leaseTTL)
	if lerr != nil {
		// Those whose lease failed are not started; those already
		// running here go on: their leases still run, the renewals
		// (renew) stop any that another instance holds, and a sender
		// whose lease went unrenewed for its TTL stops (lapse).
		m.log.Warn("webhooks: leases", "endpoints", len(ids), "held", len(held), "err", lerr)
	}
	seen := map[string]bool{}
	for _, e := range all {
		seen[e.ID] = true
		token, ok := held[e.ID]
		m.mu.Lock()
		r, was := m.running[e.ID], runs[e.ID]
		switch {
		case r != was:
			// Stopped since the listing (its lease lapsed unrenewed, or
			// its sender returned: drop): renewed under its token, the
			// lease is its, not a new sender's. The next scan takes it
			// under a new one.
		case ok && r == nil:
			// post outlives ctx, for the attempt in flight at a stop
			// (stopAll); rctx, the sender's, ends with ctx or post.
			post, cancel := context.WithCancel(context.WithoutCancel(ctx))
			rctx, cancelR := context.WithCancel(post)
			unhook := context.AfterFunc(ctx, cancelR)
			r = &run{cancel: cancel, wake: make(chan struct{}, 1), done: make(chan struct{}), lease: &lease{until: m.deadline(sent)}, token: token}
			m.running[e.ID] = r
			id := e.ID
			r.lease.mu.Lock()
			r.lease.timer = time.AfterFunc(time.Until(r.lease.until), func() { m.lapse(id, r) })
			r.lease.mu.Unlock()
			go func() {
				defer close(r.done)
				defer r.lease.timer.Stop()
				defer cancel()
				defer unhook()
				defer m.drop(id, r)
				m.sender.Run(rctx, post, id, r.token, r.wake, r.lease.held)
			}()
		case ok:
			r.lease.extend(m.deadline(sent))
		case !ok && r != nil && lerr == nil:
			r.cancel() // another sender has it now
			delete(m.running, e.ID)
		}
		m.mu.Unlock()
	}
	m.mu.Lock()
	stopped := map[string]bool{}
	for id, r := range m.running {
		if !seen[id] {
			r.cancel()
			delete(m.running, id)
			stopped[id] = true
			// Once its sender has returned: it records nothing more.
			go func() {
				<-r.done
				m.sender.metrics.forgetAll(id)
			}()
		}
	}
	// A deleted endpoint's series go, whether or not this instance sent
	// for it: the intake counted what it queued. One made again by a
	// batch queued just before the delete goes at the next scan.
	for _, id := range noted {
		if _, sending := m.running[id]; !seen[id] && !stopped[id] && !sending {
			m.sender.metrics.forgetAll(id)
		}
	}
	m.mu.Unlock()
}

// drop takes r, endpoint id's run, out of the manager once its sender
// returned, whyever it did: the next scan then takes the lease afresh, for a
// new sender, if no other instance holds it. A sender stops on its own when
// it finds its lease's deadline passed before a POST (held), and lapse,
// the lease's timer, is not what removes it then: a renewal that succeeded
// after the deadline but before the timer's callback ran moves the deadline
// first, and the callback finds it ahead. The run, left registered with no
// sender behind it, had its lease renewed by every scan and renewal, so no
// instance sent for the endpoint until this one restarted.
func (m *Manager) drop(id string, r *run) {
	m.mu.Lock()
	if m.running[id] == r {
		delete(m.running, id)
	}
	m.mu.Unlock()
}

// deadline is when a lease renewed by a command sent at sent lapses at the
// earliest, less leaseMargin.
func (m *Manager) deadline(sent time.Time) time.Time {
	return sent.Add(m.leaseTTL - leaseMargin(m.leaseTTL))
}

// lapse stops r, endpoint id's sender, once its lease's deadline passed
// without a renewal (its timer fires then; a renewal meanwhile moved the
// deadline and reset it). The sender's POST in flight is cancelled: it
// is not recorded, the batch stays in flight, and the lease's next holder
// sends it again with the same webhook-id. The scan starts a sender again
// once it takes the lease again.
func (m *Manager) lapse(id string, r *run) {
	l := r.lease
	l.mu.Lock()
	if l.lapsed || time.Now().Before(l.until) {
		l.mu.Unlock()
		return
	}
	l.lapsed = true
	l.mu.Unlock()
	m.mu.Lock()
	if m.running[id] == r {
		r.cancel()
		delete(m.running, id)
	}
	m.mu.Unlock()
	m.log.Warn("webhooks: lease lapsed unrenewed, sender stopped", "endpoint", id)
}

// stop waits, within StopWait, for the senders (told to stop by the end of
// Run's ctx) to finish their attempts in flight, their leases still
// renewed; then stops the renewals and the senders still running
// (stopAll), and gives the leases back.
func (m *Manager) stop(stopRenewing func(), renewed <-chan struct{}) {
	m.mu.Lock()
	runs := slices.Collect(maps.Values(m.running))
	m.mu.Unlock()
	wait := m.StopWait
	if wait <= 0 {
		wait = 5 * time.Second
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	for _, r := range runs {
		select {
		case <-r.done:
			continue
		case <-t.C:
			m.log.Warn("webhooks: stop: attempts still in flight cancelled", "waited", wait)
		}
		break
	}
	// No renewal after the leases are given back.
	stopRenewing()
	<-renewed
	m.stopAll()
}

// stopAll stops every sender at once, its attempt in flight cancelled (the
// batch stays in flight), and gives the leases back.
func (m *Manager) stopAll() {
	m.mu.Lock()
	runs := m.running
	m.running = map[string]*run{}
	m.mu.Unlock()
	for _, r := range runs {
		r.cancel()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for id, r := range runs {
		<-r.done
		_ = m.store.Release(ctx, id, r.token)
	}
}
