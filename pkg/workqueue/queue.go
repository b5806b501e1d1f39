// Package workqueue runs competing workers on a JetStream work-queue stream:
// many processes share one durable pull consumer, each job goes to one of
// them and is removed from the stream once acknowledged, and adding a process
// drains the queue faster. It is the queue beside package reader's log: a
// log gives every group every event, in order per partition; a queue gives
// each job to one worker, in no particular order.
//
// Each process keeps at most Concurrency jobs in hand and asks the server for
// exactly as many jobs as it has free slots, so no job waits in a client
// buffer while its ack deadline runs, and a slow job holds up one slot, not
// the queue. A job in hand tells the server it is still being worked on
// (InProgress, through package inprogress, as the log readers' batches do)
// three times per ack deadline, while its handler runs and while a failed
// job is parked, so a fetch (or a park) longer than the consumer's current
// BackOff step is not redelivered to a second worker.
//
// A handler answers in the terms of package failure, and its answer becomes
// one decision (decide): nil acks; a retryable failure is retried with
// exponential backoff and jitter through NakWithDelay; a permanent failure,
// or a retryable one on the last allowed delivery, is parked on DEAD_LETTER
// (package deadletter: reason, attempts and last error) and then
// terminated. Deliveries that never reached a decision (a worker that
// crashed on the last try) are parked by a rescuer: the server's
// MAX_DELIVERIES advisory, captured by a stream (Config.Advisories), names
// the job, and the processes share a durable consumer on that stream, so an
// advisory waits there until one of them has parked its job, whichever ran
// or stopped when it was published; a job the handler's record says is
// done (Config.Done: its last try's ack was lost) is removed without a
// dead letter. Both paths park a job under the same
// Nats-Msg-Id, so the job is parked once. Neither gives up on a park that
// DEAD_LETTER refuses: on the last try the worker keeps the job in hand and
// retries, and the rescuer NAKs the advisory with backoff and gets it again.
//
// The queue decides by the consumer's settings on the server (MaxDeliver,
// BackOff, AckWait), not by constants of its own, and reads them again
// every Config.PolicyRefresh, and at once for a delivery numbered beyond
// the MaxDeliver it read, so an operator's change is followed without a
// restart (refreshPolicy says what a stale setting costs meanwhile).
//
// Run stops gracefully: it stops pulling, lets the jobs in hand (and any the
// last pull still brings) finish within the shutdown timeout, and hands back
// (NAK, no delay) those that could not, so another worker takes them at
// once. A job aborted on its last delivery, which a NAK would exhaust, is
// handed back as a fresh copy and the original terminated.
//
// Acks and TERMs wait for the server's confirmation: acks through
// DoubleAck, TERMs as a request on the message's ack subject (Queue.term),
// since nats.go's jetstream package sends Term and TermWithReason without
// waiting. A TERM not confirmed is sent again, up to three times in all
// within the operation timeout, and then logged and counted. One lost for
// good after a park brings the job back once its ack deadline passes: it
// runs again, and a failure parks it again as a duplicate (stored once); on
// the last delivery the rescuer finds it parked and deletes it. One lost for
// good after a last-try hand-back leaves the original to run out of
// deliveries while its fresh copy runs, and the rescuer parks it as
// max_deliveries.
package workqueue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/deadletter"
	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/inprogress"
)

// Handler processes one job's payload and answers nil (done), a retryable
// error (failure.Retryable, or any unclassified error) or a permanent one
// (failure.Permanent, or a payload package events cannot decode). It must be
// idempotent: JetStream delivers at least once. ctx ends only when the worker
// must stop at once (the shutdown timeout passed).
type Handler func(ctx context.Context, data []byte) error

// DeadHook, if set, is called after a job was parked on DEAD_LETTER, before
// it is removed from the queue (for example to record "preview
// unavailable"). Its failures are its own to log.
type DeadHook func(ctx context.Context, data []byte, reason, detail string)

