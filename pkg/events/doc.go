// Package events is Snip's wire contract: the streams and subjects events travel
// on, the JSON payloads that travel there, and the schema version every payload
// carries.
//
// Every publisher and every consumer imports this package, so a field or a
// subject exists in exactly one place. Payloads are JSON with a "v" field; a
// reader that meets a version it does not know gets ErrUnknownVersion and parks
// the event instead of guessing. Every event carries an ID, a UUIDv7 assigned
// once at the source (NewID) and sent as the Nats-Msg-Id header, so JetStream's
// duplicate window drops publish retries and readers can deduplicate
// redeliveries by ID.
//
// Owner IDs and link codes are subject tokens (ValidToken): letters, digits,
// '-' and '_'. That keeps subjects such as clicks.<owner>.<code> safe to build
// by concatenation.
//
// Validity is one rule, here: ReadClick (DecodeClick, then CheckClick: the
// subject and the payload agree on owner, code and partition, and the time is
// plausible). Every reader and the outbox relay apply it, so an event invalid
// for one of them is parked by all, under the same Reason, and counted by none.
// A click in the one shape Snip writes is read by a direct parser
// (canonical.go) and any other payload by the general JSON decoder; both
// read every input the same (FuzzCanonicalClickMatchesDecoder).
package events
