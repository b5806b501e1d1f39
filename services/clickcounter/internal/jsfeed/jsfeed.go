// Package jsfeed runs the click counter's two JetStream consumers besides
// its consumer group: LINKS (who owns each code) and FRAUD_VERDICTS
// (corrections, many labels a message). Each is one durable consumer shared by every counter
// instance, read in batches (one Redis round trip per batch); a message is
// acked once its batch is written, retried with backoff when it failed, and
// parked on DEAD_LETTER (through package deadletter) when it can never be
// handled (malformed, of an unknown schema version, or any failure.Permanent):
// the failure contract every Snip consumer shares, read by failure.Classify.
//
// A feed whose consumer is gone (an operator deleted it) creates it again
// with the configuration the topology declares (Feed.Declared), as the
// reader runtime does with its partition consumers: from the stream's
// start, which is safe because the counter applies link events and verdicts
// by their sequence (a replayed one is stale and changes nothing). It does
// not start just past the last sequence applied: messages are handled out of
// order (by every instance, several batches at once), so one below it may
// still wait for a redelivery that was the deleted consumer's. While a
// feed cannot fetch (NATS away, the consumer gone and not allowed to be made
// again) it says so: a Warn log at the first failure and then at most once
// a minute, snip_clickcounter_feed_up at 0, and
// snip_clickcounter_feed_fetch_errors_total growing.
package jsfeed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/deadletter"
	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/failure"
	"github.com/snipdev/snip/pkg/inprogress"
	"github.com/snipdev/snip/services/clickcounter/internal/counter"
)

// Msg is one message of a batch: its payload and stream sequence.
type Msg struct {
	Data []byte
	Seq  uint64
}

// HandleFunc handles a batch of messages and returns one error per message,
// in the terms of package failure: nil for each one handled, a permanent
// error (failure.Permanent, or events.ErrMalformed and
// events.ErrUnknownVersion) for one that never can be (it is parked), any
// other for one to retry. Handling a message again must be harmless: a batch whose
// writes succeeded may still come again (a crash before its acks).
type HandleFunc func(ctx context.Context, msgs []Msg) []error

// Batching defaults. The workers' batches and the one being fetched stay
// within the consumers' MaxAckPending of 1000.
const (
	DefaultBatchSize = 300
	DefaultWorkers   = 2
)

// Feed is one durable consumer and its handler. It hands the handler
// batches: up to BatchSize messages, or what arrived within Linger of the
// first, so a busy feed costs one write per batch, not one per message.
type Feed struct {
	// Name labels logs and metrics ("links", "verdicts").
	Name     string
	Stream   string
	Consumer string
	// Source is the dead-letter source token: dead.<Source>.<reason>.
	Source string
	Handle HandleFunc
	// BatchSize is the most messages handed over at once
	// (DefaultBatchSize).
	BatchSize int
	// Workers is how many batches are handled at once (DefaultWorkers):
	// while one waits for Redis, the next is decoded. Handling must be
	// safe for concurrent batches (the counter orders verdicts by FRAUD
	// sequence and link events by LINKS sequence in Redis, not by arrival).
	Workers int
	// Linger is the longest a batch waits to fill after its first message
	// (default 50ms).
	Linger time.Duration
	// HandleTimeout bounds one batch's handling (default 10s).
	HandleTimeout time.Duration
	// MaxRetryDelay caps the delay before a failed message is redelivered
	// (default 10s).
	MaxRetryDelay time.Duration
	// DrainTimeout bounds the wait for messages in hand at shutdown
	// (default 10s).
	DrainTimeout time.Duration
	// AckWait is the consumer's: messages in hand longer than AckWait/3
	// (waiting for a worker, or a slow batch) are marked in progress every
	// AckWait/3, so a short AckWait redelivers only what a dead instance
	// held, never what a live one is still working on. Default: the
	// consumer's configured AckWait.
	AckWait time.Duration
	// Declared is the consumer's configuration as the topology declares it
	// (topology.ClickCounterLinksConsumerConfig): when the consumer is not
	// found, at start or after a fetch failed, the feed creates it with this
	// configuration (never updating one that exists). Its Durable must be
	// Consumer. Zero: the feed only waits for someone else to create it.
	Declared jetstream.ConsumerConfig
	Log      *slog.Logger
}

// Metrics are the feeds' Prometheus collectors.
type Metrics struct {
	messages    *prometheus.CounterVec
	up          *prometheus.GaugeVec
	fetchErrors *prometheus.CounterVec
	recreated   *prometheus.CounterVec
}

