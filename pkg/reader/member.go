package reader

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/topology"
)

// Run joins the consumer group cfg.Group on CLICKS and hands the partitions
// this member owns to h until ctx is cancelled. Then it leaves the group
// gracefully: it stops fetching, lets the batches in hand finish (within
// cfg.DrainTimeout), acks them, unpins its partitions so the other members
// take them at once, and returns nil.
//
// NATS outages are ridden out, not returned: the member keeps retrying, and
// while it cannot heartbeat its lease lapses and the others take over; it
// gives its partitions up once no heartbeat was stored for a lease TTL
// (leaseHeld; an answer counts however late, within the lease its write
// extends), and takes them afresh once one is. Run
// returns an error only for a configuration it cannot run with: among them
// ErrDuplicateMember, when another process runs as the same member and
// started first (see duplicate).
func Run(ctx context.Context, js jetstream.JetStream, cfg Config, h Handler) error {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return err
	}
	m := &member{
		cfg:      cfg,
		js:       js,
		h:        h,
		log:      cfg.Logger.With("group", cfg.Group, "member", cfg.Member),
		met:      newMetrics(cfg.Metrics),
		instance: newInstance(),
	}
	return m.run(ctx)
}

// member is one running instance of a group. Its control loop (run) owns
// the live-member set and the workers; each owned partition has a worker
// goroutine (worker.go names the files of its concerns).
type member struct {
	cfg Config
	js  jetstream.JetStream
	h   Handler
	log *slog.Logger
	met *metrics

	partitions int
	stream     jetstream.Stream
	kv         jetstream.KeyValue

	// hard is cancelled when work must stop at once (drain timeout passed).
	hard context.Context

	// rewind is the group's latest rewind request, read by workers between
	// batches.
	rewind atomic.Pointer[rewindRequest]

	// Owned by the control loop.
	live map[string]bool
	// claims are the partitions each live member said it holds, in its
	// last heartbeat: the assignment keeps them (AssignSticky).
	claims  map[string][]int
	workers map[int]*worker
	owned   []int

	// published is what this member's heartbeat says it holds (see
	// heartbeatClaims); claimed asks the heartbeat to publish it now, so
	// the others see a change without waiting for the next beat.
	published atomic.Pointer[claim]
	claimed   chan struct{}
	// lapsedLeases are the members whose lease the watch last saw go
	// (expired, deleted, purged), in the order seen, at most
	// maxLapsedLeases: the claims of such a member's next lease are of
	// before it went (apply). Control loop only, as live and claims are.
	lapsedLeases []string

	// clock is when the member started, on the monotonic clock; leaseUntil
	// is how long after it the lease surely lives (the latest sending of a
	// heartbeat heard stored, plus LeaseTTL; 0 before the first), by the
	// member's own clock. lapses counts the heartbeats stored at or after
	// that (the lease may have lapsed before them: a member cut off from
	// NATS, or frozen); lapsesSeen is the count the control loop last
	// acted on (releaseAfterLapse; control loop only). leaseBack tells the
	// control loop that the lease is held again (the first heartbeat, or
	// one after a lapse). leaving: the member left the group and stopped
	// heartbeating on purpose; its workers finish without it, holding
	// their partitions only if the lease lived when it left (leftHeld).
	clock      time.Time
	leaseMu    sync.Mutex // serializes stored
	leaseUntil atomic.Int64
	lapses     atomic.Uint64
	lapsesSeen uint64
	leaseBack  chan struct{}
	leaving    atomic.Bool
	leftHeld   atomic.Bool

	// instance tells this process's lease from another's written under the
	// same member name; since is when it joined, in its lease too.
	instance string
	since    time.Time
	// dupLogged is the instance of the last other process under this
	// member's name that was logged (control loop only).
	dupLogged string
}

