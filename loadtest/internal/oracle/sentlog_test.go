package oracle_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"

	"github.com/snipdev/snip/loadtest/internal/oracle"
	"github.com/snipdev/snip/loadtest/internal/truth"
	"github.com/snipdev/snip/loadtest/internal/workload"
)

// SentLog is complete only when every sent click was read by ID: copies,
// timed-out clicks recorded late and clicks on other links never make up
// for a missing one, an invalid click (parked by the readers) accounts for
// its own, and every click on the run's links counts in the last positions.
func TestSentLogWantsEverySentClickByID(t *testing.T) {
	t.Parallel()
	tag := workload.NewTag()
	gen, err := workload.New(spec())
	if err != nil {
		t.Fatal(err)
	}
	// Clicks 0 and 1 were sent, 2 timed out.
	tr := &truth.Truth{Version: truth.Version, Mode: truth.ModeEvents, Tag: tag.String(), Owner: "acme", Spec: spec(),
		Attempts: 3, Uncertain: []uint64{2}}
	at := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	click := func(seq uint64, part int, streamSeq uint64) oracle.LogClick {
		return oracle.LogClick{ID: uuid.MustParse(tag.EventID(seq, at)), Code: tag.LinkCode(gen.Visit(seq).Link),
			Partition: part, StreamSeq: streamSeq}
	}
	invalid := click(1, 0, 4)
	invalid.Invalid = true
	invalidTimedOut := click(2, 0, 6)
	invalidTimedOut.Invalid = true
	other := click(1, 1, 9)
	other.Code = "other-link"
	tests := []struct {
		name     string
		clicks   []oracle.LogClick
		complete bool
		last     map[int]uint64
	}{
		{name: "every_sent_click", clicks: []oracle.LogClick{click(0, 0, 1), click(1, 1, 2)}, complete: true, last: map[int]uint64{0: 1, 1: 2}},
		{name: "a_copy_does_not_make_up_for_a_missing_click", clicks: []oracle.LogClick{click(0, 0, 1), click(0, 1, 2)}, last: map[int]uint64{0: 1, 1: 2}},
		{name: "a_timed_out_click_does_not_make_up_for_a_missing_click", clicks: []oracle.LogClick{click(0, 0, 1), click(2, 1, 3)}, last: map[int]uint64{0: 1, 1: 3}},
		{name: "an_invalid_click_is_accounted_for_and_a_position", clicks: []oracle.LogClick{click(0, 0, 1), invalid}, complete: true, last: map[int]uint64{0: 4}},
		{name: "an_invalid_click_does_not_make_up_for_another", clicks: []oracle.LogClick{click(0, 0, 1), invalidTimedOut}, last: map[int]uint64{0: 6}},
		{name: "a_click_on_another_link_is_neither", clicks: []oracle.LogClick{click(0, 0, 1), other}, last: map[int]uint64{0: 1}},
		{name: "the_timed_out_click_stored_after_counts_in_the_positions", clicks: []oracle.LogClick{click(1, 1, 2), click(0, 0, 5), click(2, 0, 7)}, complete: true, last: map[int]uint64{0: 7, 1: 2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			l, err := oracle.NewSentLog(tr)
			if err != nil {
				t.Fatal(err)
			}
			l.Add(tc.clicks)
			if got := l.Complete(); got != tc.complete {
				t.Errorf("complete = %v, want %v", got, tc.complete)
			}
			if diff := cmp.Diff(tc.last, l.Last()); diff != "" {
				t.Errorf("last (-want +got):\n%s", diff)
			}
		})
	}
}
