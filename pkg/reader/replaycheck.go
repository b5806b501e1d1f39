package reader

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
)

// ErrNothingToReplay means CLICKS holds no event at or after a replay's
// position: it is empty, or the position is after its last event
// (CheckPosition). A replay from there moves no partition back, and
// waiting for it says every partition did.
var ErrNothingToReplay = errors.New("nothing to replay")

// CheckPosition says what CLICKS holds of a replay from pos, before it is
// requested (start is pos as it was given, "--since 1h" or "since 1h0m0s",
// for the messages). When CLICKS holds no event at or after pos (it is
// empty, or pos is after its last event: a sequence of another stream, a
// time with no click since), the error matches ErrNothingToReplay and names
// CLICKS' last event. Otherwise, when pos is before CLICKS' oldest event
// (its age or size limit discarded the events before it), the warning says
// where the replay really starts (each partition's first event at or after
// pos): without it a replay of 720h on a CLICKS that keeps 168h reads as a
// month reloaded. The warning is "" when CLICKS holds pos, or pos is
// sequence 1 ("the oldest retained").
//
// A group that has no consumers on CLICKS is ErrNoGroup, as Rewind would
// say, before any position is judged. Every surface that replays a group
// (snipctl, the console) asks it through CheckReplay, refuses what its
// error refuses, and shows the warning with the replay requested.
func CheckPosition(ctx context.Context, js jetstream.JetStream, group string, pos Position, start string) (warning string, err error) {
	s, err := js.Stream(ctx, events.ClicksStream)
	if err != nil {
		return "", fmt.Errorf("look up stream %s: %w", events.ClicksStream, err)
	}
	if err := groupExists(ctx, s, group); err != nil {
		return "", fmt.Errorf("position check of %s: %w", group, err)
	}
	info := s.CachedInfo()
	st := info.State
	at, seq := pos.time, pos.seq
	switch {
	case st.Msgs == 0:
		return "", fmt.Errorf("CLICKS holds no events: %w", ErrNothingToReplay)
	case at.IsZero() && seq > st.LastSeq:
		return "", fmt.Errorf("%s is after CLICKS' last event (sequence %d): %w", start, st.LastSeq, ErrNothingToReplay)
	case !at.IsZero() && st.LastTime.Before(at):
		return "", fmt.Errorf("%s (%s) is after CLICKS' last event (sequence %d, stored %s): %w", start,
			at.UTC().Format(time.RFC3339Nano), st.LastSeq, st.LastTime.UTC().Format(time.RFC3339Nano), ErrNothingToReplay)
	}
	if st.FirstSeq <= 1 {
		return "", nil // nothing ever discarded
	}
	if !at.IsZero() && !at.Before(st.FirstTime) || at.IsZero() && (seq <= 1 || seq >= st.FirstSeq) {
		return "", nil
	}
	keeps := "no age limit"
	if info.Config.MaxAge > 0 {
		keeps = "an age limit of " + info.Config.MaxAge.String()
	}
	return fmt.Sprintf("CLICKS' oldest event now is sequence %d, stored %s: the replay starts there, not at %s; what was stored before it is gone (CLICKS keeps %s)",
		st.FirstSeq, st.FirstTime.UTC().Format(time.RFC3339), start, keeps), nil
}

// ReplayUnderWay says, when the group's latest replay is not carried out
// yet by every partition (nor void: a partition left never will), that a
// replay requested now replaces it, naming it, when it was requested and
// the partitions still to move; "" when none is under way. The partitions
// carry out the group's latest request only: the one under way is never
// finished, and its partitions that did move back move back again for the
// new one. An operator who asks again to be sure (a second run, a second
// operator, the console and snipctl both) is told so before it happens.
func ReplayUnderWay(ctx context.Context, js jetstream.JetStream, group string) (string, error) {
	w, _, err := replayUnderWay(ctx, js, group)
	return w, err
}

// replayUnderWay is ReplayUnderWay, and the revision of the group's latest
// request it read (0: none).
func replayUnderWay(ctx context.Context, js jetstream.JetStream, group string) (string, uint64, error) {
	st, err := LatestRewind(ctx, js, group)
	if err != nil || st.ID == "" || st.Done() || st.Void() {
		return "", st.rev, err
	}
	return fmt.Sprintf("replay %s of group %s, requested %s, is not carried out yet by partitions %v: this replay replaces it (the partitions that carried it out move back again)",
		st.ID, group, st.Requested.UTC().Format(time.RFC3339), st.Pending()), st.rev, nil
}

// Pending returns the partitions that have not carried the replay out.
func (s RewindStatus) Pending() []int {
	var left []int
	for _, p := range s.Partitions {
		if !p.Done {
			left = append(left, p.Partition)
		}
	}
	return left
}

// ReplayWarnings are what a replay CheckReplay lets through does other than
// its operator may think; each is "" where it does not apply.
type ReplayWarnings struct {
	// Forced is CheckRecount's reason a replay of the click counter from
	// there recounts nothing: the refusal the caller's force overrode.
	Forced string
	// Replaces is ReplayUnderWay's: the group's replay under way that this
	// one replaces.
	Replaces string
	// StartsAt is CheckPosition's: where the replay really starts, pos
	// being before CLICKS' oldest event.
	StartsAt string
	// Revision is the revision of the group's latest request as
	// ReplayUnderWay read it (0: none), for RewindAfter: a replay
	// requested after the check is not replaced unsaid.
	Revision uint64
}

// CheckReplay is every check a surface makes before it requests a replay
// of group from pos (snipctl replay, the console's Replay), in order:
// CheckRecount, whose refusal (ErrNotARecount) stands unless force, and is
// then the warning Forced; CheckPosition, whose refusal
// (ErrNothingToReplay) stands; ReplayUnderWay. A group that has no
// consumers is ErrNoGroup first. What it refuses, the caller requests
// nothing of; the errors wrap the checks' own. What it lets through, the
// caller requests with RewindAfter and the warnings' Revision, so that a
// replay requested by someone else after the check is not replaced
// without the warning Replaces.
func CheckReplay(ctx context.Context, js jetstream.JetStream, group string, pos Position, start string, force bool) (ReplayWarnings, error) {
	var w ReplayWarnings
	err := CheckRecount(ctx, js, group, pos, start)
	switch {
	case errors.Is(err, ErrNotARecount) && force:
		w.Forced = err.Error()
	case err != nil:
		return ReplayWarnings{}, err
	}
	if w.StartsAt, err = CheckPosition(ctx, js, group, pos, start); err != nil {
		return ReplayWarnings{}, err
	}
	if w.Replaces, w.Revision, err = replayUnderWay(ctx, js, group); err != nil {
		return ReplayWarnings{}, err
	}
	return w, nil
}
