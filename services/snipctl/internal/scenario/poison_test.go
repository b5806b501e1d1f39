package scenario

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/deadletter"
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

// noDeadLetterEnv starts a scenario Env on a real NATS server without the
// DEAD_LETTER stream, so that every read of the dead letters fails until
// create makes it again with one letter in it; reads counts the reads of
// DEAD_LETTER the server was asked for.
func noDeadLetterEnv(t *testing.T) (js jetstream.JetStream, create func(), reads *atomic.Int64) {
	t.Helper()
	e := &Env{speed: 1, res: &Result{}}
	t.Cleanup(e.close)
	ctx := t.Context()
	js, err := e.NATS(ctx, poisonPartitions)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, events.DeadLetterStream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	if err := js.DeleteStream(ctx, events.DeadLetterStream); err != nil {
		t.Fatal(err)
	}
	sniffer, err := e.Conn("sniffer")
	if err != nil {
		t.Fatal(err)
	}
	reads = &atomic.Int64{}
	if _, err := sniffer.Subscribe("$JS.API.STREAM.INFO."+events.DeadLetterStream, func(*nats.Msg) { reads.Add(1) }); err != nil {
		t.Fatal(err)
	}
	if err := sniffer.Flush(); err != nil {
		t.Fatal(err)
	}
	create = func() {
		if _, err := js.CreateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
		if _, err := js.Publish(ctx, events.DeadLetterSubject("snip", "bad_target"), []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	return js, create, reads
}

// A read of DEAD_LETTER for the alarm that fails is made again within the
// sample, not dropped: the alarm is found in the sample in which it could
// first be read, and the failed reads are counted.
func TestAlarmWatchRetriesAFailedRead(t *testing.T) {
	t.Parallel()
	js, create, reads := noDeadLetterEnv(t)
	a := &alarmWatch{js: js}
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.sample(t.Context(), time.Now().Add(60*time.Second))
	}()
	awaitReads(t, "the alarm's sample", "DEAD_LETTER while it is not there", reads, 3, done)
	create()
	awaitDone(t, "the alarm's sample", done)
	if a.firedAt.IsZero() || a.failed < 2 || !a.failedSinceQuiet || a.lastErr == nil {
		t.Fatalf("after reads that failed, then one that found a letter: fired at %v, %d failed (%v), failed since quiet %v; want fired, at least 2 failed",
			a.firedAt, a.failed, a.lastErr, a.failedSinceQuiet)
	}
}

// Reads that keep failing end the sample at its time, counted, with the
// alarm not fired.
func TestAlarmWatchCountsReadsThatKeepFailing(t *testing.T) {
	t.Parallel()
	js, _, _ := noDeadLetterEnv(t)
	a := &alarmWatch{js: js}
	const until = 300 * time.Millisecond
	start := time.Now()
	a.sample(t.Context(), start.Add(until))
	if took := time.Since(start); took < until || !a.firedAt.IsZero() || a.failed < 2 || !errors.Is(a.lastErr, jetstream.ErrStreamNotFound) {
		t.Fatalf("sample after %v: fired at %v, %d failed (%v); want not fired, reads failing with %v until %v", took, a.firedAt, a.failed, a.lastErr, jetstream.ErrStreamNotFound, until)
	}
}

// The dead letters are read again when a read fails, and a read that keeps
// failing ends with its error at the deadline.
func TestListLettersRetriesAFailedRead(t *testing.T) {
	t.Parallel()
	js, create, reads := noDeadLetterEnv(t)
	ctx := t.Context()
	const timeout = 300 * time.Millisecond
	start := time.Now()
	if _, err := listLetters(ctx, js, timeout); !errors.Is(err, jetstream.ErrStreamNotFound) || time.Since(start) < timeout {
		t.Fatalf("listLetters after %v: %v; want %v at the %v deadline", time.Since(start), err, jetstream.ErrStreamNotFound, timeout)
	}
	var groups []deadletter.Group
	ended := make(chan error, 1)
	before := reads.Load()
	go func() {
		var err error
		groups, err = listLetters(ctx, js, 60*time.Second)
		ended <- err
	}()
	awaitReads(t, "listLetters", "DEAD_LETTER while it is not there", reads, before+3, ended)
	create()
	if err := awaitDone(t, "listLetters", ended); err != nil || len(groups) != 1 {
		t.Fatalf("listLetters once DEAD_LETTER has one letter = %v, %v; want one group", groups, err)
	}
}
