-- clicks_hourly: per link and hour, the rollup the dashboards read.
--
-- The columns are aggregate states, not numbers, so they stay exact when an
-- event is inserted twice: clicks is the set of event IDs (uniqExact), so a
-- copy adds nothing. A SummingMergeTree count would count the copy.
-- visitors is uniq over the anonymised visitor identity (exact up to 65,536
-- per state, within about 2 % beyond). inserted_rows counts every row the
-- view received, copies included: inserted_rows minus clicks is how many
-- redeliveries the warehouse absorbed.
--
-- bot is in the key rather than in an -If state (uniqExactIfState does not
-- fit an AggregateFunction(uniqExact, UUID) column on 18.16): read human
-- clicks with uniqExactMergeIf(clicks, bot = 0).
CREATE TABLE IF NOT EXISTS clicks_hourly
(
    hour          DateTime('UTC'),
    owner         String,
    code          String,
    bot           UInt8,
    clicks        AggregateFunction(uniqExact, UUID),
    visitors      AggregateFunction(uniq, String),
    inserted_rows AggregateFunction(count)
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(hour)
ORDER BY (owner, code, hour, bot)
