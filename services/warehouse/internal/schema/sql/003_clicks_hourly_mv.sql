-- clicks_hourly_mv feeds clicks_hourly from every block inserted into
-- clicks. It sees inserts, not merges: it must exist before the first click
-- is loaded (the loader applies the schema before it inserts). If an insert
-- fails halfway, clicks may hold rows the view never saw; the loader retries
-- the whole batch, and the uniqExact state absorbs the rows seen twice.
CREATE MATERIALIZED VIEW IF NOT EXISTS clicks_hourly_mv TO clicks_hourly AS
SELECT
    toStartOfHour(ts)        AS hour,
    owner,
    code,
    bot,
    uniqExactState(event_id) AS clicks,
    uniqState(visitor)       AS visitors,
    countState()             AS inserted_rows
FROM clicks
GROUP BY hour, owner, code, bot