func (m *member) run(ctx context.Context) error {
	hard, cancelHard := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHard()
	m.hard = hard
	if err := m.setup(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	m.live = map[string]bool{}
	m.claims = map[string][]int{}
	m.workers = map[int]*worker{}
	m.claimed = make(chan struct{}, 1)
	m.leaseBack = make(chan struct{}, 1)
	m.clock = time.Now()
	m.published.Store(&claim{owned: []int{}})
	m.since = time.Now().UTC().Round(0)
	m.log.Info("joining consumer group", "partitions", m.partitions, "instance", m.instance)
	// A member that holds nothing exports 0, not no series. The workers
	// count what they take over and give back (worker.run), so both are 0
	// again once drainWorkers has seen every worker end.
	m.met.owned.WithLabelValues(m.cfg.Group).Set(0)
	m.met.acquiring.WithLabelValues(m.cfg.Group).Set(0)

	hbCtx, stopHB := context.WithCancel(hard)
	var hbDone sync.WaitGroup
	hbDone.Go(func() { m.heartbeat(hbCtx) })

	exited := make(chan *worker, m.partitions+1)
	dup := m.control(ctx, exited)

	// Leave: stop heartbeating and delete our lease so the others rebalance
	// now rather than after LeaseTTL; then let our workers drain. The lease
	// goes as a purge marker that the server removes after LeaseTTL, as it
	// removes the marker of a lease that lapsed (LimitMarkerTTL): a plain
	// delete's marker would stay for good, one per member name, and every
	// member name is new (host, PID, random), so each restart would add
	// one that every member's watch of the group then reads.
	//
	// A member that stops because another process runs under its name
	// leaves the lease alone: it is the other's now.
	m.leave()
	stopHB()
	hbDone.Wait()
	if dup == nil {
		lctx, cancel := context.WithTimeout(hard, 2*time.Second)
		if err := m.kv.Purge(lctx, memberKey(m.cfg.Group, m.cfg.Member), jetstream.PurgeTTL(m.cfg.LeaseTTL)); err != nil {
			m.log.Warn("leave group: delete lease", "err", err)
		}
		cancel()
	}
	m.drainWorkers(exited)
	// Gone from the group, it sees no one: its last count would stay
	// exported for as long as the process lives.
	m.met.members.WithLabelValues(m.cfg.Group).Set(0)
	m.log.Info("left consumer group")
	return dup
}

// setup finds the stream, the partition count and the members bucket, and
// makes sure the group's consumers exist. It retries until ctx ends, so a
// member started before NATS is up simply waits.
func (m *member) setup(ctx context.Context) error {
	bo := m.cfg.newBackoff()
	for {
		err := m.trySetup(ctx)
		if err == nil {
			return nil
		}
		if errors.Is(err, ErrBadConfig) {
			return err
		}
		d := bo.NextBackOff()
		m.log.Warn("join consumer group: retrying", "err", err, "in", d)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
		}
	}
}

func (m *member) trySetup(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n := m.cfg.Partitions
	if n == 0 {
		var err error
		if n, err = topology.Partitions(ctx, m.js); err != nil {
			return err
		}
	}
	s, err := m.js.Stream(ctx, events.ClicksStream)
	if err != nil {
		return fmt.Errorf("stream %s: %w", events.ClicksStream, err)
	}
	kv, err := m.js.KeyValue(ctx, topology.MembersBucket)
	if err != nil {
		return fmt.Errorf("bucket %s (apply the topology): %w", topology.MembersBucket, err)
	}
	for p := range n {
		if err := m.ensureConsumer(ctx, s, p); err != nil {
			return err
		}
	}
	m.partitions, m.stream, m.kv = n, s, kv
	return nil
}

// ensureConsumer creates partition p's consumer if it does not exist, and
// updates the settings this member depends on if they differ. Where a
// consumer starts is fixed at creation: a group resumes where it was.
func (m *member) ensureConsumer(ctx context.Context, s jetstream.Stream, p int) error {
	want := m.cfg.consumerConfig(p)
	c, err := s.Consumer(ctx, want.Durable)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		_, err = s.CreateConsumer(ctx, want)
		if err == nil || errors.Is(err, jetstream.ErrConsumerExists) {
			return nil
		}
		return fmt.Errorf("create consumer %s: %w", want.Durable, err)
	}
	if err != nil {
		return fmt.Errorf("look up consumer %s: %w", want.Durable, err)
	}
	have := c.CachedInfo().Config
	if have.AckWait == want.AckWait && have.PinnedTTL == want.PinnedTTL && have.MaxAckPending >= want.MaxAckPending {
		return nil
	}
	have.AckWait, have.PinnedTTL = want.AckWait, want.PinnedTTL
	have.MaxAckPending = max(have.MaxAckPending, want.MaxAckPending)
	if _, err := s.UpdateConsumer(ctx, have); err != nil {
		return fmt.Errorf("update consumer %s: %w", want.Durable, err)
	}
	return nil
}

