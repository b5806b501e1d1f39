package scenario

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/topology"
)

// membersEnv starts a scenario Env on a real NATS server whose members
// bucket is gone, so that every read of the leases fails (bucket not found)
// until the topology is applied again: a read failing as one that timed
// out on a loaded machine does. It returns the Env and a count of the
// reads of the bucket the server was asked for.
func membersEnv(t *testing.T) (*Env, jetstream.JetStream, *atomic.Int64) {
	t.Helper()
	e := &Env{speed: 1, res: &Result{}}
	t.Cleanup(e.close)
	js, err := e.NATS(t.Context(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteKeyValue(t.Context(), topology.MembersBucket); err != nil {
		t.Fatal(err)
	}
	sniffer, err := e.Conn("sniffer")
	if err != nil {
		t.Fatal(err)
	}
	var reads atomic.Int64
	if _, err := sniffer.Subscribe("$JS.API.STREAM.INFO.KV_"+topology.MembersBucket, func(*nats.Msg) { reads.Add(1) }); err != nil {
		t.Fatal(err)
	}
	if err := sniffer.Flush(); err != nil {
		t.Fatal(err)
	}
	return e, js, &reads
}

// A read of the members bucket that fails does not end the wait: it is
// read again until the member shows or the wait's deadline passes.
func TestWaitMembersRetriesAFailedRead(t *testing.T) {
	t.Parallel()
	e, js, reads := membersEnv(t)
	ctx := t.Context()
	done := make(chan error, 1)
	go func() { done <- waitMembers(ctx, js, "g", 1) }()
	// A second read means the first one failed and the wait went on.
	awaitReads(t, "waitMembers", "the members bucket, missing", reads, 2, done)
	o := topology.Defaults()
	o.Partitions, o.Storage = 1, jetstream.MemoryStorage
	if err := topology.Apply(ctx, js, o); err != nil {
		t.Fatal(err)
	}
	startIdleMember(t, e)
	if err := awaitDone(t, "waitMembers", done); err != nil {
		t.Fatalf("waitMembers: %v", err)
	}
}

// awaitReads waits until reads (a count of the server's answers to the
// reads a wait makes, each failing) reaches n while the wait named what
// goes on: it must not have returned on a failed read.
func awaitReads[T any](t *testing.T, what, of string, reads *atomic.Int64, n int64, done <-chan T) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for reads.Load() < n {
		select {
		case r := <-done:
			t.Fatalf("%s returned after %d read(s) of %s: %v", what, reads.Load(), of, r)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s read %s %d time(s) in 30s", what, of, reads.Load())
		}
	}
}

// awaitDone returns what the wait named what ended with, once the reads it
// makes can succeed; it fails the test if that takes a minute.
func awaitDone[T any](t *testing.T, what string, done <-chan T) T {
	t.Helper()
	select {
	case r := <-done:
		return r
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not end in 60s after its reads could succeed", what)
		panic("unreachable")
	}
}

// startIdleMember starts member g-1 of group g, whose handler does nothing,
// and stops it when the test ends.
func startIdleMember(t *testing.T, e *Env) {
	t.Helper()
	m, err := e.startMember(t.Context(), groupConfig("g", "g-1"), func(context.Context, int, []reader.Event) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.stop(); err != nil {
			t.Error(err)
		}
	})
}

// A read that keeps failing ends the wait at its deadline, not before, and
// the error says what the reads failed with.
func TestWaitForNamesTheFailedReadAtItsDeadline(t *testing.T) {
	t.Parallel()
	_, js, reads := membersEnv(t)
	ctx := t.Context()
	const timeout = 300 * time.Millisecond
	start := time.Now()
	err := waitFor(ctx, timeout, "the leases", func() (bool, error) {
		ms, err := reader.Members(ctx, js, "g")
		return len(ms) == 1, err
	})
	took := time.Since(start)
	if !errors.Is(err, jetstream.ErrBucketNotFound) || !strings.Contains(err.Error(), "reads failed") {
		t.Fatalf("err = %v, want the deadline's error naming %v", err, jetstream.ErrBucketNotFound)
	}
	if took < timeout {
		t.Fatalf("gave up after %v and %d read(s), before the %v deadline: %v", took, reads.Load(), timeout, err)
	}
}

// A member started by a scenario logs to the run's logger (Options.Log,
// "the components' logs"), as snipctl scenario run --log shows them.
func TestStartMemberLogsToTheRunsLogger(t *testing.T) {
	t.Parallel()
	var buf lockedBuffer
	e := &Env{speed: 1, res: &Result{}, log: slog.New(slog.NewTextHandler(&buf, nil))}
	t.Cleanup(e.close)
	ctx := t.Context()
	if _, err := e.NATS(ctx, 1); err != nil {
		t.Fatal(err)
	}
	startIdleMember(t, e)
	// The member logs at Info when the group assigns it its partition.
	err := waitFor(ctx, 30*time.Second, "the member's log", func() (bool, error) {
		return strings.Contains(buf.String(), "partitions assigned") && strings.Contains(buf.String(), "member=g-1"), nil
	})
	if err != nil {
		t.Fatalf("%v; the run's log holds %q", err, buf.String())
	}
}

// lockedBuffer is a bytes.Buffer a logger and a test may share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A wait that keeps moving goes on past its stall, however long the work
// takes; one that stops gives up once nothing moved for the stall, and
// says where it stopped. Before, the repartition lesson waited a fixed
// minute for every event to be read or parked, and a loaded CI machine,
// still reading, failed it at the minute.
func TestWaitProgressEndsOnDoneOrStallNotOnAClock(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	const stall = 50 * time.Millisecond

	// Each read finds one more done: the wait runs through many stalls'
	// worth of time and ends when the work is done.
	start, n := time.Now(), 0
	err := waitProgress(ctx, stall, "the work", func() (bool, int, error) {
		n++
		return n == 40, n, nil
	})
	if err != nil {
		t.Fatalf("a wait still moving after %v (stall %v) gave up: %v", time.Since(start), stall, err)
	}
	if took := time.Since(start); took < 2*stall {
		t.Fatalf("ended after %v; 40 reads 10 ms apart take 390 ms, past the %v stall", took, stall)
	}

	// A read that fails is no progress: the count stops at 3, and the wait
	// gives up a stall later, naming the count and the failed read.
	broken := errors.New("read failed")
	start, n = time.Now(), 0
	err = waitProgress(ctx, stall, "the work", func() (bool, int, error) {
		n++
		if n > 3 {
			return false, 0, broken
		}
		return false, n, nil
	})
	took := time.Since(start)
	if !errors.Is(err, broken) || !strings.Contains(err.Error(), "no progress for 50ms (at 3 ") {
		t.Fatalf("err = %v, want no progress at 3, naming %v", err, broken)
	}
	if took < stall {
		t.Fatalf("gave up after %v, before the %v stall", took, stall)
	}
}
