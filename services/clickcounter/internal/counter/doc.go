// Package counter is the click counter's logic: it turns batches of clicks
// from one CLICKS partition into per-link counts, exactly once, and keeps
// them correct through redelivery, duplicate publishes, fraud verdicts and
// recounts.
//
// # Exactly once, from at-least-once
//
// The reader runtime hands a partition's events in stream order to one member
// at a time, and may hand them again (a crash before the ack, a partition
// move, a replay). The counter makes that harmless with two checks, both
// written atomically with the counts in one Redis script per batch:
//
//   - a per-partition watermark, the last stream sequence applied: events at
//     or below it are skipped (redelivery and replay overlap cost nothing);
//   - a record of recently counted event IDs, for the one case the watermark
//     cannot see: the same event stored twice under two sequences (an outbox
//     relay that retried a publish after JetStream's duplicate window).
//
// The script checks that the watermark is still the one the batch was
// filtered against (compare-and-set), so two members that briefly both hold
// a partition during a handover cannot both count a batch.
//
// # Aggregation
//
// A batch is folded into a Delta in Go before anything is written: a link
// with 500 clicks in a batch becomes one HINCRBY of 500, so a viral link is
// not a hot key and the write cost follows the number of distinct links in a
// batch, not the number of clicks.
//
// # Generations and recounts
//
// Counts live in numbered generations. Readers read the partition's read
// generation; batches write its write generation (the same one, except during
// a recount). A replay from the oldest retained event starts a new, empty
// write generation; the old one keeps serving reads, frozen, until the new
// one has caught up with the position the replay was asked at, and then one
// write in the batch script makes the new generation the read generation.
// The stats never show a half-rebuilt number. Events the reader runtime
// parks at the end of a batch are passed the same way (OnPassed: the batch
// script with no counts), so a recount whose last events were parked
// switches without waiting for another click.
//
// # Fraud verdicts
//
// A verdict labels one click as bot or human. The label is kept per click ID
// (for as long as CLICKS retains the click), and applied twice over: at once,
// by moving the click between its human and bot counts in every generation
// that already counted it, and at count time, for every generation that
// counts it later (a recount, or a click the counter has not reached yet).
//
// Store is the persistence the counter needs; package redisstore implements it.
package counter