// Lease is a member's heartbeat value, in the members bucket under
// "<group>.members.<member>" while the member lives.
type Lease struct {
	Member string    `json:"member"`
	Host   string    `json:"host"`
	PID    int       `json:"pid"`
	Since  time.Time `json:"since"`
	// Instance is random, one per Run: two processes given the same
	// member name write the same key, and each tells the other's lease
	// from its own by it.
	Instance string `json:"instance,omitempty"`
	// Owned are the partitions the member holds: its claims, which the
	// assignment keeps while it lives (AssignSticky).
	Owned []int `json:"owned"`
}

// heartbeat keeps this member's lease alive: a KV entry with a per-message
// TTL of LeaseTTL, rewritten every LeaseTTL/3, and at once when the
// partitions it holds change. If the member stops (crash, partition from
// NATS), the server deletes the entry when the TTL runs out and the other
// members see a delete marker.
//
// Writes go out on schedule whether or not the ones before were answered
// (asynchronously, in order on the connection, so the server stores them
// in the order they were sent), and each answer is waited for up to the
// end of the lease that write would extend (its sending plus LeaseTTL): a
// slow answer (a loaded host, a slow NATS) still counts, and a write lost
// outright is made up for by the next ones, well within the lease.
func (m *member) heartbeat(ctx context.Context) {
	host, _ := os.Hostname()
	l := Lease{Member: m.cfg.Member, Host: host, PID: os.Getpid(), Since: m.since, Instance: m.instance}
	subj := memberSubject(m.cfg.Group, m.cfg.Member)
	// A publisher of its own: its pending answers are the heartbeats'
	// alone (what the caller publishes asynchronously on js waits for
	// none of them), and one never answered is dropped after a lease.
	// Cleaned up once the answers awaited are done with: its reply
	// subscription and reconnect listener would otherwise outlive the
	// member on the caller's connection, one per run.
	pub := m.js
	if nc := m.js.Conn(); nc != nil {
		if js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(m.cfg.LeaseTTL)); err == nil {
			pub = js
			defer js.CleanupPublisher()
		}
	}
	t := time.NewTicker(m.cfg.LeaseTTL / 3)
	defer t.Stop()
	var answers sync.WaitGroup
	defer answers.Wait()
	hs := &heartbeats{log: m.log}
	for {
		l.Owned = m.heartbeatClaims()
		val, _ := json.Marshal(l)
		sent := time.Since(m.clock)
		if nc := m.js.Conn(); nc != nil && !nc.IsConnected() {
			// Not sent: the client would keep it to send once reconnected,
			// claims of long before, which the others would go by. One
			// published just after the connection dropped is kept so all
			// the same: the others ignore its claims if it comes after
			// they saw the lease go (errLapsedClaims).
			hs.failed(ctx, nats.ErrDisconnected)
		} else if f, err := pub.PublishAsync(subj, val, jetstream.WithMsgTTL(m.cfg.LeaseTTL),
			// No resending (of a write met by no responders): it would
			// be stored after the writes sent since, its claims over
			// theirs. The next beat is the retry.
			jetstream.WithRetryAttempts(0)); err != nil {
			hs.failed(ctx, err)
		} else {
			answers.Go(func() { m.awaitStored(ctx, f, sent, hs) })
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-m.claimed:
		}
	}
}

