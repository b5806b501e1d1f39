// Package livefeed shows the clicks arriving on CLICKS to the browsers that
// watch the console's live panel: one ordered consumer per console process,
// fanned out to every watching browser.
//
// The consumer runs only while someone watches (it starts with the first
// browser and stops a while after the last one left), and starts a few
// clicks back so a new page is not empty. When it stops while browsers still
// watch (it failed, or the last browser left just as another came), the next
// consumer starts after the last click they were given, so no browser gets
// a click twice. A CLICKS deleted and created again under the consumer
// (whose sequences start at 1 again) is noticed after a while without a
// click and followed afresh; each click carries the stream's creation time.
// What a browser gets is bounded
// three ways: at most MaxRate clicks a second are decoded and forwarded (a
// page cannot show 100,000 clicks a second; the rest are counted as skipped),
// each browser has a queue of Buffer clicks (a browser that falls behind
// loses clicks, counted per browser, never holds memory), and at most
// MaxBrowsers watch at once. The stream's own rate is measured from its
// sequence numbers, so the page shows the real click rate whatever it skips.
package livefeed

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/services/console/internal/ordered"
	"github.com/snipdev/snip/services/console/internal/sse"
)

// Click is what the live panel shows of one click: no visitor identity, no
// network, no user agent.
type Click struct {
	// Seq is the click's CLICKS stream sequence.
	Seq       uint64    `json:"seq"`
	Partition int       `json:"partition"`
	Time      time.Time `json:"ts"`
	Code      string    `json:"code"`
	Owner     string    `json:"owner"`
	Country   string    `json:"country,omitempty"`
	Bot       bool      `json:"bot"`
	// ReferrerHost is the referrer's host name, without path or query.
	ReferrerHost string `json:"referrer_host,omitempty"`
	// StreamCreated is when the CLICKS holding Seq was created: a page
	// tells the sequences of a CLICKS created again from the old ones by it.
	StreamCreated time.Time `json:"stream_created"`
}

// Config tunes the hub.
type Config struct {
	// Recent is how many clicks a new browser gets at once (default 50).
	Recent int
	// Buffer is each browser's queue (default 256).
	Buffer int
	// MaxBrowsers bounds the browsers watching at once (default 16).
	MaxBrowsers int
	// MaxRate bounds the clicks a second forwarded to browsers (default 200).
	MaxRate float64
	// Idle is how long the consumer keeps running after the last browser
	// left, so a page reload does not restart it (default 30s).
	Idle time.Duration
	// Logger receives the hub's logs (default: discard).
	Logger *slog.Logger
	// Metrics, if set, receives the hub's collectors.
	Metrics prometheus.Registerer
}

