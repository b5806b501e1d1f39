package scenario

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
)

// crashEnv starts a scenario Env on a real NATS server and returns a
// handle on CLICKS' consumer crash-test, which it then deletes, so that
// every read of the consumer's state fails until it is created again
// (create); reads counts the reads the server was asked for.
func crashEnv(t *testing.T) (cons jetstream.Consumer, create func(), reads *atomic.Int64) {
	t.Helper()
	e := &Env{speed: 1, res: &Result{}}
	t.Cleanup(e.close)
	ctx := t.Context()
	js, err := e.NATS(ctx, 4)
	if err != nil {
		t.Fatal(err)
	}
	cfg := jetstream.ConsumerConfig{Durable: "crash-test", AckPolicy: jetstream.AckExplicitPolicy}
	if cons, err = js.CreateConsumer(ctx, events.ClicksStream, cfg); err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteConsumer(ctx, events.ClicksStream, cfg.Durable); err != nil {
		t.Fatal(err)
	}
	sniffer, err := e.Conn("sniffer")
	if err != nil {
		t.Fatal(err)
	}
	reads = &atomic.Int64{}
	if _, err := sniffer.Subscribe("$JS.API.CONSUMER.INFO."+events.ClicksStream+"."+cfg.Durable, func(*nats.Msg) { reads.Add(1) }); err != nil {
		t.Fatal(err)
	}
	if err := sniffer.Flush(); err != nil {
		t.Fatal(err)
	}
	create = func() {
		if _, err := js.CreateConsumer(ctx, events.ClicksStream, cfg); err != nil {
			t.Fatal(err)
		}
	}
	return cons, create, reads
}

// A read of a crash worker's consumer that fails (on a loaded machine a
// request can time out) does not end the lesson: it is read again until
// it is read.
func TestCrashAllAckedRetriesAFailedRead(t *testing.T) {
	t.Parallel()
	cons, create, reads := crashEnv(t)
	var done bool
	ended := make(chan error, 1)
	go func() {
		var err error
		done, err = crashAllAcked(t.Context(), cons, 60*time.Second)
		ended <- err
	}()
	awaitReads(t, "crashAllAcked", "a consumer that is not there", reads, 3, ended)
	create()
	if err := awaitDone(t, "crashAllAcked", ended); err != nil || !done {
		t.Fatalf("crashAllAcked of an empty consumer = %v, %v; want true, nil", done, err)
	}
}

// A read that keeps failing ends the wait at its deadline, not before,
// with the read's error.
func TestCrashAllAckedNamesAFailedReadAtItsDeadline(t *testing.T) {
	t.Parallel()
	cons, _, _ := crashEnv(t)
	const timeout = 300 * time.Millisecond
	start := time.Now()
	_, err := crashAllAcked(t.Context(), cons, timeout)
	if took := time.Since(start); !errors.Is(err, jetstream.ErrConsumerNotFound) || took < timeout {
		t.Fatalf("crashAllAcked after %v: %v; want %v at the %v deadline", took, err, jetstream.ErrConsumerNotFound, timeout)
	}
}

// TestCrashPointsWithLostDeliveries runs crash-points with each design's
// first 6 events (the first crash point among them) delivered once to a
// fetch that is gone before the worker starts, as a loaded machine loses a
// delivery whose fetch ended before it arrived: the worker crashes at its
// first handling of each 6th event, whichever delivery brings it, so each
// design still crashes 10 times, loses or repeats what the lesson says,
// and a note counts the events that came late.
func TestCrashPointsWithLostDeliveries(t *testing.T) {
	// Not parallel: it sets crashLostDeliveries, which TestCrashPoints reads.
	crashLostDeliveries = crashEvery
	t.Cleanup(func() { crashLostDeliveries = 0 })
	res := runAt(t, "crash-points", 4)
	for _, mode := range crashModes {
		want := fmt.Sprintf("%s: %d events first reached the worker at a second delivery or later", mode.name, crashEvery)
		if !slices.ContainsFunc(res.Notes, func(n string) bool { return strings.HasPrefix(n, want) }) {
			t.Errorf("no note %q; the notes: %q", want, res.Notes)
		}
	}
}