// awaitStored waits for the answer to the heartbeat sent at sent (since
// m.clock), up to the end of the lease it would extend (sent+LeaseTTL):
// an answer after that extends nothing.
func (m *member) awaitStored(ctx context.Context, f jetstream.PubAckFuture, sent time.Duration, hs *heartbeats) {
	end := time.NewTimer(sent + m.cfg.LeaseTTL - time.Since(m.clock))
	defer end.Stop()
	select {
	case <-f.Ok():
		if m.stored(sent) {
			hs.answered()
		} else {
			hs.failed(ctx, errHeartbeatLate)
		}
	case err := <-f.Err():
		hs.failed(ctx, err)
	case <-end.C:
		hs.failed(ctx, errHeartbeatLate)
	case <-ctx.Done():
	}
}

// errHeartbeatLate is a heartbeat not answered within the lease it would
// have extended.
var errHeartbeatLate = errors.New("heartbeat not answered within the lease it would extend")

// heartbeats logs when the heartbeat starts failing and when it recovers,
// once each, whichever of the writes in flight tells.
type heartbeats struct {
	log     *slog.Logger
	mu      sync.Mutex
	failing bool
}

func (h *heartbeats) failed(ctx context.Context, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.failing && ctx.Err() == nil {
		h.log.Warn("heartbeat failing; the lease will lapse if it goes on", "err", err)
		h.failing = true
	}
}

func (h *heartbeats) answered() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.failing {
		h.log.Info("heartbeat recovered")
		h.failing = false
	}
}

// stored records a heartbeat the server stored, sent at sent (since
// m.clock), and reports whether it extended the lease. The lease it wrote
// lives LeaseTTL from when the server stored it, which was after it was
// sent: until sent+LeaseTTL at least, by this member's clock. Answers can
// come out of order (several writes are in flight), and the server stored
// the writes in the order they were sent, so the lease lives until the
// latest sending of a write stored, plus LeaseTTL: an earlier write
// answered later takes nothing back. One answered when that is past
// extends nothing and is not counted. Stored at or after the end of the
// lease before (now, the answer's arrival, the latest it can have been
// stored), it may have followed a lapse, which the member cannot count on
// seeing in the bucket (cut off from NATS, its watch hears nothing; back,
// its heartbeat can replace the lapse's marker before the watch reads
// it): another member may have held its partitions meanwhile. The control
// loop gives them all up, to take them afresh (releaseAfterLapse).
func (m *member) stored(sent time.Duration) bool {
	m.leaseMu.Lock()
	defer m.leaseMu.Unlock()
	now, lives := time.Since(m.clock), sent+m.cfg.LeaseTTL
	if now >= lives {
		return false
	}
	until := time.Duration(m.leaseUntil.Load())
	if until == 0 || now >= until {
		if until != 0 {
			m.lapses.Add(1)
			m.met.lapses.WithLabelValues(m.cfg.Group).Inc()
		}
		select {
		case m.leaseBack <- struct{}{}:
		default:
		}
	}
	if lives > until {
		m.leaseUntil.Store(int64(lives))
	}
	return true
}

// leaseHeld reports whether this member's lease surely lives, by its own
// clock: a heartbeat was stored less than LeaseTTL ago (from when it was
// sent). A member cut off from NATS sees no change in the bucket, the
// lapse of its own lease included; this is how it knows to fence itself.
// A member leaving the group holds its partitions until it gives them
// back (it deleted its lease on purpose).
//
// A member whose lease had lapsed when it left does not hold them: another
// member may have taken them meanwhile (it was frozen, or cut off from NATS,
// and is stopped before its heartbeats noticed).
func (m *member) leaseHeld() bool {
	if m.leaving.Load() {
		return m.leftHeld.Load()
	}
	return time.Since(m.clock) < time.Duration(m.leaseUntil.Load())
}

// leave marks the member as leaving, holding its partitions while its
// workers drain only if its lease lives now.
func (m *member) leave() {
	m.leftHeld.Store(m.leaseHeld())
	m.leaving.Store(true)
}

