// Package ownerstream is the paid plan's live click stream: each owner reads
// the clicks of their own links as Server-Sent Events, resumable with
// Last-Event-ID, and never anyone else's.
//
// A stream is an ordered consumer on CLICKS whose filter is built from the
// authenticated owner's ID, and only from it: `*.clicks.<owner>.*` (every
// partition, that owner, every link). Each event's id is the click's CLICKS
// stream sequence, so a client that reconnects with Last-Event-ID: N gets
// the owner's clicks from sequence N+1: nothing lost and nothing repeated
// across reconnects, as long as CLICKS still retains them (7 days). A start
// older than that gets a "gap" event first; a start beyond CLICKS' last
// sequence (CLICKS re-created, or an ID it never gave) gets a "reset" event,
// whose id is CLICKS' last sequence, and the stream goes on from there. A
// payload whose owner is not the stream's owner is never sent, whatever the
// subject says.
//
// The consumer is pulled only as fast as the client reads: the server holds
// at most a small buffer per stream, and a client that stops reading is
// disconnected by the write timeout (it resumes with Last-Event-ID). Streams
// are limited per owner and in total, and so is how often an owner opens
// them (each open creates a consumer); Close ends them all (at shutdown),
// and clients reconnect to another instance.
package ownerstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/services/console/internal/ordered"
	"github.com/snipdev/snip/services/console/internal/sse"
)

// ClickVersion is the version of the Click payload.
const ClickVersion = 1

// Click is what an owner's stream carries of one click. It leaves out what
// identifies a visitor or is Snip's internals: the visitor identity (a daily
// keyed hash that would let an owner follow one person across links for a
// day), the client's network prefix, and the request ID.
type Click struct {
	V int `json:"v"`
	// Seq is the click's CLICKS stream sequence, also the event's id.
	Seq       uint64    `json:"seq"`
	ID        string    `json:"id"`
	Time      time.Time `json:"ts"`
	Code      string    `json:"code"`
	Owner     string    `json:"owner"`
	Target    string    `json:"target"`
	UserAgent string    `json:"ua,omitempty"`
	Referrer  string    `json:"referrer,omitempty"`
	Country   string    `json:"country,omitempty"`
	// Bot is the label the redirect gave the click; fraud verdicts made
	// later are not in the stream.
	Bot bool `json:"bot,omitempty"`
}

// Filter is the CLICKS subject filter of an owner's stream: every partition,
// every link of that owner.
func Filter(owner string) string { return "*.clicks." + owner + ".*" }

// Start is where a stream begins.
type Start struct {
	// Seq, if not zero, is the first CLICKS sequence to send.
	Seq uint64
	// Time, if set (and Seq is zero), starts at the first click stored then
	// or later.
	Time time.Time
}

// earliestStart and latestStart bound the times a start may name: those
// whose Unix time in nanoseconds fits an int64 (years 1678 to 2262), which is
// how the server and time.Duration arithmetic hold them. Outside, the value
// wraps: a time far in the future would read as the distant past and replay
// every retained click, and year 1 would return none.
var (
	earliestStart = time.Unix(0, math.MinInt64).UTC().Truncate(time.Second).Add(time.Second)
	latestStart   = time.Unix(0, math.MaxInt64).UTC().Truncate(time.Second)
)

