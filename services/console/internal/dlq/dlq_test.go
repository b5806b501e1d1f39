package dlq_test

import (
	"testing"

	"github.com/snipdev/snip/pkg/deadletter"
	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/services/console/internal/consoletest"
	"github.com/snipdev/snip/services/console/internal/dlq"
)

// A group redrive of many letters that cannot be redriven here (from
// LINKS, which the console may not publish to) counts them all and lists
// only the oldest RefusalsListed: the answer stays small however many there
// are.
func TestGroupRedriveListsABoundedNumberOfRefusals(t *testing.T) {
	t.Parallel()
	_, js := consoletest.NATS(t)
	const source, reason, n = "click-counter", "malformed", dlq.RefusalsListed + 5
	var seqs []uint64
	for i := range n {
		ack, err := deadletter.Publish(t.Context(), js, deadletter.Parcel{Source: source, Reason: reason, Attempts: 1,
			Stream: events.LinksStream, Subject: "links.created.abc", Seq: uint64(i + 1), Data: []byte(`{"code":"abc"}`)})
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, ack.Sequence)
	}
	got, err := dlq.New(js).RedriveGroup(t.Context(), source, reason)
	if err != nil {
		t.Fatal(err)
	}
	if got.Redriven != 0 || got.RefusedCount != n || got.RefusedListed != dlq.RefusalsListed || got.Incomplete {
		t.Errorf("redriven %d, refused_count %d, refused_listed %d, incomplete %v; want 0, %d, %d, false",
			got.Redriven, got.RefusedCount, got.RefusedListed, got.Incomplete, n, dlq.RefusalsListed)
	}
	if len(got.Refused) != dlq.RefusalsListed {
		t.Fatalf("%d refusals listed, want the oldest %d of %d", len(got.Refused), dlq.RefusalsListed, n)
	}
	for i, r := range got.Refused {
		if r.Seq != seqs[i] || r.Error == "" {
			t.Fatalf("refusal %d: %+v, want letter %d with why", i, r, seqs[i])
		}
	}
}