// control is the member's loop: it follows the bucket (members joining,
// leaving and expiring; rewind requests) and keeps one worker per partition
// this member should own. It returns when ctx ends (nil), or with
// ErrDuplicateMember when another process runs under this member's name
// and this one must stop (duplicate).
func (m *member) control(ctx context.Context, exited chan *worker) error {
	resync := time.NewTicker(max(10*m.cfg.LeaseTTL, 5*time.Second))
	defer resync.Stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		w, err := m.kv.Watch(ctx, groupWatchPattern(m.cfg.Group))
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			m.log.Warn("watch group: retrying", "err", err)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(time.Second):
				continue
			}
		}
		m.live = map[string]bool{}
		m.claims = map[string][]int{}
		m.lapsedLeases = nil
		synced, afresh := false, false
	watching:
		for {
			select {
			case <-ctx.Done():
				_ = w.Stop()
				return nil
			case e, ok := <-w.Updates():
				if !ok {
					break watching
				}
				if e == nil {
					synced = true
				} else {
					m.apply(e)
					// Only a write seen live is another process's: the
					// watch's first values may hold the lease of this
					// member's previous run, dead and not yet expired.
					if synced {
						if err := m.duplicate(e); err != nil {
							_ = w.Stop()
							return err
						}
					}
				}
				if synced {
					m.reconcile(exited)
				}
			case wk := <-exited:
				if m.workers[wk.p] == wk {
					delete(m.workers, wk.p)
				}
				if synced {
					m.reconcile(exited)
				}
			case <-resync.C:
				m.resync(ctx)
				if synced {
					m.reconcile(exited)
				}
			case <-tick.C:
				if synced {
					m.reconcile(exited)
				}
			case <-m.leaseBack:
				if m.releaseAfterLapse() {
					// What the watch shows may be of before the lapse (a
					// member cut off from NATS heard nothing meanwhile):
					// assigned by it, this member would take, and claim,
					// partitions others hold now. Watch afresh.
					afresh = true
					break watching
				}
				if synced {
					m.reconcile(exited)
				}
			}
		}
		_ = w.Stop()
		if ctx.Err() != nil {
			return nil
		}
		if !afresh {
			m.log.Warn("group watch ended; watching again")
		}
	}
}

// apply folds one bucket entry into the member's view.
func (m *member) apply(e jetstream.KeyValueEntry) {
	key := e.Key()
	switch {
	case strings.HasPrefix(key, memberPrefix(m.cfg.Group)):
		id := strings.TrimPrefix(key, memberPrefix(m.cfg.Group))
		if e.Operation() == jetstream.KeyValuePut {
			m.live[id] = true
			var l Lease
			err := json.Unmarshal(e.Value(), &l)
			if i := slices.Index(m.lapsedLeases, id); i >= 0 {
				// The first lease written after the member's went: its
				// claims are of before (see lapsedClaims). The member
				// holds nothing now; its next beat says what it takes.
				m.lapsedLeases = slices.Delete(m.lapsedLeases, i, i+1)
				if err == nil && len(l.Owned) > 0 {
					m.log.Info("ignoring the claims of a member's lease written after its lease went: they are of before",
						"other", id, "claims", l.Owned)
				}
				err = errLapsedClaims
			}
			if err == nil {
				m.claims[id] = l.Owned
			} else {
				delete(m.claims, id)
			}
		} else {
			delete(m.live, id)
			delete(m.claims, id)
			if !slices.Contains(m.lapsedLeases, id) {
				if len(m.lapsedLeases) == maxLapsedLeases {
					m.lapsedLeases = slices.Delete(m.lapsedLeases, 0, 1)
				}
				m.lapsedLeases = append(m.lapsedLeases, id)
			}
		}
	case key == rewindKey(m.cfg.Group) && e.Operation() == jetstream.KeyValuePut:
		var r rewindRequest
		if err := json.Unmarshal(e.Value(), &r); err != nil {
			m.log.Error("ignoring malformed rewind request", "err", err)
			return
		}
		m.rewind.Store(&r)
		m.log.Info("rewind requested", "rewind", r.ID)
	}
}

// errLapsedClaims: a lease's claims are of before the member's lease went.
//
// The claims in the first lease a member writes after its lease went
// (lapsed, the server's marker seen) are of before it went, so stale: a
// member fences itself by its own clock before the server expires its
// lease (it gives every partition up, and heartbeatClaims claims nothing
// until the control loop has taken partitions afresh), so no claim it
// makes after the expiry can hold anything. Such a lease is a write sent
// before the lapse and stored after it: one the client kept while it
// reconnected (nats.go keeps what is published while it reconnects, to
// send once back: a heartbeat that found the connection up and was
// published just after it dropped), or one sent by a process frozen past
// its lease. Taken as claims, they would make the members that hold
// those partitions now give them up (the stale claimant outranking them),
// for nothing: the member is not reading them, and its next beat claims
// none. Its liveness counts; its claims do not.
var errLapsedClaims = errors.New("claims of before the member's lease went")