// Config configures a Queue.
type Config struct {
	// Stream and Consumer name the work-queue stream and its durable
	// consumer, which must exist (the topology creates them).
	Stream   string
	Consumer string
	// Advisories and Rescuer name the stream that captures the server's
	// MAX_DELIVERIES advisories of Consumer and the durable consumer on it
	// that the processes share to park the jobs they name (the topology
	// creates them). Empty Advisories runs no rescuer: a job whose worker
	// crashed on its last try then stays in the queue until its MaxAge.
	Advisories string
	Rescuer    string
	// Done, if set, reports whether a job's work is done already, by the
	// record that makes the handler skip it (its idempotency record). The
	// rescuer asks it before parking a job that ran out of deliveries: one
	// whose last try succeeded and whose ack was lost is removed from the
	// queue without a dead letter (redriven, it would do nothing). An
	// error, or nil Done, parks the job as before.
	Done func(ctx context.Context, data []byte) (bool, error)
	// Source is the dead letters' source token (dead.<source>.<reason>) and
	// the metrics' prefix (snip_<source>_...).
	Source string
	// Concurrency is the most jobs this process works on at once.
	Concurrency int
	// Backoff is the retry schedule of transient failures.
	Backoff Backoff
	// BacklogInterval is how often the dead-letter backlog gauge is
	// refreshed from DEAD_LETTER.
	BacklogInterval time.Duration
	// ShutdownTimeout bounds how long jobs in hand may take to finish when
	// Run's context ends.
	ShutdownTimeout time.Duration
	// OpTimeout bounds each JetStream request: an ack, a dead-letter publish.
	OpTimeout time.Duration
	// PullWait is how long one pull request waits on the server for jobs
	// (default 1s). A stop waits for the outstanding pull to end rather than
	// abandon it: a job the server sent to an abandoned pull would sit
	// unacknowledged until its ack deadline.
	PullWait time.Duration
	// PolicyRefresh is how often the pull loop reads the consumer's
	// settings (MaxDeliver, BackOff, AckWait) from the server again
	// (default 30s), so that an operator's change (snipctl topology apply)
	// is followed without a restart. A delivery numbered beyond the
	// MaxDeliver read has them read again at once.
	PolicyRefresh time.Duration
	Logger        *slog.Logger
	// Metrics receives the queue's collectors (nil: not registered).
	Metrics prometheus.Registerer
}

// Queue is one process's share of the workers.
type Queue struct {
	js     jetstream.JetStream
	nc     *nats.Conn
	cfg    Config
	handle Handler
	onDead DeadHook
	log    *slog.Logger
	m      *metrics

	rescuing  atomic.Bool
	rescueErr atomic.Pointer[error] // the rescuer's last error, for logs and /readyz

	// slots holds a token per job in hand (or asked for); Run's shutdown
	// fills it to know that every job has been settled.
	slots     chan struct{}
	consuming atomic.Bool
	lastErr   atomic.Pointer[error] // the pull loop's last error, for logs and /readyz

	// pol is the consumer's settings as last read from the server; each
	// job decides by the settings read when it started.
	pol atomic.Pointer[consumerPolicy]
}

// New returns a Queue; Run starts it.
func New(js jetstream.JetStream, cfg Config, h Handler, onDead DeadHook) *Queue {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.Concurrency = max(cfg.Concurrency, 1)
	if cfg.OpTimeout <= 0 {
		cfg.OpTimeout = 5 * time.Second
	}
	if cfg.PullWait <= 0 {
		cfg.PullWait = time.Second
	}
	if cfg.PolicyRefresh <= 0 {
		cfg.PolicyRefresh = 30 * time.Second
	}
	if cfg.BacklogInterval <= 0 {
		cfg.BacklogInterval = 30 * time.Second
	}
	if onDead == nil {
		onDead = func(context.Context, []byte, string, string) {}
	}
	return &Queue{
		js: js, nc: js.Conn(), cfg: cfg, handle: h, onDead: onDead, log: cfg.Logger,
		m:     newMetrics(cfg.Source, cfg.Metrics),
		slots: make(chan struct{}, cfg.Concurrency),
	}
}

// Ready reports whether the queue is pulling jobs and, with Advisories
// set, reading the advisories of jobs that ran out of deliveries (for
// /readyz).
func (q *Queue) Ready(context.Context) error {
	if !q.consuming.Load() {
		if err := q.lastErr.Load(); err != nil {
			return fmt.Errorf("not pulling jobs: %w", *err)
		}
		return errors.New("not pulling jobs yet")
	}
	if q.cfg.Advisories != "" && !q.rescuing.Load() {
		if err := q.rescueErr.Load(); err != nil {
			return fmt.Errorf("not reading max-deliveries advisories: %w", *err)
		}
		return errors.New("not reading max-deliveries advisories yet")
	}
	return nil
}

