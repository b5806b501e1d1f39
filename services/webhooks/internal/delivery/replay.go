package delivery

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/services/webhooks/internal/endpoint"
	"github.com/snipdev/snip/services/webhooks/internal/redisstore"
)

// Replayer refills endpoints' queues from CLICKS and FRAUD, one replay at a
// time, in the instance that accepted the request. The request is answered
// before the replay runs, so each replay's state (queued, running, failed
// with its error, done) is stored with the endpoint and shown in its GET:
// a replay that failed (NATS unavailable after the queue was cleared up to
// the cut, say) left the queue without some of the events up to its cut,
// and the owner asks again. Asking again is safe: the new replay cuts
// later, clears everything up to its cut (what the failed one refilled
// too) and refills it. A replay in progress when the instance stops is
// not resumed: a stop marks it failed. A crash cannot mark it, so each
// replay queued or running here holds a lease in Redis that Run renews
// every LeaseTTL/10: once its instance is gone the lease lapses and the
// replay reads as interrupted (redisstore.ReplayInterrupted), and the
// owner asks again. A replay superseded by a newer request (through any
// instance) or whose lease lapsed stops at its next write: its cut, each
// chunk of its clear and each batch it copies are written by scripts that
// refuse them once the replay is no longer the endpoint's latest or its
// lease is gone (redisstore.Store.UpdateAsReplay, ClearUpTo, EnqueueReplay).
// So nothing it copies lands after the newer replay's clear, where it would
// stay and reach the receiver a second time, and it neither lowers the
// newer replay's cut nor deletes what that one copied. It then writes no
// state.
type Replayer struct {
	js       jetstream.JetStream
	store    *redisstore.Store
	intake   *Intake
	log      *slog.Logger
	instance string
	leaseTTL time.Duration
	mu       sync.Mutex // held by Start, and by Run as it stops
	jobs     chan replayJob
	// stopped: Run returned; Start answers ErrBusy (another instance
	// takes the request asked again).
	stopped bool
	// partitions is CLICKS' partition count, for the readers' rule of
	// validity (events.ReadClick).
	partitions int

	heldMu sync.Mutex
	// held are the replays queued or running here whose leases Run
	// renews: endpoint ID to replay ID.
	held map[string]string
}

// ReplayerConfig is how a Replayer queues replays and holds their leases.
type ReplayerConfig struct {
	// Pending is how many requests may wait for the replay before them.
	Pending int
	// Partitions is CLICKS' partition count.
	Partitions int
	// Instance names this instance in the replays' leases.
	Instance string
	// LeaseTTL is how long a replay of an instance that stopped renewing
	// (crashed) reads as queued or running before it reads as
	// interrupted; the leases are renewed every LeaseTTL/10.
	LeaseTTL time.Duration
}

type replayJob struct {
	id    string
	state redisstore.Replay
}

// NewReplayer returns a Replayer configured by cfg.
func NewReplayer(js jetstream.JetStream, store *redisstore.Store, intake *Intake, log *slog.Logger, cfg ReplayerConfig) *Replayer {
	return &Replayer{js: js, store: store, intake: intake, log: log, instance: cfg.Instance, leaseTTL: cfg.LeaseTTL,
		jobs: make(chan replayJob, cfg.Pending), partitions: cfg.Partitions, held: map[string]string{}}
}

// lease is the lease a replay queued or running here holds.
func (r *Replayer) lease() redisstore.ReplayLease {
	return redisstore.ReplayLease{Holder: r.instance, TTL: r.leaseTTL}
}

// hold adds replay j to those whose leases Run renews; release takes it
// off once it ended here (or is no longer this instance's).
func (r *Replayer) hold(j replayJob) {
	r.heldMu.Lock()
	defer r.heldMu.Unlock()
	r.held[j.id] = j.state.ID
}

func (r *Replayer) release(j replayJob) {
	r.heldMu.Lock()
	defer r.heldMu.Unlock()
	if r.held[j.id] == j.state.ID {
		delete(r.held, j.id)
	}
}

