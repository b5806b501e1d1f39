package reader_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
)

// The server starts a consumer created at a time at the first event stored
// at or after it, its ack floor just before, so the first event after the
// floor is what the consumer owes, even before its first delivery. Only a
// consumer created on an empty stream starts at sequence 1 whatever its
// time, and is handed the events stored before a start time still to come.
// OldestUnprocessed reports that event's age: before, it reported the
// start time instead for a consumer that had delivered nothing, a time
// yet to come here, a negative age.
func TestOldestUnprocessedOfAConsumerStartedAtATimeIsItsFirstEventOwed(t *testing.T) {
	t.Parallel()
	_, js := setup(t, 1)
	ctx := t.Context()
	s, err := js.Stream(ctx, events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now().Add(time.Hour)
	c, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "later", AckPolicy: jetstream.AckAllPolicy,
		DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &start, FilterSubject: events.PartitionFilter(0)})
	if err != nil {
		t.Fatal(err)
	}
	publish(t, js, 1, 1, 0)
	last, err := s.GetLastMsgForSubject(ctx, events.PartitionFilter(0))
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.NumPending != 1 || info.AckFloor.Stream != 0 {
		t.Fatalf("the consumer created on an empty stream: %d pending, ack floor %d; want the event owed, 1 and 0",
			info.NumPending, info.AckFloor.Stream)
	}
	got, err := reader.OldestUnprocessed(ctx, s, info)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Equal(last.Time) {
		t.Errorf("oldest unprocessed %s (age %s), want the event's stored time %s", got, time.Since(got), last.Time)
	}
}
