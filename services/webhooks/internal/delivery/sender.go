package delivery

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/services/webhooks/internal/endpoint"
	"github.com/snipdev/snip/services/webhooks/internal/redisstore"
)

// SenderConfig is how senders batch and retry.
type SenderConfig struct {
	// Schedule are the waits before the 1st, 2nd, ... retry of a failing
	// batch; the last one repeats.
	Schedule []time.Duration
	// Jitter spreads each wait by up to this fraction either way, so
	// endpoints that failed together do not retry together.
	Jitter float64
	// DisableAfter disables an endpoint that has failed for this long.
	DisableAfter time.Duration
	// MaxBatchBytes bounds a request body.
	MaxBatchBytes int
	// Poll is how often an idle sender looks at its queue when nothing
	// woke it (an event queued by another instance).
	Poll time.Duration
}

// Body is what every POST carries: one or more events, oldest first.
//
//	{"events":[{"id":"<event id>","type":"click","timestamp":"<RFC 3339>","data":{...}}]}
//
// data is the event as published (events.Click, events.FraudAlert, or a test
// message). A receiver may deduplicate requests by webhook-id, which names
// one body (EncodeBody), and events by each event's id: an event can come
// in two bodies (a replay cutting it into another batch, a click stored
// twice).
type Body struct {
	Events []BodyEvent `json:"events"`
}

// BodyEvent is one event of a Body.
type BodyEvent struct {
	ID        string          `json:"id"`
	Type      string          `json:"type"`
	Timestamp time.Time       `json:"timestamp"`
	Data      json.RawMessage `json:"data"`
}

// EncodeBody returns the body of a batch of endpoint endpointID's events
// and its webhook-id: "msg_" and, in hex, the first 128 bits of the SHA-256
// of the endpoint's ID and the body. The ID names that body and nothing
// else: a retry of the batch (the sender's, a new sender's resuming the
// batch in flight, a redelivery) sends the same body, so the same ID, and a
// receiver may deduplicate by it as Standard Webhooks suggests. An ID made
// of the batch's first and last event IDs, as it was, named different
// bodies once a replay or a queue filled by several partitions put other
// events between the same two.
func EncodeBody(endpointID string, evs []redisstore.Event) ([]byte, string, error) {
	b := Body{Events: make([]BodyEvent, len(evs))}
	for i, e := range evs {
		b.Events[i] = BodyEvent{ID: e.ID, Type: e.Type, Timestamp: e.Time, Data: e.Data}
	}
	body, err := json.Marshal(b)
	if err != nil {
		return nil, "", fmt.Errorf("encode body: %w", err)
	}
	return body, WebhookID(endpointID, body), nil
}

// WebhookID is the webhook-id of body sent to endpoint endpointID (see
// EncodeBody).
func WebhookID(endpointID string, body []byte) string {
	h := sha256.New()
	h.Write([]byte(endpointID))
	h.Write([]byte{'\n'})
	h.Write(body)
	return "msg_" + hex.EncodeToString(h.Sum(nil)[:16])
}

// Sender delivers endpoints' queues.
type Sender struct {
	store   *redisstore.Store
	client  *Client
	cfg     SenderConfig
	metrics *Metrics
	log     *slog.Logger
	// OnDisabled is told when an endpoint is disabled (the service
	// publishes an event for the owner).
	OnDisabled func(ctx context.Context, e endpoint.Endpoint)
}

// NewSender returns a Sender.
func NewSender(store *redisstore.Store, client *Client, cfg SenderConfig, m *Metrics, log *slog.Logger) *Sender {
	return &Sender{store: store, client: client, cfg: cfg, metrics: m, log: log}
}

// backoff is the wait before retry n (1-based), with jitter.
func (s *Sender) backoff(n int) time.Duration {
	d := s.cfg.Schedule[min(n, len(s.cfg.Schedule))-1]
	if s.cfg.Jitter > 0 {
		d = time.Duration(float64(d) * (1 + s.cfg.Jitter*(2*rand.Float64()-1)))
	}
	return d
}

// sleep waits d, or until woken or ctx ends.
func sleep(ctx context.Context, d time.Duration, wake <-chan struct{}) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	case <-wake:
	}
}

