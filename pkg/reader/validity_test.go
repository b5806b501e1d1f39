package reader_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// otherPartitionCode returns a code that hashes to another partition than code.
func otherPartitionCode(t *testing.T, code string, partitions int) string {
	t.Helper()
	for i := range 1000 {
		c := fmt.Sprintf("other%d", i)
		if events.Partition(c, partitions) != events.Partition(code, partitions) {
			return c
		}
	}
	t.Fatal("no code in another partition")
	return ""
}

// Every reader (click counter, fraud detection, warehouse loader) reads
// CLICKS through this runtime, which applies events.ReadClick: an invalid
// event is parked by every group with the same reason, and no handler
// counts, judges or loads it.
func TestEveryReaderParksTheSameInvalidEvents(t *testing.T) {
	t.Parallel()
	const partitions = 4
	n, js := setup(t, partitions)
	ctx := t.Context()
	pub := func(subject string, c events.Click) {
		t.Helper()
		b, _ := json.Marshal(c)
		if _, err := js.Publish(ctx, subject, b, jetstream.WithMsgID(c.ID)); err != nil {
			t.Fatal(err)
		}
	}
	ids := publish(t, js, 3, 4, 0)
	// 1. Published on link0's subject; the payload names a code of
	// another partition.
	mismatch := click(otherPartitionCode(t, "link0", partitions), 100)
	pub(events.ClickSubject("acme", "link0"), mismatch)
	// 2. A click dated 1999.
	old := click("link1", 101)
	old.Time = time.Date(1999, 6, 1, 0, 0, 0, 0, time.UTC)
	pub(events.ClickSubject("acme", "link1"), old)
	// 3. The subject's owner differs from the payload's.
	owner := click("link2", 102)
	pub(events.ClickSubject("mallory", "link2"), owner)
	ids = append(ids, publish(t, js, 3, 2, 4)...)

	groups := []string{topology.GroupClickCounter, topology.GroupFraudDetection, topology.GroupWarehouseLoader}
	recs := map[string]*recorder{}
	for _, g := range groups {
		recs[g] = newRecorder()
		startMember(t, n, reader.Config{Group: g, Member: g + "-1", BatchSize: 5}, recs[g].handler(g+"-1"))
	}
	for _, g := range groups {
		testenv.WaitFor(t, 30*time.Second, g+" handled every valid event", func() bool { return recs[g].distinct() == len(ids) })
	}
	dlq, err := js.Stream(ctx, events.DeadLetterStream)
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 15*time.Second, "9 dead letters", func() bool {
		info, err := dlq.Info(ctx)
		return err == nil && info.State.Msgs == 9
	})
	got := map[string]int{}
	for seq := uint64(1); seq <= 9; seq++ {
		m, err := dlq.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		got[m.Subject]++
	}
	want := map[string]int{}
	for _, g := range groups {
		want[events.DeadLetterSubject(g, events.ReasonSubjectMismatch)] = 2
		want[events.DeadLetterSubject(g, events.ReasonImplausibleTime)] = 1
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("dead letters by subject (-want +got):\n%s", d)
	}
	for _, g := range groups {
		r := recs[g]
		r.mu.Lock()
		for _, bad := range []events.Click{mismatch, old, owner} {
			if r.seen[bad.ID] != 0 {
				t.Errorf("%s handled invalid click %s", g, bad.ID)
			}
		}
		r.mu.Unlock()
	}
}
