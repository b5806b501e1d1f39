// Package linkstore keeps links in Redis and writes their lifecycle events
// into the outbox in the same MULTI/EXEC as the change itself: no link
// without its link.created event and preview job, no event for a link that
// was not stored.
//
// Keys (see package outbox for the shard tag):
//
//	snip:{sN}:link:<code>    hash {owner, target, created (Unix ms), deleted (Unix ms, tombstones only)}
//	snip:preview:<code>      hash {status, title, description, image, site_name, fetched_at, reason}, written by the preview service
//
// A deleted link stays as a tombstone, so its code is never handed to
// someone else: an old short link in an email can never start pointing at a
// stranger's target.
package linkstore