// NewMetrics registers the feeds' collectors on reg (nil: none).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "snip_clickcounter_feed_messages_total",
			Help: "Messages of the LINKS and FRAUD_VERDICTS feeds, by feed and result (ok, retried, parked).",
		}, []string{"feed", "result"}),
		up: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "snip_clickcounter_feed_up",
			Help: "1 while the feed fetches from its consumer (messages or an idle wait), 0 while it cannot: the consumer not found, NATS away, a fetch refused.",
		}, []string{"feed"}),
		fetchErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "snip_clickcounter_feed_fetch_errors_total",
			Help: "Fetches (and consumer look-ups) of the LINKS and FRAUD_VERDICTS feeds that failed, by feed.",
		}, []string{"feed"}),
		recreated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "snip_clickcounter_feed_consumer_created_total",
			Help: "Times this instance created a feed's consumer again, with its declared configuration, after finding it gone (its stream is then handed again from the start).",
		}, []string{"feed"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.messages, m.up, m.fetchErrors, m.recreated} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("register feed metrics: %w", err)
			}
		}
	}
	return m, nil
}

// Run consumes the feed until ctx ends, then handles and acks (within
// DrainTimeout) the batches it has fetched. It waits for the consumer to
// exist (creating it again from Declared when it is gone) and for NATS to be
// reachable rather than fail.
func (f Feed) Run(ctx context.Context, js jetstream.JetStream, m *Metrics) error {
	if f.Log == nil {
		f.Log = slog.New(slog.DiscardHandler)
	}
	if f.Declared.Durable != "" && f.Declared.Durable != f.Consumer {
		return fmt.Errorf("feed %s: declared consumer %q is not the feed's consumer %q", f.Name, f.Declared.Durable, f.Consumer)
	}
	if f.BatchSize <= 0 {
		f.BatchSize = DefaultBatchSize
	}
	if f.Workers <= 0 {
		f.Workers = DefaultWorkers
	}
	f.Linger = orDefault(f.Linger, 50*time.Millisecond)
	f.HandleTimeout = orDefault(f.HandleTimeout, 10*time.Second)
	f.MaxRetryDelay = orDefault(f.MaxRetryDelay, 10*time.Second)
	f.DrainTimeout = orDefault(f.DrainTimeout, 10*time.Second)
	r := &run{f: f, js: js, m: m}
	m.up.WithLabelValues(f.Name).Set(0)
	m.fetchErrors.WithLabelValues(f.Name) // exported from the start, at 0, for increase() in alerts
	m.recreated.WithLabelValues(f.Name)
	var cons jetstream.Consumer
	for failures := uint64(1); ; failures++ {
		var err error
		if cons, err = r.consumer(ctx); err == nil {
			break
		}
		r.failed(err, failures)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(f.delay(failures)):
		}
	}
	r.fetching()
	if r.f.AckWait <= 0 {
		r.f.AckWait = cons.CachedInfo().Config.AckWait
	}
	f = r.f
	f.Log.Info("feed started", "feed", f.Name, "stream", f.Stream, "consumer", f.Consumer, "ack_wait", f.AckWait)
	defer context.AfterFunc(ctx, func() { r.drainBy() })() // the drain's clock starts when ctx ends
	batches := make(chan inHand)
	var wg sync.WaitGroup
	for range f.Workers {
		wg.Go(func() { r.work(ctx, batches) })
	}
	r.fetch(ctx, cons, batches)
	close(batches)
	wg.Wait()
	return nil
}

// run is one running feed.
type run struct {
	f  Feed
	js jetstream.JetStream
	m  *Metrics

	drainOnce sync.Once
	drainEnd  time.Time

	// Failure reporting, by Run's goroutine only (its wait for the
	// consumer, then the fetch loop).
	down     bool      // failing since the last fetch that worked
	lastWarn time.Time // the last Warn of this failure
	quiet    uint64    // failures logged at Debug since lastWarn
}

// warnEvery is how often a feed that keeps failing logs at Warn: the first
// failure, then one line a minute (with the failures in between), the rest
// at Debug. A fetch retries within seconds, so a Warn for each would flood
// the logs of an outage; a Debug for each hid a deleted consumer.
const warnEvery = time.Minute

