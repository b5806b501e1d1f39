package reader

import (
	"context"
	"encoding/json"
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

// Groups lists the consumer groups that have consumers on CLICKS, sorted:
// every consumer topology.GroupConsumerConfig made carries its group in the
// "snip.group" metadata. Tools that show every reader (the console) use it
// instead of a list that goes stale when a reader is added.
func Groups(ctx context.Context, js jetstream.JetStream) ([]string, error) {
	s, err := js.Stream(ctx, events.ClicksStream)
	if err != nil {
		return nil, fmt.Errorf("list groups: %w", err)
	}
	seen := map[string]bool{}
	l := s.ListConsumers(ctx)
	for ci := range l.Info() {
		if g := ci.Config.Metadata["snip.group"]; g != "" {
			seen[g] = true
		}
	}
	if err := l.Err(); err != nil {
		return nil, fmt.Errorf("list groups: %w", err)
	}
	groups := make([]string, 0, len(seen))
	for g := range seen {
		groups = append(groups, g)
	}
	slices.Sort(groups)
	return groups, nil
}

// Settled reports whether leases (Members) show group at rest: every one
// of its partitions held by exactly one member, and the assignment the
// members compute from these leases (AssignSticky, each lease's Owned as
// its claims) giving each partition to the member that holds it. It is
// what the leases say; a member whose view of them is a heartbeat behind
// (a join, a partition just taken) can still move one, so a caller that
// needs the group at rest sees it settled, unchanged, over a few
// heartbeats.
func Settled(group string, partitions int, leases []Lease) bool {
	holder := make([]string, partitions)
	members := make([]string, 0, len(leases))
	claims := make(map[string][]int, len(leases))
	for _, l := range leases {
		members = append(members, l.Member)
		claims[l.Member] = l.Owned
		for _, p := range l.Owned {
			if p < 0 || p >= partitions || holder[p] != "" {
				return false
			}
			holder[p] = l.Member
		}
	}
	return slices.Equal(AssignSticky(group, partitions, members, claims), holder)
}

// RestWatch watches a group come to rest, from leases read again and
// again: Observe says how long the group has been Settled with the same
// holders. A member whose view of the leases is a heartbeat behind can
// still move a partition just after the leases look settled, so a caller
// that needs the group at rest waits for a few heartbeats of it. The zero
// value is ready to use.
type RestWatch struct {
	layout string
	since  time.Time
}

// Observe takes the leases just read, at now, and returns how long the
// group has been settled on the same holders (0: not settled, or the
// holders just changed).
func (w *RestWatch) Observe(group string, partitions int, leases []Lease, now time.Time) time.Duration {
	if !Settled(group, partitions, leases) {
		w.layout = ""
		return 0
	}
	var b strings.Builder
	for _, l := range leases {
		fmt.Fprintf(&b, "%s%v;", l.Member, l.Owned)
	}
	if l := b.String(); l != w.layout {
		w.layout, w.since = l, now
	}
	return now.Sub(w.since)
}

// Members returns the leases of group's live members, by member name: who
// is in the group and the partitions each holds. A lease that lapses while
// they are read is left out.
func Members(ctx context.Context, js jetstream.JetStream, group string) ([]Lease, error) {
	kv, err := js.KeyValue(ctx, topology.MembersBucket)
	if err != nil {
		return nil, fmt.Errorf("members of %s: %w", group, err)
	}
	keys, err := kv.ListKeysFiltered(ctx, memberPrefix(group)+">")
	if err != nil {
		return nil, fmt.Errorf("members of %s: %w", group, err)
	}
	// The listing is read to its end first: its lister blocks for good on a
	// full channel left unread.
	var names []string
	for k := range keys.Keys() {
		names = append(names, k)
	}
	var out []Lease
	for _, k := range names {
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // lapsed since the listing
		}
		if err != nil {
			return nil, fmt.Errorf("members of %s: %w", group, err)
		}
		var l Lease
		if err := json.Unmarshal(e.Value(), &l); err != nil {
			return nil, fmt.Errorf("members of %s: lease %s: %w", group, k, err)
		}
		out = append(out, l)
	}
	slices.SortFunc(out, func(a, b Lease) int { return strings.Compare(a.Member, b.Member) })
	return out, nil
}

