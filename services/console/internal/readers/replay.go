package readers

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
)

// ReplayRequest is what an operator asks of a group: exactly one of Since,
// From and FromSeq, and Confirm set to the group's name; Force to replay
// the click counter from a position it will not recount from.
type ReplayRequest struct {
	// Since replays the events of the last Since (a Go duration, "24h").
	Since string `json:"since,omitempty"`
	// From replays from a time (RFC 3339), not in the future, nor before
	// what a stream position can hold (earliestFrom, in 1677).
	From string `json:"from,omitempty"`
	// FromSeq replays from a CLICKS sequence (1 is the oldest retained);
	// nil when not given, so that "from_seq": 0 is refused as such.
	FromSeq *uint64 `json:"from_seq,omitempty"`
	// Confirm must repeat the group's name: a replay moves every partition
	// of a live reader, so it is never one click away.
	Confirm string `json:"confirm"`
	// Force replays the click counter even from after the oldest event
	// CLICKS retains, which it does not recount from (the replay changes
	// nothing; reader.CheckRecount), as snipctl replay --force does.
	Force bool `json:"force,omitempty"`
}

// earliestFrom is the earliest time a replay may start from. The server
// holds a start time as nanoseconds since 1970 in an int64; outside that
// range the value wraps around: 9999 read as the distant past and replayed
// every partition from sequence 1, 1600 as the far future and replayed
// nothing. A time in the future is refused as well: it replays nothing.
var earliestFrom = time.Unix(0, math.MinInt64).UTC().Truncate(time.Second).Add(time.Second)

// Position checks the request and returns where the replay starts: From
// must lie between earliestFrom and now.
func (r ReplayRequest) Position(group string, now time.Time) (reader.Position, string, error) {
	if r.Confirm != group {
		return reader.Position{}, "", fmt.Errorf("replay %s: confirm with the group's name: %w", group, ErrNotConfirmed)
	}
	var pos reader.Position
	var desc string
	set := 0
	if r.Since != "" {
		d, err := time.ParseDuration(r.Since)
		if err != nil || d <= 0 {
			return reader.Position{}, "", fmt.Errorf("replay %s: since %q is not a positive duration: %w", group, r.Since, ErrBadReplay)
		}
		pos, desc, set = reader.FromTime(now.Add(-d)), "since "+d.String(), set+1
	}
	if r.From != "" {
		t, err := time.Parse(time.RFC3339, r.From)
		if err != nil {
			return reader.Position{}, "", fmt.Errorf("replay %s: from %q is not an RFC 3339 time: %w", group, r.From, ErrBadReplay)
		}
		if t.After(now) || t.Before(earliestFrom) {
			return reader.Position{}, "", fmt.Errorf("replay %s: from %q is not between %s and now: %w",
				group, r.From, earliestFrom.Format(time.RFC3339), ErrBadReplay)
		}
		pos, desc, set = reader.FromTime(t), "from "+t.UTC().Format(time.RFC3339), set+1
	}
	if r.FromSeq != nil {
		if *r.FromSeq == 0 {
			return reader.Position{}, "", fmt.Errorf("replay %s: from_seq 0: CLICKS sequences start at 1 (the oldest retained): %w", group, ErrBadReplay)
		}
		pos, desc, set = reader.FromSeq(*r.FromSeq), fmt.Sprintf("from sequence %d", *r.FromSeq), set+1
	}
	if set != 1 {
		return reader.Position{}, "", fmt.Errorf("replay %s: give exactly one of since, from, from_seq: %w", group, ErrBadReplay)
	}
	return pos, desc, nil
}

// Replayed is a replay requested.
type Replayed struct {
	// ID is the request's; ReplayStatus follows it.
	ID string
	// Position is what was asked ("since 24h0m0s").
	Position string
	// Warnings says what the replay does other than the operator may
	// think: why a forced replay of the click counter changes nothing, that
	// it replaces the group's replay under way (whose partitions that
	// moved back move back again), and where it really starts when CLICKS
	// no longer holds the position (reader.CheckPosition).
	Warnings []string
}

