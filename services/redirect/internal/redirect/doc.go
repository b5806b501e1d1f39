// Package redirect is the hot path: resolve a code to its link through an
// in-process cache, build the click event, and get it into the outbox before
// the caller answers 302.
//
// The cache (otter, bounded by entry count, entries expire after a TTL) is
// kept fresh by the LINKS stream: every instance follows LINKS with an
// ordered consumer from "new" and drops a code when it is deleted anywhere
// (WatchLinks). The TTL bounds staleness while NATS is away.
//
// The click is encoded by hand into a pooled buffer (AppendClick) rather
// than with encoding/json: it is the only per-request encoding, and the
// benchmark shows the difference (docs/benchmarks.md, "## Redirect").
package redirect
