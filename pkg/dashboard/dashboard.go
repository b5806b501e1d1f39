// Package dashboard holds the warehouse's named queries: the numbers a
// dashboard shows (clicks per link per hour, top links of the last 24 hours,
// unique visitors) and the reconciliation count a load test compares with
// what it sent.
//
// Every query counts distinct event IDs (uniqExact, or uniqExactMerge of the
// hourly rollup's states), never rows, so a click loaded twice is counted
// once whether or not ClickHouse has merged the copies yet. The SQL is
// portable between ClickHouse 18.16 and current servers: positional
// client-side binds (server-side {name:Type} parameters fail on 18.16), no
// CTEs, no window functions.
//
// The warehouse loader (services/warehouse) writes the tables these queries
// read, and both it and the console (services/console) ask them; the schema
// is the warehouse's (services/warehouse/internal/schema, copied to
// deploy/clickhouse). The SQL is in exported constants so that an operator
// can run the same text in clickhouse-client.
// An alias never reuses a column's name: ClickHouse resolves a name to the
// alias first, so "uniqExactMerge(clicks) AS clicks" would turn a later
// uniqExactMergeIf(clicks, ...) into an aggregate of an aggregate.
package dashboard

import (
	"context"
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// Queries runs the named queries on a connection whose default database holds
// the warehouse's tables.
type Queries struct {
	conn driver.Conn
}

// New returns the queries on conn.
func New(conn driver.Conn) *Queries { return &Queries{conn: conn} }

// HourClicks is one hour of one link.
type HourClicks struct {
	// Hour is the start of the hour, UTC.
	Hour time.Time
	// Clicks counts distinct click events, bots included.
	Clicks uint64
	// BotClicks counts the clicks labelled as bots at the source.
	BotClicks uint64
	// Visitors estimates distinct visitors (exact up to 65,536 per hour).
	// The visitor identity's key rotates daily, so one person is one visitor
	// per day at most.
	Visitors uint64
}

// ClicksPerHourSQL reads the hourly rollup of one link for [from, to).
const ClicksPerHourSQL = `
SELECT
    hour,
    uniqExactMerge(clicks)            AS total_clicks,
    uniqExactMergeIf(clicks, bot = 1) AS bot_clicks,
    uniqMerge(visitors)               AS unique_visitors
FROM clicks_hourly
WHERE owner = ? AND code = ? AND hour >= ? AND hour < ?
GROUP BY hour
ORDER BY hour`

// ClicksPerHour returns the hours of [from, to) in which link owner/code was
// clicked, oldest first. from is rounded down to its hour.
func (q *Queries) ClicksPerHour(ctx context.Context, owner, code string, from, to time.Time) ([]HourClicks, error) {
	rows, err := q.conn.Query(ctx, ClicksPerHourSQL, owner, code, hourOf(from), to.UTC())
	if err != nil {
		return nil, fmt.Errorf("query clicks per hour of %s/%s: %w", owner, code, err)
	}
	defer rows.Close()
	var out []HourClicks
	for rows.Next() {
		var h HourClicks
		if err := rows.Scan(&h.Hour, &h.Clicks, &h.BotClicks, &h.Visitors); err != nil {
			return nil, fmt.Errorf("scan clicks per hour of %s/%s: %w", owner, code, err)
		}
		h.Hour = h.Hour.UTC()
		out = append(out, h)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read clicks per hour of %s/%s: %w", owner, code, err)
	}
	return out, nil
}

// LinkClicks is one link's clicks over a window.
type LinkClicks struct {
	Owner     string
	Code      string
	Clicks    uint64
	BotClicks uint64
}

// TopLinksSQL ranks links by distinct clicks since an hour; the owner filter
// is applied when the second bind is 1. Ties are broken by owner and code so
// the order is stable.
const TopLinksSQL = `
SELECT
    owner,
    code,
    uniqExactMerge(clicks)            AS total_clicks,
    uniqExactMergeIf(clicks, bot = 1) AS bot_clicks
FROM clicks_hourly
WHERE hour >= ? AND (? = 0 OR owner = ?)
GROUP BY owner, code
ORDER BY total_clicks DESC, owner, code
LIMIT ?`

// Last24h is where "the last 24 hours" start for TopLinks at now: the
// current hour and the 23 before it, the 24 hourly buckets of the rollup.
func Last24h(now time.Time) time.Time { return hourOf(now).Add(-23 * time.Hour) }

// TopLinks returns the limit most clicked links since since (rounded down to
// its hour), most clicked first. An empty owner ranks every owner's links
// (the operator's view); otherwise only that owner's.
func (q *Queries) TopLinks(ctx context.Context, owner string, since time.Time, limit int) ([]LinkClicks, error) {
	if limit < 1 {
		return nil, fmt.Errorf("top links: limit %d: want >= 1", limit)
	}
	filter := uint8(0)
	if owner != "" {
		filter = 1
	}
	rows, err := q.conn.Query(ctx, TopLinksSQL, hourOf(since), filter, owner, uint64(limit))
	if err != nil {
		return nil, fmt.Errorf("query top links: %w", err)
	}
	defer rows.Close()
	var out []LinkClicks
	for rows.Next() {
		var l LinkClicks
		if err := rows.Scan(&l.Owner, &l.Code, &l.Clicks, &l.BotClicks); err != nil {
			return nil, fmt.Errorf("scan top links: %w", err)
		}
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read top links: %w", err)
	}
	return out, nil
}

// UniqueVisitorsSQL merges the visitor states of an owner's links (or one
// link, when the second bind is 1) over [from, to).
const UniqueVisitorsSQL = `
SELECT uniqMerge(visitors)
FROM clicks_hourly
WHERE owner = ? AND (? = 0 OR code = ?) AND hour >= ? AND hour < ?`

// UniqueVisitors estimates the distinct visitors of owner's links (of link
// code only, unless code is empty) in [from, to); from is rounded down to
// its hour. Merging the hourly states counts a visitor who came back in
// another hour once.
func (q *Queries) UniqueVisitors(ctx context.Context, owner, code string, from, to time.Time) (uint64, error) {
	filter := uint8(0)
	if code != "" {
		filter = 1
	}
	var n uint64
	if err := q.conn.QueryRow(ctx, UniqueVisitorsSQL, owner, filter, code, hourOf(from), to.UTC()).Scan(&n); err != nil {
		return 0, fmt.Errorf("query unique visitors of %s/%s: %w", owner, code, err)
	}
	return n, nil
}

// HourTotals is one hour over every link.
type HourTotals struct {
	// Hour is the start of the hour, UTC.
	Hour time.Time
	// Clicks counts distinct click events, bots included.
	Clicks uint64
	// BotClicks counts the clicks labelled as bots at the source.
	BotClicks uint64
}

// HourlyTotalsSQL sums the distinct clicks of every link per hour. It merges
// the event-ID states per link (and bot label) first and adds the results:
// an event belongs to exactly one link, hour and label, so the sum is exact,
// and no state bigger than one link's hour is ever built (a union over all
// links would hold every event ID of the hour in memory).
const HourlyTotalsSQL = `
SELECT
    hour,
    sum(link_clicks)              AS total_clicks,
    sumIf(link_clicks, bot = 1)   AS bot_clicks
FROM (
    SELECT hour, owner, code, bot, uniqExactMerge(clicks) AS link_clicks
    FROM clicks_hourly
    WHERE hour >= ? AND hour < ?
    GROUP BY hour, owner, code, bot
)
GROUP BY hour
ORDER BY hour`

// HourlyTotals returns the clicks of all links per hour in [from, to),
// oldest first, leaving out hours without clicks. from is rounded down to
// its hour.
func (q *Queries) HourlyTotals(ctx context.Context, from, to time.Time) ([]HourTotals, error) {
	rows, err := q.conn.Query(ctx, HourlyTotalsSQL, hourOf(from), to.UTC())
	if err != nil {
		return nil, fmt.Errorf("query hourly totals: %w", err)
	}
	defer rows.Close()
	var out []HourTotals
	for rows.Next() {
		var h HourTotals
		if err := rows.Scan(&h.Hour, &h.Clicks, &h.BotClicks); err != nil {
			return nil, fmt.Errorf("scan hourly totals: %w", err)
		}
		h.Hour = h.Hour.UTC()
		out = append(out, h)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read hourly totals: %w", err)
	}
	return out, nil
}

// Totals is what the warehouse holds for a time range, from the raw table.
type Totals struct {
	// Events counts distinct event IDs: every click once.
	Events uint64
	// Rows counts rows, copies of redelivered events included until
	// ClickHouse merges them away; Rows - Events is the copies not yet merged.
	Rows uint64
}

// TotalsSQL counts the raw table exactly, for reconciliation.
const TotalsSQL = `
SELECT uniqExact(event_id), count()
FROM clicks
WHERE ts >= ? AND ts < ?`

// Totals counts the clicks whose time is in [from, to) in the raw table,
// exactly: what a load test or an operator compares with what was sent.
func (q *Queries) Totals(ctx context.Context, from, to time.Time) (Totals, error) {
	var t Totals
	if err := q.conn.QueryRow(ctx, TotalsSQL, from.UTC(), to.UTC()).Scan(&t.Events, &t.Rows); err != nil {
		return Totals{}, fmt.Errorf("query totals: %w", err)
	}
	return t, nil
}

func hourOf(t time.Time) time.Time { return t.UTC().Truncate(time.Hour) }
