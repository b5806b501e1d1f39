package loader

import (
	"errors"
	"fmt"

	"github.com/snipdev/snip/pkg/events"
)

// Reasons a click is parked on DEAD_LETTER by the loader, as the token of
// dead.warehouse-loader.<reason>.
const (
	// ReasonBadRow: the click cannot be written as a row of the clicks table
	// (the ClickHouse client refused a value, e.g. a malformed event ID).
	ReasonBadRow = "bad_row"
	// ReasonImplausibleTime: the click's time is further from when JetStream
	// stored it than MaxClockSkew. Loading it would create a day partition
	// far from every other. (How many days one insert spans is not bounded
	// by this: the writer splits an insert of rows spanning more days than a
	// current server takes in one.)
	// The runtime parks such a click first (events.ReadClick), under the
	// same reason, so every reader parks it.
	ReasonImplausibleTime = events.ReasonImplausibleTime
)

// RowError is returned by an Inserter for a row it cannot encode and that
// is not well-formed (Row.Validate fails). Only that row is at fault: the
// loader parks its event and inserts the rest again. A well-formed row the
// client refuses is the table's fault (a column's type changed), which is an
// ErrPermanent error, never a RowError.
type RowError struct {
	// Index is the row's position in the slice given to Insert.
	Index int
	// Err is what the client said.
	Err error
}

func (e *RowError) Error() string { return fmt.Sprintf("row %d: %v", e.Index, e.Err) }

func (e *RowError) Unwrap() error { return e.Err }

// ErrStopped is what a handler waiting on an insert returns when the loader
// is closed before the insert finished. The runtime hands the batch out
// again later (to this process or another), so nothing is lost.
var ErrStopped = errors.New("loader stopped")

// ErrBadConfig means a Config field is out of range.
var ErrBadConfig = errors.New("invalid loader config")

// ErrPermanent marks an insert that cannot succeed until an operator acts:
// the tables do not fit the rows (a missing column, a changed type), the
// loader may not write (credentials, grants), or the server takes fewer
// partitions per insert than the writer puts in one. The events are fine, so the
// loader never parks them: it alerts (an error log and the insert-error
// metric) and retries every PermanentRetryDelay, and the stream holds the
// backlog meanwhile.
var ErrPermanent = errors.New("the warehouse refuses the rows until an operator acts")