// renew extends the leases of the replays held here every LeaseTTL/10, all
// in one round trip, until ctx ends. A replay superseded by a newer request
// or whose lease lapsed (it reads as interrupted, and the owner may have
// asked again) is no longer renewed; one the renewal failed for is tried
// again next time.
//
// A lapse is for good, so the renewals leave most of the lease as slack:
// coming a tenth of it apart, the first renewal after Redis was out of
// reach for less than nine tenths of the lease (less a renewal's own time)
// still finds it, and so does the retry of one stuck for the Redis
// client's read timeout (2 s by default, of the default 3 s lease).
// Renewed every third, two failed renewals in a row (Redis out of reach for
// a little over a third of the lease) left the next one due as the lease
// lapsed, and the retry of one stuck for the read timeout came as it
// lapsed.
func (r *Replayer) renew(ctx context.Context) {
	t := time.NewTicker(r.leaseTTL / 10)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.heldMu.Lock()
		replays := maps.Clone(r.held)
		r.heldMu.Unlock()
		if len(replays) == 0 {
			continue
		}
		held, err := r.store.RenewReplays(ctx, replays, r.instance, r.leaseTTL)
		if err != nil {
			if ctx.Err() == nil {
				r.log.Warn("webhooks: renew replay leases", "replays", len(replays), "renewed", len(held), "err", err)
			}
			continue
		}
		for id, replay := range replays {
			if !held[id] {
				r.release(replayJob{id: id, state: redisstore.Replay{ID: replay}})
			}
		}
	}
}

// Start queues a replay of endpoint e from time from and stores it as the
// endpoint's latest replay, queued; or returns ErrBusy, storing nothing.
func (r *Replayer) Start(ctx context.Context, e endpoint.Endpoint, from time.Time) error {
	// Only Start sends, under mu: a job it found room for has room when
	// sent, after its state is stored (so the replay's own writes, running
	// and done, come after this one).
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped || len(r.jobs) == cap(r.jobs) {
		return ErrBusy
	}
	now := time.Now().UTC()
	j := replayJob{id: e.ID, state: redisstore.Replay{ID: events.NewID(), State: redisstore.ReplayQueued,
		From: from.UTC(), RequestedAt: now, UpdatedAt: now}}
	if err := r.store.SetReplay(ctx, e.ID, j.state, true, r.lease()); err != nil {
		return err
	}
	r.hold(j)
	r.jobs <- j
	return nil
}

// Run performs queued replays, and renews the leases of those queued and
// running, until ctx ends. Then it marks the replay it was running, and
// those still queued, failed: they never finish here.
func (r *Replayer) Run(ctx context.Context) error {
	if r.leaseTTL <= 0 || r.instance == "" {
		return fmt.Errorf("replayer: lease TTL %s, instance %q: want a TTL > 0 and an instance", r.leaseTTL, r.instance)
	}
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		r.renew(ctx)
	}()
	defer func() { <-renewed }()
	for {
		select {
		case <-ctx.Done():
			r.mu.Lock()
			defer r.mu.Unlock()
			r.stopped = true
			for {
				select {
				case j := <-r.jobs:
					r.finish(ctx, j, 0, errStopped)
				default:
					return nil
				}
			}
		case j := <-r.jobs:
			r.run(ctx, j)
		}
	}
}

// errStopped is a replay's error when its instance stopped before it
// finished.
var errStopped = errors.New("the instance running the replay stopped before it finished; ask again")

// run performs one replay and stores how it ended.
func (r *Replayer) run(ctx context.Context, j replayJob) {
	if ctx.Err() != nil {
		r.finish(ctx, j, 0, errStopped)
		return
	}
	j.state.State, j.state.UpdatedAt = redisstore.ReplayRunning, time.Now().UTC()
	if err := r.store.SetReplay(ctx, j.id, j.state, false, r.lease()); err != nil {
		// Superseded (a newer replay clears and refills all this one
		// would), deleted, or its lease lapsed while it waited (it reads
		// as interrupted, and the owner may have asked again): nothing to
		// do. Else Redis failed, and the replay would too.
		if ctx.Err() != nil {
			err = errStopped
		}
		if !errors.Is(err, redisstore.ErrReplaySuperseded) && !errors.Is(err, endpoint.ErrNotFound) &&
			!errors.Is(err, redisstore.ErrReplayLeaseLapsed) {
			r.finish(ctx, j, 0, err)
		}
		r.release(j)
		return
	}
	n, err := r.replay(ctx, j.id, redisstore.ReplayHold{ID: j.state.ID, Holder: r.instance}, j.state.From)
	if errors.Is(err, redisstore.ErrReplaySuperseded) || errors.Is(err, redisstore.ErrReplayLeaseLapsed) {
		// It stopped as soon as a newer replay was asked for (which
		// refills all this one would) or its lease lapsed (it reads as
		// interrupted): its state is no longer its to write.
		r.log.Info("webhooks: replay stopped", "endpoint", j.id, "replay", j.state.ID, "events", n, "reason", err)
		r.release(j)
		return
	}
	if err != nil && ctx.Err() != nil {
		err = errStopped
	}
	r.finish(ctx, j, n, err)
}

