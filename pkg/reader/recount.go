package reader

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/topology"
)

// ErrNotARecount marks a replay of the click counter that would recount
// nothing (a NotARecountError).
var ErrNotARecount = errors.New("a click-counter replay that recounts nothing")

// NotARecountError is a replay of the click counter from after the oldest
// event CLICKS retains. The counter keeps all-time totals: it recounts only
// a replay that starts at that event, and skips the events of any other by
// watermark (decision 0021). Such a replay changes nothing, while whoever
// asked for it may believe the counts are being rebuilt.
type NotARecountError struct {
	// Start is the replay's position as it was given ("--since 1h",
	// "since 1h0m0s").
	Start string
	// FirstSeq and FirstStored are CLICKS' oldest retained event.
	FirstSeq    uint64
	FirstStored time.Time
}

func (e *NotARecountError) Error() string {
	return fmt.Sprintf("%s starts after the oldest event CLICKS retains (sequence %d, stored %s): "+
		"the click counter keeps all-time totals and recounts only from the oldest event, "+
		"so it would skip the replayed events and change nothing (docs/decisions/0021)",
		e.Start, e.FirstSeq, e.FirstStored.UTC().Format(time.RFC3339))
}

// Is makes a NotARecountError match ErrNotARecount.
func (e *NotARecountError) Is(target error) bool { return target == ErrNotARecount }

// CheckRecount says whether a replay of group from pos would change what
// the group's reader keeps, for the readers whose state a replay can leave
// unchanged: for the click counter, a *NotARecountError when pos is after
// the oldest event CLICKS retains (start is pos as it was given, for the
// message); nil for a replay from that event or before it, when CLICKS is
// empty, and for every other group. A click counter that has no consumers
// on CLICKS is ErrNoGroup, as Rewind would say, before any position is
// judged: a group that is not there is not there whatever the position.
// Every surface that replays a group (snipctl, the console) asks it first,
// and refuses what it returns unless the operator insists (ErrNoGroup not
// even then).
//
// CLICKS' first event is the oldest of every partition's: a replay at or
// before it starts each partition at its own first event, and the counter
// recounts them all; a replay after it leaves at least the partition that
// holds it starting after its own first event, which the counter skips.
func CheckRecount(ctx context.Context, js jetstream.JetStream, group string, pos Position, start string) error {
	if group != topology.GroupClickCounter {
		return nil
	}
	s, err := js.Stream(ctx, events.ClicksStream)
	if err != nil {
		return fmt.Errorf("the oldest event of %s: %w", events.ClicksStream, err)
	}
	if err := groupExists(ctx, s, group); err != nil {
		return fmt.Errorf("recount check of %s: %w", group, err)
	}
	st := s.CachedInfo().State
	if st.Msgs == 0 {
		return nil // nothing to replay, nothing to skip
	}
	if pos.time.IsZero() && max(pos.seq, 1) <= st.FirstSeq || !pos.time.IsZero() && !pos.time.After(st.FirstTime) {
		return nil
	}
	return &NotARecountError{Start: start, FirstSeq: st.FirstSeq, FirstStored: st.FirstTime}
}
