package reader_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/topology"
)

// CheckRecount refuses a click-counter replay only from after the oldest
// event CLICKS retains (by sequence or by time), naming that event; any
// other group, and an empty CLICKS, replay from anywhere. A click counter
// with no consumers is ErrNoGroup, whatever the position.
func TestCheckRecountRefusesAClickCounterReplayFromAfterTheOldestEvent(t *testing.T) {
	t.Parallel()
	_, js := setup(t, 2)
	ctx := t.Context()
	if err := reader.CheckRecount(ctx, js, topology.GroupClickCounter, reader.FromSeq(3), "from sequence 3"); !errors.Is(err, reader.ErrNoGroup) {
		t.Errorf("a click counter with no consumers: %v, want ErrNoGroup", err)
	}
	for p := range 2 {
		cfg := topology.GroupConsumerConfig(topology.GroupClickCounter, p, topology.GroupConsumer{
			AckWait: time.Minute, PinnedTTL: 5 * time.Second, MaxAckPending: 100, DeliverPolicy: jetstream.DeliverAllPolicy,
		})
		if _, err := js.CreateOrUpdateConsumer(ctx, events.ClicksStream, cfg); err != nil {
			t.Fatal(err)
		}
	}
	if err := reader.CheckRecount(ctx, js, topology.GroupClickCounter, reader.FromSeq(3), "from sequence 3"); err != nil {
		t.Errorf("an empty CLICKS: %v, want nil", err)
	}
	publish(t, js, 2, 3, 0)
	s, err := js.Stream(ctx, events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	first, err := s.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	third, err := s.GetMsg(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		group   string
		pos     reader.Position
		refused bool
	}{
		{"from_the_first_sequence", topology.GroupClickCounter, reader.FromSeq(1), false},
		{"from_a_later_sequence", topology.GroupClickCounter, reader.FromSeq(3), true},
		{"from_the_first_event_s_time", topology.GroupClickCounter, reader.FromTime(first.Time), false},
		{"from_before_retention", topology.GroupClickCounter, reader.FromTime(first.Time.Add(-time.Hour)), false},
		{"from_a_later_time", topology.GroupClickCounter, reader.FromTime(third.Time), true},
		{"another_group_from_a_later_sequence", topology.GroupFraudDetection, reader.FromSeq(3), false},
	}
	for _, tc := range tests {
		err := reader.CheckRecount(ctx, js, tc.group, tc.pos, "the start")
		var nr *reader.NotARecountError
		switch {
		case !tc.refused && err != nil:
			t.Errorf("%s: %v, want nil", tc.name, err)
		case tc.refused && (!errors.Is(err, reader.ErrNotARecount) || !errors.As(err, &nr) || nr.FirstSeq != 1 ||
			!strings.HasPrefix(err.Error(), "the start starts after the oldest event CLICKS retains (sequence 1,")):
			t.Errorf("%s: %v, want a NotARecountError naming sequence 1", tc.name, err)
		}
	}
}
