// Package eventload publishes click events straight into CLICKS at a
// constant rate, to load the readers beyond what HTTP on one machine can
// offer. Each event is a valid events.Click from the workload model,
// published asynchronously on clicks.<owner>.<code> with Nats-Msg-Id = its
// event ID, and at most Window publishes wait for their acks at once.
//
// The schedule is open: the publisher sends what the clock says is due,
// whatever the acks do, until the window is full; then it waits for room
// and the achieved rate falls below the offered one, which the report shows.
// A publish whose ack fails is published again with the same ID (JetStream's
// duplicate window makes that safe) up to MaxAttempts times; one that never
// gets an ack is recorded as uncertain.
package eventload

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/segmentio/encoding/json"

	"github.com/snipdev/snip/loadtest/internal/series"
	"github.com/snipdev/snip/loadtest/internal/truth"
	"github.com/snipdev/snip/loadtest/internal/workload"
	"github.com/snipdev/snip/pkg/events"
)

// Config is one run of the publisher.
type Config struct {
	// Rate is clicks per second; Duration how long to publish.
	Rate     int
	Duration time.Duration
	// Window bounds the publishes awaiting an ack (default 4096).
	Window int
	// MaxAttempts bounds publishes of one event (default 5).
	MaxAttempts int
	// AckTimeout bounds the wait for one ack (default 10s).
	AckTimeout time.Duration
	// Owner owns the clicks; Target is the base of the URL they claim to
	// redirect to (link <code>: Target/<code>).
	Owner  string
	Target string
	Tag    workload.Tag
	Gen    *workload.Generator
	// Drop, if set, is a fault injected for tests: the events it returns
	// true for are recorded as sent but never published.
	Drop func(seq uint64) bool
}

func (c *Config) defaults() error {
	if c.Window <= 0 {
		c.Window = 4096
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 5
	}
	if c.AckTimeout <= 0 {
		c.AckTimeout = 10 * time.Second
	}
	if c.Target == "" {
		c.Target = "http://127.0.0.1:8089/articles"
	}
	switch {
	case c.Rate < 1:
		return fmt.Errorf("rate %d: want >= 1", c.Rate)
	case c.Duration <= 0:
		return fmt.Errorf("duration %s: want > 0", c.Duration)
	case !events.ValidToken(c.Owner):
		return fmt.Errorf("owner %q: not a subject token", c.Owner)
	case c.Gen == nil:
		return errors.New("no workload generator")
	}
	return nil
}

// pending is a publish awaiting its ack.
type pending struct {
	seq   uint64
	at    time.Time
	msg   *nats.Msg
	fut   jetstream.PubAckFuture
	probe bool
}

// Run publishes for cfg.Duration (or until ctx ends), records every event's
// outcome in rec and its timing in m, and returns the number of events
// attempted, once every ack is in.
func Run(ctx context.Context, nc *nats.Conn, cfg Config, rec *truth.Recorder, m *series.Meter) (uint64, error) {
	if err := cfg.defaults(); err != nil {
		return 0, fmt.Errorf("events load: %w", err)
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(cfg.Window), jetstream.WithPublishAsyncTimeout(cfg.AckTimeout))
	if err != nil {
		return 0, fmt.Errorf("events load: %w", err)
	}
	acks := make(chan pending, cfg.Window)
	done := make(chan struct{})
	go func() {
		defer close(done)
		collect(js, cfg, acks, rec, m)
	}()

	start := m.Start()
	m.Offer(start, start.Add(cfg.Duration)) // the acks of the last publishes are waited for after it
	total := uint64(float64(cfg.Rate) * cfg.Duration.Seconds())
	var seq uint64
	var runErr error
loop:
	for seq < total {
		elapsed := time.Since(start)
		due := min(total, uint64(float64(cfg.Rate)*elapsed.Seconds())+1)
		for ; seq < due; seq++ {
			if ctx.Err() != nil {
				break loop
			}
			p, err := publish(ctx, js, &cfg, seq)
			if err != nil {
				runErr = err
				break loop
			}
			m.Sent()
			if p.fut == nil { // dropped by the injected fault
				rec.Record(seq, truth.Sent, "dropped (fault)")
				continue
			}
			acks <- p
		}
		if seq >= total {
			break
		}
		// Sleep until the next event is due, at least a millisecond: the
		// schedule is a rate, not a per-event timer, and the events due
		// in a millisecond go out together, in a few writes, as a busy
		// client's publishes do. (A 200 µs floor cost the generator and
		// the server each a third more CPU a click at 15,000/s: a write
		// and a read for every few events.)
		next := time.Duration(float64(seq) / float64(cfg.Rate) * float64(time.Second))
		select {
		case <-ctx.Done():
			break loop
		case <-time.After(max(next-time.Since(start), time.Millisecond)):
		}
	}
	close(acks)
	<-done
	return seq, runErr
}

