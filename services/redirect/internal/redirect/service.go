package redirect

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/snipdev/snip/services/redirect/internal/directpub"
	"github.com/snipdev/snip/services/redirect/internal/link"
	"github.com/snipdev/snip/services/redirect/internal/outbox"
	"github.com/snipdev/snip/services/redirect/internal/visitor"
)

// Bounds on what a click carries from the request.
const (
	MaxUserAgent = 512
	MaxReferrer  = 1024
	MaxRequestID = 128
)

// Policy says what a redirect does when its click could be recorded
// neither in the outbox nor straight in JetStream (Redis and NATS both
// failing at once, or the outbox full and NATS away).
type Policy string

const (
	// PolicyReject answers 503 with Retry-After (the default): a 302 always
	// means the click is recorded, and a request answered 503 is never
	// counted (decisions/0014 says exactly when it could be).
	PolicyReject Policy = "reject"
	// PolicyRedirect answers 302 anyway and counts the click in
	// clicks_unrecorded_total: for deployments where a working link matters
	// more than its click, and only while both stores fail.
	PolicyRedirect Policy = "redirect"
)

// LateReplyGrace is how long past an outbox entry's validity (plus
// OutboxWait) a request whose direct publish failed still waits for Redis's
// reply to its write before it answers an error: the reply says whether the
// relay will publish the click. Only a reply that never comes (Redis frozen or
// dead) leaves the request to answer 503 without knowing.
const LateReplyGrace = 2 * time.Second

// Options shape how a click is recorded.
type Options struct {
	// Policy applies when both paths failed.
	Policy Policy
	// OutboxWait is how long a redirect waits for the outbox before it
	// records the click straight in JetStream instead.
	OutboxWait time.Duration
	// Validity is how long after it was handed to the committer an outbox
	// entry may still be stored to count: the entry carries start+Validity
	// and the relay drops it unpublished when Redis stored it later
	// (outbox.Late). At least OutboxWait; the slack above it is how far
	// Redis's clock may run ahead of this host's before clicks take the
	// direct path needlessly.
	Validity time.Duration
}

// ClickAppender is what the service needs of the outbox committer.
type ClickAppender interface {
	SubmitBy(ctx context.Context, deadline time.Time, shard int, id, subject, data []byte, until int64) (outbox.Ticket, error)
}

// DirectPublisher records a click straight in JetStream (the second
// durable path): nil means JetStream acknowledged it.
type DirectPublisher interface {
	PublishClick(ctx context.Context, id, subject, data []byte) error
}

// Identifier computes visitor identities.
type Identifier interface {
	AppendID(ctx context.Context, dst []byte, now time.Time, ip netip.Addr, ua string) ([]byte, error)
}

// Visit is one request for a short link, as the HTTP layer saw it.
type Visit struct {
	Code      string
	Time      time.Time
	IP        netip.Addr
	UserAgent string
	Referrer  string
	Country   string
	RequestID string
	// Head requests are answered but not counted as clicks.
	Head bool
}

// Service follows short links.
type Service struct {
	resolver *Resolver
	appender ClickAppender
	direct   DirectPublisher
	ident    Identifier
	layout   outbox.Layout
	opt      Options
	m        *Metrics
	bufs     sync.Pool
}

// NewService returns the hot path. Without a direct publisher (nil), a
// click the outbox does not take in time goes by the policy.
func NewService(resolver *Resolver, appender ClickAppender, direct DirectPublisher, ident Identifier, layout outbox.Layout, opt Options, m *Metrics) *Service {
	if opt.OutboxWait <= 0 {
		opt.OutboxWait = 100 * time.Millisecond
	}
	opt.Validity = max(opt.Validity, opt.OutboxWait)
	if opt.Policy == "" {
		opt.Policy = PolicyReject
	}
	s := &Service{resolver: resolver, appender: appender, direct: direct, ident: ident, layout: layout, opt: opt, m: m}
	s.bufs.New = func() any { b := make([]byte, 0, 2048); return &b }
	return s
}

