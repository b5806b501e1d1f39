package readers_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/console/internal/consoletest"
	"github.com/snipdev/snip/services/console/internal/readers"
)

// runMember runs a live member of group that handles every event.
func runMember(t *testing.T, js jetstream.JetStream, group string) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		done <- reader.Run(t.Context(), js, reader.Config{Group: group, LeaseTTL: time.Second},
			func(context.Context, int, []reader.Event) error { return nil })
	}()
	t.Cleanup(func() { <-done })
}

// seq is a from_seq, given.
func seq(n uint64) *uint64 { return &n }

func TestSnapshotShowsLagAgeOwnersAndOtherConsumers(t *testing.T) {
	t.Parallel()
	_, js := consoletest.NATS(t)
	if err := topology.ApplyClickCounter(t.Context(), js); err != nil {
		t.Fatal(err)
	}
	consoletest.DownGroup(t, js, "down-reader")
	runMember(t, js, "live-reader")
	clicks := append(consoletest.Clicks("acme", "a", 5), consoletest.Clicks("acme", "b", 7)...)
	consoletest.Publish(t, js, clicks...)
	if _, err := js.Publish(t.Context(), events.PreviewJobSubject, []byte(`{}`)); err != nil {
		t.Fatal(err)
	}

	v := readers.New(js, readers.Thresholds{Warn: time.Millisecond, Alarm: time.Hour})
	var snap readers.Snapshot
	testenv.WaitFor(t, 30*time.Second, "the live reader caught up and owning its partitions", func() bool {
		var err error
		if snap, err = v.Snapshot(t.Context()); err != nil {
			t.Fatal(err)
		}
		return len(snap.Groups) == 2 && snap.Groups[1].Pending == 0 && snap.Groups[1].InFlight == 0 && snap.Groups[1].Unowned == 0
	})
	down, live := snap.Groups[0], snap.Groups[1]
	if down.Name != "down-reader" || live.Name != "live-reader" {
		t.Fatalf("groups %s, %s; want down-reader, live-reader (sorted)", down.Name, live.Name)
	}
	waiting := 0
	for _, p := range down.Partitions {
		if p.Pending > 0 {
			waiting++
		}
	}
	if down.Pending != uint64(len(clicks)) || down.Unowned != waiting || waiting == 0 || down.Level != readers.LevelWarn {
		t.Errorf("down reader: pending %d, unowned %d, level %s; want %d, %d (the partitions with events), warn", down.Pending, down.Unowned, down.Level, len(clicks), waiting)
	}
	var perPartition uint64
	for _, p := range down.Partitions {
		perPartition += p.Pending
		if (p.Pending > 0) != (p.OldestAge > 0) || p.Pinned {
			t.Errorf("down reader partition %+v: an age exactly where events wait, and no owner", p)
		}
	}
	if perPartition != down.Pending {
		t.Errorf("partitions sum to %d, group total %d", perPartition, down.Pending)
	}
	if live.Level != readers.LevelOK || live.OldestAge != 0 {
		t.Errorf("live reader caught up: level %s, age %v; want ok, 0", live.Level, live.OldestAge)
	}

	got := map[string]uint64{}
	for _, c := range snap.Consumers {
		got[c.Stream+"/"+c.Name] = c.Pending + uint64(c.InFlight)
	}
	want := map[string]uint64{
		events.PreviewJobsStream + "/" + topology.PreviewConsumer:                1,
		events.PreviewAdvisoriesStream + "/" + topology.PreviewRescueConsumer:    0,
		events.LinksStream + "/" + topology.ClickCounterLinksConsumer:            0,
		events.FraudVerdictsStream + "/" + topology.ClickCounterVerdictsConsumer: 0,
		events.FraudStream + "/" + topology.WebhooksAlertsConsumer:               0,
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("other consumers' unprocessed events (-want +got):\n%s", d)
	}
}

func TestThresholds(t *testing.T) {
	t.Parallel()
	th := readers.Thresholds{Warn: time.Minute, Alarm: 5 * time.Minute}
	tests := []struct {
		age  time.Duration
		want string
	}{
		{0, readers.LevelOK}, {59 * time.Second, readers.LevelOK}, {time.Minute, readers.LevelWarn},
		{299 * time.Second, readers.LevelWarn}, {5 * time.Minute, readers.LevelAlarm}, {time.Hour, readers.LevelAlarm},
	}
	for _, tc := range tests {
		if got := th.Level(tc.age); got != tc.want {
			t.Errorf("Level(%s) = %s, want %s", tc.age, got, tc.want)
		}
	}
}