// Run works on jobs until ctx ends, then shuts down gracefully (see the
// package doc) and returns. A missing consumer or a NATS outage is waited
// out, not returned; Run returns nil after a graceful stop. A Queue runs once.
func (q *Queue) Run(ctx context.Context) error {
	// Jobs run on their own context: ending ctx starts the shutdown, which
	// lets them finish; abort is for those that do not in time.
	jobs, abort := context.WithCancel(context.WithoutCancel(ctx))
	defer abort()
	defer q.startRescue(ctx)()

	wait := 250 * time.Millisecond
	for {
		err := q.pull(ctx, jobs)
		q.consuming.Store(false)
		if ctx.Err() != nil {
			break
		}
		q.lastErr.Store(&err)
		q.log.Warn("not pulling jobs; retrying", "err", err, "in", wait)
		select {
		case <-ctx.Done():
		case <-time.After(wait):
			wait = min(wait*2, 10*time.Second)
			continue
		}
		break
	}
	q.shutdown(abort)
	return nil
}

// pull asks for jobs, as many at a time as there are free slots, until ctx
// ends (nil) or the consumer cannot be used (the error).
//
// It reserves the slots before it asks, so every job the server sends has a
// slot and starts at once. (Consume with a small PullMaxMessages would do the
// same in principle, but nats.go 1.55 skips the next pull request when a
// message arrives while the previous request is still being sent, which
// stalls a one-message consumer until its heartbeat times out.)
func (q *Queue) pull(ctx, jobs context.Context) error {
	lctx, cancel := context.WithTimeout(ctx, q.cfg.OpTimeout)
	cons, err := q.js.Consumer(lctx, q.cfg.Stream, q.cfg.Consumer)
	cancel()
	if err != nil {
		return fmt.Errorf("look up consumer %s > %s: %w", q.cfg.Stream, q.cfg.Consumer, err)
	}
	q.setPolicy(policyOf(cons.CachedInfo().Config))
	read := time.Now()
	if !q.consuming.Swap(true) {
		q.log.Info("pulling jobs", "stream", q.cfg.Stream, "consumer", q.cfg.Consumer, "concurrency", q.cfg.Concurrency)
	}
	for {
		if !q.nc.IsConnected() {
			// A pull request sent now would wait in the reconnect buffer and
			// reach the server after this fetch gave up on it: the server
			// would send jobs to an inbox nobody reads.
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(q.cfg.PullWait):
				continue
			}
		}
		n := q.reserve(ctx)
		if n == 0 {
			return nil // ctx ended
		}
		if time.Since(read) >= q.cfg.PolicyRefresh {
			// Before the pull, so the jobs it brings decide by what the
			// server applies now (see refreshPolicy for what a stale
			// setting costs). A failed read keeps the settings read
			// before: the pull that follows says whether the consumer
			// is still there.
			if _, err := q.refreshPolicy(ctx, cons); err != nil && ctx.Err() == nil {
				q.log.Warn("consumer settings not read again; keeping those read before", "err", err)
			}
			read = time.Now()
			if ctx.Err() != nil {
				q.releaseN(n)
				return nil // the stop began: no pull is sent
			}
		}
		batch, err := cons.Fetch(n, jetstream.FetchMaxWait(q.cfg.PullWait))
		if err != nil {
			q.releaseN(n)
			return fmt.Errorf("pull %s > %s: %w", q.cfg.Stream, q.cfg.Consumer, err)
		}
		for m := range batch.Messages() {
			n--
			// A job that arrives after the stop began has its slot and runs
			// like the others, within the shutdown timeout: a NAK would cost
			// it one of its tries.
			go func() {
				defer q.release()
				q.work(jobs, cons, m)
			}()
		}
		q.releaseN(n)
		if err := batch.Error(); err != nil {
			return fmt.Errorf("pull %s > %s: %w", q.cfg.Stream, q.cfg.Consumer, err)
		}
	}
}

// reserve waits for a free slot and takes every other free one; it returns
// how many it took, 0 if ctx ended first. A select whose cases are both
// ready picks one at random, so a slot taken while ctx had ended is given
// back: once the stop began, no pull is sent.
func (q *Queue) reserve(ctx context.Context) int {
	select {
	case <-ctx.Done():
		return 0
	case q.slots <- struct{}{}:
	}
	if ctx.Err() != nil {
		q.release()
		return 0
	}
	n := 1
	for n < cap(q.slots) {
		select {
		case q.slots <- struct{}{}:
			n++
		default:
			return n
		}
	}
	return n
}

func (q *Queue) release() { <-q.slots }