// finish stores how replay j ended (done with n events, or failed with
// err) while it is the endpoint's latest, dropping its lease, and logs a
// failure.
func (r *Replayer) finish(ctx context.Context, j replayJob, n int, err error) {
	defer r.release(j)
	j.state.State, j.state.UpdatedAt, j.state.Events = redisstore.ReplayDone, time.Now().UTC(), n
	if err != nil {
		j.state.State, j.state.Error, j.state.Events = redisstore.ReplayFailed, ownerReason(err), 0
		if !errors.Is(err, endpoint.ErrNotFound) {
			r.log.Error("webhooks: replay", "endpoint", j.id, "from", j.state.From, "err", err)
		}
	}
	// Written also while the instance stops (ctx ended), within a bound.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if werr := r.store.SetReplay(wctx, j.id, j.state, false, redisstore.ReplayLease{}); werr != nil &&
		!errors.Is(werr, redisstore.ErrReplaySuperseded) && !errors.Is(werr, endpoint.ErrNotFound) {
		r.log.Error("webhooks: store replay state", "endpoint", j.id, "state", j.state.State, "err", werr)
	}
}

// ownerReason is what the owner is shown of a failed replay: what happened
// and what to do, not the internal error (stream names, server codes),
// which goes to the log.
func ownerReason(err error) string {
	switch {
	case errors.Is(err, errStopped):
		return "the instance running the replay stopped; ask again"
	case errors.Is(err, endpoint.ErrNotFound):
		return "the endpoint was deleted"
	}
	return "reading the event streams failed; ask again"
}

func lastSeq(ctx context.Context, js jetstream.JetStream, stream string) (uint64, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, fmt.Errorf("stream %s: %w", stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("stream %s: %w", stream, err)
	}
	return info.State.LastSeq, nil
}

// replay marks endpoint id (live intake skips events up to the streams'
// current last sequences from now on), drops its queued events up to those
// sequences, and copies the owner's events stored since from up to them
// into the queue, as replay hold. It returns how many it queued. The cut,
// each chunk of the clear and each batch it queues are refused, and the
// replay ends with redisstore.ErrReplaySuperseded or
// redisstore.ErrReplayLeaseLapsed, once hold is no longer the endpoint's
// latest replay or its lease lapsed.
func (r *Replayer) replay(ctx context.Context, id string, hold redisstore.ReplayHold, from time.Time) (int, error) {
	clicksUpto, err := lastSeq(ctx, r.js, events.ClicksStream)
	if err != nil {
		return 0, err
	}
	alertsUpto, err := lastSeq(ctx, r.js, events.FraudStream)
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, err
	}
	// Version-checked: a rotation, pause or disable at the same moment keeps
	// its change, and an endpoint deleted since the request stays deleted.
	// Written only while hold is the latest replay holding its lease, as
	// the clear and every batch: a superseded one must not lower the newer
	// one's cut, nor delete what it copied.
	e, _, err := r.store.UpdateAsReplay(ctx, id, hold, func(e *endpoint.Endpoint, _ redisstore.State) (redisstore.Write, error) {
		e.ReplayClicksUpto, e.ReplayAlertsUpto = clicksUpto, alertsUpto
		e.Generation++
		return redisstore.WriteConfig, nil
	})
	if err != nil {
		return 0, err
	}
	// Only what the replay refills goes: intake may have queued clicks
	// after the cut already (it hears of the new cut when it reloads the
	// endpoint), and nothing else would bring those back.
	if _, err := r.store.ClearUpTo(ctx, e.ID, hold, clicksUpto, alertsUpto); err != nil {
		return 0, err
	}
	n := 0
	if containsType(e.Types, endpoint.TypeClick) {
		c, err := r.copy(ctx, e, hold, events.ClicksStream, "*.clicks."+e.Owner+".*", from, clicksUpto, func(data []byte, subject string, stored time.Time) (redisstore.Event, bool) {
			// The readers' rule, as live intake (the reader runtime) applies
			// it: a click whose payload disagrees with its subject (another
			// owner's, another link's) or partition is parked there, never
			// sent, and is not sent by a replay either. A disabled
			// endpoint is refilled too (Selects, not Wants: the replay
			// cleared its queue up to the cut), and sent it once resumed.
			c, err := events.ReadClick(data, subject, r.partitions, stored)
			if err != nil || !e.Selects(endpoint.TypeClick, c.Code) {
				return redisstore.Event{}, false
			}
			b, _ := json.Marshal(c)
			return redisstore.Event{ID: c.ID, Type: endpoint.TypeClick, Time: c.Time, Data: b}, true
		})
		if err != nil {
			return n, err
		}
		n += c
	}
	if containsType(e.Types, endpoint.TypeFraudAlert) && alertsUpto > 0 {
		// An alert stored twice (republished after FRAUD's duplicate
		// window) is sent once, as live intake does. Alerts are few.
		seen := map[string]bool{}
		c, err := r.copy(ctx, e, hold, events.FraudStream, events.FraudAlertSubjects, from, alertsUpto, func(data []byte, _ string, _ time.Time) (redisstore.Event, bool) {
			a, err := events.DecodeFraudAlert(data)
			if err != nil || a.Owner != e.Owner || !e.Selects(endpoint.TypeFraudAlert, a.Code) || seen[a.ID] {
				return redisstore.Event{}, false
			}
			seen[a.ID] = true
			return redisstore.Event{ID: a.ID, Type: endpoint.TypeFraudAlert, Time: a.Time, Data: data}, true
		})
		if err != nil {
			return n, err
		}
		n += c
	}
	r.log.Info("webhooks: replay queued", "endpoint", e.ID, "from", from, "events", n)
	return n, nil
}