func TestReplayMovesTheGroupBackAndReportsProgress(t *testing.T) {
	t.Parallel()
	_, js := consoletest.NATS(t)
	runMember(t, js, "live-reader")
	seqs := consoletest.Publish(t, js, consoletest.Clicks("acme", "a", 10)...)
	v := readers.New(js, readers.Thresholds{Warn: time.Minute, Alarm: time.Hour})
	ctx := t.Context()
	testenv.WaitFor(t, 30*time.Second, "the group created", func() bool {
		_, err := reader.Lag(ctx, js, "live-reader")
		return err == nil
	})

	if st, err := v.ReplayStatus(ctx, "live-reader"); err != nil || st.ID != "" || st.Done {
		t.Fatalf("status before any replay = %+v, %v; want none", st, err)
	}
	refused := []struct {
		name string
		req  readers.ReplayRequest
		want error
	}{
		{"unconfirmed", readers.ReplayRequest{FromSeq: seq(1)}, readers.ErrNotConfirmed},
		{"confirmed_as_another_group", readers.ReplayRequest{FromSeq: seq(1), Confirm: "other"}, readers.ErrNotConfirmed},
		{"no_position", readers.ReplayRequest{Confirm: "live-reader"}, readers.ErrBadReplay},
		{"two_positions", readers.ReplayRequest{FromSeq: seq(1), Since: "1h", Confirm: "live-reader"}, readers.ErrBadReplay},
		{"negative_since", readers.ReplayRequest{Since: "-1h", Confirm: "live-reader"}, readers.ErrBadReplay},
		{"bad_time", readers.ReplayRequest{From: "yesterday", Confirm: "live-reader"}, readers.ErrBadReplay},
		// A time the streams cannot hold as a position wraps around: 9999
		// read as the distant past and replayed every partition from
		// sequence 1 (the click counter's full recount), 1600 as the far
		// future and replayed nothing, with a 202 for both.
		{"from_the_future", readers.ReplayRequest{From: time.Now().Add(time.Hour).UTC().Format(time.RFC3339), Confirm: "live-reader"}, readers.ErrBadReplay},
		{"from_past_what_a_position_holds", readers.ReplayRequest{From: "9999-12-31T00:00:00Z", Confirm: "live-reader"}, readers.ErrBadReplay},
		{"from_before_what_a_position_holds", readers.ReplayRequest{From: "1600-01-01T00:00:00Z", Confirm: "live-reader"}, readers.ErrBadReplay},
	}
	for _, tc := range refused {
		if _, err := v.Replay(ctx, "live-reader", tc.req); !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.want)
		}
	}
	if _, err := v.Replay(ctx, "no-such-group", readers.ReplayRequest{FromSeq: seq(1), Confirm: "no-such-group"}); !errors.Is(err, readers.ErrUnknownGroup) {
		t.Errorf("unknown group: err = %v, want ErrUnknownGroup", err)
	}

	replayed, err := v.Replay(ctx, "live-reader", readers.ReplayRequest{FromSeq: seq(seqs[0]), Confirm: "live-reader"})
	if err != nil {
		t.Fatal(err)
	}
	id := replayed.ID
	if replayed.Position != "from sequence 1" || len(replayed.Warnings) != 0 {
		t.Errorf("replayed %+v, want from sequence 1 and no warning", replayed)
	}
	var st readers.ReplayStatus
	testenv.WaitFor(t, 30*time.Second, "every partition moved back", func() bool {
		if st, err = v.ReplayStatus(ctx, "live-reader"); err != nil {
			t.Fatal(err)
		}
		return st.Done
	})
	if st.ID != id || st.DoneCount != consoletest.Partitions || st.Total != consoletest.Partitions || st.Requested == nil {
		t.Errorf("status = %+v, want replay %s done in all %d partitions", st, id, consoletest.Partitions)
	}
}