// Follow resolves v.Code and, unless v is a HEAD, records its click before
// returning the link, so the caller's 302 follows the click: in the Redis
// outbox when it answers within OutboxWait, else straight in JetStream.
// Errors: ErrNotFound; ErrClickNotRecorded (both paths failed, policy
// reject); ErrClickUnconfirmed (both failed, and JetStream never answered
// the direct publish, which it may have stored); ctx's error (the client went away); anything else is Redis
// failing on a cache miss.
func (s *Service) Follow(ctx context.Context, v Visit) (link.Link, error) {
	l, err := s.resolver.Resolve(ctx, v.Code)
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			s.m.Misses.Inc()
		}
		return link.Link{}, err
	}
	if v.Head {
		s.m.Heads.Inc()
		return l, nil
	}
	direct, err := s.record(ctx, &v, &l)
	if err == nil {
		if direct {
			s.m.RecordedDirect.Inc()
		} else {
			s.m.Clicks.Inc()
		}
		return l, nil
	}
	if ctx.Err() != nil {
		return link.Link{}, fmt.Errorf("follow %q: %w", v.Code, ctx.Err())
	}
	reason, answer := "unavailable", ErrClickNotRecorded
	switch {
	case errors.Is(err, directpub.ErrUnconfirmed):
		reason, answer = "unconfirmed", ErrClickUnconfirmed
	case errors.Is(err, outbox.ErrFull):
		reason = "full"
	}
	s.m.Unrecorded.WithLabelValues(reason).Inc()
	if s.opt.Policy == PolicyReject {
		return link.Link{}, fmt.Errorf("follow %q: %w: %w", v.Code, answer, err)
	}
	return l, nil
}