// Run delivers endpoint id's queue until ctx ends, the endpoint is deleted,
// held reports false (the endpoint's lease may have lapsed: see lease) or
// Redis refuses a write because the endpoint's lease no longer holds token
// (redisstore.ErrLeaseLost: it passed to another sender). held is asked
// just before each POST; token is the lease's, as the scan that started
// the sender took it, and every write of the sender's state (in flight,
// delivered, failed, disabled) is made only while the lease holds it. wake
// is signalled when events were queued for it.
//
// An attempt (its POST and the writes that record it) runs under post, not
// ctx: when ctx ends (the service stops) the sender starts no other
// attempt, but the one in flight finishes and is recorded (a delivered
// batch leaves the queue), so the receiver does not get it again from the
// next sender. post ends it at once (the lease lapsed, or the stop's wait
// for it ran out): then it is not recorded and the batch stays in flight.
// post must end when ctx's parent does, so that it outlives ctx only.
func (s *Sender) Run(ctx, post context.Context, id, token string, wake <-chan struct{}, held func() bool) {
	s.metrics.note(id)
	defer s.metrics.forget(id)
	var (
		batch   []redisstore.Event
		gen     int
		retryAt time.Time
		attempt int
		// accepted is when the receiver last took a batch from this
		// sender (zero: not yet), for RecordFailure.
		accepted time.Time
	)
	for ctx.Err() == nil {
		e, st, err := s.store.Get(ctx, id)
		if errors.Is(err, endpoint.ErrNotFound) {
			return
		}
		if err != nil {
			if ctx.Err() != nil {
				return // stopping: the read was cut short, nothing failed
			}
			s.log.Warn("webhooks: load endpoint", "endpoint", id, "err", err)
			sleep(ctx, s.cfg.Poll, nil)
			continue
		}
		s.gauges(ctx, e)
		if e.Status() != "active" {
			sleep(ctx, s.cfg.Poll, wake)
			continue
		}
		if batch != nil && gen != e.Generation {
			batch = nil // the queue was cleared by a replay
		}
		if attempt > 0 && st.Attempts == 0 && st.FailingSince.IsZero() {
			attempt, retryAt = 0, time.Time{} // the owner resumed the endpoint: try now
		}
		if batch == nil {
			attempt, retryAt = st.Attempts, time.Time{}
			batch, err = s.nextBatch(ctx, e, token, wake)
			if errors.Is(err, redisstore.ErrLeaseLost) {
				s.log.Warn("webhooks: lease taken by another sender, sender stopped", "endpoint", id)
				return
			}
			if err != nil {
				if ctx.Err() != nil {
					// Stopping while the batch filled: the reads made with
					// the ended ctx fail, and the events stay queued for
					// the next sender.
					return
				}
				s.log.Warn("webhooks: read queue", "endpoint", id, "err", err)
				sleep(ctx, s.cfg.Poll, nil)
				continue
			}
			if batch == nil {
				continue
			}
			gen = e.Generation
		}
		if wait := time.Until(retryAt); wait > 0 {
			sleep(ctx, min(wait, s.cfg.Poll), nil) // and look at the endpoint again (paused, deleted, ...)
			continue
		}
		if ctx.Err() != nil {
			return // stopping: no new attempt; the batch stays in flight
		}
		out := s.attempt(post, e, token, batch, attempt+1, accepted, held)
		if ctx.Err() != nil || out.lapsed {
			// Stopping: the attempt was recorded, or (post ended, or the
			// lease passed) the batch stays in flight and is sent again.
			return
		}
		if !out.accepted.IsZero() {
			accepted = out.accepted
		}
		if out.delivered {
			batch, attempt = nil, 0
			continue
		}
		attempt++
		if out.attempts > 0 {
			attempt = out.attempts // as stored: a resume meanwhile started the run afresh
		}
		retryAt = time.Now().Add(s.nextDelay(attempt, out.retryAfter))
	}
}

// nextDelay is the wait before the next try: the server's Retry-After when
// it sent one (capped at the schedule's longest wait), else the schedule.
func (s *Sender) nextDelay(attempt int, retryAfter time.Duration) time.Duration {
	if retryAfter > 0 {
		return min(retryAfter, s.cfg.Schedule[len(s.cfg.Schedule)-1])
	}
	return s.backoff(attempt)
}