// RewindStatus is the latest replay requested of a group, and how far it got.
type RewindStatus struct {
	// ID identifies the request; empty when the group was never replayed.
	ID string
	// Requested is when it was asked for.
	Requested time.Time
	// Partitions has one entry per partition, in order.
	Partitions []PartitionRewind
	// rev is the request's revision in the bucket, as read (0: none).
	rev uint64
}

// PartitionRewind is one partition's part of a replay.
type PartitionRewind struct {
	Partition int
	// From and Until are the partition's replayed range (RewindInfo).
	From, Until uint64
	// Done is true once the partition's owner moved its consumer back.
	Done bool
	// AtGroupStart is true when the replay was asked from before the
	// partition's consumer started (the group was created at a time or a
	// sequence): From is where it started, as far back as the server
	// moves it.
	AtGroupStart bool
	// Void is true when the partition's consumer is not the one the request
	// was made for: that one was deleted since (the group's consumers
	// removed, and maybe created again by a later deploy). The consumer
	// there now ignores the request, so a partition not Done never will
	// be; one Done was moved back as the consumer before, not as the one
	// there now.
	Void bool
}

// Done reports whether every partition has carried the replay out.
func (s RewindStatus) Done() bool {
	for _, p := range s.Partitions {
		if !p.Done {
			return false
		}
	}
	return s.ID != ""
}

// Void reports whether the replay will never be done: a partition that has
// not carried it out is Void (the group was deleted or created again after
// the replay was requested).
func (s RewindStatus) Void() bool {
	for _, p := range s.Partitions {
		if p.Void && !p.Done {
			return true
		}
	}
	return false
}

// LatestRewind reads the group's latest replay request, which partitions
// have carried it out, and which consumers are no longer the ones it was
// made for (Void). A group never replayed has a zero RewindStatus.
func LatestRewind(ctx context.Context, js jetstream.JetStream, group string) (RewindStatus, error) {
	kv, err := js.KeyValue(ctx, topology.MembersBucket)
	if err != nil {
		return RewindStatus{}, fmt.Errorf("replay status of %s: %w", group, err)
	}
	req, err := readRewind(ctx, kv, group)
	if err != nil || req.ID == "" {
		return RewindStatus{}, err
	}
	return rewindStatus(ctx, js, kv, group, req)
}

// readRewind reads the group's latest rewind request (a zero one: none).
func readRewind(ctx context.Context, kv jetstream.KeyValue, group string) (rewindRequest, error) {
	e, err := kv.Get(ctx, rewindKey(group))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return rewindRequest{}, nil
	}
	if err != nil {
		return rewindRequest{}, fmt.Errorf("replay status of %s: %w", group, err)
	}
	var req rewindRequest
	if err := json.Unmarshal(e.Value(), &req); err != nil {
		return rewindRequest{}, fmt.Errorf("replay status of %s: decode request: %w", group, err)
	}
	req.rev = e.Revision()
	return req, nil
}

// rewindStatus reads which partitions carried req out and which consumers
// are not the ones it was made for.
func rewindStatus(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, group string, req rewindRequest) (RewindStatus, error) {
	n, err := topology.Partitions(ctx, js)
	if err != nil {
		return RewindStatus{}, fmt.Errorf("replay status of %s: %w", group, err)
	}
	st := RewindStatus{ID: req.ID, Requested: req.Requested, Partitions: make([]PartitionRewind, n), rev: req.rev}
	for p := range n {
		ri := req.info(p)
		st.Partitions[p] = PartitionRewind{Partition: p, From: ri.From, Until: ri.Until, AtGroupStart: req.AtStart[strconv.Itoa(p)]}
		e, err := kv.Get(ctx, rewoundKey(group, p))
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return RewindStatus{}, fmt.Errorf("replay status of %s: partition %d: %w", group, p, err)
		default:
			st.Partitions[p].Done = string(e.Value()) == req.ID
		}
		if _, ok := req.Consumers[strconv.Itoa(p)]; !ok {
			continue // for whatever consumer there is
		}
		c, err := js.Consumer(ctx, events.ClicksStream, topology.GroupConsumerName(group, p))
		switch {
		case errors.Is(err, jetstream.ErrConsumerNotFound):
			st.Partitions[p].Void = true // deleted, not created again yet
		case err != nil:
			return RewindStatus{}, fmt.Errorf("replay status of %s: consumer of partition %d: %w", group, p, err)
		default:
			st.Partitions[p].Void = !req.madeFor(p, c.CachedInfo().Created)
		}
	}
	return st, nil
}
