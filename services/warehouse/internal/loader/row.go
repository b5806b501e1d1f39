package loader

import (
	"fmt"
	"math"
	"time"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
)

// Row is one click as the clicks table stores it (deploy/clickhouse/001_clicks.sql).
type Row struct {
	// EventID is the click's UUIDv7, part of the table's sorting key.
	EventID string
	// Time is when the redirect was served, UTC (stored to the second).
	Time      time.Time
	Owner     string
	Code      string
	Target    string
	IPPrefix  string
	Visitor   string
	UserAgent string
	Referrer  string
	// Country is an ISO 3166-1 alpha-2 code or "".
	Country   string
	RequestID string
	Bot       bool
	// Partition and Seq say where in CLICKS the event was read.
	Partition uint16
	Seq       uint64
	// IngestedAt is when JetStream stored the event, so every copy of a
	// redelivered event is the same row.
	IngestedAt time.Time
}

// MaxClockSkew bounds how far a click's time may be from when JetStream
// stored it: the one rule of validity's bound (events.MaxClockSkew). The
// reader runtime parks such a click before the loader sees it; the loader
// checks again because a row outside it would break ClickHouse's partitions.
const MaxClockSkew = events.MaxClockSkew

// RowFromEvent maps a click read from CLICKS to its row. It refuses only what
// would be wrong in the table: a time ClickHouse cannot hold or that is
// implausibly far from when the event was stored. Values of the wrong shape
// (an event ID that is not a UUID, a three-letter country) are left for the
// ClickHouse client to refuse, which the loader turns into a RowError.
func RowFromEvent(e reader.Event) (Row, error) {
	c := e.Click
	if skew := c.Time.Sub(e.Stored); skew > MaxClockSkew || skew < -MaxClockSkew {
		return Row{}, fmt.Errorf("click %s at %s was stored at %s, more than %s apart",
			c.ID, c.Time.UTC().Format(time.RFC3339), e.Stored.UTC().Format(time.RFC3339), MaxClockSkew)
	}
	if e.Partition < 0 || e.Partition > math.MaxUint16 {
		return Row{}, fmt.Errorf("click %s: partition %d out of range", c.ID, e.Partition)
	}
	return Row{
		EventID:    c.ID,
		Time:       c.Time.UTC(),
		Owner:      c.Owner,
		Code:       c.Code,
		Target:     c.Target,
		IPPrefix:   c.IPPrefix,
		Visitor:    c.Visitor,
		UserAgent:  c.UserAgent,
		Referrer:   c.Referrer,
		Country:    c.Country,
		RequestID:  c.RequestID,
		Bot:        c.Bot,
		Partition:  uint16(e.Partition),
		Seq:        e.Seq,
		IngestedAt: e.Stored.UTC(),
	}, nil
}
