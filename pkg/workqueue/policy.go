package workqueue

import (
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/failure"
)

// Reasons the queue itself gives.
const (
	// ReasonUnclassified: a handler error that carries no reason (not a
	// failure.Classified).
	ReasonUnclassified = failure.ReasonUnclassified
	// ReasonMaxDeliveries: the delivery limit was reached without a worker's
	// decision (a worker crashed or hung on the last try); found by the
	// MAX_DELIVERIES advisory.
	ReasonMaxDeliveries = "max_deliveries"
)

// Backoff is the retry schedule of transient failures: try n (1-based)
// that failed is retried after Base·2^(n-1), capped at Max, plus up to
// Jitter of that again at random, so jobs that failed together (a site that
// went down) do not all come back together. A Retry-After from the failure
// raises the delay, up to RetryAfterMax.
type Backoff struct {
	Base          time.Duration
	Max           time.Duration
	Jitter        float64
	RetryAfterMax time.Duration
}

// Delay is the wait before retrying after the failed try number attempt.
// rnd is a random number in [0, 1).
func (b Backoff) Delay(attempt uint64, retryAfter time.Duration, rnd float64) time.Duration {
	d := b.Base
	for i := uint64(1); i < attempt && d < b.Max; i++ {
		d *= 2
	}
	d = min(d, b.Max)
	d += time.Duration(float64(d) * b.Jitter * rnd)
	if retryAfter > 0 {
		d = max(d, min(retryAfter, b.RetryAfterMax))
	}
	return d
}

// consumerPolicy is what the queue needs to know of the consumer's
// configuration; it is read from the server, so the queue follows the
// consumer that exists rather than its own idea of it.
type consumerPolicy struct {
	maxDeliver int // <= 0: unlimited
	ackWait    time.Duration
	backoff    []time.Duration
}

func policyOf(c jetstream.ConsumerConfig) consumerPolicy {
	return consumerPolicy{maxDeliver: c.MaxDeliver, ackWait: c.AckWait, backoff: slices.Clone(c.BackOff)}
}

func (p consumerPolicy) equal(o consumerPolicy) bool {
	return p.maxDeliver == o.maxDeliver && p.ackWait == o.ackWait && slices.Equal(p.backoff, o.backoff)
}

// deadline is how long the server waits for an ack (or progress) of
// delivery number delivered before it redelivers.
func (p consumerPolicy) deadline(delivered uint64) time.Duration {
	if len(p.backoff) == 0 {
		return p.ackWait
	}
	i := min(int(max(delivered, 1))-1, len(p.backoff)-1)
	return p.backoff[i]
}

// keepAliveEvery is how often a worker tells the server it is still working
// on delivery number delivered: three times per ack deadline, so one lost
// or late progress message does not cost a redelivery.
func (p consumerPolicy) keepAliveEvery(delivered uint64) time.Duration {
	return max(p.deadline(delivered)/3, 20*time.Millisecond)
}

func (p consumerPolicy) lastTry(delivered uint64) bool {
	return p.maxDeliver > 0 && delivered >= uint64(p.maxDeliver)
}

// nakDelay converts the wanted wait before the next delivery into the
// delay to send with NakWithDelay.
//
// The server (nats-server 2.15 consumer.go, processNak and checkPending)
// stores a delayed NAK as "delivered at now - AckWait + delay" and then
// redelivers once the current delivery's deadline has passed since then. With
// a BackOff list that deadline is BackOff[delivered-1], not AckWait, so a
// plain NakWithDelay(d) on delivery n waits d + BackOff[n-1] - AckWait. The
// difference is subtracted here, so the job comes back after want (or after
// BackOff[n-1] - AckWait, if that is longer). TestNakDelayCompensatesForTheServersBackOff
// checks the arithmetic.
func (p consumerPolicy) nakDelay(want time.Duration, delivered uint64) time.Duration {
	extra := p.deadline(delivered) - p.ackWait
	// At least 1ms: NakWithDelay(0) is a plain NAK, which redelivers at once.
	return max(want-extra, time.Millisecond)
}

// action is what happens to a delivery once its handler returned.
type action int

const (
	ack     action = iota // done: acknowledge, the work queue removes it
	retry                 // transient failure: NAK with a delay
	dead                  // permanent failure or last try: DEAD_LETTER, then TERM
	requeue               // the worker is stopping: NAK without delay
)

type decision struct {
	action action
	reason string
	delay  time.Duration // for retry: the wanted wait before the next try
}

// decide turns a handler's result into what happens to the delivery. This
// function is the one place that does: handlers return errors in the terms
// of package failure (nil, retryable, permanent), the runtime decides. The
// queue adds one rule of its own: a retryable failure on the last allowed
// delivery is parked with its reason.
func decide(err error, aborted bool, delivered uint64, p consumerPolicy, b Backoff, rnd float64) decision {
	if err == nil {
		return decision{action: ack}
	}
	if aborted {
		return decision{action: requeue, reason: "shutdown"}
	}
	f := failure.Classify(err)
	if f.Kind == failure.Park || p.lastTry(delivered) {
		return decision{action: dead, reason: f.Reason}
	}
	return decision{action: retry, reason: f.Reason, delay: b.Delay(delivered, f.RetryAfter, rnd)}
}