// maxLapsedLeases bounds the members whose lapse is remembered (every
// restart is a new member name): older ones' next leases are taken as
// they come.
const maxLapsedLeases = 1024

// claim is what the heartbeat says the member holds: owned, as the
// control loop last assigned it with lapses counted (lapsesSeen then).
type claim struct {
	owned  []int
	lapses uint64
}

// heartbeatClaims is the Owned of the heartbeat sent now: the partitions
// the control loop assigned this member, unless its lease may have
// lapsed since (by its own clock: leaseHeld; or a heartbeat was stored
// after a lapse the control loop has not yet acted on). Then it holds
// nothing, whatever the control loop, which runs on its own tick, last
// published: a process frozen past its lease, or one whose heartbeats
// went unanswered, would otherwise claim, with its first heartbeat back,
// partitions others took meanwhile.
func (m *member) heartbeatClaims() []int {
	c := m.published.Load()
	if !m.leaseHeld() || c.lapses != m.lapses.Load() {
		return []int{}
	}
	return c.owned
}

// duplicate looks at a write of this member's own lease: one with another
// instance is another process given the same member name. Both see one
// member and work out the same partitions for it; the server's pin lets
// one of them read each, and the other waits, then forces an unpin and
// resets the partition to its ack floor, again and again. Each logs an
// error naming the other (once per other process) and counts every such
// write (snip_reader_duplicate_member_leases_total). The one that joined
// later (by the leases' Since, then Instance: both compare the same two
// values, so exactly one of them) returns ErrDuplicateMember, so that it
// stops before it forces anything, and the first goes on. Started again
// under the same name, it stops again: the name is the operator's to fix.
// Neither goes on quietly: two workers for one partition would take it
// from each other for as long as both live.
func (m *member) duplicate(e jetstream.KeyValueEntry) error {
	if e.Operation() != jetstream.KeyValuePut || e.Key() != memberKey(m.cfg.Group, m.cfg.Member) {
		return nil
	}
	var l Lease
	if err := json.Unmarshal(e.Value(), &l); err != nil || l.Instance == m.instance {
		return nil
	}
	m.met.duplicates.WithLabelValues(m.cfg.Group).Inc()
	later := m.since.After(l.Since) || m.since.Equal(l.Since) && m.instance > l.Instance
	if l.Instance != m.dupLogged {
		m.dupLogged = l.Instance
		this := "goes on: it joined first, the other stops"
		if later {
			this = "stops: the other joined first"
		}
		m.log.Error("another process runs as this member; a member name must be unique in its group (the service's *_MEMBER setting)",
			"other_host", l.Host, "other_pid", l.PID, "other_instance", l.Instance, "other_since", l.Since,
			"instance", m.instance, "since", m.since, "this_one", this)
	}
	if !later {
		return nil
	}
	return fmt.Errorf("member %s of group %s: another process (host %s, pid %d, instance %s) runs under the same name and joined first: %w",
		m.cfg.Member, m.cfg.Group, l.Host, l.PID, l.Instance, ErrDuplicateMember)
}

// resync checks the live set against the bucket, a safety net should the
// watch ever miss an update. Listing keys races with heartbeats (a key
// rewritten during the listing can be missed), so a member is dropped only if
// a direct Get says its lease is gone; listed keys are added.
func (m *member) resync(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	prefix := memberPrefix(m.cfg.Group)
	live := maps.Clone(m.live)
	for id := range m.live {
		if _, err := m.kv.Get(ctx, prefix+id); errors.Is(err, jetstream.ErrKeyNotFound) {
			delete(live, id)
		}
	}
	if lister, err := m.kv.ListKeysFiltered(ctx, prefix+"*"); err == nil {
		for k := range lister.Keys() {
			live[strings.TrimPrefix(k, prefix)] = true
		}
	}
	if !maps.Equal(live, m.live) {
		m.log.Warn("membership resync corrected the live set", "was", len(m.live), "now", len(live))
		m.live = live
		for id := range m.claims {
			if !live[id] {
				delete(m.claims, id)
			}
		}
	}
}

