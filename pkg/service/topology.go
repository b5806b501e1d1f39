package service

import (
	"context"
	"errors"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/topology"
)

// Prepare makes what the service reads and writes in JetStream exist, as
// SNIP_APPLY_TOPOLOGY says, the same way in every service. With
// ApplyTopology it applies the topology (topology.Apply, as `snipctl
// topology apply` does); without, it leaves that to snipctl. Then it applies
// the service's own consumers, if it has any (own, such as
// topology.ApplyClickCounter): they wait for their streams. Every step is
// retried while NATS or the streams are not there (Retry). A CLICKS
// partition count that differs from the existing stream's, a retention
// that would shrink an existing stream's (topology.ErrRetentionShrinks: a
// service never discards events at its start) or fewer replicas than it has
// (topology.ErrReplicasLowered: nor drops their copies), or a consumer
// that exists with a setting the server cannot update in place
// (topology.ErrConsumerImmutable, from Apply or the service's own) is
// returned at once: no retry cures a configuration that contradicts what
// exists.
func (t Topology) Prepare(ctx context.Context, log *slog.Logger, js jetstream.JetStream, own ...func(context.Context, jetstream.JetStream) error) error {
	return Retry(ctx, log, "apply topology", func(ctx context.Context) error {
		if t.ApplyTopology {
			if err := topology.Apply(ctx, js, t.Options()); err != nil {
				return permanentTopology(err)
			}
		}
		for _, apply := range own {
			if err := apply(ctx, js); err != nil {
				return permanentTopology(err)
			}
		}
		return nil
	})
}

// permanentTopology marks err Permanent where it is a topology error no
// retry cures.
func permanentTopology(err error) error {
	for _, p := range []error{topology.ErrPartitionsChanged, topology.ErrRetentionShrinks, topology.ErrReplicasLowered, topology.ErrConsumerImmutable} {
		if errors.Is(err, p) {
			return Permanent(err)
		}
	}
	return err
}

// Partitions reads CLICKS' partition count, waiting (Retry) until the
// stream is there: readers follow the stream, not their configuration.
func Partitions(ctx context.Context, log *slog.Logger, js jetstream.JetStream) (int, error) {
	var n int
	err := Retry(ctx, log, "read CLICKS partitions", func(ctx context.Context) (err error) {
		n, err = topology.Partitions(ctx, js)
		return err
	})
	return n, err
}
