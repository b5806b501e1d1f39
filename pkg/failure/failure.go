// Package failure is the failure contract every consumer in Snip shares: the
// log readers (package reader), the work queue (package workqueue), the click
// counter's feeds and the outbox relay. A handler answers one of three things:
//
//   - nil: done. The runtime acknowledges the message.
//   - a retryable error: try again later. The runtime redelivers it after a
//     backoff (exponential, with jitter, capped), never sooner than the
//     failure asks for (RetryableAfter).
//   - a permanent error: never. The runtime parks the message on DEAD_LETTER
//     (package deadletter) as dead.<source>.<reason> and moves on.
//
// Any error the handler did not classify is retryable: a Redis timeout or a
// NATS hiccup passes, and a runtime that parked it would lose work. Payloads
// that fail package events' decoding or rule of validity (events.ErrMalformed,
// events.ErrUnknownVersion, *events.InvalidError) are permanent without being
// wrapped: no number of tries makes a malformed event valid.
//
// Classify is the one function that reads a handler's answer; each runtime
// turns its Kind into an ack, a delayed NAK or a park.
package failure

import (
	"errors"
	"time"

	"github.com/snipdev/snip/pkg/events"
)

// Kind is what a runtime does with a message once its handler answered.
type Kind int

const (
	// Done: acknowledge the message.
	Done Kind = iota
	// Retry: hand the message to a handler again after a backoff.
	Retry
	// Park: copy the message to DEAD_LETTER, then acknowledge it.
	Park
)

func (k Kind) String() string {
	switch k {
	case Done:
		return "done"
	case Retry:
		return "retry"
	case Park:
		return "park"
	}
	return "unknown"
}

// ReasonUnclassified is the reason of an error that carries none: a plain
// error, which is retryable.
const ReasonUnclassified = "error"

// Classified is an error that says how it is to be treated. *Error is one;
// a runtime may wrap it to add where it happened (reader.PoisonError adds
// the batch index).
type Classified interface {
	error
	// Reason is a short subject token for the DEAD_LETTER subject and the
	// metrics: "not_found", "timeout", ...
	Reason() string
	// Permanent reports that trying again cannot help.
	Permanent() bool
	// RetryAfter is the least delay before the next try that the failure
	// itself asks for (an HTTP Retry-After), zero if none.
	RetryAfter() time.Duration
}

// Error is a classified failure. Build it with Permanent, Retryable or
// RetryableAfter.
type Error struct {
	reason     string
	permanent  bool
	retryAfter time.Duration
	err        error
}

var _ Classified = (*Error)(nil)

// Permanent says err can never succeed: the message is parked under reason.
func Permanent(reason string, err error) *Error {
	return &Error{reason: reason, permanent: true, err: err}
}

// Retryable says err may pass: the message is tried again after a backoff,
// and, if the runtime gives up (a work queue's last delivery), parked under
// reason.
func Retryable(reason string, err error) *Error {
	return &Error{reason: reason, err: err}
}

// RetryableAfter is Retryable with the least delay the failure asks for
// (an HTTP 429's or 503's Retry-After).
func RetryableAfter(reason string, after time.Duration, err error) *Error {
	return &Error{reason: reason, retryAfter: after, err: err}
}

func (e *Error) Error() string {
	if e.err == nil {
		return e.reason
	}
	return e.reason + ": " + e.err.Error()
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.err }

// Reason is the failure's subject token.
func (e *Error) Reason() string { return e.reason }

// Permanent reports whether trying again cannot help.
func (e *Error) Permanent() bool { return e.permanent }

// RetryAfter is the least delay before the next try, zero if none.
func (e *Error) RetryAfter() time.Duration { return e.retryAfter }

// Decision is what Classify makes of a handler's answer.
type Decision struct {
	Kind Kind
	// Reason is the dead-letter and metric token ("" for Done).
	Reason string
	// RetryAfter is the least delay before a Retry, zero if none.
	RetryAfter time.Duration
}

// Classify reads a handler's answer: nil is Done; an error with a Classified
// in its chain is what it says; an events decoding or validity error is
// Park under events.Reason; anything else is Retry with ReasonUnclassified.
func Classify(err error) Decision {
	if err == nil {
		return Decision{Kind: Done}
	}
	var c Classified
	if errors.As(err, &c) {
		k := Retry
		if c.Permanent() {
			k = Park
		}
		return Decision{Kind: k, Reason: c.Reason(), RetryAfter: c.RetryAfter()}
	}
	var ie *events.InvalidError
	if errors.Is(err, events.ErrMalformed) || errors.Is(err, events.ErrUnknownVersion) || errors.As(err, &ie) {
		return Decision{Kind: Park, Reason: events.Reason(err)}
	}
	return Decision{Kind: Retry, Reason: ReasonUnclassified}
}

// IsPermanent reports whether Classify(err) is Park.
func IsPermanent(err error) bool { return Classify(err).Kind == Park }