// ParseStart reads where a stream begins: the Last-Event-ID header of a
// reconnecting client (the next sequence after it) wins over the query's
// since_seq (the same meaning: the last sequence already had; 0 for every
// retained click) and since (an RFC 3339 time); with none of them the
// stream starts with the clicks stored from now on.
func ParseStart(lastEventID, sinceSeq, since string) (Start, error) {
	seqAfter := func(name, v string) (Start, error) {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil || n == ^uint64(0) {
			return Start{}, fmt.Errorf("%s %q is not a stream sequence: %w", name, v, ErrBadStart)
		}
		return Start{Seq: n + 1}, nil
	}
	switch {
	case lastEventID != "":
		return seqAfter("Last-Event-ID", lastEventID)
	case sinceSeq != "" && since != "":
		return Start{}, fmt.Errorf("give since_seq or since, not both: %w", ErrBadStart)
	case sinceSeq != "":
		return seqAfter("since_seq", sinceSeq)
	case since != "":
		t, err := time.Parse(time.RFC3339, since)
		if err != nil {
			return Start{}, fmt.Errorf("since %q is not an RFC 3339 time: %w", since, ErrBadStart)
		}
		if t.Before(earliestStart) || t.After(latestStart) {
			return Start{}, fmt.Errorf("since %q is outside %s to %s, the times a stream position can hold: %w",
				since, earliestStart.Format(time.RFC3339), latestStart.Format(time.RFC3339), ErrBadStart)
		}
		return Start{Time: t}, nil
	}
	return Start{}, nil
}

// Config tunes the streams.
type Config struct {
	// PerOwner bounds one owner's concurrent streams (default 4).
	PerOwner int
	// Max bounds all streams of this instance (default 1000).
	Max int
	// OpenBurst streams an owner may open at once, then one per
	// OpenInterval (defaults 10 and 3s): each open creates a JetStream
	// consumer, and an owner within its PerOwner could otherwise open and
	// close them as fast as it likes.
	OpenBurst    int
	OpenInterval time.Duration
	// Heartbeat is the interval of keepalive comments (default 15s).
	Heartbeat time.Duration
	// WriteTimeout disconnects a client that does not read (default 10s).
	WriteTimeout time.Duration
	// Retry is the reconnect delay the client is told (default 2s).
	Retry time.Duration
	// Logger receives the streams' logs (default: discard).
	Logger *slog.Logger
	// Metrics, if set, receives the collectors.
	Metrics prometheus.Registerer
}

func (c *Config) defaults() {
	if c.PerOwner <= 0 {
		c.PerOwner = 4
	}
	if c.Max <= 0 {
		c.Max = 1000
	}
	if c.OpenBurst <= 0 {
		c.OpenBurst = 10
	}
	if c.OpenInterval <= 0 {
		c.OpenInterval = 3 * time.Second
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = 15 * time.Second
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = 10 * time.Second
	}
	if c.Retry <= 0 {
		c.Retry = 2 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// pullBuffer is how many clicks a stream fetches ahead of its client, and
// queue how many wait decoded for the writer: together the most a stream
// holds in memory.
const (
	pullBuffer = 100
	queue      = 64
)

// Streams serves the owners' streams of one console instance.
type Streams struct {
	js  jetstream.JetStream
	cfg Config
	m   metrics

	stop     chan struct{}
	stopOnce sync.Once

	mu       sync.Mutex
	perOwner map[string]int
	total    int
	// opens is each owner's allowance of stream opens; an owner's entry is
	// forgotten, at most once per refill period, when it is full again and
	// the owner has no stream open.
	opens     map[string]*rate.Limiter
	nextPrune time.Time
}

// New returns the streams; Close ends them.
func New(js jetstream.JetStream, cfg Config) *Streams {
	cfg.defaults()
	return &Streams{js: js, cfg: cfg, m: newMetrics(cfg.Metrics), stop: make(chan struct{}), perOwner: map[string]int{},
		opens: map[string]*rate.Limiter{}}
}

// Close ends every stream, open or opening; their clients reconnect.
func (s *Streams) Close() { s.stopOnce.Do(func() { close(s.stop) }) }

// Open counts the streams open now.
func (s *Streams) Open() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total
}

func (s *Streams) acquire(owner string, now time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.total >= s.cfg.Max:
		s.m.refused.WithLabelValues("instance_limit").Inc()
		return fmt.Errorf("%d streams open: %w", s.total, ErrTooManyStreams)
	case s.perOwner[owner] >= s.cfg.PerOwner:
		s.m.refused.WithLabelValues("owner_limit").Inc()
		return fmt.Errorf("owner %s has %d streams open: %w", owner, s.perOwner[owner], ErrOwnerLimit)
	}
	// Only a stream that opens takes from the allowance.
	res := s.opensOf(owner, now).ReserveN(now, 1)
	if d := res.DelayFrom(now); d > 0 {
		res.CancelAt(now)
		s.m.refused.WithLabelValues("open_rate").Inc()
		return fmt.Errorf("owner %s: %w", owner, &OpenRateError{Wait: d})
	}
	s.perOwner[owner]++
	s.total++
	s.m.open.Set(float64(s.total))
	return nil
}

