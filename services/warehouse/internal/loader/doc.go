// Package loader is the warehouse loader's core: it turns the click batches
// the reader runtime hands it into few, large ClickHouse inserts, and returns
// for a batch only once its rows are in ClickHouse, so an event is acked
// only after the warehouse accepted it.
//
// # Batching across partitions
//
// The runtime hands a member one batch per partition at a time and waits for
// the handler before handing over more of that partition (it fetches one
// batch ahead). With eight partitions
// each batch holds an eighth of the traffic, and inserting each on its own
// would mean eight small inserts where ClickHouse wants one large one (each
// insert costs 20 to 70 ms whatever its size on 18.16, and current servers
// ask for about one insert a second per table). So Handle adds its rows to a
// shared open group and blocks; a single flusher goroutine inserts the group
// when it holds MaxRows rows (a full group takes no more, so an insert holds
// at most MaxRows plus one batch) or its oldest row has waited Linger, then
// wakes every handler whose rows it held. A partition's ack still follows the
// insert of its own rows, and the partition hands over nothing more
// meanwhile (the runtime fetches at most one batch ahead), so memory is
// bounded by partitions x 2 x the runtime's batch size.
//
// The linger is for live traffic. A batch from a backlog (its newest event
// was stored more than a linger ago: a catch-up after an outage, a backfill,
// a replay) does not wait for it: its group is inserted as soon as the
// flusher is free, the rows that gathered during one insert making the next
// (group commit). Waiting would only hold up partitions that have work, and
// the inserts grow by themselves when ClickHouse is the slower side.
//
// # Failures
//
// A failed insert fails every handler in its group with the error, and the
// groups queued behind it with it, untried (one at a time against a frozen
// server, each would wait out its own InsertTimeout); the runtime retries
// each batch with backoff and the stream holds everything behind it, so a
// ClickHouse outage stops the loader without losing a click, and the
// runtime's lag metrics say how far behind it is. A row the client
// refuses that is not well-formed (RowError; see Row.Validate) is parked
// with reader.Poison and the others are inserted again at once. Errors only
// an operator can fix (ErrPermanent: a table that no longer fits, such as a
// column whose changed type the client refuses well-formed rows for, missing
// grants, a server taking fewer partitions per insert than the writer sends)
// are not the events' fault: they are logged as errors and retried
// every PermanentRetryDelay, never parked.
//
// Delivery into ClickHouse is at least once: a crash after an insert and
// before the ack, or an insert that failed halfway, loads rows again. The
// schema makes that harmless (ReplacingMergeTree keyed by event ID, and
// queries that count distinct event IDs), and RowFromEvent makes the same
// message read again the same row (a republish under another message ID
// differs in IngestedAt and Seq, and is collapsed all the same).
package loader
