package reader_test

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
)

// logBuffer is a log destination several goroutines write to.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Two processes given the same member name write one lease key. The one
// that joined later sees the first's lease written by another instance,
// logs it as an error and stops with ErrDuplicateMember, before it forces
// the first off a partition, and without deleting the lease they share;
// the first logs the duplicate, counts it, and goes on owning every
// partition without a break (it never loses one) and handling what comes.
func TestASecondMemberOfTheSameNameStopsAndTheFirstGoesOn(t *testing.T) {
	t.Parallel()
	n, js := setup(t, 4)
	ids := publish(t, js, 8, 20, 0)

	recA := newRecorder()
	regA := prometheus.NewRegistry()
	logA := &logBuffer{}
	var revokedA atomic.Int32
	cfgA := recA.track(reader.Config{Group: "g", Member: "same", BatchSize: 50, Metrics: regA,
		Logger: slog.New(slog.NewJSONHandler(logA, nil))})
	trackRevoke := cfgA.OnRevoke
	cfgA.OnRevoke = func(p int) { revokedA.Add(1); trackRevoke(p) }
	startMember(t, n, cfgA, recA.handler("a"))
	testenv.WaitFor(t, 30*time.Second, "the first member owning every partition and handling every click", func() bool {
		return recA.settled(4, 4) && recA.handledAll(ids)
	})

	recB := newRecorder()
	logB := &logBuffer{}
	b := startMember(t, n, recB.track(reader.Config{Group: "g", Member: "same", BatchSize: 50, Metrics: prometheus.NewRegistry(),
		Logger: slog.New(slog.NewJSONHandler(logB, nil))}), recB.handler("b"))
	select {
	case err := <-b.done:
		b.done <- err // for the cleanup
		if !errors.Is(err, reader.ErrDuplicateMember) {
			t.Fatalf("the second member of the same name: Run = %v, want ErrDuplicateMember", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the second member of the same name still runs after 30s; its log:\n%s", logB)
	}
	if !strings.Contains(logB.String(), "another process runs as this member") || !strings.Contains(logB.String(), `"this_one":"stops`) {
		t.Errorf("the second member did not log the duplicate as stopping; its log:\n%s", logB)
	}
	if strings.Contains(logB.String(), "unpinning it") {
		t.Errorf("the second member forced the first off a partition; its log:\n%s", logB)
	}
	if !strings.Contains(logA.String(), "another process runs as this member") || !strings.Contains(logA.String(), `"this_one":"goes on`) {
		t.Errorf("the first member did not log the duplicate; its log:\n%s", logA)
	}
	dups, err := testutil.GatherAndCount(regA, "snip_reader_duplicate_member_leases_total")
	if err != nil || dups != 1 {
		t.Errorf("the first member's duplicate_member_leases_total series: %d, %v; want one", dups, err)
	}

	more := publish(t, js, 8, 10, 20)
	testenv.WaitFor(t, 30*time.Second, "the first member handling the clicks published after", func() bool {
		return recA.handledAll(more)
	})
	recB.mu.Lock()
	handledB := recB.byMember["b"]
	recB.mu.Unlock()
	if handledB != 0 || revokedA.Load() != 0 || !recA.settled(4, 4) {
		t.Fatalf("the second member handled %d clicks, the first lost a partition %d times, owners now %v; want 0, 0 and every partition the first's",
			handledB, revokedA.Load(), recA.ownersNow(4))
	}
}