// nextBatch returns the in-flight batch left by a previous sender, or the
// next events (up to the endpoint's BatchMax and MaxBatchBytes, waiting at
// most BatchWait after the oldest was queued for more), or nil when the
// queue stayed empty for a poll.
func (s *Sender) nextBatch(ctx context.Context, e endpoint.Endpoint, token string, wake <-chan struct{}) ([]redisstore.Event, error) {
	first, last, ok, err := s.store.Inflight(ctx, e.ID)
	if err != nil {
		return nil, err
	}
	if ok {
		evs, err := s.store.ReadRange(ctx, e.ID, first, last)
		if err != nil || len(evs) > 0 {
			return evs, err
		}
	}
	evs, err := s.store.Read(ctx, e.ID, "0", e.BatchMax, s.cfg.MaxBatchBytes, 0)
	if err != nil {
		return nil, err
	}
	if len(evs) == 0 {
		sleep(ctx, s.cfg.Poll, wake)
		return nil, nil
	}
	deadline := entryTime(evs[0].Entry).Add(e.BatchWait)
	size := 0
	for _, ev := range evs {
		size += ev.Size()
	}
	for len(evs) < e.BatchMax && size < s.cfg.MaxBatchBytes && time.Now().Before(deadline) && ctx.Err() == nil {
		sleep(ctx, min(time.Until(deadline), 10*time.Millisecond+time.Until(deadline)/4), wake)
		more, err := s.store.Read(ctx, e.ID, evs[len(evs)-1].Entry, e.BatchMax-len(evs), s.cfg.MaxBatchBytes-size, 0)
		if err != nil {
			return nil, err
		}
		if len(more) > 0 && size+more[0].Size() > s.cfg.MaxBatchBytes {
			break
		}
		for _, ev := range more {
			size += ev.Size()
		}
		evs = append(evs, more...)
	}
	if err := s.store.SetInflight(ctx, e.ID, token, evs[0].Entry, evs[len(evs)-1].Entry); err != nil {
		return nil, err
	}
	return evs, nil
}

// entryTime is when a queue entry was added (its ID is "<unix ms>-<n>").
func entryTime(entry string) time.Time {
	ms, _ := strconv.ParseInt(strings.SplitN(entry, "-", 2)[0], 10, 64)
	return time.UnixMilli(ms)
}

// outcome is what one attempt came to.
type outcome struct {
	// delivered: the receiver took the batch and it left the queue.
	delivered bool
	// accepted is when the attempt the receiver took (2xx) was made, even
	// if recording it failed; zero when it did not take it.
	accepted time.Time
	// attempts is the failing run's attempts as stored, 0 when not stored.
	attempts int
	// retryAfter is the server's Retry-After.
	retryAfter time.Duration
	// lapsed: the sender stops. Nothing was sent (the endpoint's lease
	// may have lapsed), or the outcome was not recorded because the lease
	// holds another sender's token (redisstore.ErrLeaseLost): the batch
	// stays in flight, and the lease's holder sends it (again).
	lapsed bool
}

