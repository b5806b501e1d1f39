package readers

import (
	"errors"

	"github.com/snipdev/snip/pkg/reader"
)

// Errors of a replay request.
var (
	// ErrNotConfirmed means the request did not repeat the group's name.
	ErrNotConfirmed = errors.New("replay not confirmed")
	// ErrBadReplay means the position is missing, doubled or malformed.
	ErrBadReplay = errors.New("invalid replay position")
	// ErrUnknownGroup means no such consumer group reads CLICKS.
	ErrUnknownGroup = errors.New("no such consumer group")
	// ErrNotARecount means a replay of the click counter from a position
	// it will not recount from, without force; the error says why.
	ErrNotARecount = errors.New(`replay from sequence 1 ("from_seq": 1) to recount, or force it ("force": true) to replay anyway`)
	// ErrNothingToReplay means CLICKS holds no event at or after the
	// position (it is after CLICKS' last event, or CLICKS is empty): the
	// replay would move nothing back. The error names the last event
	// (reader.CheckPosition).
	ErrNothingToReplay = reader.ErrNothingToReplay
	// ErrNotReplayable means a group whose consumers JetStream moves back
	// only to their ack floor (created at new events: the webhooks group);
	// the error says so, and for webhooks what to do instead.
	ErrNotReplayable = reader.ErrNotReplayable
	// ErrRequestedMeanwhile means another replay of the group was requested
	// between this one's checks and its request: nothing was requested,
	// and the error names that replay (reader.RewindAfter). Asked again,
	// the replay comes with the warning that it replaces it.
	ErrRequestedMeanwhile = reader.ErrReplayRequestedMeanwhile
)
