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

// Validate reports whether r is well-formed by Snip's rule of validity: the
// checks events.Click.Validate makes of the fields a row keeps (a UUIDv7
// event ID, a time, owner and code tokens, a country of zero or two bytes),
// and the bounds RowFromEvent applies (the click's time within MaxClockSkew
// of when it was stored, both times in the range of ClickHouse's DateTime).
// Every row RowFromEvent makes from an event the runtime hands out passes,
// and the clicks table as the schema creates it accepts every row that
// passes. So a row that passes and is refused by the ClickHouse client
// says the table changed, not that the row is bad.
func (r *Row) Validate() error {
	c := events.Click{V: events.ClickVersion, ID: r.EventID, Time: r.Time, Code: r.Code, Owner: r.Owner, Country: r.Country}
	if err := c.Validate(); err != nil {
		return err
	}
	if skew := r.Time.Sub(r.IngestedAt); skew > MaxClockSkew || skew < -MaxClockSkew {
		return fmt.Errorf("click %s at %s was stored at %s, more than %s apart",
			r.EventID, r.Time.UTC().Format(time.RFC3339), r.IngestedAt.UTC().Format(time.RFC3339), MaxClockSkew)
	}
	for _, t := range []time.Time{r.Time, r.IngestedAt} {
		if t.Before(minDateTime) || !t.Before(maxDateTime) {
			return fmt.Errorf("click %s: time %s outside ClickHouse's DateTime range", r.EventID, t.UTC().Format(time.RFC3339))
		}
	}
	return nil
}

// The range of ClickHouse's DateTime as the client accepts it.
var (
	minDateTime = time.Unix(0, 0)
	maxDateTime = time.Date(2106, 1, 1, 0, 0, 0, 0, time.UTC)
)

// RowFromEvent maps a click read from CLICKS to its row. It refuses only what
// would be wrong in the table: a time ClickHouse cannot hold or that is
// implausibly far from when the event was stored. Values of the wrong shape
// (an event ID that is not a UUID, a three-letter country) cannot come from
// the runtime, which parks such events first; should one come, the
// ClickHouse client refuses it and the writer returns a RowError (see
// Validate).
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