// attempt posts batch once (the n-th try) and records the outcome, if held
// still reports true just before the POST; the outcome is recorded only
// while the endpoint's lease holds token. okAfter is when the receiver
// last took a batch from this sender.
func (s *Sender) attempt(ctx context.Context, e endpoint.Endpoint, token string, batch []redisstore.Event, n int, okAfter time.Time, held func() bool) outcome {
	body, webhookID, err := EncodeBody(e.ID, batch)
	if err != nil {
		s.log.Error("webhooks: encode batch", "endpoint", e.ID, "err", err)
		return outcome{}
	}
	if !held() {
		return outcome{lapsed: true}
	}
	now := time.Now()
	res := s.client.Post(ctx, e.URL, e.Secrets(now), webhookID, body, now)
	if ctx.Err() != nil {
		return outcome{}
	}
	s.metrics.latency.WithLabelValues(e.ID).Observe(res.Duration.Seconds())
	ids := make([]string, len(batch))
	entries := make([]string, len(batch))
	for i, ev := range batch {
		ids[i], entries[i] = ev.ID, ev.Entry
	}
	d := redisstore.Delivery{
		ID: events.NewID(), WebhookID: webhookID, EventIDs: ids, Attempt: n, Time: now.UTC(),
		Code: res.Code, Response: res.Response, Error: res.ErrorText(), DurationMS: res.Duration.Milliseconds(),
	}
	if res.OK() {
		d.Status = "delivered"
	} else {
		d.Status = "failed"
	}
	if err := s.store.AddDelivery(ctx, e.ID, d, body); err != nil {
		s.log.Warn("webhooks: record delivery", "endpoint", e.ID, "err", err)
	}
	if res.OK() {
		// Delivered also ends the failing run, in the same script. If it
		// failed, the batch is sent again (a duplicate with the same
		// webhook-id), and the failing run left stored is stale: the next
		// failure's RecordFailure is given this time and starts afresh.
		removed, err := s.store.Delivered(ctx, e.ID, token, entries)
		if err != nil {
			if errors.Is(err, redisstore.ErrLeaseLost) {
				s.log.Warn("webhooks: lease taken by another sender, delivery not marked, sender stopped", "endpoint", e.ID)
				return outcome{lapsed: true}
			}
			s.log.Warn("webhooks: mark delivered", "endpoint", e.ID, "err", err)
			return outcome{accepted: now}
		}
		// Each queued event is counted once, as it leaves the queue: the
		// events this delivery removed. Those of the batch the backlog
		// bound dropped while it was in flight were counted as dropped
		// then (and a replay's clear re-queues what it removes, counted
		// when its copy is delivered).
		s.metrics.delivered.WithLabelValues(e.ID).Add(float64(removed))
		return outcome{delivered: true, accepted: now}
	}
	s.metrics.failed.WithLabelValues(e.ID).Inc()
	st, err := s.store.RecordFailure(ctx, e.ID, token, now, okAfter, d.Error)
	if errors.Is(err, redisstore.ErrLeaseLost) {
		s.log.Warn("webhooks: lease taken by another sender, failure not recorded, sender stopped", "endpoint", e.ID)
		return outcome{lapsed: true}
	}
	if err != nil {
		if !errors.Is(err, endpoint.ErrNotFound) {
			s.log.Warn("webhooks: record state", "endpoint", e.ID, "err", err)
		}
		return outcome{retryAfter: res.RetryAfter}
	}
	if now.Sub(st.FailingSince) >= s.cfg.DisableAfter && s.disable(ctx, e.ID, token) {
		s.log.Warn("webhooks: lease taken by another sender, endpoint not disabled, sender stopped", "endpoint", e.ID)
		return outcome{lapsed: true}
	}
	return outcome{attempts: st.Attempts, retryAfter: res.RetryAfter}
}

// disable stops deliveries to an endpoint that failed for too long; what is
// queued stays (bounded) and the owner can resume or replay it. It is a
// version-checked Update that looks at the failing run again as it writes:
// the owner's changes made meanwhile (a rotated secret) are kept, a resume
// that cleared the run wins, and a deleted endpoint stays deleted. It is
// written only while the endpoint's lease holds token (UpdateAsSender): a
// delivery by the lease's next holder ends the run without a new revision.
// It reports whether the lease held another token (nothing written).
func (s *Sender) disable(ctx context.Context, id, token string) (lost bool) {
	var disabled bool
	e, _, err := s.store.UpdateAsSender(ctx, id, token, func(e *endpoint.Endpoint, st redisstore.State) (redisstore.Write, error) {
		now := time.Now()
		disabled = e.DisabledAt.IsZero() && !st.FailingSince.IsZero() && now.Sub(st.FailingSince) >= s.cfg.DisableAfter
		if !disabled {
			return redisstore.WriteNothing, nil
		}
		e.DisabledAt = now.UTC()
		e.DisabledReason = fmt.Sprintf("failing since %s: %s", st.FailingSince.UTC().Format(time.RFC3339), st.LastError)
		return redisstore.WriteConfig, nil
	})
	if errors.Is(err, redisstore.ErrLeaseLost) {
		return true
	}
	if err != nil {
		if !errors.Is(err, endpoint.ErrNotFound) {
			s.log.Warn("webhooks: disable endpoint", "endpoint", id, "err", err)
		}
		return false
	}
	if !disabled {
		return false
	}
	s.log.Warn("webhooks: endpoint disabled", "endpoint", id, "owner", e.Owner, "reason", e.DisabledReason)
	if s.OnDisabled != nil {
		s.OnDisabled(ctx, e)
	}
	return false
}

// gauges refreshes the endpoint's backlog and status gauges.
func (s *Sender) gauges(ctx context.Context, e endpoint.Endpoint) {
	n, oldest, err := s.store.Backlog(ctx, e.ID)
	if err != nil {
		return
	}
	s.metrics.backlog.WithLabelValues(e.ID).Set(float64(n))
	age := 0.0
	if !oldest.IsZero() {
		age = time.Since(oldest).Seconds()
	}
	s.metrics.oldest.WithLabelValues(e.ID).Set(age)
	dis := 0.0
	if !e.DisabledAt.IsZero() {
		dis = 1
	}
	s.metrics.disabled.WithLabelValues(e.ID).Set(dis)
}
