package delivery

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/netguard"
	"github.com/snipdev/snip/services/webhooks/internal/endpoint"
	"github.com/snipdev/snip/services/webhooks/internal/redisstore"
)

// ErrBusy: too many replays are waiting; try again later.
var ErrBusy = errors.New("too many replays in progress")

// ErrCreating: the owner's other endpoint creations held the owner's
// create lock longer than a create waits for it; try again later.
var ErrCreating = errors.New("other endpoints of this owner are being created")

// ownerLockTTL bounds how long a create holds its owner's lock when its
// instance dies holding it; createWait is how long a create waits for it.
const (
	ownerLockTTL = 15 * time.Second
	createWait   = 10 * time.Second
)

// Admin is what the owner API does with endpoints.
type Admin struct {
	Store    *redisstore.Store
	Client   *Client
	Dialer   *netguard.Dialer
	Rules    endpoint.Rules
	Replayer *Replayer
	Intake   *Intake
	// RotationOverlap is how long the old secret keeps signing after a rotation.
	RotationOverlap time.Duration
	// MaxPerOwner bounds an owner's endpoints (each costs a queue and a
	// sender).
	MaxPerOwner int
	// Narrower, if set, widens the group's consumers to a new endpoint's
	// clicks before Create answers.
	Narrower *Narrower
}

// startLive sets where live intake starts for e: after CLICKS' last click
// now (see endpoint.Endpoint.ReplayClicksUpto).
func (a *Admin) startLive(ctx context.Context, e *endpoint.Endpoint) error {
	if a.Narrower == nil {
		return nil
	}
	upto, err := lastSeq(ctx, a.Narrower.js, events.ClicksStream)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrNotReading, err)
	}
	e.ReplayClicksUpto = upto
	return nil
}

// narrow makes the group's consumers read what the stored endpoints want,
// before an answer that promises an endpoint its clicks.
func (a *Admin) narrow(ctx context.Context) error {
	if a.Narrower == nil {
		return nil
	}
	nctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := a.Narrower.Sync(nctx); err != nil {
		return fmt.Errorf("%w: %v", ErrNotReading, err)
	}
	return nil
}

// Status is an endpoint as its owner sees it: configuration (the secrets
// only when asked), status, backlog and its latest replay.
type Status struct {
	endpoint.Endpoint
	Status       string    `json:"status"`
	Backlog      int64     `json:"backlog"`
	OldestQueued time.Time `json:"oldest_queued,omitzero"`
	FailingSince time.Time `json:"failing_since,omitzero"`
	LastError    string    `json:"last_error,omitempty"`
	// Replay is the latest replay's state (absent if none was asked for):
	// the replay runs after its request was answered, so a failure shows
	// here, and the owner asks again.
	Replay redisstore.Replay `json:"replay,omitzero"`
}

// statusJSON is the owner API's shape of a Status: the batch wait in the
// unit a create takes it in (batch_wait_ms), the secrets only in the answers
// that carry them (a create, a rotation), and none of the service's own
// bookkeeping (the replay cuts, the replay generation: the owner sees a
// replay's state in replay).
type statusJSON struct {
	ID             string            `json:"id"`
	Owner          string            `json:"owner"`
	URL            string            `json:"url"`
	Types          []string          `json:"event_types"`
	Links          []string          `json:"links,omitempty"`
	BatchMax       int               `json:"batch_max"`
	BatchWaitMS    int64             `json:"batch_wait_ms"`
	Secret         string            `json:"secret,omitempty"`
	OldSecret      string            `json:"old_secret,omitempty"`
	OldSecretUntil time.Time         `json:"old_secret_until,omitzero"`
	Paused         bool              `json:"paused"`
	DisabledAt     time.Time         `json:"disabled_at,omitzero"`
	DisabledReason string            `json:"disabled_reason,omitempty"`
	CreatedAt      time.Time         `json:"created_at"`
	Status         string            `json:"status"`
	Backlog        int64             `json:"backlog"`
	OldestQueued   time.Time         `json:"oldest_queued,omitzero"`
	FailingSince   time.Time         `json:"failing_since,omitzero"`
	LastError      string            `json:"last_error,omitempty"`
	Replay         redisstore.Replay `json:"replay,omitzero"`
}