func (q *Queue) releaseN(n int) {
	for range n {
		<-q.slots
	}
}

// setPolicy stores the consumer's settings, and logs a change.
func (q *Queue) setPolicy(p consumerPolicy) {
	if old := q.pol.Swap(&p); old != nil && !old.equal(p) {
		q.log.Info("consumer settings changed on the server; following them",
			"max_deliver", p.maxDeliver, "backoff", p.backoff, "ack_wait", p.ackWait,
			"was_max_deliver", old.maxDeliver, "was_backoff", old.backoff, "was_ack_wait", old.ackWait)
	}
}

// refreshPolicy reads the consumer's settings from the server again: one
// CONSUMER.INFO request.
//
// Settings read before a change cost this much until they are read again
// (at most PolicyRefresh, for the jobs that start meanwhile; a job in
// hand keeps the settings it started with):
//   - MaxDeliver raised: a transient failure on the old last try is parked
//     with its reason after fewer tries than configured; a job aborted at
//     a stop on it is handed back as a fresh copy rather than NAKed. A
//     delivery numbered beyond the old MaxDeliver shows the change, and
//     work reads the settings again before it decides.
//   - MaxDeliver lowered: a transient failure on the new last try is NAKed
//     as a retry, the server gives up on it, and the rescuer parks it as
//     max_deliveries (the failure's reason and error lost); a job aborted
//     at a stop on it is NAKed, exhausted, and parked so without a real
//     try.
//   - BackOff or AckWait changed: the keep-alive runs at a third of the
//     old deadline (a new deadline below that hands a job in hand to a
//     second worker, whose run idempotency turns into a no-op), and a
//     retry's delay is corrected by the old step, so it comes sooner or
//     later by the difference.
func (q *Queue) refreshPolicy(ctx context.Context, cons jetstream.Consumer) (consumerPolicy, error) {
	ctx, cancel := context.WithTimeout(ctx, q.cfg.OpTimeout)
	defer cancel()
	info, err := cons.Info(ctx)
	if err != nil {
		return *q.pol.Load(), fmt.Errorf("read consumer %s > %s: %w", q.cfg.Stream, q.cfg.Consumer, err)
	}
	p := policyOf(info.Config)
	q.setPolicy(p)
	return p, nil
}

func (q *Queue) work(jobs context.Context, cons jetstream.Consumer, m jetstream.Msg) {
	meta, err := m.Metadata()
	if err != nil {
		q.log.Error("message without JetStream metadata; terminating it", "subject", m.Subject(), "err", err)
		q.term(m, "", q.log)
		return
	}
	pol := *q.pol.Load()
	if pol.maxDeliver > 0 && meta.NumDelivered > uint64(pol.maxDeliver) {
		// The server delivered the job more often than the MaxDeliver
		// read allows: it was raised since. Read it now, before this job
		// is parked on a try that is not its last (the jobs that start
		// after it get what is read here too).
		p, perr := q.refreshPolicy(jobs, cons)
		if perr != nil {
			q.log.Warn("delivery beyond the consumer's MaxDeliver as read, and the settings could not be read again", "seq", meta.Sequence.Stream, "delivery", meta.NumDelivered, "max_deliver", pol.maxDeliver, "err", perr)
		}
		pol = p
	}
	q.m.inFlight.Inc()
	defer q.m.inFlight.Dec()
	stop := inprogress.Keep(pol.keepAliveEvery(meta.NumDelivered), m)
	start := time.Now()
	err = q.handle(jobs, m.Data())
	stop()
	q.m.duration.Observe(time.Since(start).Seconds())
	d := decide(err, err != nil && jobs.Err() != nil, meta.NumDelivered, pol, q.cfg.Backoff, rand.Float64())
	q.settle(jobs, m, meta, pol, d, err)
}

