package warehousetest

import (
	"testing"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// RowsPerEvent reads the clicks table: how many rows each event ID has (more
// than one until ClickHouse merges the copies of a redelivered event).
func RowsPerEvent(tb testing.TB, conn driver.Conn) map[string]int {
	tb.Helper()
	rows, err := conn.Query(tb.Context(), "SELECT toString(event_id), count() FROM clicks GROUP BY event_id")
	if err != nil {
		tb.Fatalf("read event ids: %v", err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n uint64
		if err := rows.Scan(&id, &n); err != nil {
			tb.Fatalf("scan event ids: %v", err)
		}
		out[id] = int(n)
	}
	if err := rows.Err(); err != nil {
		tb.Fatalf("read event ids: %v", err)
	}
	return out
}