func containsType(ts []string, t string) bool {
	for _, x := range ts {
		if x == t {
			return true
		}
	}
	return false
}

// copy reads stream (filtered) from a start time up to sequence upto with
// an ordered consumer (deleted when done) and queues what convert accepts (given each message's
// payload, subject and time stored), 500 at a time, as replay hold: the
// script that queues a batch refuses it once hold is superseded, its lease
// lapsed or the endpoint is deleted, and copy returns that error.
func (r *Replayer) copy(ctx context.Context, e endpoint.Endpoint, hold redisstore.ReplayHold, stream, filter string, from time.Time, upto uint64,
	convert func(data []byte, subject string, stored time.Time) (redisstore.Event, bool)) (int, error) {
	if upto == 0 {
		return 0, nil
	}
	// Each copy creates a consumer on the stream: deleted when done, so
	// that replays asked again and again leave none behind.
	cons, done, err := reader.OneOffRead(ctx, r.js, stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{filter}, DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &from,
	})
	if err != nil {
		return 0, fmt.Errorf("replay %s: %w", stream, err)
	}
	defer done()
	total, noResponders := 0, 0
	for {
		if err := ctx.Err(); err != nil {
			return total, fmt.Errorf("replay %s: %w", stream, err)
		}
		msgs, err := cons.Fetch(500, jetstream.FetchMaxWait(time.Second))
		if errors.Is(err, nats.ErrNoResponders) && noResponders < maxNoResponders {
			// On a NATS cluster a pull can reach no one while the ordered
			// consumer is being recreated on another node; the same
			// consumer's next pull goes on where it stopped.
			noResponders++
			continue
		}
		if err != nil {
			return total, fmt.Errorf("replay %s: %w", stream, err)
		}
		var batch []redisstore.Event
		done, got := false, 0
		for m := range msgs.Messages() {
			got++
			md, err := m.Metadata()
			if err != nil {
				continue
			}
			if md.Sequence.Stream > upto {
				done = true
				continue
			}
			if ev, ok := convert(m.Data(), m.Subject(), md.Timestamp); ok {
				ev.Seq = md.Sequence.Stream
				batch = append(batch, ev)
			}
			if md.Sequence.Stream == upto || md.NumPending == 0 {
				done = true
			}
		}
		if err := msgs.Error(); errors.Is(err, nats.ErrNoResponders) && noResponders < maxNoResponders {
			noResponders++
			continue
		} else if err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, nats.ErrTimeout) {
			return total, fmt.Errorf("replay %s: %w", stream, err)
		}
		noResponders = 0
		if len(batch) > 0 {
			if _, err := r.intake.enqueueReplay(ctx, e.ID, hold, batch); err != nil {
				return total, err
			}
			total += len(batch)
		}
		if done {
			return total, nil
		}
		if got == 0 {
			// Nothing came within the wait: the end of what matches the
			// filter, or a slow server. Only the consumer knows which.
			info, err := cons.Info(ctx)
			for i := 0; errors.Is(err, nats.ErrNoResponders) && i < maxNoResponders; i++ {
				info, err = cons.Info(ctx)
			}
			if err != nil {
				return total, fmt.Errorf("replay %s: %w", stream, err)
			}
			if info.NumPending == 0 {
				return total, nil
			}
		}
	}
}

// maxNoResponders is how many pulls (or consumer infos) in a row a replay
// retries when no server answers them.
const maxNoResponders = 20