// consumer looks the feed's consumer up and, when it is not found and the
// feed has its Declared configuration, creates it with that configuration
// (CreateConsumer: one that exists, made meanwhile by another instance or
// snipctl, is taken as it is, never updated).
func (r *run) consumer(ctx context.Context) (jetstream.Consumer, error) {
	f := r.f
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := r.js.Consumer(ctx, f.Stream, f.Consumer)
	if !errors.Is(err, jetstream.ErrConsumerNotFound) || f.Declared.Durable == "" {
		if err != nil {
			return nil, fmt.Errorf("look up consumer %s > %s: %w", f.Stream, f.Consumer, err)
		}
		return c, nil
	}
	c, err = r.js.CreateConsumer(ctx, f.Stream, f.Declared)
	if errors.Is(err, jetstream.ErrConsumerExists) {
		c, err = r.js.Consumer(ctx, f.Stream, f.Consumer)
	}
	if err != nil {
		return nil, fmt.Errorf("consumer %s > %s not found; create it again: %w", f.Stream, f.Consumer, err)
	}
	r.m.recreated.WithLabelValues(f.Name).Inc()
	f.Log.Warn("feed consumer was gone; created it again with its declared configuration: the stream is handed again from its start (what was applied is stale and changes nothing)",
		"feed", f.Name, "stream", f.Stream, "consumer", f.Consumer)
	return c, nil
}

// failed records a failure to fetch or to find the consumer: the gauge goes
// to 0, the error is counted, and logged at Warn at most every warnEvery.
func (r *run) failed(err error, failures uint64) {
	f := r.f
	r.m.up.WithLabelValues(f.Name).Set(0)
	r.m.fetchErrors.WithLabelValues(f.Name).Inc()
	now := time.Now()
	if r.down && now.Sub(r.lastWarn) < warnEvery {
		r.quiet++
		f.Log.Debug("feed fetch", "feed", f.Name, "err", err)
		return
	}
	f.Log.Warn("feed cannot fetch; retrying", "feed", f.Name, "stream", f.Stream, "consumer", f.Consumer,
		"failures", failures, "not_logged", r.quiet, "err", err)
	r.down, r.lastWarn, r.quiet = true, now, 0
}

// fetching records a fetch that worked (messages, or none within the wait).
func (r *run) fetching() {
	r.m.up.WithLabelValues(r.f.Name).Set(1)
	if r.down {
		r.f.Log.Info("feed fetching again", "feed", r.f.Name, "consumer", r.f.Consumer)
		r.down = false
	}
}

// drainBy is when a graceful stop gives up on the batches in hand:
// DrainTimeout after ctx ended (when the first call is made).
func (r *run) drainBy() time.Time {
	r.drainOnce.Do(func() { r.drainEnd = time.Now().Add(r.f.DrainTimeout) })
	return r.drainEnd
}

// idleWait is how long a fetch waits for the first message of a batch when
// the feed is idle: it bounds how long a stop waits for the fetch in
// flight.
const idleWait = time.Second

// fetch reads batches and hands them to the workers until ctx ends: up to
// BatchSize messages, or what arrived within Linger of the first. It
// fetches the next batch while the workers handle the previous ones, and
// waits for a worker before fetching more (the workers' batches, and the
// one it holds, are all the feed has unacked). It pulls with Fetch, not a
// prefetching subscription, so that when it returns every message it
// received has been handed over.
func (r *run) fetch(ctx context.Context, cons jetstream.Consumer, batches chan<- inHand) {
	f := r.f
	idle, failures := true, uint64(0)
	for ctx.Err() == nil {
		var batch []jetstream.Msg
		var err error
		want := f.BatchSize
		if idle {
			// Messages that arrived are kept even if the fetch then failed.
			batch, err = collect(cons.Fetch(1, jetstream.FetchMaxWait(idleWait)))
			want--
		}
		if want > 0 && (!idle || len(batch) > 0) {
			var more []jetstream.Msg
			more, err = collect(cons.Fetch(want, jetstream.FetchMaxWait(f.Linger)))
			batch = append(batch, more...)
		}
		if len(batch) == 0 {
			switch {
			case ctx.Err() != nil: // stopping: a fetch cut short is no failure
			case err != nil && !errors.Is(err, nats.ErrTimeout):
				// NATS down, the consumer deleted: say so, look the consumer
				// up (creating it again if it is gone), wait, try again.
				failures++
				if c, lerr := r.consumer(ctx); lerr == nil {
					cons = c
				} else {
					err = fmt.Errorf("%w (%w)", err, lerr)
				}
				r.failed(err, failures)
				select {
				case <-ctx.Done():
				case <-time.After(f.delay(failures)):
				}
			default: // an idle wait that ended without messages
				r.fetching()
			}
			idle = true
			continue
		}
		failures = 0
		r.fetching()
		idle = len(batch) < f.BatchSize/2
		b := inHand{msgs: batch, settled: r.keepInProgress(batch)}
		batches <- b // also after ctx ended: every fetched message is handled
	}
}

