package oracle

import (
	"context"
	"time"

	"github.com/google/uuid"
)

// LogClick is a click as CLICKS stores it: the fields of events.Click the
// oracle checks, and where it was stored.
type LogClick struct {
	ID        uuid.UUID
	RequestID string
	Code      string
	Bot       bool
	// IPPrefix is the anonymised client network the redirect recorded.
	IPPrefix  string
	Partition int
	StreamSeq uint64
	Stored    time.Time
	// Invalid is set when the payload fails events.DecodeClick: readers
	// park such a click instead of counting it. Its Code is the one its
	// payload names, or the one of the subject it was stored under when
	// the payload names none.
	Invalid bool
	// Visitor is the click's anonymised visitor identity: what fraud
	// detection's per-visitor alerts name, and what the counter's daily
	// unique visitors count.
	Visitor string
	// Time is the click's own time (Click.Time: when the redirect served
	// it, or the publisher sent it), not when CLICKS stored it: the hour
	// and UTC day the counter counts it in.
	Time time.Time
}

// LogReader reads the run owner's clicks from CLICKS, from the start of the
// run on, in stream order.
type LogReader interface {
	// Next returns the clicks stored since the previous call (a bounded
	// batch), and whether the reader has reached the end of the log as it
	// was when the call returned.
	Next(ctx context.Context) (clicks []LogClick, atEnd bool, err error)
}

// Verdict is one label of a verdict message from FRAUD_VERDICTS, reduced to
// what the oracle checks.
type Verdict struct {
	// ID identifies the label: the ID of the verdict message that carried
	// it (deterministic, the Nats-Msg-Id) and the click ID, so a message
	// stored twice shows as a duplicate.
	ID       string
	ClickID  uuid.UUID
	Code     string
	Bot      bool
	Rule     string
	FraudSeq uint64
}

// VerdictReader reads the verdicts about the run owner's clicks from FRAUD_VERDICTS,
// in stream order.
type VerdictReader interface {
	// Next returns the verdicts stored since the previous call and whether
	// the reader has reached the end of FRAUD_VERDICTS.
	Next(ctx context.Context) (verdicts []Verdict, atEnd bool, err error)
}

// Pair is a human and a bot count.
type Pair struct{ Human, Bot int64 }

// TopDimensions is the most countries and referrers a CounterReader asks
// the counter to list per link (its stats API's limit). A link the run
// sent more of than that is not checked by dimension.
const TopDimensions = 100

// The longest series the counter's stats API answers: the hourly series
// ends with the current hour, the daily one with the current UTC day.
const (
	MaxSeriesHours = 48
	MaxSeriesDays  = 30
)

// Span is how many hours and days of a link's series a CounterReader asks
// for, each series ending now (by the counter's clock).
type Span struct{ Hours, Days int }

// LinkStats is what the counter shows about one link: its totals, its
// counts by country and by referrer host, and its hourly and daily series,
// each human and bot apart.
type LinkStats struct {
	Totals Pair
	// Countries is by ISO code, "unknown" for a click without one;
	// Referrers by the Referer's host without "www.", "(direct)" for a
	// click without one. Each lists up to TopDimensions names.
	Countries, Referrers map[string]Pair
	// Hourly and Daily are the series asked for, oldest first.
	Hourly []HourCount
	Daily  []DayCount
}

// HourCount is one hour of a link's hourly series: the clicks whose own
// time falls in it.
type HourCount struct {
	// Hour is the hour's start, UTC.
	Hour time.Time
	Pair
}

// DayCount is one UTC day of a link's daily series.
type DayCount struct {
	// Day is the day's midnight, UTC.
	Day time.Time
	Pair
	// Uniques is the counter's estimate (a HyperLogLog) of the distinct
	// visitors among the day's clicks the redirect did not label bots;
	// a fraud verdict does not change it.
	Uniques int64
}

// Alert is one alert from FRAUD, reduced to what the oracle checks.
type Alert struct {
	// ID is the alert's ID (its Nats-Msg-Id): stored twice, it shows as a
	// duplicate.
	ID   string
	Rule string
	Code string
	// Key is what the rule counted on (a visitor, for visitor_burst).
	Key string
}

