package counter

import (
	"context"
	"time"
)

// Store is what the counter needs from its database. Every method that
// writes counts is atomic and guarded by a compare-and-set on the
// partition's State, so a caller that raced with another writer is told so
// (Conflict) and nothing is written. Package redisstore implements it.
type Store interface {
	// State reads a partition's generations and write watermark.
	State(ctx context.Context, partition int) (State, error)
	// Apply writes one batch if the partition is still in w.Expect.
	Apply(ctx context.Context, w *Write) (ApplyResult, error)
	// StartGeneration begins a recount of a partition for replay replayID:
	// a new, empty write generation that becomes the read generation once
	// its watermark reaches until (at once if until is 0), and that counts
	// the partition's events from sequence from on (the oldest CLICKS
	// retains), none before. started is false when that replay had already
	// started one, unless a call with the same token did (non-empty): the
	// caller's own earlier try, whose answer it did not get.
	StartGeneration(ctx context.Context, partition int, replayID, token string, from, until uint64) (s State, started bool, err error)
	// Generations lists the generations that have keys in the store.
	Generations(ctx context.Context, partition int) ([]int64, error)
	// DropGeneration deletes every key of one generation.
	DropGeneration(ctx context.Context, partition int, gen int64) error
	// Correct applies verdicts: each Corrections is one partition's, applied
	// in one atomic step if the partition's generations are still
	// Corrections.Expect's (else nothing is written: Conflict). For each
	// verdict it records the label and moves the click between its human
	// and bot counts in the generations that have counted it. All partitions
	// go in one round trip; results[i] answers batches[i].
	Correct(ctx context.Context, batches []*Corrections) (results []CorrectionsResult)
	// ApplyLinkEvents records links' owners and deletions from LINKS, in one
	// round trip; an event at or below the sequence already applied for its
	// code is ignored (applied[i] is false).
	ApplyLinkEvents(ctx context.Context, es []LinkEvent) (applied []bool, err error)
	// ForgetLinks gives the all-time counts of deleted links, in their
	// partition's read and write generations, an expiry at Until (making
	// the link's hash if it has none yet, so that a late click keeps it),
	// and records them per partition until then for ExpireDeletedLinks. A
	// link whose Until has passed has its counts deleted at once. Applying
	// it again changes nothing.
	ForgetLinks(ctx context.Context, links []DeletedLink) error
	// ExpireDeletedLinks gives the counts of the partition's deleted links
	// recorded by ForgetLinks their expiry in its read and write
	// generations, where a generation made since (a recount) counted them.
	ExpireDeletedLinks(ctx context.Context, partition int) error
	// Link returns what LINKS said about a code, and whether it said anything.
	Link(ctx context.Context, code string) (LinkInfo, bool, error)
	// Replicated waits until the store's replicas have every write made so
	// far to the given partitions and LINKS records of codes; an error says
	// they did not confirm in time. It is a no-op when the store does not
	// wait for replicas.
	Replicated(ctx context.Context, partitions []int, codes []string) error
	// MarkLost records, with generation write's watermark, that the
	// store lost the events of the partition from sequence from to until
	// (excluded) after they were counted: the stretch the counter asked
	// for again (see catchUp). State returns it (Lost), so a member that
	// takes the partition over during the catch-up knows which of the
	// events it is handed were lost.
	MarkLost(ctx context.Context, partition int, write int64, from, until uint64) error
	// ReadStats reads a link's counts from the read generation, in one
	// atomic snapshot.
	ReadStats(ctx context.Context, partition int, ref LinkRef, days []Day) (Snapshot, error)
}

// State is where a partition's counts stand.
type State struct {
	// Read is the generation the stats are read from.
	Read int64
	// Write is the generation batches are written to; it differs from Read
	// while a recount rebuilds it.
	Write int64
	// Until is the stream sequence at which the write generation takes over
	// the reads; 0 when no recount is running.
	Until uint64
	// Replay is the ID of the last replay that started a generation.
	Replay string
	// WM is the write generation's watermark: the last sequence applied.
	WM uint64
	// Token is the token of the write that moved WM there (Write.Token),
	// as State reads it; "" if none recorded one.
	Token string
	// LostFrom and LostUntil are the last stretch of events MarkLost
	// recorded for the write generation (LostUntil 0: none). Those above
	// WM are still to be counted again; those at or below it were.
	LostFrom, LostUntil uint64
}

// Recounting reports whether a recount is running.
func (s State) Recounting() bool { return s.Write != s.Read }

// Write is one batch, aggregated, ready to be applied atomically.
type Write struct {
	Partition int
	// Expect is the state the batch was filtered against; Apply writes only
	// if the write generation and its watermark are still these.
	Expect State
	// FirstSeq is the batch's first event (for OnPassed, the first event
	// parked): where a generation that has counted nothing yet starts.
	FirstSeq uint64
	// LastSeq and LastStored are the batch's last event: the new watermark
	// (for OnPassed, a write of no events, the last event parked).
	LastSeq    uint64
	LastStored time.Time
	// Counted is how many events the delta counts.
	Counted int64
	// Marks are the counted events' IDs: checked against, then added to,
	// the recent-ID record, and checked against verdict labels.
	Marks []Mark
	Delta *Delta
	// DedupTTL is how long the recent-ID record keeps an ID.
	DedupTTL time.Duration
	// Token names this write: Apply records it beside the new watermark,
	// and State returns it (State.Token) until another write moves the
	// watermark, so a writer whose answer was lost can tell whether its
	// write landed.
	Token string
}

