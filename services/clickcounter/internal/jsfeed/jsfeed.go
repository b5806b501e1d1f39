// Package jsfeed runs the click counter's two small JetStream consumers
// besides its consumer group: LINKS (who owns each code) and FRAUD verdicts
// (corrections). Each is one durable consumer shared by every counter
// instance; a message is acked when its handler succeeds, retried with
// backoff when it fails, and parked on DEAD_LETTER when it can never be
// handled (malformed or of an unknown schema version).
package jsfeed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
)

// HandleFunc handles one message's payload; seq is its stream sequence. An
// error wrapping events.ErrMalformed or events.ErrUnknownVersion is
// permanent (the message is parked); any other error is retried.
type HandleFunc func(ctx context.Context, data []byte, seq uint64) error

// Feed is one durable consumer and its handler.
type Feed struct {
	// Name labels logs and metrics ("links", "verdicts").
	Name     string
	Stream   string
	Consumer string
	// Source is the dead-letter source token: dead.<Source>.<reason>.
	Source string
	Handle HandleFunc
	// HandleTimeout bounds one message's handling (default 10s).
	HandleTimeout time.Duration
	// MaxRetryDelay caps the delay before a failed message is redelivered
	// (default 10s).
	MaxRetryDelay time.Duration
	// DrainTimeout bounds the wait for messages in hand at shutdown
	// (default 10s).
	DrainTimeout time.Duration
	Log          *slog.Logger
}

// Metrics are the feeds' Prometheus collectors.
type Metrics struct {
	messages *prometheus.CounterVec
}

// NewMetrics registers the feeds' collectors on reg (nil: none).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{messages: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "snip_clickcounter_feed_messages_total",
		Help: "Messages of the LINKS and FRAUD feeds, by feed and result (ok, retried, parked).",
	}, []string{"feed", "result"})}
	if reg != nil {
		if err := reg.Register(m.messages); err != nil {
			return nil, fmt.Errorf("register feed metrics: %w", err)
		}
	}
	return m, nil
}

// Run consumes the feed until ctx ends, then stops pulling and waits (up to
// DrainTimeout) for the messages in hand to be handled and acked. It waits
// for the consumer to exist and for NATS to be reachable rather than fail.
func (f Feed) Run(ctx context.Context, js jetstream.JetStream, m *Metrics) error {
	if f.Log == nil {
		f.Log = slog.New(slog.DiscardHandler)
	}
	f.HandleTimeout = orDefault(f.HandleTimeout, 10*time.Second)
	f.MaxRetryDelay = orDefault(f.MaxRetryDelay, 10*time.Second)
	f.DrainTimeout = orDefault(f.DrainTimeout, 10*time.Second)
	var cons jetstream.Consumer
	for wait := 250 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
		var err error
		if cons, err = js.Consumer(ctx, f.Stream, f.Consumer); err == nil {
			break
		}
		f.Log.Warn("feed consumer not available; retrying", "feed", f.Name, "consumer", f.Consumer, "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
	cc, err := cons.Consume(func(msg jetstream.Msg) { f.handle(ctx, js, m, msg) },
		jetstream.PullMaxMessages(256),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			f.Log.Debug("feed consume", "feed", f.Name, "err", err)
		}))
	if err != nil {
		return fmt.Errorf("consume %s: %w", f.Consumer, err)
	}
	f.Log.Info("feed started", "feed", f.Name, "stream", f.Stream, "consumer", f.Consumer)
	<-ctx.Done()
	cc.Drain()
	select {
	case <-cc.Closed():
	case <-time.After(f.DrainTimeout):
		cc.Stop()
		f.Log.Warn("feed drain timed out; unacked messages will be redelivered", "feed", f.Name)
	}
	return nil
}