// inHand is a fetched batch; settled is called once every message is.
type inHand struct {
	msgs    []jetstream.Msg
	settled func()
}

// keepInProgress marks the batch's messages in progress every AckWait/3
// until the returned func is called (they are settled), so JetStream
// redelivers them only if this instance dies (then within AckWait), not
// while it waits for a worker or for a slow Redis.
func (r *run) keepInProgress(msgs []jetstream.Msg) (settled func()) {
	if r.f.AckWait <= 0 {
		return func() {}
	}
	return inprogress.Keep(max(r.f.AckWait/3, 10*time.Millisecond), msgs...)
}

// collect drains a fetch; it returns what arrived and the fetch's error.
func collect(b jetstream.MessageBatch, err error) ([]jetstream.Msg, error) {
	if err != nil {
		return nil, err
	}
	var out []jetstream.Msg
	for m := range b.Messages() {
		out = append(out, m)
	}
	return out, b.Error()
}

// work handles batches until there are no more. After a batch that failed
// as a whole (Redis down?) it waits before the next, which would most
// likely fail the same way.
func (r *run) work(ctx context.Context, batches <-chan inHand) {
	var failures uint64
	for b := range batches {
		batch := b.msgs
		// Finish what is in hand even when shutdown has begun, but within
		// DrainTimeout of it.
		hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.f.HandleTimeout)
		if ctx.Err() != nil {
			cancel()
			hctx, cancel = context.WithDeadline(context.WithoutCancel(ctx), r.drainBy())
		}
		failed := r.handle(hctx, batch)
		b.settled()
		cancel()
		if !failed {
			failures = 0
			continue
		}
		failures++
		select {
		case <-ctx.Done():
		case <-time.After(r.f.delay(failures)):
		}
	}
}

// handle hands a batch to the handler and settles each message: ack when
// handled, park and ack when it never can be, redeliver later when it
// failed. It reports whether every message failed and is to be retried.
func (r *run) handle(ctx context.Context, batch []jetstream.Msg) (allFailed bool) {
	f, m := r.f, r.m
	in := make([]Msg, 0, len(batch))
	mds := make([]*jetstream.MsgMetadata, 0, len(batch))
	msgs := make([]jetstream.Msg, 0, len(batch))
	for _, msg := range batch {
		md, err := msg.Metadata()
		if err != nil {
			f.Log.Error("feed message without metadata", "feed", f.Name, "err", err)
			_ = msg.Term()
			continue
		}
		in = append(in, Msg{Data: msg.Data(), Seq: md.Sequence.Stream})
		mds = append(mds, md)
		msgs = append(msgs, msg)
	}
	if len(in) == 0 {
		return false
	}
	errs := f.Handle(ctx, in)
	if len(errs) != len(in) { // a broken handler: handle nothing rather than ack unhandled messages
		err := fmt.Errorf("feed %s: handler answered %d of %d messages", f.Name, len(errs), len(in))
		f.Log.Error("feed handler", "feed", f.Name, "err", err)
		errs = make([]error, len(in))
		for i := range errs {
			errs[i] = err
		}
	}
	var retried []uint64
	var firstErr error
	for i, msg := range msgs {
		md, err := mds[i], errs[i]
		seq := md.Sequence.Stream
		d := failure.Classify(err)
		if d.Kind == failure.Done {
			if err := msg.Ack(); err != nil {
				f.Log.Warn("feed ack", "feed", f.Name, "seq", seq, "err", err)
			}
			m.messages.WithLabelValues(f.Name, "ok").Inc()
			continue
		}
		if d.Kind == failure.Park {
			perr := f.park(ctx, r.js, msg, md, d.Reason, err)
			if perr == nil {
				f.Log.Warn("feed message parked", "feed", f.Name, "seq", seq, "reason", d.Reason, "err", err)
				_ = msg.Ack()
				m.messages.WithLabelValues(f.Name, "parked").Inc()
				continue
			}
			err = perr
		}
		_ = msg.NakWithDelay(max(f.delay(md.NumDelivered), d.RetryAfter))
		m.messages.WithLabelValues(f.Name, "retried").Inc()
		retried = append(retried, seq)
		if firstErr == nil {
			firstErr = err
		}
	}
	if len(retried) > 0 { // one line per batch: a Redis outage fails every message
		f.Log.Warn("feed messages failed; retrying", "feed", f.Name, "count", len(retried),
			"first_seq", retried[0], "last_seq", retried[len(retried)-1], "err", firstErr)
	}
	return len(retried) == len(msgs)
}