func (q *Queue) settle(jobs context.Context, m jetstream.Msg, meta *jetstream.MsgMetadata, pol consumerPolicy, d decision, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), q.cfg.OpTimeout)
	defer cancel()
	log := q.log.With("seq", meta.Sequence.Stream, "delivery", meta.NumDelivered)
	switch d.action {
	case ack:
		if aerr := m.DoubleAck(ctx); aerr != nil {
			// The job is done; if the ack was lost it comes back and the
			// handler's idempotency skips it.
			log.Warn("ack not confirmed", "err", aerr)
		}
		q.m.deliveries.WithLabelValues("done").Inc()
	case requeue:
		if pol.lastTry(meta.NumDelivered) {
			// A NAK would end the job's last delivery: the server would give
			// up on it and it would be parked without a real try. Queue a
			// fresh copy (a deterministic Msg-Id, so a repeated hand-back is
			// stored once) and terminate this one.
			perr := q.requeueCopy(ctx, m, meta)
			if perr == nil {
				q.term(m, "handed_back", log)
				log.Info("job handed back at shutdown as a fresh copy (last try)", "err", err)
				q.m.deliveries.WithLabelValues("handed_back").Inc()
				return
			}
			log.Error("last try handed back at shutdown: fresh copy not queued; NAKing it", "err", perr)
		}
		_ = m.Nak()
		log.Info("job handed back at shutdown", "err", err)
		q.m.deliveries.WithLabelValues("handed_back").Inc()
	case retry:
		_ = m.NakWithDelay(pol.nakDelay(d.delay, meta.NumDelivered))
		log.Info("job failed; retrying", "reason", d.reason, "in", d.delay, "err", err)
		q.m.deliveries.WithLabelValues("retried").Inc()
		q.m.retries.WithLabelValues(d.reason).Inc()
	case dead:
		p := deadletter.Parcel{
			Source: q.cfg.Source, Reason: d.reason, Stream: meta.Stream, Subject: m.Subject(), Seq: meta.Sequence.Stream,
			Attempts: int(meta.NumDelivered), Error: err.Error(), Consumer: meta.Consumer, Data: m.Data(),
		}
		var (
			dup  bool
			perr error
		)
		if pol.lastTry(meta.NumDelivered) {
			// A NAK now would make the server give up on the job, and the
			// rescuer would park it only once a pull made the server notice
			// (and with the worker's reason and error lost). Keep the job in
			// hand instead and retry the park until it succeeds or the
			// worker must stop.
			dup, perr = q.parkHolding(jobs, m, meta, pol, p, log)
		} else {
			// The park (a publish waiting for DEAD_LETTER's ack, then the
			// dead hook) may outlast the delivery's ack deadline: keep
			// telling the server the job is in hand, as while it ran, so it
			// is not handed to a second worker meanwhile.
			stop := inprogress.Keep(pol.keepAliveEvery(meta.NumDelivered), m)
			dup, perr = q.park(ctx, p)
			stop()
		}
		if perr != nil {
			if pol.lastTry(meta.NumDelivered) {
				// The worker is stopping (parkHolding gives up only then).
				// This NAK makes the server give up on the job, and the
				// rescuer parks it: a hand-back at shutdown, not a retry,
				// and without delay, so that it is parked at the next
				// pull rather than after a retry's wait.
				log.Error("last try: job failed and could not be dead-lettered before the stop; handing it to the rescuer", "reason", d.reason, "err", err, "park_err", perr)
				_ = m.Nak()
				q.m.deliveries.WithLabelValues("handed_back").Inc()
				return
			}
			// Not parked: keep the job and try again later. The next
			// delivery fails again, or not, and parks it then: a retry,
			// counted as one, with the failure's reason.
			log.Error("job failed and could not be dead-lettered; retrying", "reason", d.reason, "err", err, "park_err", perr)
			_ = m.NakWithDelay(pol.nakDelay(q.cfg.Backoff.Delay(meta.NumDelivered, 0, rand.Float64()), meta.NumDelivered))
			q.m.deliveries.WithLabelValues("retried").Inc()
			q.m.retries.WithLabelValues(d.reason).Inc()
			return
		}
		q.term(m, d.reason, log)
		q.m.deliveries.WithLabelValues("dead_lettered").Inc()
		if dup {
			// Parked before (a worker whose TERM was lost): counted then.
			log.Info("job was already dead-lettered; terminated", "reason", d.reason)
			return
		}
		log.Warn("job dead-lettered", "reason", d.reason, "attempts", meta.NumDelivered, "err", err)
		q.m.dead.WithLabelValues(d.reason, "worker").Inc()
	}
}

// requeueCopy publishes m's payload again to its subject, as a new job with
// all its tries, under Nats-Msg-Id "<job id>:handback:<stream seq>".
func (q *Queue) requeueCopy(ctx context.Context, m jetstream.Msg, meta *jetstream.MsgMetadata) error {
	id := deadletter.PayloadID(m.Data())
	if id == "" {
		id = meta.Stream
	}
	c := nats.NewMsg(m.Subject())
	c.Data = m.Data()
	c.Header.Set(events.HeaderMsgID, fmt.Sprintf("%s:handback:%d", id, meta.Sequence.Stream))
	_, err := q.js.PublishMsg(ctx, c, jetstream.WithExpectStream(meta.Stream))
	return err
}