// Replay asks group to replay CLICKS as r says and returns the request.
// Each partition moves back when its owner takes the request; ReplayStatus
// shows how far it got. A group with no consumers on CLICKS is
// ErrUnknownGroup, whatever the position and Force. A replay of the click
// counter that it would not recount from is refused (ErrNotARecount, with
// reader.CheckRecount's reason) unless r.Force, and then comes with that
// reason as a warning. A position with nothing after it in CLICKS (after
// its last event, or CLICKS empty) is refused (ErrNothingToReplay, naming
// the last event), and one before its oldest event comes with a warning
// saying where the replay really starts (reader.CheckPosition). A replay
// asked while the group's previous one is under way comes with a warning
// that it replaces it (reader.ReplayUnderWay); one asked while another
// replay of the group is requested after its checks is refused
// (ErrRequestedMeanwhile, naming that one), not requested unwarned. A group started at new
// events (the webhooks group) cannot be replayed: ErrNotReplayable. What is
// refused requests nothing.
func (v *View) Replay(ctx context.Context, group string, r ReplayRequest) (Replayed, error) {
	if !events.ValidToken(group) {
		return Replayed{}, fmt.Errorf("replay %q: %w", group, ErrUnknownGroup)
	}
	pos, desc, err := r.Position(group, time.Now())
	if err != nil {
		return Replayed{}, err
	}
	out := Replayed{Position: desc, Warnings: []string{}}
	w, err := reader.CheckReplay(ctx, v.js, group, pos, desc, r.Force)
	switch {
	case errors.Is(err, reader.ErrNoGroup):
		return Replayed{}, fmt.Errorf("replay %s: %w", group, ErrUnknownGroup)
	case errors.Is(err, reader.ErrNotARecount):
		return Replayed{}, fmt.Errorf("replay %s: %w: %w", group, err, ErrNotARecount)
	case errors.Is(err, reader.ErrNothingToReplay):
		return Replayed{}, fmt.Errorf("replay %s: %w; nothing requested", group, err)
	case err != nil:
		return Replayed{}, fmt.Errorf("replay %s: %w", group, err)
	}
	if w.Forced != "" {
		out.Warnings = append(out.Warnings, w.Forced+"; replayed anyway (force)")
	}
	if w.Replaces != "" {
		out.Warnings = append(out.Warnings, w.Replaces)
	}
	if v.checked != nil {
		v.checked(group)
	}
	// Requested only if no other replay was since the check (another
	// operator, snipctl): that one is not replaced without the warning
	// saying so. The caller is told ErrRequestedMeanwhile, naming it, and
	// nothing is requested; asked again, the warning says it replaces it.
	out.ID, err = reader.RewindAfter(ctx, v.js, group, pos, w.Revision)
	if errors.Is(err, reader.ErrNoGroup) {
		return Replayed{}, fmt.Errorf("replay %s: %w", group, ErrUnknownGroup)
	}
	if err != nil {
		return Replayed{}, err
	}
	if w.StartsAt != "" {
		out.Warnings = append(out.Warnings, w.StartsAt)
	}
	return out, nil
}

// ReplayStatus is the latest replay of a group, as the panel shows it.
type ReplayStatus struct {
	Group     string     `json:"group"`
	ID        string     `json:"id,omitempty"`
	Requested *time.Time `json:"requested,omitempty"`
	Done      bool       `json:"done"`
	// Void: the replay will never be done. A partition that has not moved
	// back has a consumer other than the one the replay was made for (the
	// group was deleted or created again since), which ignores it.
	Void      bool               `json:"void"`
	DoneCount int                `json:"partitions_done"`
	Total     int                `json:"partitions"`
	Parts     []PartitionRewound `json:"partition_status"`
}

// PartitionRewound is one partition of a replay.
type PartitionRewound struct {
	Partition int    `json:"partition"`
	From      uint64 `json:"from_seq"`
	Until     uint64 `json:"until_seq"`
	Done      bool   `json:"done"`
	// Void: the partition's consumer is not the one the replay was made
	// for (reader.PartitionRewind.Void); with Done false, it never moves
	// back for it.
	Void bool `json:"void"`
	// AtGroupStart: the replay was asked from before the group started (at
	// a time), and this partition replays from its first event since
	// (reader.PartitionRewind.AtGroupStart).
	AtGroupStart bool `json:"at_group_start"`
}

// ReplayStatus reads the group's latest replay, which partitions have
// moved back, and whether the replay is void.
func (v *View) ReplayStatus(ctx context.Context, group string) (ReplayStatus, error) {
	if !events.ValidToken(group) {
		return ReplayStatus{}, fmt.Errorf("replay status of %q: %w", group, ErrUnknownGroup)
	}
	st, err := reader.LatestRewind(ctx, v.js, group)
	if err != nil {
		return ReplayStatus{}, err
	}
	out := ReplayStatus{Group: group, ID: st.ID, Done: st.Done(), Void: st.Void(), Total: len(st.Partitions), Parts: []PartitionRewound{}}
	if st.ID != "" {
		t := st.Requested
		out.Requested = &t
	}
	for _, p := range st.Partitions {
		out.Parts = append(out.Parts, PartitionRewound{Partition: p.Partition, From: p.From, Until: p.Until, Done: p.Done, Void: p.Void, AtGroupStart: p.AtGroupStart})
		if p.Done {
			out.DoneCount++
		}
	}
	return out, nil
}
