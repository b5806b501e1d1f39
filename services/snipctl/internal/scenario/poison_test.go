package scenario

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
)

// noGroupEnv starts a scenario Env on a real NATS server with the given
// CLICKS partitions and no group yet, so that every read of a group's lag
// fails (reader.ErrNoGroup) until a member creates its consumers. It
// returns the Env and a count of the reads of CLICKS the server was asked
// for.
func noGroupEnv(t *testing.T, partitions int) (*Env, jetstream.JetStream, *atomic.Int64) {
	t.Helper()
	e := &Env{speed: 1, res: &Result{}}
	t.Cleanup(e.close)
	js, err := e.NATS(t.Context(), partitions)
	if err != nil {
		t.Fatal(err)
	}
	sniffer, err := e.Conn("sniffer")
	if err != nil {
		t.Fatal(err)
	}
	var reads atomic.Int64
	if _, err := sniffer.Subscribe("$JS.API.STREAM.INFO."+events.ClicksStream, func(*nats.Msg) { reads.Add(1) }); err != nil {
		t.Fatal(err)
	}
	if err := sniffer.Flush(); err != nil {
		t.Fatal(err)
	}
	return e, js, &reads
}

// A lag read that fails does not end the wait for the healthy partitions
// as a lag of zero would: the lag is read again until the group's is read,
// and is zero.
func TestWaitHealthyPartitionsRetriesAFailedRead(t *testing.T) {
	t.Parallel()
	e, js, reads := noGroupEnv(t, poisonPartitions)
	ctx := t.Context()
	done := make(chan error, 1)
	go func() { done <- waitHealthyPartitions(ctx, js, "g", 0, 60*time.Second) }()
	// reader.Lag reads CLICKS twice (its partitions, then the stream): a
	// fourth read means the first lag read failed and the wait went on.
	awaitReads(t, "waitHealthyPartitions", "CLICKS with no group on it", reads, 4, done)
	startIdleMember(t, e)
	if err := awaitDone(t, "waitHealthyPartitions", done); err != nil {
		t.Fatalf("waitHealthyPartitions: %v", err)
	}
}

// A lag read that keeps failing ends the wait at its deadline with the
// read's error, and poisonLag reports it rather than a lag of zero.
func TestPoisonLagNamesAFailedRead(t *testing.T) {
	t.Parallel()
	_, js, _ := noGroupEnv(t, poisonPartitions)
	ctx := t.Context()
	if s, o, err := poisonLag(ctx, js, "g", 0); !errors.Is(err, reader.ErrNoGroup) {
		t.Fatalf("poisonLag of a group with no consumers = %v, %v, %v; want %v", s, o, err, reader.ErrNoGroup)
	}
	const timeout = 300 * time.Millisecond
	start := time.Now()
	err := waitHealthyPartitions(ctx, js, "g", 0, timeout)
	if took := time.Since(start); !errors.Is(err, reader.ErrNoGroup) || took < timeout {
		t.Fatalf("waitHealthyPartitions after %v: %v; want %v at the %v deadline", took, err, reader.ErrNoGroup, timeout)
	}
}
