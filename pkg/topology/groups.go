package topology

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
)

// PriorityGroup is the name of the priority group on every group consumer.
// With the pinned_client policy the server serves only one client of it at a
// time: the member that owns the partition.
const PriorityGroup = "owner"

// GroupConsumerName is the durable consumer of partition p in a group.
func GroupConsumerName(group string, p int) string {
	return group + "-p" + strconv.Itoa(p)
}

// GroupConsumer holds the tunable parts of a group's partition consumers.
type GroupConsumer struct {
	// AckWait is how long the server waits for an ack before redelivering.
	AckWait time.Duration
	// PinnedTTL is how long the server keeps a silent member pinned; it
	// bounds how long a crashed member blocks its partition.
	PinnedTTL time.Duration
	// MaxAckPending bounds the events in flight to the owner.
	MaxAckPending int
	// DeliverPolicy and OptStartTime say where a new consumer begins.
	DeliverPolicy jetstream.DeliverPolicy
	OptStartTime  *time.Time
}

// GroupConsumerConfig is the configuration of partition p's consumer in a
// consumer group on CLICKS.
//
// AckAll: the owner handles a partition's events strictly in order and acks
// a batch by acking its last event, one ack per batch. MaxDeliver is
// unlimited: the reader runtime parks poison events itself (on DEAD_LETTER,
// with the reason), rather than letting the server drop them silently.
func GroupConsumerConfig(group string, p int, gc GroupConsumer) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:        GroupConsumerName(group, p),
		Description:    "consumer group " + group + ", partition " + strconv.Itoa(p),
		FilterSubject:  events.PartitionFilter(p),
		AckPolicy:      jetstream.AckAllPolicy,
		AckWait:        gc.AckWait,
		MaxDeliver:     -1,
		MaxAckPending:  gc.MaxAckPending,
		DeliverPolicy:  gc.DeliverPolicy,
		OptStartTime:   gc.OptStartTime,
		PriorityGroups: []string{PriorityGroup},
		PriorityPolicy: jetstream.PriorityPolicyPinned,
		PinnedTTL:      gc.PinnedTTL,
		MaxWaiting:     64,
		Metadata:       map[string]string{"snip.group": group, "snip.partition": strconv.Itoa(p)},
	}
}

// Interest is what a narrowed group reads of CLICKS: for each owner, the
// link codes it wants, or nil for every link of the owner. A nil Interest
// is everything.
type Interest map[string][]string

// MaxGroupFilters bounds the filter subjects of one narrowed partition
// consumer. Past it the consumer reads the whole partition again (and the
// reader skips what nobody wants): the server matches every stored subject
// against the filters, which stays cheap for a few hundred.
const MaxGroupFilters = 256

// InterestMetadata is the consumer metadata key where NarrowGroup records
// the version of the interest a consumer was narrowed to.
const InterestMetadata = "snip.interest"

// NoClicksFilter is partition p's filter when nothing in it is wanted: a
// subject no click is stored under ("~" is not a valid owner or code).
func NoClicksFilter(p int) string {
	return strconv.Itoa(p) + ".clicks.~.~"
}

// GroupFilters returns the filter subjects of partition p's consumer (of
// partitions) in a group that reads only in's clicks: one
// <p>.clicks.<owner>.> per owner that wants every link, one
// <p>.clicks.<owner>.<code> per wanted code stored in partition p, and
// NoClicksFilter(p) when that leaves nothing. Filters never overlap (the
// server refuses overlapping ones) and come sorted.
func GroupFilters(p, partitions int, in Interest) []string {
	if in == nil {
		return []string{events.PartitionFilter(p)}
	}
	prefix := strconv.Itoa(p) + "."
	seen := map[string]bool{}
	for owner, codes := range in {
		if codes == nil {
			seen[prefix+events.ClickSubject(owner, ">")] = true
			continue
		}
		for _, c := range codes {
			if events.Partition(c, partitions) == p {
				seen[prefix+events.ClickSubject(owner, c)] = true
			}
		}
	}
	if len(seen) == 0 {
		return []string{NoClicksFilter(p)}
	}
	if len(seen) > MaxGroupFilters {
		return []string{events.PartitionFilter(p)}
	}
	return slices.Sorted(maps.Keys(seen))
}

// NarrowGroup sets the filters of a group's partition consumers to what in
// wants (GroupFilters), so the server does not send the group clicks it
// would skip. version orders the calls: it is recorded in each consumer's
// metadata (InterestMetadata), and a consumer that records version or a
// later one is left alone, so an older view never overwrites a newer one
// that was applied first. Callers that can race must still serialise their
// calls (read the interest and its version, then narrow, under one lock):
// JetStream has no compare-and-set for consumer configurations.
//
// A narrowed consumer keeps its place. It is not sent what its filters
// leave out, and it does not move past those clicks either: widened again,
// it is sent the clicks it had not passed, older ones included, so a
// reader that wants only what is stored after a widening skips the rest
// itself (by sequence). Every click stored after NarrowGroup returns that
// the new filters match is sent. A consumer that does not exist yet is
// skipped: the reader runtime creates it reading the whole partition, and
// the next call narrows it. It returns how many consumers' filters changed.
func NarrowGroup(ctx context.Context, js jetstream.JetStream, group string, partitions int, in Interest, version int64) (int, error) {
	s, err := js.Stream(ctx, events.ClicksStream)
	if err != nil {
		return 0, fmt.Errorf("narrow %s: %w", group, err)
	}
	changed := 0
	v := strconv.FormatInt(version, 10)
	for p := range partitions {
		name := GroupConsumerName(group, p)
		c, err := s.Consumer(ctx, name)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			continue
		}
		if err != nil {
			return changed, fmt.Errorf("narrow %s: %w", name, err)
		}
		cfg := c.CachedInfo().Config
		if have, err := strconv.ParseInt(cfg.Metadata[InterestMetadata], 10, 64); err == nil && have >= version {
			continue
		}
		want := GroupFilters(p, partitions, in)
		have := cfg.FilterSubjects
		if cfg.FilterSubject != "" {
			have = []string{cfg.FilterSubject}
		}
		cfg.Metadata = maps.Clone(cfg.Metadata)
		if cfg.Metadata == nil {
			cfg.Metadata = map[string]string{}
		}
		cfg.Metadata[InterestMetadata] = v
		if len(want) == 1 {
			cfg.FilterSubject, cfg.FilterSubjects = want[0], nil
		} else {
			cfg.FilterSubject, cfg.FilterSubjects = "", want
		}
		if _, err := s.UpdateConsumer(ctx, cfg); err != nil {
			return changed, fmt.Errorf("narrow %s: %w", name, err)
		}
		if !slices.Equal(have, want) {
			changed++
		}
	}
	return changed, nil
}
