package reader_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// handing is one event as the handler was handed it.
type handing struct {
	seq, deliveries uint64
}

const firstPass = 10 // 1..10 in CLICKS, a new stream

// gapAfterALostAck runs a member of a group starting at start on one
// partition: it handles 1..10 in batches of 5, the server refuses the ack of
// the batch ending at 10 (the ack floor stays behind it), then the first
// delivery of 11 never reaches the member: a gap at the start of the next
// batch, nothing of it handled. With refuseAgain, the server goes on
// refusing the member's acks until it has refused one more after the gap
// (the owner's ack again of the last event it handled, ackHandled), as a
// NATS hiccup that lasts would. It returns once 11..15 are handled and
// acked: the first and the last event of the batch whose ack was lost, and
// the events handed again as first deliveries.
func gapAfterALostAck(t *testing.T, group string, start reader.Start, refuseAgain bool) (first, last uint64, again []uint64) {
	t.Helper()
	s := newAckRefusingServer(t, 1)
	consumer := topology.GroupConsumerName(group, 0)
	refused := "$JS.ACK." + events.ClicksStream + "." + consumer + "."

	var mu sync.Mutex
	var dropNext, dropped bool // drop the first delivery of the next event published
	var lastFirstPass uint64   // the last event of the first pass
	reader.SetDropForTest(group, func(seq uint64) bool {
		mu.Lock()
		defer mu.Unlock()
		if !dropNext || dropped || seq <= lastFirstPass {
			return false
		}
		dropped = true
		return true
	})
	t.Cleanup(func() { reader.SetDropForTest(group, nil) })

	var handed []handing
	lostFirst := uint64(0) // the first event of the batch whose ack is refused
	reg := prometheus.NewRegistry()
	// AckWait long enough that no event is marked in progress (an ack
	// refused too) while acks are refused: each refusal is an ack.
	s.member(t, reader.Config{Group: group, Member: "m", BatchSize: 5, Start: start, Metrics: reg, AckWait: 3 * time.Minute}, func(_ context.Context, _ int, b []reader.Event) error {
		mu.Lock()
		defer mu.Unlock()
		for _, ev := range b {
			handed = append(handed, handing{ev.Seq, ev.Deliveries})
		}
		if lostFirst == 0 && b[len(b)-1].Seq == firstPass {
			lostFirst, lastFirstPass = b[0].Seq, b[len(b)-1].Seq
			s.refuseAcks(t, consumer) // before the runtime acks the batch
		}
		return nil
	})
	testenv.WaitFor(t, 30*time.Second, "the group's consumer", func() bool {
		_, err := s.js.Consumer(t.Context(), events.ClicksStream, consumer)
		return err == nil
	})
	cons, err := s.js.Consumer(t.Context(), events.ClicksStream, consumer)
	if err != nil {
		t.Fatal(err)
	}
	if ids := publish(t, s.js, 1, firstPass, 0); len(ids) != firstPass {
		t.Fatalf("published %d clicks, want %d", len(ids), firstPass)
	}
	testenv.WaitFor(t, 30*time.Second, "the server to refuse the first pass's last ack", func() bool { return s.log.of(refused) > 0 })
	refusals := s.log.of(refused)
	if !refuseAgain {
		s.refuseAcks(t, "")
	}
	mu.Lock()
	first, last = lostFirst, lastFirstPass
	dropNext = true
	mu.Unlock()
	if info, err := cons.Info(t.Context()); err != nil || info.AckFloor.Stream != first-1 {
		t.Fatalf("ack floor %v (%v), want %d: the last batch's ack lost", info.AckFloor.Stream, err, first-1)
	}

	second := publish(t, s.js, 1, 5, firstPass)
	if refuseAgain {
		testenv.WaitFor(t, 60*time.Second, "the server to refuse an ack after the gap", func() bool { return s.log.of(refused) > refusals })
		s.refuseAcks(t, "")
	}
	testenv.WaitFor(t, 60*time.Second, "the second pass handled and acked", func() bool {
		info, err := cons.Info(t.Context())
		return err == nil && info.AckFloor.Stream == last+uint64(len(second))
	})
	mu.Lock()
	defer mu.Unlock()
	if !dropped {
		t.Fatal("no delivery was dropped: no gap was made")
	}
	if v := gathered(t, reg, "snip_reader_delivery_gaps_total"); v != 1 {
		t.Errorf("delivery_gaps_total = %v, want 1", v)
	}
	firsts := map[uint64]int{}
	for _, h := range handed {
		if h.deliveries > 1 {
			continue
		}
		if firsts[h.seq]++; firsts[h.seq] > 1 {
			again = append(again, h.seq)
		}
	}
	for seq := uint64(1); seq <= last+uint64(len(second)); seq++ {
		if firsts[seq] == 0 {
			t.Errorf("event %d was never handed", seq)
		}
	}
	return first, last, again
}

// A delivery gap right after a batch whose ack was lost on its way
// (gapAfterALostAck): the partition goes on after 10, the last event
// handled, and 11..15 are handed once each. Before, it went back to its ack
// floor: 6..10 came again as first deliveries (a reset forgets
// deliveries), behind what the member had handled (fraud detection counts
// those in snip_fraud_events_behind_total, never to be judged).
func TestAGapAfterALostAckGoesOnAfterWhatWasHandled(t *testing.T) {
	t.Parallel()
	_, last, again := gapAfterALostAck(t, "gapfloor", reader.StartAtOldest(), false)
	if len(again) > 0 {
		t.Errorf("after the gap the member was handed %v again as first deliveries, want none: the partition goes on after %d, the last event handled", again, last)
	}
}

