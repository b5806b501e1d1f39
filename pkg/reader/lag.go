package reader

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/topology"
)

// Lag reports, for every partition of a group, how far the group is behind:
// events not yet delivered, delivered but not acked, and when the oldest
// unprocessed event was stored. It reads the server's state, so it is right
// even when every member is down; `snipctl lag <group>` uses it.
//
// It reads each partition's consumer by name, which a service's NATS user
// may (it reads its own group's), where LagAll lists every consumer of
// CLICKS, which only the console's, the load test's and an operator's may.
//
// The server updates a consumer's pending count asynchronously (it acks a
// publish, then signals the stream's consumers from another goroutine), so
// right after a publish Lag may not count the newest events yet; a moment
// later it does. It is a monitor, not a barrier.
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

// LagAll is Lag of every group on CLICKS (those Groups lists), by group,
// from one listing of CLICKS' consumers: the console and `snipctl lag` use
// it. Its NATS user needs $JS.API.CONSUMER.LIST.CLICKS.
func LagAll(ctx context.Context, js jetstream.JetStream) (map[string][]PartitionLag, error) {
	all, err := lagOf(ctx, js)
	if err != nil {
		return nil, fmt.Errorf("lag of every group: %w", err)
	}
	return all, nil
}

// lagOf reads the lag of every group's partitions, by group, each group's
// in partition order. The consumers come from one
// listing of CLICKS' consumers (a page holds 256), which carry their group
// and partition in their metadata, rather than one request each: on a busy
// server a request can take a tenth of a second, and a console showing five
// groups of eight partitions asked about fifty times a refresh. The oldest
// unprocessed event costs one more request for each partition that is
// behind (none for one caught up).
func lagOf(ctx context.Context, js jetstream.JetStream) (map[string][]PartitionLag, error) {
	s, err := js.Stream(ctx, events.ClicksStream)
	if err != nil {
		return nil, err
	}
	parts, err := listGroupConsumers(ctx, s)
	if err != nil {
		return nil, err
	}
	out := map[string][]PartitionLag{}
	for _, pt := range parts {
		pl, err := lagFromInfo(ctx, s, pt.Partition, pt.Info)
		if err != nil {
			return nil, err
		}
		out[pt.Group] = append(out[pt.Group], pl)
	}
	return out, nil
}

// GroupConsumer is one partition consumer of a consumer group on CLICKS,
// as the server reported it.
type GroupConsumer struct {
	Group     string
	Partition int
	Info      *jetstream.ConsumerInfo
}

// GroupConsumers lists the partition consumers of every group on CLICKS,
// by group and then partition, from one listing of the stream's consumers
// (a page holds 256): each carries its group and partition in its metadata
// ("snip.group", "snip.partition"). A tool that needs only the consumers'
// state (the load test's backlog, read every second) reads it so, in two
// requests however many groups there are.
func GroupConsumers(ctx context.Context, js jetstream.JetStream) ([]GroupConsumer, error) {
	s, err := js.Stream(ctx, events.ClicksStream)
	if err != nil {
		return nil, fmt.Errorf("list group consumers: %w", err)
	}
	gcs, err := listGroupConsumers(ctx, s)
	if err != nil {
		return nil, fmt.Errorf("list group consumers: %w", err)
	}
	return gcs, nil
}

// listGroupConsumers is GroupConsumers of s.
func listGroupConsumers(ctx context.Context, s jetstream.Stream) ([]GroupConsumer, error) {
	var out []GroupConsumer
	var bad error // the listing is read to its end either way: its lister blocks until it is
	l := s.ListConsumers(ctx)
	for ci := range l.Info() {
		g := ci.Config.Metadata["snip.group"]
		if g == "" {
			continue
		}
		p, err := strconv.Atoi(ci.Config.Metadata["snip.partition"])
		if err != nil {
			bad = cmp.Or(bad, fmt.Errorf("consumer %s of group %s: bad snip.partition %q", ci.Name, g, ci.Config.Metadata["snip.partition"]))
			continue
		}
		out = append(out, GroupConsumer{Group: g, Partition: p, Info: ci})
	}
	if err := cmp.Or(l.Err(), bad); err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b GroupConsumer) int {
		return cmp.Or(strings.Compare(a.Group, b.Group), cmp.Compare(a.Partition, b.Partition))
	})
	return out, nil
}

// partitionLag reads one partition consumer's state and the stored time of
// the first event it has not acked (a member's own gauges, reportLag).
func partitionLag(ctx context.Context, s jetstream.Stream, group string, p int) (PartitionLag, error) {
	name := topology.GroupConsumerName(group, p)
	c, err := s.Consumer(ctx, name)
	if err != nil {
		return PartitionLag{}, fmt.Errorf("consumer %s: %w", name, err)
	}
	return lagFromInfo(ctx, s, p, c.CachedInfo())
}

