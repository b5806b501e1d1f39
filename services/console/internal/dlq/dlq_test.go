package dlq_test

import (
	"fmt"
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

// A source that parks letters under many made-up reasons does not make the
// panel list (and read a letter of) every one: Groups holds the GroupsShown
// groups with the most letters, and counts every letter and group.
func TestGroupsAreTheOnesWithTheMostLetters(t *testing.T) {
	t.Parallel()
	_, js := consoletest.NATS(t)
	const source, extra = "webhooks", 3
	park := func(reason string, seq uint64) {
		t.Helper()
		if _, err := deadletter.Publish(t.Context(), js, deadletter.Parcel{Source: source, Reason: reason, Attempts: 1,
			Stream: events.ClicksStream, Subject: "clicks.acme.abc", Seq: seq, Data: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	// Two letters under each of GroupsShown reasons, one under each of
	// the extra ones, which are left out.
	var seq uint64
	want := map[string]bool{}
	for i := range dlq.GroupsShown + extra {
		reason := fmt.Sprintf("made-up-%03d", i)
		letters := 1
		if i >= extra {
			letters, want[reason] = 2, true
		}
		for range letters {
			seq++
			park(reason, seq)
		}
	}
	got, err := dlq.New(js).Groups(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if got.Total != seq || got.TotalGroups != dlq.GroupsShown+extra || len(got.Groups) != dlq.GroupsShown {
		t.Fatalf("total %d, total_groups %d, %d groups listed; want %d, %d, %d",
			got.Total, got.TotalGroups, len(got.Groups), seq, dlq.GroupsShown+extra, dlq.GroupsShown)
	}
	for i, g := range got.Groups {
		if !want[g.Reason] || g.Count != 2 || g.Newest.Seq == 0 {
			t.Errorf("group %d: %s/%s with %d letters (newest %d), want one of the reasons with 2", i, g.Source, g.Reason, g.Count, g.Newest.Seq)
		}
		if i > 0 && got.Groups[i-1].Reason >= g.Reason {
			t.Errorf("groups not sorted: %s before %s", got.Groups[i-1].Reason, g.Reason)
		}
	}
}