// Mark is one counted event's ID and the label it was counted with.
type Mark struct {
	ID string
	IDMark
	// Assumed is the verdict label the event was counted with, or 0 if it
	// was counted with its own Bot flag because no verdict was known.
	Assumed Label
}

// ApplyStatus is what Apply did.
type ApplyStatus int

// Apply outcomes.
const (
	// Applied: the batch is written and the watermark moved.
	Applied ApplyStatus = iota
	// Conflict: the partition's state changed; reload it and filter again.
	Conflict
	// Recheck: nothing was written because some marks were already counted
	// (Duplicates) or carry another verdict label than assumed (Labels).
	Recheck
)

// ApplyResult is Apply's answer.
type ApplyResult struct {
	Status ApplyStatus
	// Duplicates are indexes into Write.Marks of events already counted.
	Duplicates []int
	// Labels maps indexes into Write.Marks to their current verdict label
	// (0: none), for the marks whose label differs from Assumed.
	Labels map[int]Label
	// Switched: the write generation became the read generation.
	Switched bool
}

// Corrections are one partition's verdicts, in FRAUD order.
type Corrections struct {
	Partition int
	// Expect is the partition state the generations below were read from.
	Expect State
	Items  []Correction
}

// Correction is one verdict, resolved into the counts it moves.
type Correction struct {
	ClickID string
	// Mark locates the click in the recent-ID record: a generation whose
	// record holds its fingerprint has counted it.
	Mark     IDMark
	LabelDay Day
	// FraudSeq orders verdicts of one click: a verdict at or below the
	// sequence already recorded is stale and changes nothing.
	FraudSeq uint64
	// To is the verdict's label; Source is the click's own label (Bot flag).
	To     Label
	Source Label
	// ClickSeq is where the click is in CLICKS (in the partition of its
	// code): once the record's bucket of the click is gone, a
	// generation whose watermark is at or past it has counted it.
	ClickSeq uint64
	Link     LinkRef
	Day      Day
	Hour     int
	Country  string
	Referrer string
	// LabelExpiry is when the recorded label may be forgotten.
	LabelExpiry time.Time
}

// CorrectionsResult is what Correct did with one partition's verdicts.
type CorrectionsResult struct {
	// Conflict: the partition's generations changed; nothing was written.
	Conflict bool
	// Items answer Corrections.Items, one each, when the step was applied.
	Items []CorrectionResult
	// Err: the step failed; it may have been applied or not. Applying it
	// again is harmless: a verdict already recorded is stale.
	Err error
}

// CorrectionResult is what Correct did with one verdict.
type CorrectionResult struct {
	Status CorrectionStatus
	// Moved is the number of generations whose counts moved.
	Moved int
}

// CorrectionStatus says how a verdict was applied.
type CorrectionStatus int

// Correction outcomes.
const (
	// Relabelled: the click's label changed (counts moved in Moved
	// generations; 0 if none had counted it yet).
	Relabelled CorrectionStatus = iota
	// Unchanged: the verdict repeats the click's current label.
	Unchanged
	// Stale: a verdict at or after this one was already applied.
	Stale
)

// String is the status's name in metrics: relabelled, unchanged, stale,
// expired, not_counted.
func (s CorrectionStatus) String() string {
	switch s {
	case Relabelled:
		return "relabelled"
	case Unchanged:
		return "unchanged"
	case Stale:
		return "stale"
	case Expired:
		return "expired"
	case NotCounted:
		return "not_counted"
	}
	return "unknown"
}

// DeletedLink is a link LINKS said was deleted, and when its counts may go:
// once no click of it can be counted (or a verdict move one) any more.
type DeletedLink struct {
	Partition int
	Ref       LinkRef
	Until     time.Time
}

// LinkInfo is what LINKS said last about a code.
type LinkInfo struct {
	Owner   string
	Deleted bool
	// Seq is the LINKS sequence of that event.
	Seq uint64
}

// Position is how far a generation has counted.
type Position struct {
	// Seq is the last CLICKS sequence applied in the partition.
	Seq uint64
	// Stored is when that event was stored.
	Stored time.Time
	// Events is how many events the generation has counted.
	Events int64
}

// Snapshot is a link's counts in the read generation, read atomically.
type Snapshot struct {
	State State
	// Read is the read generation's position; Write the recount's.
	Read  Position
	Write Position
	// Exists reports whether the read generation has counted any click of
	// the link.
	Exists    bool
	Total     Pair
	Countries map[string]Pair
	Referrers map[string]Pair
	Days      map[Day]DayCounts
}

// DayCounts are a link's counts on one day.
type DayCounts struct {
	Total   Pair
	Hours   [24]Pair
	Uniques int64
}
