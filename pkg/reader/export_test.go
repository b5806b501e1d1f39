package reader

import (
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// SetDropForTest makes members of group lose the deliveries drop returns
// true for, as if the client had given up on a fetch while they were on
// their way (nil: lose none).
func SetDropForTest(group string, drop func(streamSeq uint64) bool) {
	if drop == nil {
		dropForTest.Delete(group)
		return
	}
	dropForTest.Store(group, drop)
}

// DeliverFrom is where partition 0's consumer of cfg would begin if it were
// created at now: its deliver policy and start time (nil for none).
func DeliverFrom(cfg Config, now time.Time) (jetstream.DeliverPolicy, *time.Time) {
	cc := cfg.consumerConfig(0)
	if cc.OptStartTime != nil && cfg.Start.policy == startWithin {
		t := cfg.Start.from(now)
		return cc.DeliverPolicy, &t
	}
	return cc.DeliverPolicy, cc.OptStartTime
}