// record builds the click in one pooled buffer laid out as
// [event ID][subject][JSON] and records it: in the outbox if Redis stores it
// within OutboxWait (and in time by outbox.Late), otherwise straight in
// JetStream. If that fails too while the outbox write is still in flight,
// it waits until the relay's rule has decided (the entry's validity plus
// OutboxWait), so an error is answered only for a click whose outbox entry,
// if it ever lands, the relay drops. direct reports which path recorded it.
func (s *Service) record(ctx context.Context, v *Visit, l *link.Link) (direct bool, err error) {
	bp := s.bufs.Get().(*[]byte)
	var t outbox.Ticket
	defer func() {
		// A ticket still in flight means a committer worker may read the
		// buffer; then it is left to the GC instead of reused.
		if t.Done() || !t.Submitted() {
			s.bufs.Put(bp)
		}
		t.Release()
	}()
	b := (*bp)[:0]

	id, err := uuid.NewV7()
	if err != nil {
		return false, fmt.Errorf("click id: %w", err)
	}
	b = appendUUID(b, id)
	idEnd := len(b)
	b = append(b, "clicks."...)
	b = append(b, l.Owner...)
	b = append(b, '.')
	b = append(b, l.Code...)
	subjEnd := len(b)
	b = visitor.AppendPrefix(b, v.IP)
	prefixEnd := len(b)
	ua := visitor.Truncate(v.UserAgent, MaxUserAgent)
	b, err = s.ident.AppendID(ctx, b, v.Time, v.IP, ua)
	if err != nil {
		*bp = b
		return false, fmt.Errorf("%w: %w", outbox.ErrUnavailable, err)
	}
	visEnd := len(b)
	c := clickFields{
		ID:        b[:idEnd],
		Time:      v.Time,
		Code:      l.Code,
		Owner:     l.Owner,
		Target:    l.Target,
		IPPrefix:  b[subjEnd:prefixEnd],
		Visitor:   b[prefixEnd:visEnd],
		UserAgent: ua,
		Referrer:  visitor.Truncate(v.Referrer, MaxReferrer),
		Country:   v.Country,
		RequestID: visitor.Truncate(v.RequestID, MaxRequestID),
		Bot:       visitor.IsBot(v.UserAgent),
	}
	b = appendClick(b, &c)
	*bp = b // keep the grown buffer for the next request
	evID, subj, data := b[:idEnd], b[idEnd:subjEnd], b[visEnd:]

	start := time.Now()
	until := start.Add(s.opt.Validity).UnixMilli()
	// The wait for the outbox ends at deadline: a pooled timer in the
	// committer, not a context.WithDeadline of ctx a click.
	deadline := start.Add(s.opt.OutboxWait)
	t, oerr := s.appender.SubmitBy(ctx, deadline, s.layout.Shard(l.Code), evID, subj, data, until)
	if oerr == nil {
		var stored int64
		stored, oerr = t.WaitBy(ctx, deadline)
		if oerr == nil && !outbox.Late(stored, until) {
			return false, nil
		}
		if errors.Is(oerr, outbox.ErrNotReplicated) && !outbox.Late(stored, until) {
			s.backUp(ctx, evID, subj, data)
			return false, nil
		}
		if oerr == nil {
			oerr = fmt.Errorf("outbox entry stored at %d, after its validity %d: %w", stored, until, outbox.ErrUnavailable)
		}
	}
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	if errors.Is(oerr, context.DeadlineExceeded) {
		oerr = fmt.Errorf("outbox did not answer within %s: %w", s.opt.OutboxWait, outbox.ErrUnavailable)
	}
	if s.direct == nil {
		return false, oerr
	}
	dstart := time.Now()
	derr := s.direct.PublishClick(ctx, evID, subj, data)
	s.m.DirectDuration.Observe(time.Since(dstart).Seconds())
	if derr == nil {
		return true, nil
	}
	if t.Submitted() && !t.Done() {
		// The relay's rule decides by when Redis stored the entry, so its
		// reply, whenever it comes, says what the relay will do: wait for it
		// past the validity too (LateReplyGrace), so that a reply delayed by
		// a starved process or a slow network is not taken for a click
		// Redis never stored (answered 503, then relayed and counted).
		gctx, cancel := context.WithDeadline(ctx, time.UnixMilli(until).Add(s.opt.OutboxWait+LateReplyGrace))
		stored, err := t.Wait(gctx)
		cancel()
		if err == nil && !outbox.Late(stored, until) {
			return false, nil
		}
		if errors.Is(err, outbox.ErrNotReplicated) && !outbox.Late(stored, until) {
			// In the outbox on its master alone; the direct publish just
			// failed, so there is no second copy to make.
			s.m.ReplicaShortMasterOnly.Inc()
			return false, nil
		}
	}
	return false, fmt.Errorf("record click: %w; direct: %w", oerr, derr)
}

// backUp records a click its Redis master stored but its replicas did not
// acknowledge in time (so the master's crash would lose it) straight in
// JetStream as well, with the event ID as Nats-Msg-Id: the relay's later
// publish of the outbox entry is then a duplicate that CLICKS drops. The
// click counts as recorded either way (it is in the outbox, as on a Redis
// without replicas), so a failed publish still answers 302, and is counted.
func (s *Service) backUp(ctx context.Context, id, subject, data []byte) {
	if s.direct != nil {
		start := time.Now()
		err := s.direct.PublishClick(ctx, id, subject, data)
		s.m.DirectDuration.Observe(time.Since(start).Seconds())
		if err == nil {
			s.m.ReplicaShortPublished.Inc()
			return
		}
	}
	s.m.ReplicaShortMasterOnly.Inc()
}

// appendUUID appends the canonical 36-character text of id.
func appendUUID(b []byte, id uuid.UUID) []byte {
	var t [36]byte
	const hx = "0123456789abcdef"
	j := 0
	for i, x := range id {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			t[j] = '-'
			j++
		}
		t[j], t[j+1] = hx[x>>4], hx[x&0xf]
		j += 2
	}
	return append(b, t[:]...)
}
