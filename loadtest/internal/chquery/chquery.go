// Package chquery reads the warehouse's `clicks` table in ClickHouse for the
// oracle. It relies only on the table's contract: one row per click event,
// with event_id, owner, code and bot columns, where redelivered events may
// leave duplicate rows until ReplacingMergeTree merges them, so events are
// counted with uniqExact(event_id), never count(). The SQL runs on Debian's
// ClickHouse 18.16 and on current servers.
package chquery

import (
	"context"
	"fmt"
	"strings"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/google/uuid"

	"github.com/snipdev/snip/loadtest/internal/oracle"
)

// Table is the warehouse table the oracle reads.
const Table = "clicks"

// Client queries the warehouse.
type Client struct{ conn driver.Conn }

// Open connects to the ClickHouse named by dsn, e.g.
// clickhouse://127.0.0.1:9000/snip (the native protocol: HTTP does not
// work with 18.16).
func Open(dsn string) (*Client, error) {
	opts, err := clickhouse.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("clickhouse dsn: %w", err)
	}
	conn, err := clickhouse.Open(opts)
	if err != nil {
		return nil, fmt.Errorf("open clickhouse: %w", err)
	}
	return &Client{conn: conn}, nil
}

// New wraps an open connection.
func New(conn driver.Conn) *Client { return &Client{conn: conn} }

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Ping checks that the server answers and the table exists.
func (c *Client) Ping(ctx context.Context) error {
	var n uint64
	if err := c.conn.QueryRow(ctx, "SELECT count() FROM system.tables WHERE database = currentDatabase() AND name = ?", Table).Scan(&n); err != nil {
		return fmt.Errorf("ping clickhouse: %w", err)
	}
	if n == 0 {
		return fmt.Errorf("ping clickhouse: no table %q in the current database", Table)
	}
	return nil
}

// like escapes a prefix for LIKE.
func like(prefix string) string {
	r := strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`)
	return r.Replace(prefix) + "%"
}

// LinkCounts implements oracle.WarehouseReader.
func (c *Client) LinkCounts(ctx context.Context, owner, prefix string) (map[string]oracle.WarehouseCount, error) {
	rows, err := c.conn.Query(ctx, `
		SELECT code, uniqExact(event_id), uniqExactIf(event_id, bot = 1), count()
		FROM `+Table+`
		WHERE owner = ? AND code LIKE ?
		GROUP BY code`, owner, like(prefix))
	if err != nil {
		return nil, fmt.Errorf("warehouse link counts: %w", err)
	}
	defer rows.Close()
	out := map[string]oracle.WarehouseCount{}
	for rows.Next() {
		var code string
		var w oracle.WarehouseCount
		if err := rows.Scan(&code, &w.Distinct, &w.DistinctBots, &w.Rows); err != nil {
			return nil, fmt.Errorf("warehouse link counts: %w", err)
		}
		out[code] = w
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("warehouse link counts: %w", err)
	}
	return out, nil
}

// EventIDs implements oracle.WarehouseReader.
func (c *Client) EventIDs(ctx context.Context, owner, prefix string, fn func(string, uuid.UUID, bool)) error {
	rows, err := c.conn.Query(ctx, `
		SELECT DISTINCT code, event_id, bot FROM `+Table+` WHERE owner = ? AND code LIKE ?`, owner, like(prefix))
	if err != nil {
		return fmt.Errorf("warehouse event ids: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var code string
		var id uuid.UUID
		var bot uint8
		if err := rows.Scan(&code, &id, &bot); err != nil {
			return fmt.Errorf("warehouse event ids: %w", err)
		}
		fn(code, id, bot != 0)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("warehouse event ids: %w", err)
	}
	return nil
}

// Count returns the distinct events of one link: the probe poller's query.
func (c *Client) Count(ctx context.Context, owner, code string) (int, error) {
	var n uint64
	if err := c.conn.QueryRow(ctx, `SELECT uniqExact(event_id) FROM `+Table+` WHERE owner = ? AND code = ?`, owner, code).Scan(&n); err != nil {
		return 0, fmt.Errorf("warehouse count %s: %w", code, err)
	}
	return int(n), nil
}
