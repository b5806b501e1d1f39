// Package outbox is the redirect service's transactional outbox in Redis and
// the relay that moves it to JetStream.
//
// Writers put an event into the outbox in the same Redis round trip as the
// change it describes: a link and its link.created event and preview job in
// one MULTI/EXEC (package linkstore), a click before its 302 (Committer, a
// group commit). The Relay, which runs in every redirect instance, publishes
// the entries to JetStream with Nats-Msg-Id set to the event ID and deletes an
// entry only after JetStream acknowledged it. So a crash anywhere loses
// nothing: what is in the outbox is published at least once, and the stream's
// duplicate window (plus readers' dedup by event ID) makes that once.
//
// Layout (docs/decisions/0010-redirect-outbox.md has the reasoning):
//
//	snip:{sN}:link:<code>       hash: a link (package linkstore)
//	snip:{sN}:outbox:clicks     stream: clicks for CLICKS
//	snip:{sN}:outbox:links      stream: link events for LINKS
//	snip:{sN}:outbox:jobs       stream: preview jobs for PREVIEW_JOBS
//	snip:{sN}:outbox:lease      string: the relay lease of shard N (token)
//	snip:{sN}:outbox:dead       stream: entries parked when even DEAD_LETTER refused them
//	snip:outbox:shards          string: the shard count, fixed at first start
//	snip:outbox:relays          sorted set: live relay instances (heartbeats)
//
// N = Layout.Shard(code), a hash of the link code, so every event of one link
// is in one shard, in order, and the {sN} hash tag puts a link and its shard's
// outbox in one Redis Cluster slot, where one MULTI/EXEC can span them.
// Each shard is relayed by one instance at a time under a lease, which keeps
// order per link and hands a dead instance's shards to the others.
//
// A batch JetStream acknowledged whose delete Redis did not answer is also
// recorded in NATS, in the KV bucket snip_outbox_untrimmed under
// <shard>.<lane> (Records), for an instance that takes the shard over
// before the relay deletes it: it deletes the batch instead of publishing
// it again (decision 0177).
//
// An outbox entry has three fields: id (the event ID, sent as Nats-Msg-Id),
// subject and data (the JSON payload); a click's entry has a fourth, until,
// its validity (see Late).
package outbox
