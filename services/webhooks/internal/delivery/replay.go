package delivery

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/services/webhooks/internal/endpoint"
	"github.com/snipdev/snip/services/webhooks/internal/redisstore"
)

// Replayer refills endpoints' queues from CLICKS and FRAUD, one replay at a
// time, in the instance that accepted the request. A replay in progress
// when the instance stops is not resumed: the owner asks again.
type Replayer struct {
	js     jetstream.JetStream
	store  *redisstore.Store
	intake *Intake
	log    *slog.Logger
	jobs   chan replayJob
	// partitions is CLICKS' partition count, for the readers' rule of
	// validity (events.ReadClick).
	partitions int
}

type replayJob struct {
	id   string
	from time.Time
}

// NewReplayer returns a Replayer that queues at most pending requests, of
// a CLICKS stream of partitions partitions.
func NewReplayer(js jetstream.JetStream, store *redisstore.Store, intake *Intake, log *slog.Logger, pending, partitions int) *Replayer {
	return &Replayer{js: js, store: store, intake: intake, log: log, jobs: make(chan replayJob, pending), partitions: partitions}
}

// Start queues a replay of endpoint e from time from, or returns ErrBusy.
func (r *Replayer) Start(_ context.Context, e endpoint.Endpoint, from time.Time) error {
	select {
	case r.jobs <- replayJob{id: e.ID, from: from}:
		return nil
	default:
		return ErrBusy
	}
}

// Run performs queued replays until ctx ends.
func (r *Replayer) Run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case j := <-r.jobs:
			if err := r.replay(ctx, j); err != nil && ctx.Err() == nil {
				r.log.Error("webhooks: replay", "endpoint", j.id, "from", j.from, "err", err)
			}
		}
	}
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

// replay marks the endpoint (live intake skips events up to the streams'
// current last sequences from now on), drops its queued events up to those
// sequences, and copies the owner's events stored since j.from up to them
// into the queue.
func (r *Replayer) replay(ctx context.Context, j replayJob) error {
	clicksUpto, err := lastSeq(ctx, r.js, events.ClicksStream)
	if err != nil {
		return err
	}
	alertsUpto, err := lastSeq(ctx, r.js, events.FraudStream)
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return err
	}
	// Version-checked: a rotation, pause or disable at the same moment keeps
	// its change, and an endpoint deleted since the request stays deleted.
	e, _, err := r.store.Update(ctx, j.id, func(e *endpoint.Endpoint, _ redisstore.State) (redisstore.Write, error) {
		e.ReplayClicksUpto, e.ReplayAlertsUpto = clicksUpto, alertsUpto
		e.Generation++
		return redisstore.WriteConfig, nil
	})
	if err != nil {
		return err
	}
	// Only what the replay refills goes: intake may have queued clicks
	// after the cut already (it hears of the new cut when it reloads the
	// endpoint), and nothing else would bring those back.
	if _, err := r.store.ClearUpTo(ctx, e.ID, clicksUpto, alertsUpto); err != nil {
		return err
	}
	n := 0
	if containsType(e.Types, endpoint.TypeClick) {
		c, err := r.copy(ctx, e, events.ClicksStream, "*.clicks."+e.Owner+".*", j.from, clicksUpto, func(data []byte, subject string, stored time.Time) (redisstore.Event, bool) {
			// The readers' rule, as live intake (the reader runtime) applies
			// it: a click whose payload disagrees with its subject (another
			// owner's, another link's) or partition is parked there, never
			// sent, and is not sent by a replay either.
			c, err := events.ReadClick(data, subject, r.partitions, stored)
			if err != nil || !e.Wants(endpoint.TypeClick, c.Code) {
				return redisstore.Event{}, false
			}
			b, _ := json.Marshal(c)
			return redisstore.Event{ID: c.ID, Type: endpoint.TypeClick, Time: c.Time, Data: b}, true
		})
		if err != nil {
			return err
		}
		n += c
	}
	if containsType(e.Types, endpoint.TypeFraudAlert) && alertsUpto > 0 {
		// An alert stored twice (republished after FRAUD's duplicate
		// window) is sent once, as live intake does. Alerts are few.
		seen := map[string]bool{}
		c, err := r.copy(ctx, e, events.FraudStream, events.FraudAlertSubjects, j.from, alertsUpto, func(data []byte, _ string, _ time.Time) (redisstore.Event, bool) {
			a, err := events.DecodeFraudAlert(data)
			if err != nil || a.Owner != e.Owner || !e.Wants(endpoint.TypeFraudAlert, a.Code) || seen[a.ID] {
				return redisstore.Event{}, false
			}
			seen[a.ID] = true
			return redisstore.Event{ID: a.ID, Type: endpoint.TypeFraudAlert, Time: a.Time, Data: data}, true
		})
		if err != nil {
			return err
		}
		n += c
	}
	r.log.Info("webhooks: replay queued", "endpoint", e.ID, "from", j.from, "events", n)
	return nil
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
// an ordered consumer and queues what convert accepts (given each message's
// payload, subject and time stored), 500 at a time.
func (r *Replayer) copy(ctx context.Context, e endpoint.Endpoint, stream, filter string, from time.Time, upto uint64,
	convert func(data []byte, subject string, stored time.Time) (redisstore.Event, bool)) (int, error) {
	if upto == 0 {
		return 0, nil
	}
	cons, err := r.js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{filter}, DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &from,
	})
	if err != nil {
		return 0, fmt.Errorf("replay %s: %w", stream, err)
	}
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
			if err := r.intake.enqueue(ctx, redisstore.DedupNone, 0, map[string][]redisstore.Event{e.ID: batch}); err != nil {
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
