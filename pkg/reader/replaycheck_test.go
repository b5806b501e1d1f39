package reader_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/topology"
)

// CheckPosition refuses a position CLICKS holds nothing after (an empty
// CLICKS, a sequence or a time after its last event) and warns of one
// before its oldest event, saying where the replay starts; a group with no
// consumers is ErrNoGroup first. ReplayUnderWay warns of the group's
// replay not carried out yet, naming it and its partitions.
func TestCheckPositionAndReplayUnderWay(t *testing.T) {
	t.Parallel()
	_, js := setup(t, 2)
	ctx := t.Context()
	if _, err := reader.CheckPosition(ctx, js, "g", reader.FromSeq(1), "from 1"); !errors.Is(err, reader.ErrNoGroup) {
		t.Errorf("a group with no consumers: %v, want ErrNoGroup", err)
	}
	for p := range 2 {
		cfg := topology.GroupConsumerConfig("g", p, topology.GroupConsumer{
			AckWait: time.Minute, PinnedTTL: 5 * time.Second, MaxAckPending: 100, DeliverPolicy: jetstream.DeliverAllPolicy,
		})
		if _, err := js.CreateOrUpdateConsumer(ctx, events.ClicksStream, cfg); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := reader.CheckPosition(ctx, js, "g", reader.FromSeq(1), "from 1"); !errors.Is(err, reader.ErrNothingToReplay) ||
		!strings.HasPrefix(err.Error(), "CLICKS holds no events") {
		t.Errorf("an empty CLICKS: %v, want ErrNothingToReplay saying CLICKS holds no events", err)
	}
	publish(t, js, 2, 5, 0)
	s, err := js.Stream(ctx, events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	last, err := s.GetMsg(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Purge(ctx, jetstream.WithPurgeSequence(6)); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		pos     reader.Position
		nothing string // the error's start, "" for none
		warns   bool
	}{
		{"after_the_last_sequence", reader.FromSeq(11), "the start is after CLICKS' last event (sequence 10)", false},
		{"after_the_last_time", reader.FromTime(last.Time.Add(time.Nanosecond)), "the start (", false},
		{"the_last_sequence", reader.FromSeq(10), "", false},
		{"the_last_time", reader.FromTime(last.Time), "", false},
		{"the_oldest_retained", reader.FromSeq(1), "", false},
		{"the_oldest_event", reader.FromSeq(6), "", false},
		{"a_discarded_sequence", reader.FromSeq(3), "", true},
		{"a_discarded_time", reader.FromTime(last.Time.Add(-time.Hour)), "", true},
	}
	for _, tc := range tests {
		warning, err := reader.CheckPosition(ctx, js, "g", tc.pos, "the start")
		switch {
		case tc.nothing != "" && (!errors.Is(err, reader.ErrNothingToReplay) || !strings.HasPrefix(err.Error(), tc.nothing) ||
			!strings.Contains(err.Error(), "sequence 10")):
			t.Errorf("%s: %v, want ErrNothingToReplay saying %q and naming sequence 10", tc.name, err, tc.nothing)
		case tc.nothing == "" && err != nil:
			t.Errorf("%s: %v, want nil", tc.name, err)
		case (warning != "") != tc.warns || tc.warns && (!strings.HasPrefix(warning, "CLICKS' oldest event now is sequence 6") ||
			!strings.Contains(warning, "not at the start")):
			t.Errorf("%s: warning %q, want one = %v, saying the replay starts at sequence 6, not at the start", tc.name, warning, tc.warns)
		}
	}

	if w, err := reader.ReplayUnderWay(ctx, js, "g"); err != nil || w != "" {
		t.Errorf("before any replay: %q, %v; want none under way", w, err)
	}
	id, err := reader.Rewind(ctx, js, "g", reader.FromSeq(1))
	if err != nil {
		t.Fatal(err)
	}
	if w, err := reader.ReplayUnderWay(ctx, js, "g"); err != nil || !strings.HasPrefix(w, "replay "+id+" of group g, requested ") ||
		!strings.Contains(w, "partitions [0 1]: this replay replaces it") {
		t.Errorf("with replay %s under way (no member): %q, %v; want it named, with partitions [0 1]", id, w, err)
	}
}

// RewindAfter stores a request only while the group's latest one is the
// one CheckReplay read (its Revision): none, or that one. Another stored
// in between is ErrReplayRequestedMeanwhile, naming it, and stays the
// latest.
func TestRewindAfterStoresOnlyOverTheRequestTheCheckRead(t *testing.T) {
	t.Parallel()
	_, js := setup(t, 2)
	ctx := t.Context()
	for p := range 2 {
		cfg := topology.GroupConsumerConfig("g", p, topology.GroupConsumer{
			AckWait: time.Minute, PinnedTTL: 5 * time.Second, MaxAckPending: 100, DeliverPolicy: jetstream.DeliverAllPolicy,
		})
		if _, err := js.CreateOrUpdateConsumer(ctx, events.ClicksStream, cfg); err != nil {
			t.Fatal(err)
		}
	}
	publish(t, js, 2, 5, 0)
	check := func() reader.ReplayWarnings {
		t.Helper()
		w, err := reader.CheckReplay(ctx, js, "g", reader.FromSeq(1), "from 1", false)
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	latest := func() string {
		t.Helper()
		st, err := reader.LatestRewind(ctx, js, "g")
		if err != nil {
			t.Fatal(err)
		}
		return st.ID
	}
	// None requested yet: both checks read none, the second to ask is refused.
	a, b := check(), check()
	if a.Revision != 0 || a.Replaces != "" {
		t.Fatalf("before any replay: %+v, want no revision and no replay under way", a)
	}
	first, err := reader.RewindAfter(ctx, js, "g", reader.FromSeq(1), a.Revision)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reader.RewindAfter(ctx, js, "g", reader.FromSeq(1), b.Revision); !errors.Is(err, reader.ErrReplayRequestedMeanwhile) ||
		!strings.Contains(err.Error(), "replay "+first+" (requested ") {
		t.Errorf("second over none: %v, want ErrReplayRequestedMeanwhile naming %s", err, first)
	}
	// One requested: both checks read it, the second to ask is refused.
	a, b = check(), check()
	if a.Revision == 0 || !strings.HasPrefix(a.Replaces, "replay "+first+" of group g") {
		t.Fatalf("with %s under way: %+v, want its revision and a warning naming it", first, a)
	}
	second, err := reader.RewindAfter(ctx, js, "g", reader.FromSeq(1), a.Revision)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reader.RewindAfter(ctx, js, "g", reader.FromSeq(1), b.Revision); !errors.Is(err, reader.ErrReplayRequestedMeanwhile) ||
		!strings.Contains(err.Error(), "replay "+second+" (requested ") {
		t.Errorf("second over %s: %v, want ErrReplayRequestedMeanwhile naming %s", first, err, second)
	}
	if id := latest(); id != second {
		t.Errorf("latest replay %s, want %s: a refused request stores nothing", id, second)
	}
}