func (c *Config) defaults() {
	if c.Recent <= 0 {
		c.Recent = 50
	}
	if c.Buffer <= 0 {
		c.Buffer = 256
	}
	if c.MaxBrowsers <= 0 {
		c.MaxBrowsers = 16
	}
	if c.MaxRate <= 0 {
		c.MaxRate = 200
	}
	if c.Idle <= 0 {
		c.Idle = 30 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Hub follows CLICKS for the browsers that subscribed.
type Hub struct {
	js      jetstream.JetStream
	cfg     Config
	limiter *rate.Limiter
	m       metrics
	wake    chan struct{}

	mu     sync.Mutex
	subs   map[*Subscription]struct{}
	recent []sse.Event // ring of the last Recent forwarded clicks, oldest first
	left   time.Time   // when the last browser left
	// followErr is why the last consumer could not start or ended, until
	// one starts: the page says it rather than a quiet stream's figures.
	followErr string
	// resumeAfter is the last CLICKS sequence the browsers watching when
	// the consumer stopped had been given (sent, or in their Recent); 0 when
	// nobody watched then, and the next consumer starts Recent back.
	resumeAfter uint64

	lastSeq  atomic.Uint64 // newest CLICKS sequence seen
	created  atomic.Int64  // when the CLICKS followed was created (Unix ns)
	rate     atomic.Uint64 // clicks a second on CLICKS (float64 bits)
	skipped  atomic.Uint64
	received atomic.Uint64
	running  atomic.Bool
}

// New returns a hub; Run makes it follow CLICKS.
func New(js jetstream.JetStream, cfg Config) *Hub {
	cfg.defaults()
	burst := max(cfg.Recent, int(cfg.MaxRate))
	return &Hub{
		js: js, cfg: cfg, m: newMetrics(cfg.Metrics),
		limiter: rate.NewLimiter(rate.Limit(cfg.MaxRate), burst),
		wake:    make(chan struct{}, 1),
		subs:    map[*Subscription]struct{}{},
	}
}

// Subscription is one browser's view of the hub.
type Subscription struct {
	ch      chan sse.Event
	recent  []sse.Event
	dropped atomic.Uint64
}

// C delivers the clicks, as "click" events whose ID is the stream sequence.
func (s *Subscription) C() <-chan sse.Event { return s.ch }

// Recent returns the clicks forwarded just before the subscription began,
// oldest first; C continues after them without a gap.
func (s *Subscription) Recent() []sse.Event { return s.recent }

// Dropped counts the clicks this browser lost because its queue was full.
func (s *Subscription) Dropped() uint64 { return s.dropped.Load() }

// Subscribe registers a browser. Unsubscribe it when it leaves.
func (h *Hub) Subscribe() (*Subscription, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.subs) >= h.cfg.MaxBrowsers {
		h.m.refused.Inc()
		return nil, fmt.Errorf("subscribe: %d browsers: %w", len(h.subs), ErrTooManyBrowsers)
	}
	s := &Subscription{ch: make(chan sse.Event, h.cfg.Buffer), recent: append([]sse.Event(nil), h.recent...)}
	h.subs[s] = struct{}{}
	h.m.browsers.Set(float64(len(h.subs)))
	select {
	case h.wake <- struct{}{}:
	default:
	}
	return s, nil
}

// Unsubscribe removes a browser.
func (h *Hub) Unsubscribe(s *Subscription) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.subs[s]; !ok {
		return
	}
	delete(h.subs, s)
	h.m.browsers.Set(float64(len(h.subs)))
	if len(h.subs) == 0 {
		h.left = time.Now()
	}
}

// Stats is what the live panel shows besides the clicks.
type Stats struct {
	// Rate is the clicks a second stored in CLICKS, measured each second.
	Rate float64 `json:"rate"`
	// LastSeq is the newest CLICKS sequence the hub saw. It is stored once
	// the click has been forwarded or counted as skipped or dropped, so the
	// figures read with it include that click.
	LastSeq uint64 `json:"last_seq"`
	// Skipped counts the clicks not forwarded because of MaxRate.
	Skipped uint64 `json:"skipped"`
	// Browsers is how many watch now.
	Browsers int `json:"browsers"`
	// Following is true while the consumer runs.
	Following bool `json:"following"`
	// Error is why the hub is not following CLICKS while browsers watch
	// (retried): CLICKS missing, NATS away. Empty while it follows.
	Error string `json:"error,omitempty"`
}

// Stats returns the hub's figures now.
func (h *Hub) Stats() Stats {
	h.mu.Lock()
	n, ferr := len(h.subs), h.followErr
	h.mu.Unlock()
	following := h.running.Load()
	if following {
		ferr = ""
	}
	return Stats{
		Rate: float64frombits(h.rate.Load()), LastSeq: h.lastSeq.Load(), Skipped: h.skipped.Load(),
		Browsers: n, Following: following, Error: ferr,
	}
}

// Run follows CLICKS whenever browsers watch, until ctx ends. Failures
// (NATS away, CLICKS missing) are logged and retried; it returns nil.
func (h *Hub) Run(ctx context.Context) error {
	wait := time.Second
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-h.wake:
		}
		if h.idle() {
			continue
		}
		err := h.follow(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			wait = time.Second
			continue
		}
		h.mu.Lock()
		h.followErr = err.Error()
		h.mu.Unlock()
		h.cfg.Logger.Warn("live clicks: following CLICKS failed; retrying", "err", err, "in", wait)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		wait = min(2*wait, 30*time.Second)
		h.poke()
	}
}