// opensOf is owner's allowance of stream opens; s.mu is held.
func (s *Streams) opensOf(owner string, now time.Time) *rate.Limiter {
	if !now.Before(s.nextPrune) {
		for o, l := range s.opens {
			if s.perOwner[o] == 0 && l.TokensAt(now) >= float64(s.cfg.OpenBurst) {
				delete(s.opens, o)
			}
		}
		s.nextPrune = now.Add(time.Duration(s.cfg.OpenBurst) * s.cfg.OpenInterval)
	}
	l, ok := s.opens[owner]
	if !ok {
		l = rate.NewLimiter(rate.Every(s.cfg.OpenInterval), s.cfg.OpenBurst)
		s.opens[owner] = l
	}
	return l
}

func (s *Streams) release(owner string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.perOwner[owner]--; s.perOwner[owner] <= 0 {
		delete(s.perOwner, owner)
	}
	s.total--
	s.m.open.Set(float64(s.total))
}

// Serve streams owner's clicks from start to w until the client leaves (ctx
// ends; with ErrKeyRevoked as its cause, the key was revoked), the client
// stops reading, or Close. owner must be the
// authenticated owner's ID. Errors before the stream opens (limits, NATS)
// are returned with nothing written, for the caller to answer; once the
// stream is open Serve returns nil.
func (s *Streams) Serve(ctx context.Context, w http.ResponseWriter, owner string, start Start) error {
	if !events.ValidToken(owner) {
		return fmt.Errorf("stream clicks of %q: %w", owner, ErrBadOwner)
	}
	if err := s.acquire(owner, time.Now()); err != nil {
		return fmt.Errorf("stream clicks of %s: %w", owner, err)
	}
	defer s.release(owner)

	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{Filter(owner)}}
	switch {
	case start.Seq > 0:
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, start.Seq
	case !start.Time.IsZero():
		t := start.Time
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &t
	default:
		cfg.DeliverPolicy = jetstream.DeliverNewPolicy
	}
	octx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	firstSeq, lastSeq, err := s.bounds(octx)
	if err != nil {
		return fmt.Errorf("stream clicks of %s: %w: %w", owner, ErrUnavailable, err)
	}
	// A start beyond the stream's end is not a position CLICKS ever held
	// (CLICKS was re-created, or the ID was made up): waiting there would
	// show nothing until the sequences pass it. The stream starts at the
	// end instead, and says so.
	ahead := start.Seq > lastSeq+1
	if ahead {
		cfg.OptStartSeq = lastSeq + 1
	}
	it, err := ordered.Open(octx, s.js, events.ClicksStream, cfg, pullBuffer)
	if err != nil {
		return fmt.Errorf("stream clicks of %s: %w: %w", owner, ErrUnavailable, err)
	}
	defer it.Close()

	stream, err := sse.Open(w, s.cfg.Retry, s.cfg.WriteTimeout)
	if err != nil {
		s.end("write_error")
		return nil
	}
	log := s.cfg.Logger.With("owner", owner)
	if start.Seq > 0 && start.Seq < firstSeq {
		// The client asks for clicks CLICKS no longer retains: say so, so
		// it knows its copy may have a hole, then send what there is.
		gap, _ := json.Marshal(map[string]uint64{"requested_seq": start.Seq, "first_seq": firstSeq})
		if stream.Write(sse.Event{Name: "gap", Data: gap}) != nil || stream.Flush() != nil {
			s.end("write_error")
			return nil
		}
	}

	if ahead {
		// Its id is where the stream now stands: a client that reconnects
		// before a click of its owner arrives resumes from there, not from
		// its ID beyond the end, which would reset it to the end of then and
		// skip the clicks stored in between.
		reset, _ := json.Marshal(map[string]uint64{"requested_seq": start.Seq, "last_seq": lastSeq})
		ev := sse.Event{ID: strconv.FormatUint(lastSeq, 10), Name: "reset", Data: reset}
		if stream.Write(ev) != nil || stream.Flush() != nil {
			s.end("write_error")
			return nil
		}
	}

	// A click is counted once it is flushed to the connection, not when it
	// is queued: a stream that ends drops what it still queues.
	stream.OnSent(func(n int) { s.m.clicks.Add(float64(n)) })
	ch := make(chan sse.Event, queue)
	quit := make(chan struct{})
	pumpDone := make(chan struct{})
	go func() {
		defer close(pumpDone)
		s.pump(it, owner, ch, quit, log)
	}()
	err = stream.Pump(ctx, ch, s.stop, s.cfg.Heartbeat, nil)
	close(quit)
	it.Stop()
	<-pumpDone
	switch {
	case err == nil && isClosed(s.stop):
		_ = stream.Comment("server shutting down; reconnect with Last-Event-ID")
		_ = stream.Flush()
		s.end("shutdown")
	case err == nil:
		s.end("consumer")
	case errors.Is(context.Cause(ctx), ErrKeyRevoked):
		s.end("revoked")
	case ctx.Err() != nil:
		s.end("client")
	default:
		log.Info("owner stream: client not reading; disconnected", "err", err)
		s.end("write_error")
	}
	return nil
}

