package reader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/failure"
)

// Event is one click read from CLICKS, with where it was stored.
type Event struct {
	// Click is the decoded, validated payload. Its strings share the
	// message's payload memory (events.ReadClickShared: no allocation per
	// string): a handler that keeps one beyond the batch, as a map key or in
	// a cache, keeps the whole payload alive and should keep
	// strings.Clone of it instead.
	Click events.Click
	// Partition is the CLICKS partition the event is in.
	Partition int
	// Seq is the CLICKS stream sequence; it increases within a partition.
	Seq uint64
	// Stored is when JetStream stored the event.
	Stored time.Time
	// Deliveries counts deliveries of this event to this group (1 = first).
	Deliveries uint64
}

// Handler processes a batch of one partition's events, in stream order. It
// is never called concurrently for the same partition. Its answer follows
// the failure contract every Snip consumer shares (package failure), with
// the batch index a batch handler must add to a permanent error:
//
//   - nil: every event of the batch is done and the batch is acked.
//   - a permanent error naming its event, a *PoisonError (see Poison): the
//     events before Index are done, the event at Index is parked on
//     DEAD_LETTER as dead.<group>.<reason> and acked, and the events after
//     it are handed to the handler again in a new batch. A permanent error
//     without an index (failure.Permanent) parks the event of a one-event
//     batch; in a longer batch the runtime cannot tell which event it is
//     about, so it logs that and retries the batch.
//   - Replay(from, err): nothing of the batch is done, and the handler needs
//     the partition's events again from stream sequence from (at or before
//     the batch's first event), acked or not. The runtime drops the batch
//     unacked, moves the partition's consumer back to from and hands
//     everything from there again, in order, in new batches. For a handler
//     whose store lost events it had acknowledged (the click counter after
//     a Redis failover). Events parked before are parked again (their dead
//     letters carry the same Nats-Msg-Id).
//   - any other error is retryable: the partition waits (exponential backoff
//     with jitter, capped at Config.MaxRetryDelay, never shorter than the
//     error's failure.RetryableAfter) and the same batch is handed again.
//     Nothing after it is processed meanwhile.
//
// The context is cancelled only when the member must stop at once (the drain
// timeout passed); a graceful stop lets the batch in hand finish.
type Handler func(ctx context.Context, partition int, batch []Event) error

// ReplayError is a handler's request to be handed its partition's events
// again from a stream sequence (see Replay).
type ReplayError struct {
	// From is the stream sequence the events are handed again from.
	From uint64
	// Err says why.
	Err error
}

func (e *ReplayError) Error() string {
	return fmt.Sprintf("replay the partition from sequence %d: %v", e.From, e.Err)
}

func (e *ReplayError) Unwrap() error { return e.Err }

// Replay is a handler's answer when it needs the partition's events again
// from stream sequence from, which is at or before the batch's first event
// (see Handler). A from of 0, or past the batch's first event, is a
// mistake: the runtime logs it and retries the batch as after a transient
// error. The server moves the partition back no further than where the
// group started: a from before it is moved up to it (the group never read
// the events before), and a group started at new events (StartAtNew) goes
// back only to its ack floor, logged as an error: the events from from up
// to the floor are not handed again. Where the partition's consumer was
// deleted and created again since the batch was delivered, the new one
// goes no further than its own ack floor, so it hands every event it has
// not handed (from its start, for a group created again at the oldest).
// One deleted and not yet created again, the runtime creates it (as the
// group's config says) and goes the same way: the partition goes on.
func Replay(from uint64, err error) error { return &ReplayError{From: from, Err: err} }

// PoisonError marks one event of a batch as one that can never be
// processed: failure.Permanent with the event's index in the batch.
type PoisonError struct {
	// Index is the position of the event in the batch.
	Index int
	// Reason is a short token for the dead-letter subject, e.g. "bad_target".
	Reason string
	// Err is what went wrong.
	Err error
}

func (e *PoisonError) Error() string {
	return fmt.Sprintf("poison event at batch index %d (%s): %v", e.Index, e.Reason, e.Err)
}

// Unwrap returns the permanent failure (package failure) the error stands
// for, which wraps Err: failure.Classify of a PoisonError is Park with its
// Reason, and errors.Is finds Err.
func (e *PoisonError) Unwrap() error { return failure.Permanent(e.Reason, e.Err) }

// Poison returns a *PoisonError for batch[index]: the event is parked under
// reason.
func Poison(index int, reason string, err error) error {
	return &PoisonError{Index: index, Reason: reason, Err: err}
}

