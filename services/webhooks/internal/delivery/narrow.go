package delivery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/webhooks/internal/endpoint"
	"github.com/snipdev/snip/services/webhooks/internal/redisstore"
)

// ErrNotReading: an endpoint was not created because the group's consumers
// could not be told to read its clicks (NATS unavailable). Nothing was
// stored; the owner tries again.
var ErrNotReading = errors.New("could not start reading the endpoint's clicks")

// ClickInterest is what the endpoints want of CLICKS, by owner: nil for
// an owner with an endpoint that wants every link, else the codes its
// endpoints list. Disabled endpoints and endpoints without the click type
// want nothing; paused ones keep queueing, so they count.
func ClickInterest(eps []endpoint.Endpoint) topology.Interest {
	in := topology.Interest{}
	for _, e := range eps {
		if !e.DisabledAt.IsZero() || !slices.Contains(e.Types, endpoint.TypeClick) {
			continue
		}
		codes, seen := in[e.Owner]
		switch {
		case len(e.Links) == 0:
			in[e.Owner] = nil
		case seen && codes == nil: // an endpoint of the owner already wants every link
		default:
			in[e.Owner] = append(slices.Clip(codes), e.Links...)
		}
	}
	return in
}

// Narrower keeps the webhooks group's partition consumers filtered to the
// clicks some endpoint wants, so that the server sends the group only
// those: an owner without a click endpoint costs the group nothing, however
// many clicks their links get. Every instance runs one; they take turns
// under a Redis lock, and each consumer records the endpoints' version it
// was narrowed to (topology.NarrowGroup), so an older view never replaces
// a newer one.
type Narrower struct {
	store      *redisstore.Store
	js         jetstream.JetStream
	group      string
	partitions int
	instance   string
	log        *slog.Logger
	// Every is how often Run checks for a changed version; it narrows
	// again, unchanged or not, every tenth check (a consumer the reader
	// runtime re-created reads everything until then).
	Every time.Duration
	// LockTTL bounds how long a crashed instance holds the lock.
	LockTTL time.Duration

	mu sync.Mutex // one Sync at a time in this instance
}

// NewNarrower returns a Narrower of group's consumers.
func NewNarrower(store *redisstore.Store, js jetstream.JetStream, group string, partitions int, instance string, log *slog.Logger) *Narrower {
	return &Narrower{store: store, js: js, group: group, partitions: partitions, instance: instance, log: log,
		Every: 2 * time.Second, LockTTL: 15 * time.Second}
}

// Sync narrows the group's consumers to the endpoints stored now and
// returns the version it applied. Once it returns, every consumer reads at
// least what those endpoints want: a click stored after that reaches the
// intake.
func (n *Narrower) Sync(ctx context.Context) (int64, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for {
		ok, err := n.store.LockInterest(ctx, n.instance, n.LockTTL)
		if err != nil {
			return 0, fmt.Errorf("narrow: %w", err)
		}
		if ok {
			break
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("narrow: waiting for the lock: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_ = n.store.UnlockInterest(uctx, n.instance)
	}()
	// The version first: the endpoints read after it are at least that
	// version's (an endpoint stored in between makes the view wider, never
	// narrower, and the next Sync records it).
	v, err := n.store.Version(ctx)
	if err != nil {
		return 0, fmt.Errorf("narrow: %w", err)
	}
	eps, err := n.store.All(ctx)
	if err != nil {
		return 0, fmt.Errorf("narrow: %w", err)
	}
	in := ClickInterest(eps)
	changed, err := topology.NarrowGroup(ctx, n.js, n.group, n.partitions, in, v)
	if err != nil {
		return 0, err
	}
	if changed > 0 {
		n.log.Info("webhooks: the group reads the clicks of these owners' endpoints", "owners", len(in), "version", v, "consumers_changed", changed)
	}
	return v, nil
}

// Run narrows at start, whenever the endpoints' version changes, and every
// tenth check regardless, until ctx ends. A failure is logged and tried
// again at the next check: until then the consumers read more than needed
// (never less, except for an endpoint whose create call failed, which was
// not stored).
func (n *Narrower) Run(ctx context.Context) error {
	var applied int64 = -1
	failing := false
	t := time.NewTicker(n.Every)
	defer t.Stop()
	for i := 0; ; i++ {
		v, err := n.store.Version(ctx)
		if err == nil && (v != applied || i%10 == 0) {
			var got int64
			got, err = n.Sync(ctx)
			if err == nil {
				applied = got
			}
		}
		switch {
		case err != nil && ctx.Err() == nil && !failing:
			n.log.Warn("webhooks: narrowing the group's consumers failed; trying again", "err", err)
			failing = true
		case err == nil && failing:
			n.log.Info("webhooks: narrowing the group's consumers recovered")
			failing = false
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
