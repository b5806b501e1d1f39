package clicklog_test

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/fraud/internal/clicklog"
	"github.com/snipdev/snip/services/fraud/internal/fraud"
	"github.com/snipdev/snip/services/fraud/internal/traffic"
)

func TestReadsClicksBySequenceAndScansAPartition(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t)
	js := n.JetStream(t)
	ctx := t.Context()
	o := topology.Defaults()
	o.Partitions, o.Storage = 4, jetstream.MemoryStorage
	if err := topology.Apply(ctx, js, o); err != nil {
		t.Fatal(err)
	}
	clicks := traffic.Generate(traffic.Spec{Seed: 1, Start: time.Now().Add(-time.Minute), Duration: 20 * time.Second, HumanRate: 20, Links: 20, Owners: 2})
	if err := traffic.Publish(ctx, js, clicks, 256); err != nil {
		t.Fatal(err)
	}
	l := clicklog.New(js, 4)

	ev, err := l.Click(ctx, 7)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(clicks[6].Click, ev.Click); d != "" || ev.Seq != 7 || ev.Partition != events.Partition(ev.Click.Code, 4) || ev.Stored.IsZero() {
		t.Fatalf("Click(7) = %+v (-want +got):\n%s", ev, d)
	}
	at, err := l.StoredAt(ctx, 7)
	if err != nil || !at.Equal(ev.Stored) {
		t.Fatalf("StoredAt(7) = %s, %v; want %s", at, err, ev.Stored)
	}
	if _, err := l.Click(ctx, uint64(len(clicks)+10)); !errors.Is(err, fraud.ErrNotInLog) {
		t.Fatalf("Click past the end: %v, want ErrNotInLog", err)
	}

	// Scan partition 1 up to (not including) the sequence of its 20th click.
	var want []uint64
	for i, c := range clicks {
		if events.Partition(c.Code, 4) == 1 {
			want = append(want, uint64(i+1))
		}
	}
	until := want[19]
	var got []uint64
	count, err := l.Scan(ctx, 1, time.Now().Add(-time.Hour), until, func(ev reader.Event) {
		if ev.Partition != 1 {
			t.Errorf("scan of partition 1 got partition %d", ev.Partition)
		}
		got = append(got, ev.Seq)
	})
	if err != nil || count != 19 {
		t.Fatalf("Scan = %d, %v; want 19", count, err)
	}
	if d := cmp.Diff(want[:19], got); d != "" {
		t.Fatalf("scanned sequences (-want +got):\n%s", d)
	}
	// Until past the end: everything; a start after the last event: nothing.
	if count, err := l.Scan(ctx, 1, time.Now().Add(-time.Hour), 1<<62, func(reader.Event) {}); err != nil || count != len(want) {
		t.Fatalf("Scan to the end = %d, %v; want %d", count, err, len(want))
	}
	if count, err := l.Scan(ctx, 1, time.Now().Add(time.Hour), 1<<62, func(reader.Event) {}); err != nil || count != 0 {
		t.Fatalf("Scan of the future = %d, %v; want 0", count, err)
	}

	// Next: the partition's first event at or after a sequence, past the
	// other partitions' events; 0 past its last.
	for _, tc := range []struct{ from, want uint64 }{
		{1, want[0]}, {want[0], want[0]}, {want[0] + 1, want[1]}, {want[len(want)-1] + 1, 0},
	} {
		if got, err := l.Next(ctx, 1, tc.from); err != nil || got != tc.want {
			t.Fatalf("Next(1, %d) = %d, %v; want %d", tc.from, got, err, tc.want)
		}
	}
}

// A scan reads with an ordered consumer of its own on CLICKS, which it
// deletes when done, whichever way it ends (to its until, to the
// partition's end, nothing from its start): after 5 scans CLICKS has as
// many consumers as before. Before, each stayed until the server dropped
// it as inactive (nats.go's default for an ordered consumer, 5 minutes),
// so the rebuilds of every assignment and rewind piled them up on CLICKS.
func TestAScanLeavesNoConsumerBehind(t *testing.T) {
	t.Parallel()
	js := testenv.StartNATS(t).JetStream(t)
	ctx := t.Context()
	o := topology.Defaults()
	o.Partitions, o.Storage = 4, jetstream.MemoryStorage
	if err := topology.Apply(ctx, js, o); err != nil {
		t.Fatal(err)
	}
	clicks := traffic.Generate(traffic.Spec{Seed: 1, Start: time.Now().Add(-time.Minute), Duration: 5 * time.Second, HumanRate: 20, Links: 20, Owners: 2})
	if err := traffic.Publish(ctx, js, clicks, 256); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	consumers := func() int {
		info, err := s.Info(ctx)
		if err != nil {
			return -1
		}
		return info.State.Consumers
	}
	before := consumers()
	l := clicklog.New(js, 4)
	past, future := time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	for p := range 4 {
		if n, err := l.Scan(ctx, p, past, 1<<62, func(reader.Event) {}); err != nil || n == 0 {
			t.Fatalf("Scan of partition %d = %d, %v; want its events", p, n, err)
		}
	}
	if n, err := l.Scan(ctx, 0, future, 1<<62, func(reader.Event) {}); err != nil || n != 0 {
		t.Fatalf("Scan of the future = %d, %v; want 0", n, err)
	}
	now := before
	if !testenv.Poll(20*time.Second, func() bool { now = consumers(); return now == before }) {
		t.Errorf("CLICKS has %d consumers 20 s after 5 scans, want %d as before them", now, before)
	}
}
