package inprogress_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/inprogress"
	"github.com/snipdev/snip/pkg/testenv"
)

// marks records the in-progress marks ("+WPI") sent for a stream's
// messages, per message, as a second connection sees them on the ack
// subjects.
type marks struct {
	mu    sync.Mutex
	times map[string][]time.Time // by ack subject (one per message)
}

func (m *marks) count() (total int, per map[string]int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	per = map[string]int{}
	for subj, ts := range m.times {
		per[subj] = len(ts)
		total += len(ts)
	}
	return total, per
}

// Keep marks each message at the interval, so none is redelivered past
// AckWait while kept; stop returns promptly, and no mark follows it: the
// messages are then redelivered one AckWait later.
func TestKeepMarksAtTheIntervalUntilStopped(t *testing.T) {
	t.Parallel()
	const every, ackWait = 100 * time.Millisecond, time.Second
	ns := testenv.StartNATS(t)
	js := ns.JetStream(t)
	ctx := t.Context()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "KEEP", Subjects: []string{"keep.>"}}); err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateConsumer(ctx, "KEEP", jetstream.ConsumerConfig{Durable: "keeper", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait})
	if err != nil {
		t.Fatal(err)
	}

	seen := &marks{times: map[string][]time.Time{}}
	sniffer := ns.Connect(t)
	if _, err := sniffer.Subscribe("$JS.ACK.KEEP.keeper.>", func(m *nats.Msg) {
		if string(m.Data) == "+WPI" {
			seen.mu.Lock()
			seen.times[m.Subject] = append(seen.times[m.Subject], time.Now())
			seen.mu.Unlock()
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := sniffer.Flush(); err != nil {
		t.Fatal(err)
	}

	for _, subj := range []string{"keep.a", "keep.b"} {
		if _, err := js.Publish(ctx, subj, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	deliveries := make(chan jetstream.Msg, 16)
	cc, err := cons.Consume(func(m jetstream.Msg) { deliveries <- m })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cc.Stop)
	var kept []jetstream.Msg
	for range 2 {
		select {
		case m := <-deliveries:
			kept = append(kept, m)
		case <-time.After(10 * time.Second):
			t.Fatal("the two messages were not delivered")
		}
	}

	start := time.Now()
	stop := inprogress.Keep(every, kept...)
	// 15 marks of each: 1.5 s, past AckWait.
	testenv.WaitFor(t, 20*time.Second, "15 marks of each message", func() bool {
		_, per := seen.count()
		return len(per) == 2 && per[kept[0].Reply()] >= 15 && per[kept[1].Reply()] >= 15
	})
	select {
	case m := <-deliveries:
		md, _ := m.Metadata()
		t.Fatalf("a kept message was redelivered (%s, delivery %d) %s after Keep", m.Subject(), md.NumDelivered, time.Since(start))
	default:
	}
	_, per := seen.count()
	elapsed := time.Since(start)
	if most := int(elapsed/every) + 1; per[kept[0].Reply()] > most || per[kept[1].Reply()] > most {
		t.Errorf("marks %v in %s: more than one per %s", per, elapsed, every)
	}

	stopStart := time.Now()
	stop()
	if d := time.Since(stopStart); d > time.Second {
		t.Errorf("stop took %s", d)
	}
	stop() // a second call does nothing
	total, _ := seen.count()

	// With no more marks, both messages come again one AckWait after the
	// last; had Keep gone on marking, they would not.
	redelivered := map[string]bool{}
	testenv.WaitFor(t, 20*time.Second, "both messages redelivered after stop", func() bool {
		select {
		case m := <-deliveries:
			if md, err := m.Metadata(); err == nil && md.NumDelivered == 2 {
				redelivered[m.Subject()] = true
				_ = m.Ack()
			}
		case <-time.After(50 * time.Millisecond):
		}
		return len(redelivered) == 2
	})
	if after, _ := seen.count(); after != total {
		t.Errorf("%d marks after stop returned", after-total)
	}
}

// stop does not wait for the next interval: a Keep with a long interval
// stops at once.
func TestKeepStopsAtOnce(t *testing.T) {
	t.Parallel()
	ns := testenv.StartNATS(t)
	js := ns.JetStream(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "KEEP", Subjects: []string{"keep.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "keep.a", []byte("x")); err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateConsumer(ctx, "KEEP", jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	stop := inprogress.Keep(time.Hour, m)
	start := time.Now()
	stop()
	if d := time.Since(start); d > time.Second {
		t.Errorf("stop of an hourly Keep took %s", d)
	}
}