// AlertReader reads the alerts on the run owner's links from FRAUD, in
// stream order.
type AlertReader interface {
	// Next returns the alerts stored since the previous call and whether
	// the reader has reached the end of FRAUD.
	Next(ctx context.Context) (alerts []Alert, atEnd bool, err error)
}

// CounterReader reads the click counter's public stats API.
type CounterReader interface {
	// Stats returns a link's stats, with the series span asks for; a link
	// the counter has not counted any click of has zero totals, no
	// dimensions and no series.
	Stats(ctx context.Context, code string, span Span) (LinkStats, error)
}

// WarehouseCount is one link's clicks in the warehouse.
type WarehouseCount struct {
	// Distinct is the number of distinct event IDs.
	Distinct uint64
	// DistinctBots is the number of distinct event IDs labelled bot.
	DistinctBots uint64
	// Rows is the number of rows, redelivered copies not yet merged away
	// included.
	Rows uint64
}

// WarehouseReader queries the warehouse's clicks table.
type WarehouseReader interface {
	// LinkCounts returns the counts of every link of owner whose code starts
	// with prefix, by code.
	LinkCounts(ctx context.Context, owner, prefix string) (map[string]WarehouseCount, error)
	// EventIDs calls fn with every distinct (code, event ID, bot flag) of
	// those links: an event stored under two codes or with two flags comes
	// twice.
	EventIDs(ctx context.Context, owner, prefix string, fn func(code string, id uuid.UUID, bot bool)) error
}

// Position is how far one reader has processed one stream (or one
// partition of CLICKS).
type Position struct {
	// Reader names the reader: a consumer group on CLICKS, or
	// "FRAUD_VERDICTS/<consumer>" for a durable consumer on FRAUD_VERDICTS.
	Reader string
	// Stream is CLICKS or FRAUD_VERDICTS.
	Stream string
	// Partition is the CLICKS partition; -1 on FRAUD_VERDICTS.
	Partition int
	// AckFloor is the last stream sequence acknowledged with everything
	// before it: every event of the reader's at or below it is processed.
	AckFloor uint64
	// Backlog is the events not yet processed: not delivered plus
	// delivered but not acknowledged, whoever sent them.
	Backlog uint64
}

// Positions reports how far each reader has processed.
type Positions interface {
	// Positions returns one position per reader deployed and partition (a
	// consumer group on CLICKS: one per partition consumer; a durable
	// consumer on FRAUD: one).
	Positions(ctx context.Context) ([]Position, error)
}

// WebhookEvent is one event the load test's webhook receiver was sent.
type WebhookEvent struct {
	// ID is the event's `id` (for a click, its event ID): what receivers
	// deduplicate by.
	ID string
	// Type is the event's type (click, fraud_alert, test).
	Type string
	// Code is the link its data names.
	Code string
	// Copies is how many times it was delivered: 1, or more when a batch
	// or a click stored twice was sent again (at-least-once).
	Copies uint64
	// First orders the first deliveries: 1 for the first event the
	// receiver recorded, then 2, and so on (a request's events in body
	// order).
	First uint64
}

// WebhookDeliveries is what the receiver has been sent so far.
type WebhookDeliveries struct {
	Events []WebhookEvent
	// Requests counts the POSTs received; BadSignatures those whose
	// signature did not verify (refused, their events not recorded);
	// BadBodies those that verified but were not a body of events.
	Requests, BadSignatures, BadBodies uint64
	// Unrecorded counts events the receiver did not record because it
	// held as many as its bound.
	Unrecorded uint64
}

// WebhookReader is the load test's webhook receiver, registered as an
// endpoint of the run's owner.
type WebhookReader interface {
	// Endpoint is the endpoint's ID in the webhooks service.
	Endpoint() string
	// Wants reports whether the endpoint's filter wants clicks on a link.
	Wants(code string) bool
	// Deliveries returns everything delivered so far.
	Deliveries() WebhookDeliveries
	// Queued returns the events the webhooks service holds in the
	// endpoint's queue, not yet delivered (the one in flight included).
	Queued(ctx context.Context) (uint64, error)
}
