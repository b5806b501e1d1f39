-- clicks: one row per click event, the warehouse's fact table.
--
-- Idempotency lives here, not in the insert path: ClickHouse 18.16 has no
-- insert deduplication for non-replicated tables, and the loader delivers at
-- least once. A redelivered event has the same sorting key (event_id is in
-- it) and the same partition (ts is in both), so ReplacingMergeTree collapses
-- the copies when it merges. Until then a copy is a second row: count events
-- with uniqExact(event_id) or read with FINAL, never with count().
--
-- Portable on purpose: it runs unchanged on Debian's 18.16 and a current
-- server, so no LowCardinality, DateTime64, IPv6, Bool, CODEC or TTL.
-- Times are DateTime('UTC') (seconds; the UUIDv7 event_id carries the
-- millisecond). ip_prefix is the anonymised network ("203.0.113.0/24"); the
-- raw client address never reaches the warehouse. ingested_at is when
-- JetStream stored the event, not now(), so a redelivered row is identical
-- to the first copy.
CREATE TABLE IF NOT EXISTS clicks
(
    event_id         UUID,
    ts               DateTime('UTC'),
    owner            String,
    code             String,
    target           String,
    ip_prefix        String,
    visitor          String,
    user_agent       String,
    referrer         String,
    country          FixedString(2),
    request_id       String,
    bot              UInt8,
    stream_partition UInt16,
    stream_seq       UInt64,
    ingested_at      DateTime('UTC')
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(ts)
ORDER BY (owner, code, ts, event_id)