// parkHolding parks p, retrying with the retry backoff while telling the
// server that m is still being worked on, until the park succeeds (nil) or
// jobs ends (the last error).
func (q *Queue) parkHolding(jobs context.Context, m jetstream.Msg, meta *jetstream.MsgMetadata, pol consumerPolicy, p deadletter.Parcel, log *slog.Logger) (duplicate bool, err error) {
	stop := inprogress.Keep(pol.keepAliveEvery(meta.NumDelivered), m)
	defer stop()
	for try := uint64(1); ; try++ {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(jobs), q.cfg.OpTimeout)
		dup, err := q.park(ctx, p)
		cancel()
		if err == nil {
			return dup, nil
		}
		wait := q.cfg.Backoff.Delay(try, 0, rand.Float64())
		log.Warn("last try: could not dead-letter the job; keeping it and retrying", "in", wait, "err", err)
		select {
		case <-jobs.Done():
			return false, err
		case <-time.After(wait):
		}
	}
}

// park publishes p to DEAD_LETTER and runs the dead hook, unless
// DEAD_LETTER already held the job (duplicate: the other path or an
// earlier try parked it, and ran the hook then).
func (q *Queue) park(ctx context.Context, p deadletter.Parcel) (duplicate bool, err error) {
	ack, err := deadletter.Publish(ctx, q.js, p)
	if err != nil {
		q.m.parkErrors.Inc()
		return false, err
	}
	if ack.Duplicate {
		return true, nil
	}
	q.onDead(ctx, p.Data, p.Reason, p.Error)
	return false, nil
}

// shutdown runs after pulling stopped: it waits for the jobs in hand, and
// aborts those that do not finish within the shutdown timeout.
func (q *Queue) shutdown(abort context.CancelFunc) {
	if q.waitIdle(time.After(q.cfg.ShutdownTimeout)) {
		q.log.Info("stopped; every job in hand was settled")
		return
	}
	q.log.Warn("jobs still running at the shutdown timeout; handing them back")
	abort()
	if !q.waitIdle(time.After(q.cfg.OpTimeout)) {
		q.log.Error("jobs did not stop after abort; the server redelivers them after their ack deadline")
	}
}

// waitIdle takes every slot, which succeeds once every job in hand was
// settled, and gives them back; false if deadline came first.
func (q *Queue) waitIdle(deadline <-chan time.Time) bool {
	taken := 0
	defer func() {
		for range taken {
			<-q.slots
		}
	}()
	for taken < cap(q.slots) {
		select {
		case q.slots <- struct{}{}:
			taken++
		case <-deadline:
			return false
		}
	}
	return true
}