// reconcile starts and stops workers so this member owns exactly the
// partitions the assignment gives it. A member that cannot see its own
// lease, or whose lease may have lapsed by its own clock (no heartbeat
// stored for LeaseTTL: leaseHeld), owns nothing: that is how a member cut
// off from NATS, which sees no change in the bucket, fences itself. One
// whose heartbeat was stored again after such a lapse (lapses) gives every
// partition up, to take again afresh (acquire, OnAssign) whichever the
// assignment gives it: another member may have held it meanwhile.
// The assignment keeps what live members hold (their heartbeats' claims;
// this member's own from its current view), so a failover moves only the
// dead member's partitions.
func (m *member) reconcile(exited chan *worker) {
	// A lapse the control loop has not yet acted on (leaseBack) is not
	// held either: its view of the group may be of before it.
	held := m.leaseHeld() && m.lapses.Load() == m.lapsesSeen
	if !held && len(m.owned) > 0 {
		m.log.Warn("no heartbeat stored for a lease TTL: the lease may have lapsed, giving every partition up")
	}
	var want []int
	if m.live[m.cfg.Member] && held {
		members := slices.Collect(maps.Keys(m.live))
		claims := maps.Clone(m.claims)
		claims[m.cfg.Member] = m.owned
		for p, owner := range AssignSticky(m.cfg.Group, m.partitions, members, claims) {
			if owner == m.cfg.Member {
				want = append(want, p)
			}
		}
	}
	wanted := map[int]bool{}
	for _, p := range want {
		wanted[p] = true
	}
	for p, w := range m.workers {
		if !wanted[p] && !w.releasing {
			w.release()
		}
	}
	for _, p := range want {
		if _, ok := m.workers[p]; !ok {
			w := newWorker(m, p)
			m.workers[p] = w
			go func() {
				w.run()
				exited <- w
			}()
		}
	}
	m.met.members.WithLabelValues(m.cfg.Group).Set(float64(len(m.live)))
	changed := !slices.Equal(want, m.owned)
	if changed {
		m.met.rebalances.WithLabelValues(m.cfg.Group).Inc()
		m.log.Info("partitions assigned", "owned", want, "live_members", len(m.live))
		m.owned = want
	}
	if changed || m.published.Load().lapses != m.lapsesSeen {
		m.published.Store(&claim{owned: slices.Clone(want), lapses: m.lapsesSeen})
		select {
		case m.claimed <- struct{}{}:
		default:
		}
	}
}

// releaseAfterLapse gives every partition up (to take afresh) if a
// heartbeat was stored after the lease may have lapsed (member.stored)
// since it last looked, and reports whether one was.
func (m *member) releaseAfterLapse() bool {
	n := m.lapses.Load()
	if n == m.lapsesSeen {
		return false
	}
	m.lapsesSeen = n
	m.log.Warn("heartbeat stored again after the lease may have lapsed: giving every partition up, to take afresh what the group's current state gives this member")
	for _, w := range m.workers {
		if !w.releasing {
			w.release()
		}
	}
	return true
}

// drainWorkers asks every worker to release its partition and waits for
// all of them, cancelling the handlers if DrainTimeout passes first.
func (m *member) drainWorkers(exited chan *worker) {
	for _, w := range m.workers {
		if !w.releasing {
			w.release()
		}
	}
	deadline := time.NewTimer(m.cfg.DrainTimeout)
	defer deadline.Stop()
	for len(m.workers) > 0 {
		select {
		case w := <-exited:
			if m.workers[w.p] == w {
				delete(m.workers, w.p)
			}
		case <-deadline.C:
			m.log.Warn("drain timeout: cancelling handlers", "partitions", slices.Collect(maps.Keys(m.workers)))
			for _, w := range m.workers {
				w.cancel()
			}
			deadline.Reset(time.Hour)
		}
	}
}
