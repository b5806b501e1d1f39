package reader

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/topology"
)

// Lag reports, for every partition of a group, how far the group is behind:
// events not yet delivered, delivered but not acked, and when the oldest
// unprocessed event was stored. It reads the server's state, so it is right
// even when every member is down; the console and `snipctl lag` use it.
func Lag(ctx context.Context, js jetstream.JetStream, group string) ([]PartitionLag, error) {
	n, err := topology.Partitions(ctx, js)
	if err != nil {
		return nil, fmt.Errorf("lag of %s: %w", group, err)
	}
	s, err := js.Stream(ctx, events.ClicksStream)
	if err != nil {
		return nil, fmt.Errorf("lag of %s: %w", group, err)
	}
	out := make([]PartitionLag, 0, n)
	for p := range n {
		pl, err := partitionLag(ctx, s, group, p)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("lag of %s: %w", group, err)
		}
		out = append(out, pl)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("lag of %s: %w", group, ErrNoGroup)
	}
	return out, nil
}

// partitionLag reads one partition consumer's state and the stored time of
// the first event it has not acked.
func partitionLag(ctx context.Context, s jetstream.Stream, group string, p int) (PartitionLag, error) {
	name := topology.GroupConsumerName(group, p)
	c, err := s.Consumer(ctx, name)
	if err != nil {
		return PartitionLag{}, fmt.Errorf("consumer %s: %w", name, err)
	}
	info := c.CachedInfo()
	pl := PartitionLag{
		Partition:  p,
		Consumer:   name,
		Pending:    info.NumPending,
		AckPending: info.NumAckPending,
		AckFloor:   info.AckFloor.Stream,
	}
	for _, g := range info.PriorityGroups {
		if g.Group == topology.PriorityGroup {
			pl.Pinned = g.PinnedClientID
		}
	}
	if pl.Pending == 0 && pl.AckPending == 0 {
		return pl, nil
	}
	// The first unprocessed event: after the ack floor if events are in
	// flight, else after the last delivered one.
	next := info.AckFloor.Stream + 1
	if info.NumAckPending == 0 && info.Delivered.Stream > info.AckFloor.Stream {
		next = info.Delivered.Stream + 1
	}
	m, err := s.GetMsg(ctx, next, jetstream.WithGetMsgSubject(events.PartitionFilter(p)))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return pl, nil
	case err != nil:
		return PartitionLag{}, fmt.Errorf("oldest unprocessed event of %s: %w", name, err)
	}
	pl.OldestUnprocessed = m.Time
	// A group that started at a time has skipped what came before; the
	// oldest event it still owes is then no older than its start.
	if st := info.Config.OptStartTime; st != nil && info.Delivered.Stream == 0 && m.Time.Before(*st) {
		pl.OldestUnprocessed = *st
	}
	return pl, nil
}
