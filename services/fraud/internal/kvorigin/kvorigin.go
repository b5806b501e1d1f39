// Package kvorigin records in NATS where each partition's fraud statistics
// begin: the first CLICKS sequence whose judgement was applied to Redis. It
// is the NATS side of fraud.Origins.
//
// The record is one key per partition, "<group>.origin.<partition>", in the
// consumer groups' bucket (topology.MembersBucket), next to the group's
// replay requests: a key the group's NATS user may already write, that no
// Redis failure can take with it. It is written about once per partition in
// the group's life (the first batch applied), so it costs nothing per click,
// and only ever lowered, but past statistics lost for good (Raise).
// Replaying reads those replay requests (reader.LatestRewind), once per
// takeover that finds Redis's mark ahead of where it resumes.
package kvorigin

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/fraud/internal/fraud"
)

var _ fraud.Origins = (*Origins)(nil)

// Origins reads and writes the records of one consumer group.
type Origins struct {
	js     jetstream.JetStream
	group  string
	bucket *topology.Bucket // looked up once, again after a failure
}

// New returns the records of group's partitions.
func New(js jetstream.JetStream, group string) *Origins {
	return &Origins{js: js, group: group, bucket: topology.NewBucket(js, topology.MembersBucket)}
}

// recordKey is the key of partition's record in topology.MembersBucket.
func recordKey(group string, partition int) string {
	return group + ".origin." + strconv.Itoa(partition)
}

// get returns the partition's record and its revision (0, 0: none).
func (o *Origins) get(ctx context.Context, kv jetstream.KeyValue, partition int) (uint64, uint64, error) {
	key := recordKey(o.group, partition)
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, 0, nil
	}
	if err != nil {
		o.bucket.Forget()
		return 0, 0, fmt.Errorf("get %s: %w", key, err)
	}
	seq, err := strconv.ParseUint(string(e.Value()), 10, 64)
	if err != nil || seq == 0 {
		return 0, 0, fmt.Errorf("get %s: malformed value %q", key, e.Value())
	}
	return seq, e.Revision(), nil
}

// Origin returns the first sequence of partition whose statistics were
// applied, as recorded (0: none recorded).
func (o *Origins) Origin(ctx context.Context, partition int) (uint64, error) {
	kv, err := o.bucket.Get(ctx)
	if err != nil {
		return 0, fmt.Errorf("origin of partition %d: %w", partition, err)
	}
	seq, _, err := o.get(ctx, kv, partition)
	if err != nil {
		return 0, fmt.Errorf("origin of partition %d: %w", partition, err)
	}
	return seq, nil
}

// Lower records seq as partition's origin unless one at or before it is
// recorded. Writers racing each other leave the lowest: each write is
// conditional on the revision it read.
func (o *Origins) Lower(ctx context.Context, partition int, seq uint64) error {
	return o.write(ctx, partition, seq, func(cur uint64) bool { return cur != 0 && cur <= seq })
}

// Raise records seq as partition's origin where from is still the one
// recorded, leaving any other record alone: the statistics of the events
// from from up to seq were lost for good (retention took them before the
// store lost them), so the partition's statistics begin at seq, and a later
// loss does not report them lost again. Each write is conditional on the
// revision it read, as Lower's.
func (o *Origins) Raise(ctx context.Context, partition int, from, seq uint64) error {
	return o.write(ctx, partition, seq, func(cur uint64) bool { return cur != from || cur >= seq })
}

// write records seq as partition's origin unless keep says the record there
// (0: none) stays. Each write is conditional on the revision it read: a
// writer that another was first for reads again.
func (o *Origins) write(ctx context.Context, partition int, seq uint64, keep func(cur uint64) bool) error {
	if seq == 0 {
		return fmt.Errorf("origin of partition %d: sequence 0", partition)
	}
	kv, err := o.bucket.Get(ctx)
	if err != nil {
		return fmt.Errorf("origin of partition %d: %w", partition, err)
	}
	key, val := recordKey(o.group, partition), []byte(strconv.FormatUint(seq, 10))
	for {
		cur, rev, err := o.get(ctx, kv, partition)
		if err != nil {
			return fmt.Errorf("origin of partition %d: %w", partition, err)
		}
		if keep(cur) {
			return nil
		}
		if cur == 0 {
			_, err = kv.Create(ctx, key, val)
		} else {
			_, err = kv.Update(ctx, key, val, rev)
		}
		if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue // another writer was first: read again
		}
		if err != nil {
			o.bucket.Forget()
			return fmt.Errorf("origin of partition %d: put %s: %w", partition, key, err)
		}
		return nil
	}
}

// Replaying reports whether partition carried out the group's latest replay
// (reader.Rewind, recorded in the same bucket) with the consumer it has now
// and next is within it: at or after the replay's first event of the
// partition and at or before the last one it hands again. A replay made for
// the consumer before (the group's consumers deleted and created again:
// reader.PartitionRewind.Void) is not this group's, even where the consumer
// before carried it out: the new group never moved back for it.
func (o *Origins) Replaying(ctx context.Context, partition int, next uint64) (bool, error) {
	st, err := reader.LatestRewind(ctx, o.js, o.group)
	if err != nil {
		return false, fmt.Errorf("replay of partition %d: %w", partition, err)
	}
	if partition < 0 || partition >= len(st.Partitions) {
		return false, nil
	}
	pr := st.Partitions[partition]
	return pr.Done && !pr.Void && pr.From <= next && next <= pr.Until, nil
}

// Consumer returns when the group's consumer of partition on CLICKS was
// created (zero: there is none): one deleted and created again since has
// another time.
func (o *Origins) Consumer(ctx context.Context, partition int) (time.Time, error) {
	c, err := o.js.Consumer(ctx, events.ClicksStream, topology.GroupConsumerName(o.group, partition))
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("consumer of partition %d: %w", partition, err)
	}
	return c.CachedInfo().Created, nil
}
