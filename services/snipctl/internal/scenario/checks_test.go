package scenario

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// A lesson's checks judge what was observed from outside the code it
// teaches about, not what that code says it did. Each check function is fed
// here an observation where the lesson's claim holds, and fabricated ones
// where it does not: the rows that claim what is false must FAIL.
func TestChecksFailWhenTheClaimIsFalse(t *testing.T) {
	t.Parallel()
	outboxOK := outboxSeen{links: 43, once: 43, stored: 43, published: 53, twice: 10}
	tests := []struct {
		name   string
		checks func(e *Env)
		fail   []string // the rows that must FAIL, in table order
	}{
		{
			name:   "outbox_claim_holds",
			checks: func(e *Env) { outboxChecks(e, outboxOK) },
		},
		{
			name: "outbox_stream_kept_the_second_copies",
			checks: func(e *Env) {
				s := outboxOK
				s.once, s.stored = 33, 53 // ten links with two events in LINKS
				outboxChecks(e, s)
			},
			fail: []string{"outbox: links with exactly one event in LINKS"},
		},
		{
			name: "outbox_relay_never_sent_twice",
			checks: func(e *Env) {
				s := outboxOK
				s.published, s.twice = 43, 0
				outboxChecks(e, s)
			},
			fail: []string{"outbox: events sent twice (seen on the wire)"},
		},
		{
			name: "outbox_rolled_back_links_written",
			checks: func(e *Env) {
				s := outboxOK
				s.links, s.once, s.stored = 50, 50, 50
				outboxChecks(e, s)
			},
			fail: []string{"outbox: links written (every 7th rolled back)", "outbox: links with exactly one event in LINKS"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := &Env{speed: 1, res: &Result{}}
			tc.checks(e)
			var failed []string
			for _, c := range e.res.Checks {
				if !c.OK {
					failed = append(failed, c.Name)
				}
			}
			if diff := cmp.Diff(tc.fail, failed); diff != "" {
				t.Errorf("rows that FAIL (-want +got):\n%s", diff)
			}
		})
	}
}