// lagFromInfo is partition p's lag from its consumer's info, and the
// stored time of the first event the consumer has not acked.
func lagFromInfo(ctx context.Context, s jetstream.Stream, p int, info *jetstream.ConsumerInfo) (PartitionLag, error) {
	pl := PartitionLag{
		Partition:  p,
		Consumer:   info.Name,
		Pending:    info.NumPending,
		AckPending: info.NumAckPending,
		AckFloor:   info.AckFloor.Stream,
	}
	for _, g := range info.PriorityGroups {
		if g.Group == topology.PriorityGroup {
			pl.Pinned = g.PinnedClientID
		}
	}
	t, err := OldestUnprocessed(ctx, s, info)
	if err != nil {
		return PartitionLag{}, fmt.Errorf("oldest unprocessed event of %s: %w", info.Name, err)
	}
	pl.OldestUnprocessed = t
	return pl, nil
}

// maxLagFilters is the most filter subjects OldestUnprocessed asks for one
// by one (a narrowed group's consumer has one per owner it reads).
const maxLagFilters = 16

// OldestUnprocessed returns when the oldest event a consumer of stream s has
// not processed was stored: the first one after its ack floor while events
// are in flight, else the first after the last delivered one. It is zero
// when the consumer is caught up. Any durable consumer can be asked: the
// console reads the preview workers' and the counter's feeds with it too.
func OldestUnprocessed(ctx context.Context, s jetstream.Stream, info *jetstream.ConsumerInfo) (time.Time, error) {
	if info.NumPending == 0 && info.NumAckPending == 0 {
		return time.Time{}, nil
	}
	next := info.AckFloor.Stream + 1
	if info.NumAckPending == 0 && info.Delivered.Stream > info.AckFloor.Stream {
		next = info.Delivered.Stream + 1
	}
	filters := info.Config.FilterSubjects
	if info.Config.FilterSubject != "" {
		filters = []string{info.Config.FilterSubject}
	}
	if len(filters) == 0 || len(filters) > maxLagFilters {
		// No filter, or too many to ask for one by one: the first event
		// after next of any subject ("" below), which with filters may be
		// one the consumer is not sent (older than what it owes).
		filters = []string{""}
	}
	var m *jetstream.RawStreamMsg // the earliest of the filters' first events
	for _, f := range filters {
		var opts []jetstream.GetMsgOpt
		if f != "" {
			opts = append(opts, jetstream.WithGetMsgSubject(f))
		}
		got, err := s.GetMsg(ctx, next, opts...)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			continue
		case err != nil:
			return time.Time{}, err
		}
		if m == nil || got.Sequence < m.Sequence {
			m = got
		}
	}
	if m == nil {
		return time.Time{}, nil
	}
	// So also for a consumer created at a time, before its first
	// delivery: the server puts its ack floor just before the first event
	// stored at or after that time, and one created on an empty stream
	// starts at sequence 1 whatever its time, owing the events stored
	// before a start still to come. Its start time is no event's.
	return m.Time, nil
}

// lagEvery is how often a partition's owner reads its lag for its gauges.
const lagEvery = 5 * time.Second

// reportLag keeps the partition's lag gauges current while this owner
// holds it, until the returned stop is called (and returns once the
// reporter ended): it reads them at once, then every lagEvery. It runs
// beside the worker's loop, not in it, so the gauges go on telling while
// the loop waits: a handler that hangs on one batch, an OnAssign or an
// OnRewind that rebuilds for minutes. Read from the loop, they froze at
// their last value then, and the age of the oldest unprocessed event, the
// figure the group's stall alerts go by, stayed what it was before the
// stall. The caller forgets the gauges (forgetPartition) after stop, so
// none is written again for a partition given up.
func (w *worker) reportLag() (stop func()) {
	return repeat(lagEvery, true, func() bool { w.updateLag(); return true })
}

// repeat calls f in a goroutine of its own, at once if now, then every d,
// until f returns false or the returned stop is called; stop returns once
// the goroutine has ended (f is not running and will not run again).
func repeat(d time.Duration, now bool, f func() bool) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(d)
		defer t.Stop()
		if now && !f() {
			return
		}
		for {
			select {
			case <-quit:
				return
			case <-t.C:
			}
			if !f() {
				return
			}
		}
	}()
	return func() {
		close(quit)
		<-done
	}
}

// updateLag reads the partition's lag and sets its gauges. A read that
// fails leaves them as they were (NATS away: the lease lapses, and the
// partition is given up, its gauges with it).
func (w *worker) updateLag() {
	ctx, cancel := context.WithTimeout(w.ctx, 2*time.Second)
	defer cancel()
	pl, err := partitionLag(ctx, w.m.stream, w.m.cfg.Group, w.p)
	if err != nil {
		return
	}
	g := w.m.cfg.Group
	w.m.met.lag.WithLabelValues(g, w.ps).Set(float64(pl.Pending))
	w.m.met.ackPending.WithLabelValues(g, w.ps).Set(float64(pl.AckPending))
	age := 0.0
	if !pl.OldestUnprocessed.IsZero() {
		age = time.Since(pl.OldestUnprocessed).Seconds()
	}
	w.m.met.oldestAge.WithLabelValues(g, w.ps).Set(age)
}
