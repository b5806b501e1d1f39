// Package warehouseview is the console's warehouse panel: the top links of
// the last 24 hours and the clicks per hour over every link, from the
// warehouse's ClickHouse tables through the named queries of pkg/dashboard.
//
// ClickHouse is optional for the console: without an address the panel says
// it is not configured, and while ClickHouse is down (or the warehouse
// loader has not created its tables yet) it says why, and the rest of the
// page works as before.
package warehouseview

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/snipdev/snip/pkg/dashboard"
)

// Config says where ClickHouse is.
type Config struct {
	// Addrs are host:port of the native protocol; empty: no warehouse panel.
	Addrs    []string
	Database string
	User     string
	Password string
	// DialTimeout bounds connecting and the handshake: a frozen server
	// answers nothing, and no context deadline interrupts a handshake.
	DialTimeout time.Duration
	// TopLinks is how many links the panel ranks (default 10).
	TopLinks int
}

// View asks the warehouse.
type View struct {
	cfg  Config
	conn driver.Conn
	q    *dashboard.Queries
}

// Open returns a view; it does not connect (ClickHouse may come later).
func Open(cfg Config) (*View, error) {
	if cfg.TopLinks <= 0 {
		cfg.TopLinks = 10
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 2 * time.Second
	}
	if cfg.User == "" {
		cfg.User = "default"
	}
	v := &View{cfg: cfg}
	if len(cfg.Addrs) == 0 {
		return v, nil
	}
	conn, err := clickhouse.Open(&clickhouse.Options{
		Protocol:     clickhouse.Native,
		Addr:         cfg.Addrs,
		Auth:         clickhouse.Auth{Database: cfg.Database, Username: cfg.User, Password: cfg.Password},
		DialTimeout:  cfg.DialTimeout,
		ReadTimeout:  20 * time.Second,
		MaxOpenConns: 2,
		MaxIdleConns: 2,
		ClientInfo:   clickhouse.ClientInfo{Products: []struct{ Name, Version string }{{Name: "snip-console", Version: "1"}}},
	})
	if err != nil {
		return nil, fmt.Errorf("open clickhouse: %w", err)
	}
	v.conn, v.q = conn, dashboard.New(conn)
	return v, nil
}

// Close closes the connection pool.
func (v *View) Close() error {
	if v.conn == nil {
		return nil
	}
	return v.conn.Close()
}

// Snapshot is the warehouse panel.
type Snapshot struct {
	Configured bool `json:"configured"`
	// Available is true when the figures below could be read.
	Available bool `json:"available"`
	// Error says why not: "ClickHouse not reachable: ..." or the tables
	// are missing.
	Error    string    `json:"error,omitempty"`
	Since    time.Time `json:"since"`
	TopLinks []Link    `json:"top_links"`
	Hours    []Hour    `json:"hours"`
}

// Link is one of the top links.
type Link struct {
	Owner     string `json:"owner"`
	Code      string `json:"code"`
	Clicks    uint64 `json:"clicks"`
	BotClicks uint64 `json:"bot_clicks"`
}

// Hour is the clicks of every link in one hour.
type Hour struct {
	Hour      time.Time `json:"hour"`
	Clicks    uint64    `json:"clicks"`
	BotClicks uint64    `json:"bot_clicks"`
}

// Snapshot reads the last 24 hours (the current hour and the 23 before).
// Failures are in the snapshot, not an error: the panel shows them.
func (v *View) Snapshot(ctx context.Context, now time.Time) Snapshot {
	snap := Snapshot{Configured: v.conn != nil, Since: dashboard.Last24h(now), TopLinks: []Link{}, Hours: []Hour{}}
	if v.conn == nil {
		snap.Error = "ClickHouse not configured (CLICKHOUSE_ADDR)"
		return snap
	}
	if err := v.conn.Ping(ctx); err != nil {
		snap.Error = describe(err)
		return snap
	}
	top, err := v.q.TopLinks(ctx, "", snap.Since, v.cfg.TopLinks)
	if err != nil {
		snap.Error = describe(err)
		return snap
	}
	hours, err := v.q.HourlyTotals(ctx, snap.Since, now.Add(time.Hour))
	if err != nil {
		snap.Error = describe(err)
		return snap
	}
	for _, l := range top {
		snap.TopLinks = append(snap.TopLinks, Link(l))
	}
	for _, h := range hours {
		snap.Hours = append(snap.Hours, Hour(h))
	}
	snap.Available = true
	return snap
}

// ClickHouse error codes the panel explains.
const (
	codeUnknownTable    = 60
	codeUnknownDatabase = 81
)

func describe(err error) string {
	var ex *clickhouse.Exception
	if errors.As(err, &ex) && (ex.Code == codeUnknownTable || ex.Code == codeUnknownDatabase) {
		return "the warehouse's tables are not there yet (the warehouse loader creates them): " + ex.Message
	}
	if errors.As(err, &ex) {
		return "ClickHouse refused the query: " + ex.Message
	}
	return "ClickHouse not reachable: " + err.Error()
}