// Dead-letter reasons the runtime itself uses: an event that fails
// events.ReadClick is parked under events.Reason of its error, before any
// handler sees it (these two, and events.ReasonSubjectMismatch,
// ReasonWrongPartition and ReasonImplausibleTime).
const (
	// ReasonMalformed: the payload is not a valid click.
	ReasonMalformed = events.ReasonMalformed
	// ReasonUnknownVersion: the payload's schema version is not one this
	// build reads.
	ReasonUnknownVersion = events.ReasonUnknownVersion
)

// Start says where a group's consumers begin when they are first created.
// It is ignored for consumers that exist: a group resumes where it was.
//
// Every reader says it the same way, in code (StartAtOldest, StartAtNew,
// StartAtTime, StartWithin) or in configuration (ParseStart: "oldest",
// "new", a duration such as "72h", or an RFC 3339 time). Start implements
// encoding.TextUnmarshaler, so a Config field of type Start reads its
// environment variable directly.
type Start struct {
	policy startPolicy
	time   time.Time
	within time.Duration
}

type startPolicy int

const (
	startOldest startPolicy = iota
	startNew
	startTime
	startWithin
)

// StartAtOldest starts a new group at the oldest event CLICKS retains.
func StartAtOldest() Start { return Start{policy: startOldest} }

// StartAtNew starts a new group with the events published after it joined.
func StartAtNew() Start { return Start{policy: startNew} }

// StartAtTime starts a new group at the first event stored at or after t:
// "load the last three days first" is StartAtTime(time.Now().Add(-72*time.Hour)).
func StartAtTime(t time.Time) Start { return Start{policy: startTime, time: t} }

// StartWithin starts a new group at the first event stored within d before
// its consumers are created: "load the last three days first" said once in
// configuration, StartWithin(72*time.Hour).
func StartWithin(d time.Duration) Start { return Start{policy: startWithin, within: d} }

// ParseStart reads a Start from configuration: "oldest", "new", a positive
// Go duration (StartWithin: "72h" loads the last three days first) or an
// RFC 3339 time (StartAtTime).
func ParseStart(s string) (Start, error) {
	switch s {
	case "oldest":
		return StartAtOldest(), nil
	case "new":
		return StartAtNew(), nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		if d <= 0 {
			return Start{}, fmt.Errorf("start %q: a duration must be positive: %w", s, ErrBadConfig)
		}
		return StartWithin(d), nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return StartAtTime(t), nil
	}
	return Start{}, fmt.Errorf("start %q: want oldest, new, a positive duration or an RFC 3339 time: %w", s, ErrBadConfig)
}