// MarshalJSON writes s as the owner API answers it (statusJSON). The
// endpoint's stored form (endpoint.Endpoint's own JSON, in Redis) is
// another thing and keeps its fields.
func (s Status) MarshalJSON() ([]byte, error) {
	e := s.Endpoint
	return json.Marshal(statusJSON{
		ID: e.ID, Owner: e.Owner, URL: e.URL, Types: e.Types, Links: e.Links,
		BatchMax: e.BatchMax, BatchWaitMS: e.BatchWait.Milliseconds(),
		Secret: e.Secret, OldSecret: e.OldSecret, OldSecretUntil: e.OldSecretUntil,
		Paused: e.Paused, DisabledAt: e.DisabledAt, DisabledReason: e.DisabledReason, CreatedAt: e.CreatedAt,
		Status: s.Status, Backlog: s.Backlog, OldestQueued: s.OldestQueued,
		FailingSince: s.FailingSince, LastError: s.LastError, Replay: s.Replay,
	})
}

func (a *Admin) status(ctx context.Context, e endpoint.Endpoint, st redisstore.State, secrets bool) (Status, error) {
	n, oldest, err := a.Store.Backlog(ctx, e.ID)
	if err != nil {
		return Status{}, err
	}
	if !secrets {
		e.Secret, e.OldSecret = "", ""
	}
	return Status{Endpoint: e, Status: e.Status(), Backlog: n, OldestQueued: oldest,
		FailingSince: st.FailingSince, LastError: st.LastError, Replay: st.Replay}, nil
}

// Create validates and stores a new endpoint. Its host must resolve to
// addresses the SSRF guard allows now (and it is checked again at every
// connection). It answers once the group's consumers read the endpoint's
// clicks: every click stored after the answer is queued for it. If they
// cannot be told to (NATS unavailable), the endpoint is deleted again and
// the error is ErrNotReading.
func (a *Admin) Create(ctx context.Context, owner string, r endpoint.Request) (Status, error) {
	e, err := endpoint.New(owner, r, a.Rules, time.Now())
	if err != nil {
		return Status{}, err
	}
	if err := a.checkHost(ctx, e.URL); err != nil {
		return Status{}, err
	}
	if err := a.put(ctx, e); err != nil {
		return Status{}, err
	}
	if err := a.narrow(ctx); err != nil {
		if derr := a.Store.Delete(context.WithoutCancel(ctx), e); derr != nil {
			// Stored after all: Narrower.Run reads its clicks once NATS answers.
			return Status{}, errors.Join(err, derr)
		}
		return Status{}, err
	}
	return a.status(ctx, e, redisstore.State{}, true)
}

// put stores the owner's new endpoint e if the owner has room for it.
// The owner's creates take turns (a lock in Redis, across instances), so
// each counts what the ones before it stored: counted side by side, many
// creates at once all saw room, and the limit bounded nothing.
func (a *Admin) put(ctx context.Context, e endpoint.Endpoint) error {
	unlock, err := a.lockOwner(ctx, e.Owner)
	if err != nil {
		return err
	}
	defer unlock()
	have, err := a.Store.List(ctx, e.Owner)
	if err != nil {
		return err
	}
	if len(have) >= a.MaxPerOwner {
		return fmt.Errorf("at most %d endpoints per owner: %w", a.MaxPerOwner, endpoint.ErrInvalid)
	}
	if err := a.startLive(ctx, &e); err != nil {
		return err
	}
	return a.Store.Put(ctx, e)
}

// lockOwner takes the owner's create lock, waiting for it at most
// createWait, and returns what gives it back.
func (a *Admin) lockOwner(ctx context.Context, owner string) (unlock func(), err error) {
	holder := events.NewID()
	wctx, cancel := context.WithTimeout(ctx, createWait)
	defer cancel()
	for {
		ok, err := a.Store.LockOwner(wctx, owner, holder, ownerLockTTL)
		if err != nil && wctx.Err() == nil {
			return nil, fmt.Errorf("create: %w", err)
		}
		if ok {
			break
		}
		select {
		case <-wctx.Done():
		case <-time.After(10 * time.Millisecond):
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("create: %w", err)
		}
		return nil, fmt.Errorf("create: waited %s: %w", createWait, ErrCreating)
	}
	return func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_ = a.Store.UnlockOwner(uctx, owner, holder)
	}, nil
}