func (h *Hub) poke() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// idle reports whether no browser has watched for cfg.Idle.
func (h *Hub) idle() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs) == 0 && time.Since(h.left) >= h.cfg.Idle
}

// follow runs one ordered consumer until no browser has watched for
// cfg.Idle, ctx ends, or the consumer fails.
func (h *Hub) follow(ctx context.Context) error {
	started := false
	// recreated: CLICKS was deleted and created again under the consumer,
	// which then waits silently for the new stream's sequences to pass
	// the old ones (nats.go's ordered consumer resumes after its last
	// message): the position is forgotten and the next consumer starts
	// afresh.
	var recreated atomic.Bool
	defer func() { h.stopped(started, recreated.Load()) }()
	s, err := h.js.Stream(ctx, events.ClicksStream)
	if err != nil {
		return fmt.Errorf("follow clicks: %w", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return fmt.Errorf("follow clicks: %w", err)
	}
	start, resumed := h.startAt(info.State.FirstSeq, info.State.LastSeq)
	it, err := ordered.Open(ctx, h.js, events.ClicksStream, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:   start,
	}, 500)
	if err != nil {
		return fmt.Errorf("follow clicks: %w", err)
	}
	defer it.Close()
	h.mu.Lock()
	if !resumed {
		// The consumer starts Recent back, or after a gap: the ring would
		// repeat its clicks or skip the gap for a new browser.
		h.recent = h.recent[:0]
	}
	h.followErr = ""
	h.mu.Unlock()
	h.lastSeq.Store(start - 1)
	h.created.Store(info.Created.UnixNano())
	started = true
	h.running.Store(true) // until stopped
	h.cfg.Logger.Info("live clicks: following CLICKS", "from_seq", start, "resumed", resumed)

	// The watcher measures the rate and stops the iterator when ctx ends or
	// nobody has watched for cfg.Idle; Next then returns.
	var stoppedIdle atomic.Bool
	watchDone := make(chan struct{})
	defer close(watchDone)
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		prev, prevAt := h.lastSeq.Load(), time.Now()
		checked := prevAt
		for {
			select {
			case <-ctx.Done():
				it.Stop()
				return
			case <-watchDone:
				return
			case now := <-t.C:
				seq := h.lastSeq.Load()
				h.rate.Store(float64bits(float64(seq-min(prev, seq)) / now.Sub(prevAt).Seconds()))
				moved := seq != prev
				prev, prevAt = seq, now
				// No click for a while: is it still the CLICKS it started on?
				if !moved && now.Sub(checked) >= recreateCheck {
					checked = now
					if h.createdAgain(ctx, s, info.Created) {
						recreated.Store(true)
						it.Stop()
						return
					}
				}
				if h.idle() {
					stoppedIdle.Store(true)
					it.Stop()
					return
				}
			}
		}
	}()
	for {
		msg, err := it.Next()
		if err != nil {
			if recreated.Load() {
				return fmt.Errorf("follow clicks: %s was created again; starting afresh", events.ClicksStream)
			}
			if stoppedIdle.Load() {
				h.cfg.Logger.Info("live clicks: nobody watching; stopped following CLICKS")
				h.rate.Store(0)
				return nil
			}
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("follow clicks: %w", err)
		}
		h.handle(msg)
	}
}

// recreateCheck is how long the hub's consumer may see no click before the
// hub checks that CLICKS is still the stream it started on.
const recreateCheck = 5 * time.Second