// The same for a group started at new events (the webhooks group), whose
// consumer the server moves back only to its ack floor (a reset to a
// sequence is refused): the owner acks 10 again, which moves the floor up
// to it, and the partition goes on from the floor, after 10; 11..15 are
// handed once each. Before, it went back to the floor behind the lost ack:
// 6..10 came again as first deliveries (webhooks sent again).
func TestAGapAfterALostAckOfAGroupStartedAtNewGoesOnAfterWhatWasHandled(t *testing.T) {
	t.Parallel()
	_, last, again := gapAfterALostAck(t, "gapfloornew", reader.StartAtNew(), false)
	if len(again) > 0 {
		t.Errorf("after the gap the member was handed %v again as first deliveries, want none: the partition goes on after %d, the last event handled", again, last)
	}
}

// A group started at new events whose owner cannot ack the last event it
// handled again either (acks still refused after the gap): the partition
// goes on from its ack floor, the events handled past it come again (at
// least once), rather than waiting for an ack that does not come, or
// retrying a move the server refuses, and handling nothing more.
func TestAGapAfterALostAckOfAGroupStartedAtNewThatCannotAckAgainGoesOnFromTheFloor(t *testing.T) {
	t.Parallel()
	first, last, again := gapAfterALostAck(t, "gapfloornewrefused", reader.StartAtNew(), true)
	if len(again) != int(last-first+1) || again[0] != first || again[len(again)-1] != last {
		t.Errorf("after the gap the member was handed %v again as first deliveries, want the batch whose ack was lost, %d..%d", again, first, last)
	}
}

// gapOfAConsumerCreatedAgain deletes a partition's consumer and creates it
// again under its owner, between two pulls (the owner's handler busy with
// 1..5, 6..10 fetched; fewer where a fetch took less than a batch within
// Linger): the new consumer counts its deliveries from 1 again, which the
// owner takes for a gap. With refuseReset, the server refuses the owner's
// first request to reset the consumer after the gap (a reset that times
// out), and allows the next. It returns once the new consumer has acked
// 11..15 too, with the events the group created again never handed: of
// those the consumer before delivered (handed once for it), those handed
// only once.
func gapOfAConsumerCreatedAgain(t *testing.T, group string, refuseReset bool) (missed []uint64) {
	t.Helper()
	s := newAckRefusingServer(t, 1)
	ids := publish(t, s.js, 1, firstPass, 0)
	consumer := topology.GroupConsumerName(group, 0)
	reset := "$JS.API.CONSUMER.RESET." + events.ClicksStream + "." + consumer
	h := newFirstBatchHeld()
	s.member(t, reader.Config{Group: group, Member: "m", BatchSize: 5}, h.handle)
	old := h.fetchedAhead(t, s.js, consumer)
	if err := s.js.DeleteConsumer(t.Context(), events.ClicksStream, consumer); err != nil {
		t.Fatal(err)
	}
	createAgain(t, s.js, old.Config)
	if refuseReset {
		s.refuse(t, reset)
	}
	close(h.release)
	more := publish(t, s.js, 1, 5, firstPass)
	if refuseReset {
		testenv.WaitFor(t, 60*time.Second, "the server to refuse the reset after the gap", func() bool { return s.log.of(reset) > 0 })
		s.refuse(t)
	}
	last := uint64(len(ids) + len(more))
	testenv.WaitFor(t, 60*time.Second, "the new consumer acked to the last event", func() bool {
		c, err := s.js.Consumer(t.Context(), events.ClicksStream, consumer)
		return err == nil && c.CachedInfo().AckFloor.Stream == last
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	// The events the consumer before delivered, the batch held and the one
	// fetched ahead, are handed for it once each; the group created again
	// hands them again, and every event after them once.
	for seq := uint64(1); seq <= old.Delivered.Stream; seq++ {
		if h.handed[seq] < 2 {
			missed = append(missed, seq)
		}
	}
	for seq := old.Delivered.Stream + 1; seq <= last; seq++ {
		if h.handed[seq] == 0 {
			t.Errorf("event %d was never handed", seq)
		}
	}
	return missed
}

// A partition's consumer deleted and created again under its owner
// (gapOfAConsumerCreatedAgain): what the owner handled was of the consumer
// before, not of this one: the partition goes on from the new consumer's
// ack floor, and the group created again handles every event from its
// start. Going on after the last event the owner handled, it would skip
// them.
func TestAGapOfAConsumerCreatedAgainGoesOnFromItsAckFloor(t *testing.T) {
	t.Parallel()
	if missed := gapOfAConsumerCreatedAgain(t, "again", false); len(missed) > 0 {
		t.Errorf("the consumer created again never handed %v, want every event from its start", missed)
	}
}

// The same where the first reset after the gap fails (refused, as one that
// times out): the owner tries again, and goes by the new consumer's ack
// floor again. Before, the first try's read of the consumer had left the
// new one's creation time in the owner's cached info, which the retry took
// for the consumer the last event handled was of: it went on after that
// event (10), and the group created again never handled 1..10.
func TestAGapOfAConsumerCreatedAgainWhoseResetFailedGoesOnFromItsAckFloor(t *testing.T) {
	t.Parallel()
	if missed := gapOfAConsumerCreatedAgain(t, "againreset", true); len(missed) > 0 {
		t.Errorf("the consumer created again, its first reset refused, never handed %v, want every event from its start", missed)
	}
}