func (a *Admin) checkHost(ctx context.Context, raw string) error {
	u, err := endpoint.CheckURL(raw, a.Rules.HTTPHosts)
	if err != nil {
		return err
	}
	if err := a.Dialer.CheckHost(ctx, u.Hostname()); err != nil {
		if errors.Is(err, netguard.ErrRefused) || errors.Is(err, netguard.ErrNoSuchHost) {
			return fmt.Errorf("url: %v: %w", err, endpoint.ErrInvalid)
		}
		return err
	}
	return nil
}

// List returns the owner's endpoints, without secrets.
func (a *Admin) List(ctx context.Context, owner string) ([]Status, error) {
	eps, err := a.Store.List(ctx, owner)
	if err != nil {
		return nil, err
	}
	out := make([]Status, 0, len(eps))
	for _, e := range eps {
		_, st, err := a.Store.Get(ctx, e.ID)
		if errors.Is(err, endpoint.ErrNotFound) {
			continue // deleted since the listing
		}
		if err != nil {
			return nil, err
		}
		s, err := a.status(ctx, e, st, false)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// Get returns one of the owner's endpoints, without secrets.
func (a *Admin) Get(ctx context.Context, owner, id string) (Status, error) {
	e, st, err := a.Store.GetOwned(ctx, owner, id)
	if err != nil {
		return Status{}, err
	}
	return a.status(ctx, e, st, false)
}

// Delete removes one of the owner's endpoints and its queue.
func (a *Admin) Delete(ctx context.Context, owner, id string) error {
	e, _, err := a.Store.GetOwned(ctx, owner, id)
	if err != nil {
		return err
	}
	return a.Store.Delete(ctx, e)
}

// update changes one of the owner's endpoints with edit, version-checked
// (redisstore.Store.Update: a change made by another writer meanwhile is
// kept, and a deleted endpoint stays deleted); another owner's endpoint is
// not found.
func (a *Admin) update(ctx context.Context, owner, id string, edit redisstore.Edit) (endpoint.Endpoint, redisstore.State, error) {
	return a.Store.Update(ctx, id, func(e *endpoint.Endpoint, st redisstore.State) (redisstore.Write, error) {
		if e.Owner != owner {
			return redisstore.WriteNothing, fmt.Errorf("endpoint %s: %w", id, endpoint.ErrNotFound)
		}
		return edit(e, st)
	})
}

// SetPaused pauses or resumes an endpoint. Resuming also re-enables a
// disabled endpoint and starts its retries afresh (its delivery state is
// cleared in the same write).
func (a *Admin) SetPaused(ctx context.Context, owner, id string, paused bool) (Status, error) {
	var enabled bool
	e, st, err := a.update(ctx, owner, id, func(e *endpoint.Endpoint, _ redisstore.State) (redisstore.Write, error) {
		e.Paused, enabled = paused, false
		if paused {
			return redisstore.WriteConfig, nil
		}
		if !e.DisabledAt.IsZero() {
			if err := a.startLive(ctx, e); err != nil {
				return redisstore.WriteNothing, err
			}
			e.DisabledAt, e.DisabledReason, enabled = time.Time{}, "", true
		}
		return redisstore.WriteConfigAndResetState, nil
	})
	if err != nil {
		return Status{}, err
	}
	if enabled {
		// A disabled endpoint wanted nothing; resumed, it wants its clicks
		// again. If this fails the endpoint is resumed all the same, and
		// Narrower.Run widens the consumers once NATS answers. A paused
		// endpoint's clicks were read all along (ClickInterest): its
		// resume changes nothing the group reads, and needs no NATS.
		if err := a.narrow(ctx); err != nil {
			return Status{}, err
		}
	}
	return a.status(ctx, e, st, false)
}

// Rotate gives the endpoint a new secret; both sign for RotationOverlap.
// The secret answered is the one stored: a disable or a pause at the same
// moment does not write the old one back.
func (a *Admin) Rotate(ctx context.Context, owner, id string) (Status, error) {
	now := time.Now()
	e, st, err := a.update(ctx, owner, id, func(e *endpoint.Endpoint, _ redisstore.State) (redisstore.Write, error) {
		e.Rotate(now, a.RotationOverlap)
		return redisstore.WriteConfig, nil
	})
	if err != nil {
		return Status{}, err
	}
	return a.status(ctx, e, st, true)
}

// SendTest queues a test event for the endpoint and returns its ID. An
// endpoint deleted between the read and the queue write gets nothing queued
// (the store writes no queue for it), and that is endpoint.ErrNotFound,
// as for an endpoint that was never there: no ID of an event never queued.
func (a *Admin) SendTest(ctx context.Context, owner, id string) (string, error) {
	e, _, err := a.Store.GetOwned(ctx, owner, id)
	if err != nil {
		return "", err
	}
	ev := redisstore.Event{ID: events.NewID(), Type: endpoint.TypeTest, Time: time.Now().UTC(),
		Data: json.RawMessage(`{"message":"test event from Snip"}`)}
	added, err := a.Intake.enqueue(ctx, redisstore.DedupNone, 0, map[string][]redisstore.Event{e.ID: {ev}})
	if err != nil {
		return "", err
	}
	if added[e.ID] == 0 {
		return "", fmt.Errorf("endpoint %s: deleted before its test event was queued: %w", id, endpoint.ErrNotFound)
	}
	return ev.ID, nil
}

// Deliveries returns the endpoint's recent delivery attempts, newest first.
func (a *Admin) Deliveries(ctx context.Context, owner, id string) ([]redisstore.Delivery, error) {
	if _, _, err := a.Store.GetOwned(ctx, owner, id); err != nil {
		return nil, err
	}
	return a.Store.Deliveries(ctx, id)
}

// Redeliver sends a recent delivery's body again, now, with the same
// webhook-id and a fresh signature, and records the attempt.
func (a *Admin) Redeliver(ctx context.Context, owner, id, deliveryID string) (redisstore.Delivery, error) {
	e, _, err := a.Store.GetOwned(ctx, owner, id)
	if err != nil {
		return redisstore.Delivery{}, err
	}
	ds, err := a.Store.Deliveries(ctx, id)
	if err != nil {
		return redisstore.Delivery{}, err
	}
	var orig *redisstore.Delivery
	for i := range ds {
		if ds[i].ID == deliveryID {
			orig = &ds[i]
			break
		}
	}
	if orig == nil {
		return redisstore.Delivery{}, fmt.Errorf("delivery %s: %w", deliveryID, endpoint.ErrNotFound)
	}
	body, err := a.Store.Body(ctx, id, deliveryID)
	if err != nil {
		return redisstore.Delivery{}, err
	}
	now := time.Now()
	res := a.Client.Post(ctx, e.URL, e.Secrets(now), orig.WebhookID, body, now)
	d := redisstore.Delivery{
		ID: events.NewID(), WebhookID: orig.WebhookID, EventIDs: orig.EventIDs, Attempt: 1, Time: now.UTC(),
		Code: res.Code, Response: res.Response, Error: res.ErrorText(), DurationMS: res.Duration.Milliseconds(),
		Status: "failed", Redelivery: true,
	}
	if res.OK() {
		d.Status = "delivered"
	}
	return d, a.Store.AddDelivery(ctx, id, d, body)
}

// earliestReplay is the earliest time a replay may start from. The server
// holds a start time as nanoseconds since 1970 in an int64; an earlier time
// wraps around, and a replay from it (which drops the queued events up to
// its cut first) found nothing to refill from 1600, say, and lost them.
var earliestReplay = time.Unix(0, math.MinInt64).UTC().Truncate(time.Second).Add(time.Second)

// Replay drops the endpoint's queued events up to a cut at the streams'
// ends (not its test events, which no stream refills) and refills the queue, in the background, with the owner's events
// stored since from up to the cut (from not in the future, nor before
// earliestReplay); ErrBusy when the instance has no room for another
// replay. The endpoint's Status shows how the replay goes.
func (a *Admin) Replay(ctx context.Context, owner, id string, from time.Time) error {
	e, _, err := a.Store.GetOwned(ctx, owner, id)
	if err != nil {
		return err
	}
	if from.After(time.Now()) {
		return fmt.Errorf("replay from %s: in the future: %w", from.Format(time.RFC3339), endpoint.ErrInvalid)
	}
	if from.Before(earliestReplay) {
		return fmt.Errorf("replay from %s: before %s, the earliest time a stream position can hold: %w",
			from.Format(time.RFC3339), earliestReplay.Format(time.RFC3339), endpoint.ErrInvalid)
	}
	return a.Replayer.Start(ctx, e, from)
}