// UnmarshalText is ParseStart, for configuration loaders.
func (s *Start) UnmarshalText(b []byte) error {
	v, err := ParseStart(string(b))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// String is the Start as ParseStart reads it.
func (s Start) String() string {
	switch s.policy {
	case startNew:
		return "new"
	case startTime:
		return s.time.UTC().Format(time.RFC3339Nano)
	case startWithin:
		return s.within.String()
	}
	return "oldest"
}

// from is where the group's consumers begin if they are created at now:
// the zero time for the oldest event or the new ones, per policy.
func (s Start) from(now time.Time) time.Time {
	switch s.policy {
	case startTime:
		return s.time
	case startWithin:
		return now.Add(-s.within)
	}
	return time.Time{}
}

// Config configures a member.
type Config struct {
	// Group is the consumer group, e.g. topology.GroupClickCounter.
	Group string
	// Member identifies this instance; it must be unique in the group and a
	// subject token. Default: hostname-pid-random.
	Member string
	// Partitions is the number of CLICKS partitions; 0 reads it from the
	// stream (topology.Partitions), which is what services should do.
	Partitions int
	// BatchSize is the most events handed to the Handler at once (default 500).
	BatchSize int
	// Linger is the longest the runtime waits to fill a batch before handing
	// over what it has (default 100ms).
	Linger time.Duration
	// LeaseTTL is how long a silent member stays in the group: the failover
	// time after a crash (default 3s). Members heartbeat every LeaseTTL/3,
	// each write's answer counting up to LeaseTTL after it was sent.
	LeaseTTL time.Duration
	// AckWait is how long JetStream waits for an ack before redelivering
	// (default 60s). The runtime signals progress every AckWait/3 from a
	// batch's decoding to its ack (the handler running, a retry's wait, an
	// event's parking) and while a fetched batch waits its turn, so a
	// handler may take longer than AckWait: it bounds only how long a
	// process that died or froze holds events.
	AckWait time.Duration
	// AckTimeout is how long the runtime waits for the server to confirm
	// an ack (a batch's, or an owner's ack again of the last event it
	// handled) before it takes the ack as lost (default 10s). A batch's
	// lost ack is healed by the next batch's, or the batch comes again; an
	// ack the server never answers (one refused, or sent to a consumer
	// created again under the owner) holds the partition up this long.
	AckTimeout time.Duration
	// MaxRetryDelay caps the backoff between retries of a failing batch,
	// and of a failing move back for a delivery gap or a Replay (default
	// the smaller of 10s and AckWait/3, so the batch's ack timers are
	// refreshed in time). A failing fetch backs off no longer than an idle
	// pull waits (LeaseTTL/2), so its owner keeps the partition's pin.
	MaxRetryDelay time.Duration
	// DrainTimeout bounds a graceful stop: finishing the batch in hand and
	// acking it (default 30s).
	DrainTimeout time.Duration
	// Start is where the group's consumers begin if they do not exist yet.
	Start Start
	// Metadata, if set, is added to the metadata of each consumer the member
	// creates, and like Start it is fixed at creation: a note that lives and
	// dies with the group's consumers, which the reader reads back on its
	// next start (the warehouse loader records its backfill cut there, so a
	// partition whose consumer a first start never created gets the same
	// cut). The runtime's own keys ("snip.group", "snip.partition") win.
	Metadata map[string]string
	// OnAssign, if set, is called when this member becomes the owner of a
	// partition, before the first batch; resumeSeq is the first sequence that
	// may be handed out (the consumer's ack floor + 1). An error is retried
	// with the handler's backoff, with the same resumeSeq, for as long as
	// the partition is this member's: the member keeps it meanwhile (no
	// OnRevoke, nothing handed out, no other member reading it). If another member
	// acked the partition after this one took it over (a member that had not
	// yet heard the partition moved), the first batch finds the ack floor
	// moved: OnRevoke is called, then OnAssign again with resumeSeq the
	// first batch's first sequence, so state rebuilt from the log up to
	// resumeSeq always meets the first event handed out.
	OnAssign func(ctx context.Context, partition int, resumeSeq uint64) error
	// OnRevoke, if set, is called after the member stopped processing a
	// partition and acked what it handled.
	OnRevoke func(partition int)
	// OnRewind, if set, is called on the owner of a partition when a replay
	// (Rewind) reaches it: after the member stopped processing the partition
	// and acked what it handled, and before the consumer moves back to
	// r.From. A reader that deduplicates by sequence uses it to start a new
	// generation of its state. The runtime decides before the call whether
	// the partition moves back at all, and says so in r.MovesBack: a reader
	// that keeps its state when nothing is replayed goes by it, never by a
	// position of its own, so its state and the consumer agree. If the
	// partition moves while OnRewind runs, the consumer is left where it is
	// and the rewind to the next owner, whose OnRewind is called for it in
	// turn (and who decides again). If the partition's consumer is deleted
	// and created again while OnRewind runs, the decision, made on the one
	// before, is made again on the new one: OnRewind is called again, or,
	// where the request was made for the one before, not at all (the
	// request is void for the new one, which starts at its own ack floor).
	// One deleted and not created again the owner creates (as the group's
	// config says) and goes the same way.
	OnRewind func(ctx context.Context, partition int, r RewindInfo) error
	// OnPassed, if set, is called when the runtime passes stream positions
	// of a partition that the handler never completed: a batch whose last
	// events were parked, by the runtime before the handler saw them (the
	// rule of validity) or as poison on the handler's answer. The handler
	// learns of every other position from a later batch, but not of these
	// until the partition's next valid event, which may never come: a reader
	// that waits for a position (a recount that ends at RewindInfo.Until)
	// uses OnPassed to learn it has been passed. It is called after those
	// events are on DEAD_LETTER and before the batch is acked, on the
	// partition's worker (never concurrently with the handler for the
	// partition), and not for a batch whose last event the handler completed.
	// Its answer follows the handler's contract: nil acks the batch;
	// Replay(from) with from at or before PassedInfo.First drops the batch
	// unacked and hands the partition's events again from there; any other
	// error (a permanent one included: the events are parked already) is
	// retried with the handler's backoff, and nothing after the batch is
	// processed meanwhile. A batch handed again (a crash before the ack)
	// calls it again with the same positions: it must be idempotent.
	OnPassed func(ctx context.Context, partition int, p PassedInfo) error
	// Logger receives the runtime's logs (default: discard).
	Logger *slog.Logger
	// Metrics, if set, receives the runtime's Prometheus collectors.
	Metrics prometheus.Registerer
}

// RewindInfo describes a replay as one partition sees it.
type RewindInfo struct {
	// ID identifies the replay request (a UUIDv7).
	ID string
	// From is the first sequence of this partition the replay hands out
	// again: never before where the partition's consumer started (a
	// replay asked from earlier starts there: Rewind, and the runtime for
	// a request an older version stored).
	From uint64
	// Until is the last sequence stored in this partition when the replay was
	// requested: once the group has handled it, the replay has caught up.
	Until uint64
	// Requested is when the replay was asked for.
	Requested time.Time
	// MovesBack reports whether the partition's consumer moves back to From
	// after OnRewind returns: From is at or before the event after the last
	// one the partition handled (by its ack floor, or by what its owner
	// handled past a floor an ack lost on its way left behind). When false
	// (From is past that, the partition holds nothing to replay, or the
	// server moves its consumer back only to its ack floor: a request
	// stored before Rewind refused a group started at new events), the
	// partition goes on where it was, after the last event it handled
	// (past a lost ack too, which the move acks; in a group started at new
	// events, whose consumers the server moves only back to their ack
	// floor, the owner acks that event again first, and goes on from the
	// floor, right after it: only where that ack fails too are the events
	// past the floor handed again), and a reader keeps its state.
	MovesBack bool
}

// PassedInfo describes the positions OnPassed is told about: the events of
// the partition from First through Last, the batch's last, were parked and
// none was completed by the handler.
type PassedInfo struct {
	// First is the stream sequence of the first of those events.
	First uint64
	// Last is the stream sequence of the last: the batch's last event,
	// which the partition's ack now covers.
	Last uint64
	// Stored is when JetStream stored the event at Last.
	Stored time.Time
}

// Position is where a replay starts.
type Position struct {
	seq  uint64
	time time.Time
}

// FromSeq replays from stream sequence seq (in each partition, the first
// event at or after it).
func FromSeq(seq uint64) Position { return Position{seq: seq} }

// FromTime replays from the first event stored at or after t.
func FromTime(t time.Time) Position { return Position{time: t} }

// PartitionLag is how far one partition of a group is behind.
type PartitionLag struct {
	Partition int
	// Consumer is the durable consumer's name.
	Consumer string
	// Pending is the number of events not yet delivered to the group.
	Pending uint64
	// AckPending is the number delivered but not yet acked.
	AckPending int
	// OldestUnprocessed is when the oldest event not yet acked was stored;
	// zero when the partition is caught up.
	OldestUnprocessed time.Time
	// AckFloor is the last stream sequence acked with everything before it.
	AckFloor uint64
	// Pinned is the client ID currently pinned to the partition, if any.
	Pinned string
}

// Errors.
var (
	// ErrNoGroup means the group has no consumers on CLICKS.
	ErrNoGroup = errors.New("consumer group not found")
	// ErrBadConfig means a Config field is out of range.
	ErrBadConfig = errors.New("invalid reader config")
	// ErrDuplicateMember means another process runs in the group under
	// this member's name (Config.Member) and joined first: Run returns it,
	// and the other goes on. Member names must be unique in a group.
	ErrDuplicateMember = errors.New("another process runs under this member name; member names must be unique in a group")
	// ErrRewindVoid means a rewind will never be carried out: a partition
	// that has not carried it out has a consumer other than the one the
	// request was made for (WaitRewind).
	ErrRewindVoid = errors.New("the group was deleted or created again after this replay was requested")
	// ErrRewindSuperseded means a rewind will never be carried out: another
	// was requested of the group after it, and the partitions carry out
	// the group's latest request only (WaitRewind).
	ErrRewindSuperseded = errors.New("another replay of the group was requested after this one; it replaces it")
	// ErrRewindUnknown means no rewind with the ID waited for was found
	// stored for the group (WaitRewind).
	ErrRewindUnknown = errors.New("no replay with this ID was requested of the group")
	// ErrNotReplayable means a group cannot be replayed: its consumers were
	// created at new events (StartAtNew, the webhooks group) or at the last
	// ones, and the server moves such a consumer back only to its ack
	// floor (Rewind).
	ErrNotReplayable = errors.New("JetStream cannot move its consumers back")
	// ErrReplayRequestedMeanwhile means another replay of the group was
	// stored after CheckReplay read the group's latest request and before
	// RewindAfter stored its own: RewindAfter stored nothing, so that the
	// caller, not told its replay replaces that one, replaces nothing.
	ErrReplayRequestedMeanwhile = errors.New("another replay of the group was requested meanwhile")
)
