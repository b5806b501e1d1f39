package topology

import (
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