func (f Feed) handle(ctx context.Context, js jetstream.JetStream, m *Metrics, msg jetstream.Msg) {
	md, err := msg.Metadata()
	if err != nil {
		f.Log.Error("feed message without metadata", "feed", f.Name, "err", err)
		_ = msg.Term()
		return
	}
	// Finish what is in hand even when shutdown has begun.
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.HandleTimeout)
	defer cancel()
	err = f.Handle(hctx, msg.Data(), md.Sequence.Stream)
	switch {
	case err == nil:
		if err := msg.Ack(); err != nil {
			f.Log.Warn("feed ack", "feed", f.Name, "seq", md.Sequence.Stream, "err", err)
		}
		m.messages.WithLabelValues(f.Name, "ok").Inc()
	case errors.Is(err, events.ErrMalformed) || errors.Is(err, events.ErrUnknownVersion):
		reason := reader.ReasonMalformed
		if errors.Is(err, events.ErrUnknownVersion) {
			reason = reader.ReasonUnknownVersion
		}
		if perr := f.park(hctx, js, msg, md, reason, err); perr != nil {
			f.Log.Warn("feed park; retrying", "feed", f.Name, "seq", md.Sequence.Stream, "err", perr)
			_ = msg.NakWithDelay(f.delay(md.NumDelivered))
			m.messages.WithLabelValues(f.Name, "retried").Inc()
			return
		}
		f.Log.Warn("feed message parked", "feed", f.Name, "seq", md.Sequence.Stream, "reason", reason, "err", err)
		_ = msg.Ack()
		m.messages.WithLabelValues(f.Name, "parked").Inc()
	default:
		f.Log.Warn("feed message failed; retrying", "feed", f.Name, "seq", md.Sequence.Stream,
			"deliveries", md.NumDelivered, "err", err)
		_ = msg.NakWithDelay(f.delay(md.NumDelivered))
		m.messages.WithLabelValues(f.Name, "retried").Inc()
	}
}

// park copies the message to DEAD_LETTER with the reason. The Nats-Msg-Id
// is derived from the original's place, so parking twice stores it once.
func (f Feed) park(ctx context.Context, js jetstream.JetStream, msg jetstream.Msg, md *jetstream.MsgMetadata, reason string, cause error) error {
	seq := strconv.FormatUint(md.Sequence.Stream, 10)
	dead := nats.NewMsg(events.DeadLetterSubject(f.Source, reason))
	dead.Data = msg.Data()
	dead.Header.Set(events.HeaderMsgID, "dead:"+f.Stream+":"+f.Consumer+":"+seq)
	dead.Header.Set(events.HeaderDeadReason, reason)
	dead.Header.Set(events.HeaderDeadError, cause.Error())
	dead.Header.Set(events.HeaderDeadSource, f.Stream)
	dead.Header.Set(events.HeaderDeadSubject, msg.Subject())
	dead.Header.Set(events.HeaderDeadSeq, seq)
	dead.Header.Set(events.HeaderDeadAttempts, strconv.FormatUint(md.NumDelivered, 10))
	dead.Header.Set(events.HeaderDeadGroup, f.Consumer)
	if _, err := js.PublishMsg(ctx, dead); err != nil {
		return fmt.Errorf("park %s seq %s: %w", f.Stream, seq, err)
	}
	return nil
}

// delay is the redelivery delay after n deliveries: exponential from 250ms,
// capped, with jitter so instances do not retry in step.
func (f Feed) delay(n uint64) time.Duration {
	d := 250 * time.Millisecond << min(n, 10)
	d = min(d, f.MaxRetryDelay)
	return d/2 + rand.N(d/2+1)
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// Links returns the LINKS feed's handler: it decodes a link event and hands
// it to apply.
func Links(apply func(ctx context.Context, e *events.LinkEvent, seq uint64) error) HandleFunc {
	return func(ctx context.Context, data []byte, seq uint64) error {
		e, err := events.DecodeLinkEvent(data)
		if err != nil {
			return err
		}
		return apply(ctx, &e, seq)
	}
}

// Verdicts returns the FRAUD feed's handler: it decodes a verdict and hands
// it to apply.
func Verdicts(apply func(ctx context.Context, v *events.FraudVerdict, seq uint64) error) HandleFunc {
	return func(ctx context.Context, data []byte, seq uint64) error {
		v, err := events.DecodeFraudVerdict(data)
		if err != nil {
			return err
		}
		return apply(ctx, &v, seq)
	}
}
