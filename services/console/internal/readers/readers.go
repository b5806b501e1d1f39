// Package readers is the console's view of everything that reads a stream:
// the consumer groups on CLICKS per partition (events not yet delivered,
// delivered but not acked, the age of the oldest unread event, whether an
// owner is pinned), the other durable consumers (preview workers, the
// counter's feeds), and replays of a group.
//
// The two alarms of a log reader are lag and the age of the oldest unread
// event; age is the one with a threshold, because lag in events means
// nothing without the rate. Everything here is read from the server, so it
// is right when every member of a group is down: that is when it matters.
package readers

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/topology"
)

// Levels of an age against the thresholds.
const (
	LevelOK    = "ok"
	LevelWarn  = "warn"
	LevelAlarm = "alarm"
)

// Thresholds colour an oldest-unread age.
type Thresholds struct {
	Warn  time.Duration `json:"-"`
	Alarm time.Duration `json:"-"`
}

// Level is the level of an age.
func (t Thresholds) Level(age time.Duration) string {
	switch {
	case age >= t.Alarm:
		return LevelAlarm
	case age >= t.Warn:
		return LevelWarn
	}
	return LevelOK
}

// Partition is one partition of a group.
type Partition struct {
	Partition int    `json:"partition"`
	Consumer  string `json:"consumer"`
	// Pending is the events not yet delivered to the group.
	Pending uint64 `json:"pending"`
	// InFlight is the events delivered and not yet acked.
	InFlight int `json:"in_flight"`
	// OldestAge is the age in seconds of the oldest event not processed; 0
	// when caught up.
	OldestAge float64 `json:"oldest_unread_age_s"`
	AckFloor  uint64  `json:"ack_floor"`
	// Pinned is true when a member owns the partition (pinned_client).
	Pinned bool   `json:"pinned"`
	Level  string `json:"level"`
}

// Group is one consumer group on CLICKS, with its totals.
type Group struct {
	Name       string      `json:"group"`
	Partitions []Partition `json:"partitions"`
	Pending    uint64      `json:"pending"`
	InFlight   int         `json:"in_flight"`
	OldestAge  float64     `json:"oldest_unread_age_s"`
	// Unowned counts partitions with events waiting and no member pinned:
	// nobody is reading them. (The server pins a member on its first
	// delivery, so an idle partition shows no owner either; that is fine.)
	Unowned int    `json:"unowned"`
	Level   string `json:"level"`
	// ReplayNote says what a replay does to this reader's state.
	ReplayNote string `json:"replay_note"`
}

// Consumer is a durable consumer outside the groups.
type Consumer struct {
	Stream   string `json:"stream"`
	Name     string `json:"consumer"`
	Filter   string `json:"filter,omitempty"`
	Pending  uint64 `json:"pending"`
	InFlight int    `json:"in_flight"`
	// Redelivered is the in-flight events delivered more than once.
	Redelivered int `json:"redelivered"`
	// Waiting is the pull requests waiting: idle workers.
	Waiting   int     `json:"waiting"`
	OldestAge float64 `json:"oldest_unread_age_s"`
	Level     string  `json:"level"`
}

// Snapshot is the readers panel.
type Snapshot struct {
	Time       time.Time  `json:"time"`
	WarnAfter  float64    `json:"warn_after_s"`
	AlarmAfter float64    `json:"alarm_after_s"`
	Groups     []Group    `json:"groups"`
	Consumers  []Consumer `json:"consumers"`
}

// View reads the readers' state.
type View struct {
	js jetstream.JetStream
	th Thresholds
	// checked, when set (by a test), is called with the group between a
	// replay's checks and its request.
	checked func(group string)
}

// New returns a view with thresholds th.
func New(js jetstream.JetStream, th Thresholds) *View { return &View{js: js, th: th} }

// otherStreams are the streams whose durable consumers the panel lists
// besides the groups (CLICKS durables outside a group are listed too).
var otherStreams = []string{events.ClicksStream, events.PreviewJobsStream, events.PreviewAdvisoriesStream, events.LinksStream, events.FraudStream, events.FraudVerdictsStream, events.DeadLetterStream}

// Snapshot reads every group and consumer now.
func (v *View) Snapshot(ctx context.Context) (Snapshot, error) {
	now := time.Now()
	snap := Snapshot{Time: now.UTC(), WarnAfter: v.th.Warn.Seconds(), AlarmAfter: v.th.Alarm.Seconds(), Groups: []Group{}, Consumers: []Consumer{}}
	// Every group's partitions from one listing of CLICKS' consumers.
	lags, err := reader.LagAll(ctx, v.js)
	if err != nil {
		return Snapshot{}, fmt.Errorf("readers: %w", err)
	}
	for _, g := range slices.Sorted(maps.Keys(lags)) {
		snap.Groups = append(snap.Groups, v.group(g, lags[g], now))
	}
	for _, name := range otherStreams {
		cs, err := v.consumers(ctx, name, now)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		if err != nil {
			return Snapshot{}, fmt.Errorf("readers: %w", err)
		}
		snap.Consumers = append(snap.Consumers, cs...)
	}
	return snap, nil
}

