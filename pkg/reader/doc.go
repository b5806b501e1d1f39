// Package reader runs a consumer group on CLICKS: the runtime every log
// reader (click counter, fraud detection, warehouse loader) is built on.
//
// # The group
//
// CLICKS is partitioned by link code (a stream subject transform puts the
// partition number in front of every subject). A group has one durable
// consumer per partition, "<group>-p<N>", filtered on "<N>.clicks.>". Each
// partition is read by exactly one member of the group at a time, so events
// of one link are handled in order, one at a time, by one process:
//
//   - Members announce themselves with heartbeat leases in the snip_members
//     KV bucket (key "<group>.members.<member>", per-key TTL). A member that
//     stops heartbeating expires; one that stops gracefully deletes its key.
//     A member fences itself by its own clock: once no heartbeat of its own
//     was stored for a lease TTL from its sending (cut off from NATS, whose
//     bucket it then sees nothing of, its own lease's lapse included; or
//     frozen; or every answer slower than the lease), it hands its handler
//     nothing more, acks nothing, and gives its partitions up (OnRevoke),
//     without unpinning them; once a heartbeat is stored after such a
//     lapse, it takes whatever the assignment gives it afresh (OnAssign),
//     another member having maybe held it meanwhile; each such heartbeat is
//     counted (snip_reader_lease_lapses_total). Heartbeats go out every
//     LeaseTTL/3 whether or not the ones before were answered, and an
//     answer counts however late it comes within the lease its write
//     extends (later, it says nothing of when the write was stored): a slow
//     NATS or a loaded host costs no lapse while answers take less than a
//     lease TTL.
//     Member names must be unique in a group: each lease carries a random
//     instance token, and a member that sees its key written by another
//     process logs an error naming it and counts it
//     (snip_reader_duplicate_member_leases_total); the one of the two that
//     joined later stops (ErrDuplicateMember), leaving the key to the other.
//   - Every member computes the same assignment from the live members and
//     the partitions each says it holds (its claims, in its heartbeat):
//     claims are kept up to the bound ceil(partitions/members), the rest go
//     by rendezvous hashing with bounded load (AssignSticky). So no member
//     has more than the bound, and when a member dies while idle members
//     exist only its partitions move, to idle members. With 6 partitions
//     and 10 members, exactly 6 members work. A member claims nothing while
//     its lease may have lapsed by its own clock, and the claims of the
//     first lease a member writes after the others saw its lease go are of
//     before (a heartbeat its client kept while reconnecting, or sent
//     frozen past its lease): the others count it live, not its claims.
//   - The consumers use JetStream's pinned_client priority policy, so even
//     while members disagree during a change only one client can pull a
//     partition. A member that gives a partition up finishes and acks its
//     batch, then unpins it so the next owner starts at once; the pin is
//     its own until then, however long the handler takes (an owner holding
//     a batch pulls at most one byte every LeaseTTL/3, which delivers
//     nothing and keeps the pin the server drops after a lease TTL without
//     a pull).
//   - A new owner whose predecessor died resets the consumer to its ack floor
//     before reading, so the events the dead member had in flight come first
//     and order per link holds across the move.
//
// # Batches and acknowledgement
//
// The runtime hands the Handler a batch of one partition's events in stream
// order (up to BatchSize, waiting at most Linger to fill it) and acks the
// batch when the handler returns nil. A partition with nothing to read,
// busy before or not, waits for its next event with one pull at a time,
// each waiting up to LeaseTTL/2 (100ms to 5s). While the handler runs,
// while it waits to retry, while an event is being parked and while the
// next batch waits its turn, the runtime marks the events in progress every AckWait/3
// (package inprogress, which the work queue's jobs use too), so a
// slow handler (or a DEAD_LETTER that is away) causes no redelivery. A retryable error makes the partition
// wait and retry the same batch with backoff; Replay(from) has the
// consumer moved back and the events handed again from there (a move back
// that fails, NATS away or the consumer gone, is tried again with the same
// backoff, the first failure and every tenth logged; a consumer gone is
// created again, as a fetch that finds it gone does, and the move goes by
// the new one's ack floor); a permanent one naming its
// event (Poison) parks that event on DEAD_LETTER and moves on. That is the
// failure contract every Snip consumer shares (package failure); the work
// queue beside this log runtime (package workqueue) reads its handlers'
// answers the same way. Each click is decoded in place, its strings sharing
// the message's payload (events.ReadClickShared). Events that fail the one
// rule of validity (events.ReadClick: malformed, unknown schema version, subject and payload
// disagreeing on owner, code or partition, implausible time) are parked by
// the runtime before the handler sees them, so every reader parks the same
// events.
//
// A handler learns where its partition stands from the events it is
// handed: a parked event between two valid ones is passed when the next is
// handed. A batch that ends in parked events (or holds nothing else) is
// acked without the handler learning of those positions; a reader that
// waits for a position (the click counter's recount switches once it has
// passed the last event stored when the replay was asked) sets
// Config.OnPassed, called with the positions passed after the events are
// parked and before the ack. Readers that leave it unset see no change.
//
// # Replays
//
// Rewind asks a group to replay CLICKS from a sequence or a time: each
// partition's owner stops, acks, decides once whether the partition moves
// back (the replay's start at or before the event after the last one the
// partition handled: by its ack floor, or past it by what the owner handled
// and acked, an ack lost on its way), tells the reader (Config.OnRewind,
// RewindInfo.MovesBack; the consumer deleted and created again meanwhile, it
// decides again on the new one), moves the consumer back if so (if not, it
// goes on after the last event it handled; in a group started at new events,
// whose consumers the server moves back only to their ack floor, the owner
// first acks that event again, which brings the floor up to it, and only
// where that ack fails too are the events past the floor handed again) and
// records that it did. A reader with state goes by that decision, not by a
// position of its own, so its state and the consumer never disagree. A
// request is for the consumers the group had when it was made (it records
// when each was created): if they are deleted and the group is created again
// before a partition carried it out, the new group ignores it, and the
// request is void: LatestRewind shows those partitions Void, never to be
// done, and WaitRewind ends with ErrRewindVoid rather than waiting. A
// partition's consumer deleted while its owner carries the request out
// (and not created again by anyone else) the owner creates again, at the
// group's start: the request is void for it too, and the partition goes on
// from the new consumer's start, not from the request's From. A group
// has one request at a time: another replay requested before the partitions
// carried one out replaces it (they carry out the latest), and WaitRewind
// for the one replaced ends with ErrRewindSuperseded, naming the latest,
// once it reads that stored after the one it waits for. A request it never
// reads stored (a wrong ID) ends the wait after ten seconds, not at once
// (the server read may lag behind the request): ErrRewindUnknown.
//
// Before it asks Rewind, a surface that replays a group (snipctl, the
// console) asks CheckReplay: CheckRecount (a click-counter replay that
// would recount nothing, refused unless forced), CheckPosition, which
// refuses a position CLICKS holds
// nothing after (ErrNothingToReplay: after its last event, or CLICKS
// empty; Rewind would store a replay that moves nothing back) and warns
// of one before CLICKS' oldest event (the replay starts there), and
// ReplayUnderWay, which warns that the new request replaces the group's
// replay under way. The surface then asks RewindAfter with the revision
// the check read (ReplayWarnings.Revision), which stores the request only
// if no other was stored since (ErrReplayRequestedMeanwhile): a replay
// requested between the check and the request is not replaced unwarned.
//
// A replay goes back no further than where the group started, the lowest
// sequence the server moves its consumers back to: a group started at the
// oldest event goes back anywhere, one started at a time (StartAtTime,
// StartWithin) to each partition's first event at or after it, so a replay
// from before it starts there (RewindStatus: PartitionRewind.AtGroupStart).
// A group started at new events (StartAtNew, the webhooks group) the
// server moves only back to its ack floor: Rewind refuses it
// (ErrNotReplayable) and stores nothing. A partition's owner goes by the
// same bound (a request stored by an older version, or for consumers
// created again since): a replay from before the start starts there, and
// one the server would refuse altogether is nothing to replay (OnRewind
// told MovesBack false), never a move retried for ever. So is a handler's
// Replay(from): from before the start is moved up to it (the group never
// read the events before); a group started at new events goes back to its
// ack floor, the events before it missed, and says so in an error log; a
// partition whose consumer was created again since the batch goes no
// further than the new one's ack floor, never past events it never handed.
//
// A delivery the server made that never reached the member (a gap in the
// consumer's delivery count) is not acked past: the batch is handled up to
// it, and the partition goes on after the last event handled (its ack floor,
// or past it where the ack of that batch was lost on its way; a group
// started at new events, which the server moves back only to its ack floor,
// gets there by the owner acking that event again first, and hands the
// events past the floor again only where that ack fails too). A
// partition's consumer deleted and created again under its owner counts
// its deliveries from 1 again, which can read as a gap: what the owner
// handled was of the consumer before, so the partition goes on from the
// new one's ack floor, and the group created again is handed every event
// from its start, even where the first reset after the gap fails and is
// tried again. One deleted and not created again before the move back is
// created again by the owner, at the group's start, and goes the same way;
// so is one whose owner's fetch finds it gone, tried again until it is
// created (a first try can fail: refused, or racing the server's delete).
//
// Delivery is at least once: after a crash or a partition move, the events
// after the last acked batch are handed out again. Handlers are idempotent
// (each reader's README says how); Event.Seq increases within a partition,
// which makes a per-partition high-water mark a cheap first line of defence.
package reader