// pump reads the owner's clicks and queues them for the writer, until the
// iterator stops or quit closes. It closes ch when the consumer fails, which
// ends the stream (the client resumes).
func (s *Streams) pump(it *ordered.Iterator, owner string, ch chan<- sse.Event, quit <-chan struct{}, log *slog.Logger) {
	for {
		msg, err := it.Next()
		if err != nil {
			if !errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				log.Warn("owner stream: consumer failed; ending the stream", "err", err)
				close(ch)
			}
			return
		}
		md, err := msg.Metadata()
		if err != nil {
			continue
		}
		// The readers' rule of validity: a click they all park is not sent.
		// It also makes sure the payload's owner is the subject's, which the
		// consumer filtered on: one owner's click never reaches another.
		// (The partition check needs the partition count, which is not
		// known here: a click in the wrong partition is still sent.)
		c, err := events.ReadClick(msg.Data(), msg.Subject(), 0, md.Timestamp)
		if err != nil {
			s.m.skipped.WithLabelValues(events.Reason(err)).Inc()
			continue
		}
		data, _ := json.Marshal(Click{
			V: ClickVersion, Seq: md.Sequence.Stream, ID: c.ID, Time: c.Time, Code: c.Code, Owner: c.Owner,
			Target: c.Target, UserAgent: c.UserAgent, Referrer: c.Referrer, Country: c.Country, Bot: c.Bot,
		})
		select {
		case ch <- sse.Event{ID: strconv.FormatUint(md.Sequence.Stream, 10), Name: "click", Data: data}:
		case <-quit:
			return
		}
	}
}

// bounds are the first and last sequences CLICKS holds now.
func (s *Streams) bounds(ctx context.Context) (first, last uint64, err error) {
	st, err := s.js.Stream(ctx, events.ClicksStream)
	if err != nil {
		return 0, 0, err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return 0, 0, err
	}
	return info.State.FirstSeq, info.State.LastSeq, nil
}

func (s *Streams) end(reason string) { s.m.ended.WithLabelValues(reason).Inc() }

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