func (v *View) group(name string, lag []reader.PartitionLag, now time.Time) Group {
	g := Group{Name: name, Partitions: make([]Partition, 0, len(lag)), ReplayNote: ReplayNote(name)}
	var oldest time.Duration
	for _, pl := range lag {
		var age time.Duration
		if !pl.OldestUnprocessed.IsZero() {
			age = max(now.Sub(pl.OldestUnprocessed), 0)
		}
		g.Partitions = append(g.Partitions, Partition{
			Partition: pl.Partition, Consumer: pl.Consumer, Pending: pl.Pending, InFlight: pl.AckPending,
			OldestAge: age.Seconds(), AckFloor: pl.AckFloor, Pinned: pl.Pinned != "", Level: v.th.Level(age),
		})
		g.Pending += pl.Pending
		g.InFlight += pl.AckPending
		oldest = max(oldest, age)
		if pl.Pinned == "" && (pl.Pending > 0 || pl.AckPending > 0) {
			g.Unowned++
		}
	}
	g.OldestAge, g.Level = oldest.Seconds(), v.th.Level(oldest)
	return g
}

func (v *View) consumers(ctx context.Context, stream string, now time.Time) ([]Consumer, error) {
	s, err := v.js.Stream(ctx, stream)
	if err != nil {
		return nil, err
	}
	// The listing is read to its end before anything else can fail: its
	// lister sends on an unbuffered channel and, left unread, blocks for
	// good (a goroutine lost on every failed refresh).
	var infos []*jetstream.ConsumerInfo
	l := s.ListConsumers(ctx)
	for info := range l.Info() {
		// Ordered and other ephemeral consumers (the console's own among
		// them) come and go; group consumers have their own panel.
		if info.Config.Durable == "" || info.Config.Metadata["snip.group"] != "" {
			continue
		}
		infos = append(infos, info)
	}
	if err := l.Err(); err != nil {
		return nil, fmt.Errorf("list consumers of %s: %w", stream, err)
	}
	var out []Consumer
	for _, info := range infos {
		t, err := reader.OldestUnprocessed(ctx, s, info)
		if err != nil {
			return nil, fmt.Errorf("consumer %s on %s: %w", info.Name, stream, err)
		}
		var age time.Duration
		if !t.IsZero() {
			age = max(now.Sub(t), 0)
		}
		filter := info.Config.FilterSubject
		if filter == "" {
			filter = strings.Join(info.Config.FilterSubjects, " ")
		}
		out = append(out, Consumer{
			Stream: stream, Name: info.Name, Filter: filter, Pending: info.NumPending, InFlight: info.NumAckPending,
			Redelivered: info.NumRedelivered, Waiting: info.NumWaiting, OldestAge: age.Seconds(), Level: v.th.Level(age),
		})
	}
	slices.SortFunc(out, func(a, b Consumer) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// ReplayNote says, for the readers Snip ships, what a replay does to their
// state; a reader's README is the long form.
func ReplayNote(group string) string {
	switch group {
	case topology.GroupClickCounter:
		return "Counts are all-time totals. Only a replay from sequence 1 (the oldest retained click) recounts: " +
			"into a new generation, which replaces the old counts in one step when it has caught up. " +
			"A replay from later (since 24h) would recount nothing (the replayed clicks are below its watermark and skipped), " +
			"so it is refused unless forced; forced, it changes nothing and counts nothing twice."
	case topology.GroupFraudDetection:
		return "The detector's windows restart at the replay's first click. Alert IDs are deterministic (rule, link, key, period), " +
			"so a replay raises no new alert (FRAUD drops the copies); its verdict messages are cut by the replay's batches, " +
			"and the counter applies each label once by click ID."
	case topology.GroupWebhooks:
		return "Webhooks reads only the clicks published after its group was created: JetStream cannot move its consumers back, " +
			"so the group cannot be replayed (the console refuses it). To send an endpoint again what it missed, replay that endpoint: " +
			`POST /api/webhooks/endpoints/<id>/replay {"from": "<RFC 3339>"} on the webhooks service.`
	case topology.GroupWarehouseLoader:
		return "Rows are idempotent (ReplacingMergeTree on the event ID, queries count distinct IDs): a replay re-inserts copies " +
			"that change no answer and merge away. Use it to reload a range the warehouse lost."
	}
	return "Each partition's owner moves its consumer back and handles the events again; what that does to the reader's state is the reader's own (see its README)."
}
