// Package delivery is the webhooks service's core: the intake that copies
// each owner's events into the queues of the endpoints that want them, and
// the senders that deliver each endpoint's queue, signed, batched and
// retried, one sender per endpoint so that one endpoint's trouble stays its
// own.
package delivery

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/services/webhooks/internal/endpoint"
	"github.com/snipdev/snip/services/webhooks/internal/redisstore"
)

// Intake routes events to endpoint queues. Its view of the endpoints is
// reloaded whenever the store's version changes (checked once per batch), so
// an endpoint gets the events handled after it was created.
type Intake struct {
	store   *redisstore.Store
	metrics *Metrics
	// Notify, if set, is told which endpoints got events (to wake their
	// senders at once).
	Notify func(id string)

	mu       sync.Mutex
	version  int64
	loaded   bool
	byOwner  map[string][]endpoint.Endpoint
	loadedAt time.Time
}

// NewIntake returns an Intake over store.
func NewIntake(store *redisstore.Store, m *Metrics) *Intake {
	return &Intake{store: store, metrics: m}
}

// endpoints returns the current endpoints by owner, reloading on change.
func (in *Intake) endpoints(ctx context.Context) (map[string][]endpoint.Endpoint, error) {
	v, err := in.store.Version(ctx)
	if err != nil {
		return nil, err
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.loaded && v == in.version && time.Since(in.loadedAt) < time.Minute {
		return in.byOwner, nil
	}
	all, err := in.store.All(ctx)
	if err != nil {
		return nil, err
	}
	m := map[string][]endpoint.Endpoint{}
	for _, e := range all {
		m[e.Owner] = append(m[e.Owner], e)
	}
	in.byOwner, in.version, in.loaded, in.loadedAt = m, v, true, time.Now()
	return m, nil
}

// HandleClicks is the CLICKS consumer group's handler: each click goes to
// the queues of its owner's endpoints that want it. A Redis failure is
// transient (the batch is handed again; a repeat queues duplicates with the
// same event IDs, which at-least-once allows).
func (in *Intake) HandleClicks(ctx context.Context, partition int, batch []reader.Event) error {
	eps, err := in.endpoints(ctx)
	if err != nil {
		return fmt.Errorf("handle clicks: %w", err)
	}
	q := map[string][]redisstore.Event{}
	for i, ev := range batch {
		var data []byte
		for _, e := range eps[ev.Click.Owner] {
			if !e.Wants(endpoint.TypeClick, ev.Click.Code) || ev.Seq <= e.ReplayClicksUpto {
				continue
			}
			if data == nil {
				if data, err = json.Marshal(ev.Click); err != nil {
					return reader.Poison(i, "encode", err)
				}
			}
			q[e.ID] = append(q[e.ID], redisstore.Event{Seq: ev.Seq, ID: ev.Click.ID, Type: endpoint.TypeClick, Time: ev.Click.Time, Data: data})
		}
	}
	_, err = in.enqueue(ctx, redisstore.DedupSeq, partition, q)
	return err
}

// HandleAlert routes one fraud alert (FRAUD sequence seq).
func (in *Intake) HandleAlert(ctx context.Context, seq uint64, a events.FraudAlert, raw []byte) error {
	eps, err := in.endpoints(ctx)
	if err != nil {
		return fmt.Errorf("handle alert: %w", err)
	}
	q := map[string][]redisstore.Event{}
	for _, e := range eps[a.Owner] {
		if e.Wants(endpoint.TypeFraudAlert, a.Code) && seq > e.ReplayAlertsUpto {
			q[e.ID] = append(q[e.ID], redisstore.Event{Seq: seq, ID: a.ID, Type: endpoint.TypeFraudAlert, Time: a.Time, Data: raw})
		}
	}
	_, err = in.enqueue(ctx, redisstore.DedupID, 0, q)
	return err
}

// enqueue queues q's events (redisstore.Store.Enqueue), counts them and
// wakes their senders. It returns how many each endpoint got: none for an
// endpoint deleted meanwhile, whose queue the store does not write.
func (in *Intake) enqueue(ctx context.Context, mode redisstore.Dedup, partition int, q map[string][]redisstore.Event) (map[string]int64, error) {
	for id := range q {
		in.metrics.note(id) // before any series of it is made (Manager.scan)
	}
	added, dropped, err := in.store.Enqueue(ctx, mode, partition, q)
	if err != nil {
		return nil, err
	}
	for id, n := range dropped {
		in.metrics.dropped.WithLabelValues(id).Add(float64(n))
	}
	for id, n := range added {
		in.queued(id, n)
	}
	return added, nil
}

// enqueueReplay queues a replay's batch for endpoint id while the replay
// is the endpoint's latest and its lease is held
// (redisstore.Store.EnqueueReplay), counts it and wakes the sender, as
// enqueue does. It returns how many were queued.
func (in *Intake) enqueueReplay(ctx context.Context, id string, hold redisstore.ReplayHold, batch []redisstore.Event) (int64, error) {
	in.metrics.note(id)
	added, dropped, err := in.store.EnqueueReplay(ctx, id, hold, batch)
	if err != nil {
		return 0, err
	}
	if dropped > 0 {
		in.metrics.dropped.WithLabelValues(id).Add(float64(dropped))
	}
	if added > 0 {
		in.queued(id, added)
	}
	return added, nil
}

// queued counts n events queued for endpoint id and wakes its sender.
func (in *Intake) queued(id string, n int64) {
	in.metrics.queued.WithLabelValues(id).Add(float64(n))
	if in.Notify != nil {
		in.Notify(id)
	}
}