// createdAgain reports whether CLICKS now is another stream than the one
// created at created (deleted and created again). A failed read is not.
func (h *Hub) createdAgain(ctx context.Context, s jetstream.Stream, created time.Time) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	info, err := s.Info(ctx)
	if err != nil {
		return false
	}
	if !info.Created.Equal(created) {
		h.cfg.Logger.Warn("live clicks: CLICKS was created again; following the new stream from its newest clicks",
			"was_created", created, "created", info.Created)
		return true
	}
	return false
}

// startAt is where the next consumer starts on a stream that holds first to
// last: Recent back, so a new browser is not empty, but never at or before
// a click the watching browsers were given (they would get it twice). It
// resumes right after that click when the stream still holds what followed
// it and no more than Recent clicks came since; after a longer outage it
// starts Recent back, past what the browsers have. A stream whose last
// sequence is below it was created again: its sequences are new clicks.
func (h *Hub) startAt(first, last uint64) (start uint64, resumed bool) {
	start = max(first, last+1-min(last, uint64(h.cfg.Recent)), 1)
	h.mu.Lock()
	after := h.resumeAfter
	h.mu.Unlock()
	if after == 0 || after > last {
		return start, false
	}
	start = max(start, after+1)
	return start, start == after+1
}

// stopped records where a consumer stopped. Browsers still watching were
// given every click up to lastSeq (sent, or in their Recent), so the next
// consumer resumes after it. With nobody watching it forgets the position
// and the ring: the next browser gets fresh recent clicks, once (the ring
// would give it stale ones, or the same ones twice). After CLICKS was
// created again (recreated) the position is of the old stream: forgotten
// too.
func (h *Hub) stopped(started, recreated bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.running.Store(false) // after the consumer's deletion, with the position recorded
	switch {
	case len(h.subs) == 0, recreated:
		h.recent, h.resumeAfter = h.recent[:0], 0
	case started:
		h.resumeAfter = h.lastSeq.Load()
	}
}

// handle forwards one message to every browser, within the rate limit.
func (h *Hub) handle(msg jetstream.Msg) {
	md, err := msg.Metadata()
	if err != nil {
		return
	}
	// LastSeq is published last, after the message's skipped, dropped and
	// forwarded counts: whoever sees LastSeq reach a sequence (Stats, a
	// test waiting for a click) sees that message's counts too.
	defer h.lastSeq.Store(md.Sequence.Stream)
	h.received.Add(1)
	h.m.received.Inc()
	if !h.limiter.Allow() {
		h.skipped.Add(1)
		h.m.skipped.Inc()
		return
	}
	// The readers' rule of validity (the partition count is not known
	// here, so a click in the wrong partition is the one invalid click the
	// console can still show; every reader parks it).
	c, err := events.ReadClick(msg.Data(), msg.Subject(), 0, md.Timestamp)
	if err != nil {
		h.m.malformed.Inc()
		return
	}
	data, _ := json.Marshal(Click{
		Seq: md.Sequence.Stream, Partition: events.PartitionOf(msg.Subject()), Time: c.Time,
		Code: c.Code, Owner: c.Owner, Country: c.Country, Bot: c.Bot, ReferrerHost: referrerHost(c.Referrer),
		StreamCreated: time.Unix(0, h.created.Load()).UTC(),
	})
	h.broadcast(sse.Event{ID: strconv.FormatUint(md.Sequence.Stream, 10), Name: "click", Data: data})
}

// broadcast queues e for every browser; a full queue loses e for that
// browser only, and it is counted.
func (h *Hub) broadcast(e sse.Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.recent) == h.cfg.Recent {
		copy(h.recent, h.recent[1:])
		h.recent = h.recent[:len(h.recent)-1]
	}
	h.recent = append(h.recent, e)
	for s := range h.subs {
		select {
		case s.ch <- e:
		default:
			s.dropped.Add(1)
			h.m.dropped.Inc()
		}
	}
}

// referrerHost is the host of a referrer URL, or "" when it has none.
func referrerHost(ref string) string {
	if ref == "" {
		return ""
	}
	u, err := url.Parse(ref)
	if err != nil {
		return ""
	}
	return u.Hostname()
}