// publish sends event seq, waiting for room in the window as long as ctx
// allows.
func publish(ctx context.Context, js jetstream.JetStream, cfg *Config, seq uint64) (pending, error) {
	v := cfg.Gen.Visit(seq)
	now := time.Now()
	code := cfg.Tag.LinkCode(v.Link)
	c := events.Click{
		V: events.ClickVersion, ID: cfg.Tag.EventID(seq, now), Time: now.UTC(),
		Code: code, Owner: cfg.Owner, Target: strings.TrimSuffix(cfg.Target, "/") + "/" + code,
		IPPrefix: workload.IPPrefix(v.IP), Visitor: cfg.Gen.VisitorHash(&v),
		UserAgent: v.UserAgent, Referrer: v.Referrer, Country: v.Country,
		RequestID: cfg.Tag.RequestID(seq), Bot: v.Kind == workload.Bot,
	}
	data, err := json.Marshal(&c)
	if err != nil {
		return pending{}, fmt.Errorf("encode click: %w", err)
	}
	msg := nats.NewMsg(events.ClickSubject(cfg.Owner, code))
	msg.Data = data
	msg.Header.Set(events.HeaderMsgID, c.ID)
	p := pending{seq: seq, at: now, msg: msg, probe: v.Kind == workload.Probe}
	if cfg.Drop != nil && cfg.Drop(seq) {
		return p, nil
	}
	for {
		p.fut, err = js.PublishMsgAsync(msg, jetstream.WithStallWait(time.Second))
		if err == nil {
			return p, nil
		}
		if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			return pending{}, fmt.Errorf("publish click %d: %w", seq, err)
		}
		if ctx.Err() != nil {
			return pending{}, ctx.Err()
		}
	}
}

// collect waits for each ack in publish order, republishing failures, and
// records outcomes and latencies (publish to ack).
func collect(js jetstream.JetStream, cfg Config, acks <-chan pending, rec *truth.Recorder, m *series.Meter) {
	for p := range acks {
		ok := wait(p.fut)
		for attempt := 2; !ok && attempt <= cfg.MaxAttempts; attempt++ {
			ctx, cancel := context.WithTimeout(context.Background(), cfg.AckTimeout)
			_, err := js.PublishMsg(ctx, p.msg)
			cancel()
			ok = err == nil
		}
		now := time.Now()
		m.Done(now.Sub(p.at), ok)
		if !ok {
			rec.Record(p.seq, truth.Uncertain, "no ack")
			continue
		}
		rec.Record(p.seq, truth.Sent, "ack")
		if p.probe {
			m.ProbeSent(now)
		}
	}
}

// wait reports whether f was acked. The publisher's async timeout
// (AckTimeout) fails a future whose ack does not come, so Err always
// answers in time: no timer of our own per event.
func wait(f jetstream.PubAckFuture) bool {
	select {
	case <-f.Ok():
		return true
	case <-f.Err():
		return false
	}
}