// A replay whose group's consumers were deleted and created again before
// its partitions moved back never will be: the status (and the API's JSON,
// which the page renders) says void, not running. Before, it showed the
// replay running for ever, 0 of N partitions moved back.
func TestAReplayOfAGroupCreatedAgainIsVoid(t *testing.T) {
	t.Parallel()
	_, js := consoletest.NATS(t)
	consoletest.Publish(t, js, consoletest.Clicks("acme", "a", 5)...)
	consoletest.DownGroup(t, js, "down-reader") // no member: nobody carries the replay out
	v := readers.New(js, readers.Thresholds{Warn: time.Minute, Alarm: time.Hour})
	ctx := t.Context()
	replayed, err := v.Replay(ctx, "down-reader", readers.ReplayRequest{FromSeq: seq(1), Confirm: "down-reader"})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := v.ReplayStatus(ctx, "down-reader"); err != nil || st.ID != replayed.ID || st.Done || st.Void {
		t.Fatalf("status with the group's own consumers = %+v, %v; want replay %s pending", st, err, replayed.ID)
	}

	for p := range consoletest.Partitions {
		if err := js.DeleteConsumer(ctx, events.ClicksStream, topology.GroupConsumerName("down-reader", p)); err != nil {
			t.Fatal(err)
		}
	}
	consoletest.DownGroup(t, js, "down-reader")
	st, err := v.ReplayStatus(ctx, "down-reader")
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		ID    string `json:"id"`
		Done  bool   `json:"done"`
		Void  bool   `json:"void"`
		Count int    `json:"partitions_done"`
		Parts []struct {
			Done bool `json:"done"`
			Void bool `json:"void"`
		} `json:"partition_status"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.ID != replayed.ID || got.Done || !got.Void || got.Count != 0 || len(got.Parts) != consoletest.Partitions {
		t.Fatalf("status after the group was created again = %s; want replay %s void, none of %d partitions done", b, replayed.ID, consoletest.Partitions)
	}
	for i, p := range got.Parts {
		if p.Done || !p.Void {
			t.Errorf("partition %d: %+v, want void, not done", i, p)
		}
	}
}

// TestAReplayRequestedBetweenAnothersCheckAndRequestIsNotReplacedUnsaid:
// operator A's replay has made its checks (no replay under way) when
// operator B's replay of the same group is checked and requested; A's
// request then is refused, naming B's replay, rather than replacing it
// with neither told (both had checked before either requested). Asked
// again, A's replay is requested with the warning that it replaces B's.
func TestAReplayRequestedBetweenAnothersCheckAndRequestIsNotReplacedUnsaid(t *testing.T) {
	t.Parallel()
	_, js := consoletest.NATS(t)
	consoletest.Publish(t, js, consoletest.Clicks("acme", "a", 10)...)
	consoletest.DownGroup(t, js, "idle") // nobody carries a replay out
	ctx := t.Context()
	a := readers.New(js, readers.Thresholds{Warn: time.Minute, Alarm: time.Hour})
	b := readers.New(js, readers.Thresholds{Warn: time.Minute, Alarm: time.Hour})
	req := readers.ReplayRequest{FromSeq: seq(1), Confirm: "idle"}

	var first readers.Replayed
	readers.OnChecked(a, func(string) {
		readers.OnChecked(a, nil)
		var err error
		if first, err = b.Replay(ctx, "idle", req); err != nil {
			t.Errorf("operator B's replay: %v", err)
		}
		if len(first.Warnings) != 0 {
			t.Errorf("operator B's replay, the first: warnings %q, want none", first.Warnings)
		}
	})
	got, err := a.Replay(ctx, "idle", req)
	if !errors.Is(err, readers.ErrRequestedMeanwhile) || first.ID == "" || !strings.Contains(err.Error(), "replay "+first.ID+" (requested ") {
		t.Fatalf("operator A's replay, checked before B's was requested and asked after: %+v, %v; want ErrRequestedMeanwhile naming B's replay %s (both requested, neither told it replaces the other)",
			got, err, first.ID)
	}
	if st, err := reader.LatestRewind(ctx, js, "idle"); err != nil || st.ID != first.ID {
		t.Errorf("latest replay = %q (%v), want B's %s: A's refused request stored nothing", st.ID, err, first.ID)
	}
	t.Logf("operator A was told: %v", err)
	again, err := a.Replay(ctx, "idle", req)
	if err != nil {
		t.Fatalf("operator A asking again: %v", err)
	}
	if len(again.Warnings) != 1 || !strings.HasPrefix(again.Warnings[0], "replay "+first.ID+" of group idle") || !strings.Contains(again.Warnings[0], "this replay replaces it") {
		t.Errorf("operator A asking again: warnings %q, want one saying it replaces B's %s", again.Warnings, first.ID)
	}
}
