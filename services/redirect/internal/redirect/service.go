package redirect

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/google/uuid"

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

// Policy says what a redirect does when its click cannot be written to the
// outbox (Redis down, or the outbox full because NATS has been away).
type Policy string

const (
	// PolicyRedirect answers 302 anyway and counts the click in
	// clicks_unrecorded_total: availability of links is the product. The
	// guarantee "a 302 only after the click is in the outbox" is off for
	// exactly the requests that counter counts.
	PolicyRedirect Policy = "redirect"
	// PolicyReject answers 503 with Retry-After: no redirect without its
	// click, for deployments where every click is billed.
	PolicyReject Policy = "reject"
)

// ClickAppender is what the service needs of the outbox committer.
type ClickAppender interface {
	Append(ctx context.Context, shard int, id, subject, data []byte) error
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
	ident    Identifier
	layout   outbox.Layout
	policy   Policy
	m        *Metrics
	bufs     sync.Pool
}

// NewService returns the hot path.
func NewService(resolver *Resolver, appender ClickAppender, ident Identifier, layout outbox.Layout, policy Policy, m *Metrics) *Service {
	s := &Service{resolver: resolver, appender: appender, ident: ident, layout: layout, policy: policy, m: m}
	s.bufs.New = func() any { b := make([]byte, 0, 2048); return &b }
	return s
}

// Follow resolves v.Code and, unless v is a HEAD, writes its click into the
// outbox before returning the link, so the caller's 302 follows the click.
// Errors: ErrNotFound; ErrClickNotRecorded (policy reject); anything else is
// Redis failing on a cache miss.
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
	err = s.record(ctx, &v, &l)
	if err == nil {
		s.m.Clicks.Inc()
		return l, nil
	}
	reason := "unavailable"
	if errors.Is(err, outbox.ErrFull) {
		reason = "full"
	}
	s.m.Unrecorded.WithLabelValues(reason).Inc()
	if s.policy == PolicyReject {
		return link.Link{}, fmt.Errorf("follow %q: %w: %w", v.Code, ErrClickNotRecorded, err)
	}
	return l, nil
}

// record builds the click in one pooled buffer laid out as
// [event ID][subject][JSON] and appends it to the outbox.
func (s *Service) record(ctx context.Context, v *Visit, l *link.Link) error {
	bp := s.bufs.Get().(*[]byte)
	defer func() {
		// After a cancelled wait a committer worker may still read the
		// buffer; then it is left to the GC instead of reused.
		if ctx.Err() == nil {
			s.bufs.Put(bp)
		}
	}()
	b := (*bp)[:0]

	id, err := uuid.NewV7()
	if err != nil {
		return fmt.Errorf("click id: %w", err)
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
		return fmt.Errorf("%w: %w", outbox.ErrUnavailable, err)
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
	return s.appender.Append(ctx, s.layout.Shard(l.Code), b[:idEnd], b[idEnd:subjEnd], b[visEnd:])
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