// park copies the message to DEAD_LETTER with the reason (package
// deadletter: its Nats-Msg-Id is derived from the original's place, so
// parking twice stores it once).
func (f Feed) park(ctx context.Context, js jetstream.JetStream, msg jetstream.Msg, md *jetstream.MsgMetadata, reason string, cause error) error {
	_, err := deadletter.Publish(ctx, js, deadletter.Parcel{
		Source:   f.Source,
		Reason:   reason,
		Stream:   f.Stream,
		Subject:  msg.Subject(),
		Seq:      md.Sequence.Stream,
		Attempts: int(md.NumDelivered),
		Error:    cause.Error(),
		Consumer: f.Consumer,
		Data:     msg.Data(),
	})
	return err
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

// Links returns the LINKS feed's handler: it decodes link events and hands
// them to apply, in one call per batch; apply's error fails them all.
func Links(apply func(ctx context.Context, es []counter.LinkEvent) error) HandleFunc {
	return decoded(func(data []byte, seq uint64) (counter.LinkEvent, error) {
		e, err := events.DecodeLinkEvent(data)
		return counter.LinkEvent{E: &e, Seq: seq}, err
	}, func(ctx context.Context, es []counter.LinkEvent) []error {
		err := apply(ctx, es)
		errs := make([]error, len(es))
		for i := range errs {
			errs[i] = err
		}
		return errs
	})
}

// MaxLabelsPerApply bounds the labels of one call of the verdict feed's
// apply (one Redis round trip): a batch of messages of many labels each is
// applied in slices of at most this many.
const MaxLabelsPerApply = 1000

// Verdicts returns the FRAUD_VERDICTS feed's handler: it decodes each
// message (many labels; events.DecodeFraudVerdictBatch), expands it into one
// counter.Verdict per label, each with the message's stream sequence, and
// hands them to apply in slices of at most MaxLabelsPerApply. A message is
// done when every label of it is; when one is not, the message is retried
// (its applied labels change nothing again) or, if a label can never be
// applied, parked.
func Verdicts(apply func(ctx context.Context, vs []counter.Verdict) []counter.VerdictResult) HandleFunc {
	return func(ctx context.Context, msgs []Msg) []error {
		errs := make([]error, len(msgs))
		var vs []counter.Verdict
		var of []int // message index of each verdict
		for i, m := range msgs {
			b, err := events.DecodeFraudVerdictBatch(m.Data)
			if err != nil {
				errs[i] = err
				continue
			}
			for _, v := range b.Verdicts() {
				vs = append(vs, counter.Verdict{V: &v, Seq: m.Seq})
				of = append(of, i)
			}
		}
		for start := 0; start < len(vs); start += MaxLabelsPerApply {
			end := min(start+MaxLabelsPerApply, len(vs))
			for k, r := range apply(ctx, vs[start:end]) {
				if r.Err == nil {
					continue
				}
				i := of[start+k]
				// A label to retry wins over one that never can be applied:
				// the message is retried, not parked, while any can still be.
				if errs[i] == nil || failure.IsPermanent(errs[i]) && !failure.IsPermanent(r.Err) {
					errs[i] = r.Err
				}
			}
		}
		return errs
	}
}

// decoded decodes each message of a batch and hands the ones that decode
// to apply; the others fail with their decoding error (permanent).
func decoded[T any](decode func(data []byte, seq uint64) (T, error), apply func(context.Context, []T) []error) HandleFunc {
	return func(ctx context.Context, msgs []Msg) []error {
		errs := make([]error, len(msgs))
		items := make([]T, 0, len(msgs))
		at := make([]int, 0, len(msgs))
		for i, m := range msgs {
			it, err := decode(m.Data, m.Seq)
			if err != nil {
				errs[i] = err
				continue
			}
			items = append(items, it)
			at = append(at, i)
		}
		if len(items) > 0 {
			for j, err := range apply(ctx, items) {
				errs[at[j]] = err
			}
		}
		return errs
	}
}