// advisory is the part of the server's MAX_DELIVERIES advisory
// (io.nats.jetstream.advisory.v1.max_deliver) the rescuer needs.
type advisory struct {
	Stream     string `json:"stream"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
}

// AdvisorySubject is where the server announces that a message of
// stream's consumer ran out of deliveries.
func AdvisorySubject(stream, consumer string) string {
	return events.MaxDeliveriesAdvisorySubject(stream, consumer)
}

// startRescue starts the rescuer, which parks jobs that ran out of
// deliveries without a worker's decision, and the dead-letter backlog
// gauge (refreshed every BacklogInterval), until ctx ends. The returned
// wait blocks until both stopped, after ctx ended.
//
// The server notices that a job ran out of deliveries when it would deliver
// it again, which it does only to a waiting pull, and then announces it on
// the MAX_DELIVERIES advisory subject: core NATS, once. The Advisories
// stream captures the announcement (the topology declares it in the account
// of the queue's stream, where the server publishes it), so it waits there
// for a rescuer however many processes run then, or none. Every process
// pulls from the one durable consumer Rescuer on it: each advisory goes to
// one process, which acks it once the job is parked and deleted from the
// queue, or found gone, and NAKs it with the retry backoff otherwise. A
// process that stops finishes the rescue in hand first; one that dies
// holding an advisory leaves it to the server, which hands it to another
// after the consumer's AckWait.
func (q *Queue) startRescue(ctx context.Context) (wait func()) {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		t := time.NewTicker(q.cfg.BacklogInterval)
		defer t.Stop()
		for {
			q.measureBacklog(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	go func() {
		defer wg.Done()
		if q.cfg.Advisories == "" {
			q.log.Warn("no advisory stream configured: jobs whose worker crashed on the last try stay in the queue")
			return
		}
		wait := 250 * time.Millisecond
		for {
			err := q.rescue(ctx)
			q.rescuing.Store(false)
			if ctx.Err() != nil {
				return
			}
			q.rescueErr.Store(&err)
			q.log.Warn("not reading max-deliveries advisories; retrying", "err", err, "in", wait)
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
				wait = min(wait*2, 10*time.Second)
			}
		}
	}()
	return wg.Wait
}

// rescue pulls advisories one at a time and rescues each one's job, until
// ctx ends (nil) or the consumer cannot be used (the error). One at a
// time: an advisory waits in no client buffer while its AckWait runs, and
// each process takes only what it works on, so the others share the rest.
func (q *Queue) rescue(ctx context.Context) error {
	lctx, cancel := context.WithTimeout(ctx, q.cfg.OpTimeout)
	cons, err := q.js.Consumer(lctx, q.cfg.Advisories, q.cfg.Rescuer)
	cancel()
	if err != nil {
		return fmt.Errorf("look up consumer %s > %s: %w", q.cfg.Advisories, q.cfg.Rescuer, err)
	}
	every := cons.CachedInfo().Config.AckWait / 3
	if every <= 0 {
		every = 10 * time.Second
	}
	if !q.rescuing.Swap(true) {
		q.log.Info("rescuing jobs that ran out of deliveries", "stream", q.cfg.Advisories, "consumer", q.cfg.Rescuer)
	}
	for ctx.Err() == nil {
		if !q.nc.IsConnected() {
			// As in pull: a request sent now would reach the server after
			// this fetch gave up on it.
			select {
			case <-ctx.Done():
			case <-time.After(q.cfg.PullWait):
			}
			continue
		}
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(q.cfg.PullWait))
		if err != nil {
			return fmt.Errorf("pull %s > %s: %w", q.cfg.Advisories, q.cfg.Rescuer, err)
		}
		for m := range batch.Messages() {
			// The rescue in hand finishes (at most 2 OpTimeouts) even if the
			// stop began: its ack saves another process the work.
			q.rescueAdvisory(context.WithoutCancel(ctx), m, every)
		}
		if err := batch.Error(); err != nil {
			return fmt.Errorf("pull %s > %s: %w", q.cfg.Advisories, q.cfg.Rescuer, err)
		}
	}
	return nil
}

// term terminates m (a TERM with reason, if any) and waits for the
// server's confirmation, as DoubleAck does for an ack: the server answers a
// TERM sent as a request on the message's ack subject (its reply subject)
// once it has recorded it, and answers again for one it already has, so a
// TERM that timed out is sent again. A consumer that is gone has no one to
// answer (nats.ErrNoResponders), and sending again cannot help.
func (q *Queue) term(m jetstream.Msg, reason string, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), q.cfg.OpTimeout)
	defer cancel()
	body := []byte("+TERM")
	if reason != "" {
		body = append(body, ' ')
		body = append(body, reason...)
	}
	var err error
	for range 3 {
		if err = q.termOnce(ctx, m, body); err == nil || errors.Is(err, nats.ErrNoResponders) || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		log.Warn("TERM not confirmed", "reason", reason, "err", err)
		q.m.termsUnconfirmed.Inc()
	}
}

// termOnce sends one TERM request, waiting at most a third of ctx's time.
func (q *Queue) termOnce(ctx context.Context, m jetstream.Msg, body []byte) error {
	if d, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Until(d)/3)
		defer cancel()
	}
	_, err := q.nc.RequestWithContext(ctx, m.Reply(), body)
	return err
}

// rescueAdvisory parks the job advisory m names and acks m, or NAKs m with
// the retry backoff if the job is still in the queue.
func (q *Queue) rescueAdvisory(ctx context.Context, m jetstream.Msg, every time.Duration) {
	var a advisory
	if err := json.Unmarshal(m.Data(), &a); err != nil || a.StreamSeq == 0 || (a.Stream != "" && a.Stream != q.cfg.Stream) {
		q.log.Error("max-deliveries advisory unreadable or not about this queue; dropped", "subject", m.Subject(), "data", deadletter.HeaderSafe(string(m.Data())))
		q.term(m, "unreadable", q.log)
		return
	}
	stop := inprogress.Keep(every, m)
	err := q.rescueSeq(ctx, a.StreamSeq, a.Deliveries)
	stop()
	actx, cancel := context.WithTimeout(ctx, q.cfg.OpTimeout)
	defer cancel()
	if err == nil {
		if aerr := m.DoubleAck(actx); aerr != nil {
			// The job is parked and gone: an advisory that comes back finds
			// it gone and is acked then.
			q.log.Warn("max-deliveries advisory handled; ack not confirmed", "seq", a.StreamSeq, "err", aerr)
		}
		return
	}
	tries := uint64(1)
	if meta, merr := m.Metadata(); merr == nil {
		tries = meta.NumDelivered
	}
	wait := q.cfg.Backoff.Delay(tries, 0, rand.Float64())
	q.m.rescueRetries.Inc()
	q.log.Warn("rescue job: not done; the advisory is kept and retried", "seq", a.StreamSeq, "try", tries, "in", wait, "err", err)
	_ = m.NakWithDelay(wait)
}

// rescueSeq copies the job at seq to DEAD_LETTER and deletes it from the
// queue. A job already gone was handled by another path or process. An
// error means the job is still in the queue and the rescue must be retried.
func (q *Queue) rescueSeq(ctx context.Context, seq, deliveries uint64) error {
	ctx, cancel := context.WithTimeout(ctx, 2*q.cfg.OpTimeout)
	defer cancel()
	s, err := q.js.Stream(ctx, q.cfg.Stream)
	if err != nil {
		return fmt.Errorf("look up stream %s: %w", q.cfg.Stream, err)
	}
	raw, err := s.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read job %d: %w", seq, err)
	}
	if q.done(ctx, seq, raw.Data) {
		if err := deadletter.DeleteIfPresent(ctx, s, seq); err != nil {
			return fmt.Errorf("done, not deleted from %s: %w", q.cfg.Stream, err)
		}
		q.log.Info("job ran out of deliveries but the handler's record says it is done (a lost ack); removed without a dead letter", "seq", seq, "attempts", deliveries)
		q.m.rescuedDone.Inc()
		return nil
	}
	p := deadletter.Parcel{
		Source: q.cfg.Source, Reason: ReasonMaxDeliveries, Stream: q.cfg.Stream, Subject: raw.Subject, Seq: seq,
		Attempts: int(deliveries), Consumer: q.cfg.Consumer, Data: raw.Data,
		Error: "delivery limit reached without a worker's decision (a worker crashed, hung or lost its connection on the last try)",
	}
	dup, err := q.park(ctx, p)
	if err != nil {
		return err
	}
	if dup {
		// The worker parked it and its TERM was lost, or an earlier try of
		// this rescue parked it and did not delete it: counted then.
		q.log.Info("job was already dead-lettered", "seq", seq, "via", "advisory")
	} else {
		q.log.Warn("job dead-lettered", "reason", ReasonMaxDeliveries, "seq", seq, "attempts", deliveries, "via", "advisory")
		q.m.dead.WithLabelValues(ReasonMaxDeliveries, "advisory").Inc()
	}
	if err := deadletter.DeleteIfPresent(ctx, s, seq); err != nil {
		// A retry parks it again under the same Nats-Msg-Id, which
		// DEAD_LETTER's duplicate window stores once.
		return fmt.Errorf("parked, not deleted from %s: %w", q.cfg.Stream, err)
	}
	return nil
}

// done asks Config.Done whether the job at seq is done already; false when
// it cannot tell.
func (q *Queue) done(ctx context.Context, seq uint64, data []byte) bool {
	if q.cfg.Done == nil {
		return false
	}
	done, err := q.cfg.Done(ctx, data)
	if err != nil {
		q.log.Warn("rescue job: cannot tell whether it is done; parking it", "seq", seq, "err", err)
		return false
	}
	return done
}

// measureBacklog sets the dead-letter backlog gauge from DEAD_LETTER's
// per-subject counts.
func (q *Queue) measureBacklog(ctx context.Context) {
	s, err := q.js.Stream(ctx, events.DeadLetterStream)
	if err != nil {
		return
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(deadletter.Filter(q.cfg.Source, "")))
	if err != nil {
		return
	}
	q.m.backlog.Reset()
	for subj, n := range info.State.Subjects {
		q.m.backlog.WithLabelValues(subj[len("dead."+q.cfg.Source+"."):]).Set(float64(n))
	}
}
