package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

func publishClicks(t *testing.T, js jetstream.JetStream, n int) {
	t.Helper()
	for i := range n {
		c := events.Click{V: events.ClickVersion, ID: events.NewID(), Time: time.Now().UTC(), Code: "c" + string(rune('a'+i%5)), Owner: "acme", Target: "https://example.com", Visitor: "v"}
		b, _ := json.Marshal(c)
		if _, err := js.Publish(t.Context(), events.ClickSubject(c.Owner, c.Code), b, jetstream.WithMsgID(c.ID)); err != nil {
			t.Fatal(err)
		}
	}
}

func TestReplayAndLag(t *testing.T) {
	t.Parallel()
	environ, js := appliedNATS(t)
	publishClicks(t, js, 20)

	var handled atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- reader.Run(ctx, js, reader.Config{Group: "demo", Member: "m", LeaseTTL: time.Second},
			func(_ context.Context, _ int, b []reader.Event) error { handled.Add(int64(len(b))); return nil })
	}()
	t.Cleanup(func() { cancel(); <-done })
	testenv.WaitFor(t, 30*time.Second, "first pass", func() bool { return handled.Load() == 20 })

	out, err := snipctl(t, environ, "lag", "demo")
	if err != nil {
		t.Fatalf("lag: %v\n%s", err, out)
	}
	if !strings.Contains(out, "demo") || !strings.Contains(out, "oldest unhandled") {
		t.Fatalf("lag output lacks the group or header:\n%s", out)
	}
	out, err = snipctl(t, environ, "replay", "demo", "--from-seq", "1", "--wait")
	if err != nil {
		t.Fatalf("replay: %v\n%s", err, out)
	}
	testenv.WaitFor(t, 30*time.Second, "replayed pass", func() bool { return handled.Load() == 40 })

	if _, err := snipctl(t, environ, "replay", "demo"); err == nil {
		t.Fatal("replay without a position succeeded")
	}
	if _, err := snipctl(t, environ, "replay", "demo", "--since", "1h", "--from-seq", "3"); err == nil {
		t.Fatal("replay with two positions succeeded")
	}
	if out, err := snipctl(t, environ, "replay", "nosuchgroup", "--since", "1h"); err == nil {
		t.Fatalf("replay of a missing group succeeded:\n%s", out)
	}
}

// The click counter recounts only a replay from the oldest retained event
// (decision 0021); snipctl refuses any other, saying what to do, unless
// --force.
func TestReplayOfTheClickCounterMustBeARecount(t *testing.T) {
	t.Parallel()
	environ, js := appliedNATS(t)
	publishClicks(t, js, 10)
	var handled atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- reader.Run(ctx, js, reader.Config{Group: topology.GroupClickCounter, Member: "m", LeaseTTL: time.Second},
			func(_ context.Context, _ int, b []reader.Event) error { handled.Add(int64(len(b))); return nil })
	}()
	t.Cleanup(func() { cancel(); <-done })
	testenv.WaitFor(t, 30*time.Second, "first pass", func() bool { return handled.Load() == 10 })
	kv, err := js.KeyValue(t.Context(), topology.MembersBucket)
	if err != nil {
		t.Fatal(err)
	}
	requested := func() string {
		e, err := kv.Get(t.Context(), topology.GroupClickCounter+".rewind")
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return ""
		}
		if err != nil {
			t.Fatal(err)
		}
		return string(e.Value())
	}
	stream, err := js.Stream(t.Context(), events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	fifth, err := stream.GetMsg(t.Context(), 5)
	if err != nil {
		t.Fatal(err)
	}
	later := fifth.Time.UTC().Format(time.RFC3339Nano) // after the oldest event
	// Sequential: the cases share the group and its last replay request.
	tests := []struct {
		name    string
		args    []string
		refused bool
		output  string
	}{
		{name: "from_a_later_time_is_refused", args: []string{"--from", later}, refused: true},
		{name: "since_a_short_while_is_refused", args: []string{"--since", "1ms"}, refused: true},
		{name: "from_a_later_sequence_is_refused", args: []string{"--from-seq", "3"}, refused: true},
		{name: "forced_it_is_requested_with_a_warning", args: []string{"--from", later, "--force"}, output: "warning: --from " + later + " starts after the oldest event"},
		{name: "since_before_the_oldest_event_is_a_recount", args: []string{"--since", "1h"}, output: "a recount"},
		{name: "from_the_first_sequence_is_a_recount", args: []string{"--from-seq", "1"}, output: "a recount"},
		{name: "from_before_retention_is_a_recount", args: []string{"--from", "2000-01-01T00:00:00Z"}, output: "a recount"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := requested()
			out, err := snipctl(t, environ, append([]string{"replay", topology.GroupClickCounter}, tc.args...)...)
			if tc.refused {
				if !errors.Is(err, errNotARecount) || !strings.Contains(err.Error(), "--from-seq 1") || !strings.Contains(err.Error(), "--force") {
					t.Fatalf("err = %v, want a refusal naming --from-seq 1 and --force\n%s", err, out)
				}
				if requested() != before {
					t.Fatal("a refused replay was requested")
				}
				return
			}
			if err != nil || !strings.Contains(out, tc.output) {
				t.Fatalf("err = %v, output:\n%s\nwant it to contain %q", err, out, tc.output)
			}
			if requested() == before {
				t.Fatal("the replay was not requested")
			}
		})
	}
	// Other groups replay from anywhere, as before: from a sequence the
	// click counter's would be refused at, the request goes on to the group
	// (here one that does not exist, which is the error).
	if out, err := snipctl(t, environ, "replay", "nosuchgroup", "--from-seq", "3"); !errors.Is(err, reader.ErrNoGroup) {
		t.Fatalf("another group's replay from sequence 3: err = %v, want it requested (ErrNoGroup for a group with no consumers)\n%s", err, out)
	}
}

// A click counter with no consumers on CLICKS is reported as a group that
// is not there, whatever the position: not refused as a replay it would not
// recount from, which says to replay from sequence 1 instead, and --force
// does not request it.
func TestReplayOfAClickCounterThatIsNotThereSaysSo(t *testing.T) {
	t.Parallel()
	environ, js := appliedNATS(t)
	publishClicks(t, js, 10)
	for _, args := range [][]string{
		{"--from-seq", "3"},
		{"--since", "1ms"},
		{"--from-seq", "3", "--force"},
		{"--from-seq", "1"},
	} {
		out, err := snipctl(t, environ, append([]string{"replay", topology.GroupClickCounter}, args...)...)
		if !errors.Is(err, reader.ErrNoGroup) || errors.Is(err, errNotARecount) || strings.Contains(out, "warning") {
			t.Errorf("replay of a click counter with no consumers %v: err = %v, want ErrNoGroup alone\n%s", args, err, out)
		}
	}
	kv, err := js.KeyValue(t.Context(), topology.MembersBucket)
	if err != nil {
		t.Fatal(err)
	}
	if e, err := kv.Get(t.Context(), topology.GroupClickCounter+".rewind"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("rewind request of a group that is not there: %v, %v; want none", e, err)
	}
}

// Words after the group are refused, naming them, rather than ignored (with
// the flags after them): "replay alpha --from-seq 1 beta" does not replay
// alpha alone and succeed.
func TestReplayRefusesExtraArguments(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"replay", "alpha", "--from-seq", "1", "beta"},
		{"replay", "alpha", "beta", "--from-seq", "1"},
	} {
		_, err := snipctl(t, nil, args...)
		if !errors.Is(err, errUsage) || !strings.Contains(fmt.Sprint(err), `"beta"`) {
			t.Errorf("snipctl %v: err = %v, want a usage error naming beta", args, err)
		}
	}
}

// lag of a group that does not exist prints the table (the groups that do
// exist, and "no such group") and fails naming it, so scripts see it.
func TestLagOfAnUnknownGroupFails(t *testing.T) {
	t.Parallel()
	environ, js := appliedNATS(t)
	downGroup(t, js, "demo")
	out, err := snipctl(t, environ, "lag", "demo", "nope")
	if err == nil || errors.Is(err, errUsage) || !strings.HasSuffix(err.Error(), "no such group: nope") {
		t.Errorf("lag of an unknown group: err = %v, want an error naming it", err)
	}
	if !strings.Contains(out, "nope") || !strings.Contains(out, "no such group") || !regexp.MustCompile(`demo +1 +0 `).MatchString(out) {
		t.Errorf("lag printed no table of the groups:\n%s", out)
	}
}

// lag takes group names only: a flag (-h, --json) is a usage error, not a
// group reported as missing with exit status 1.
func TestLagRefusesAFlag(t *testing.T) {
	t.Parallel()
	environ, _ := appliedNATS(t)
	for _, args := range [][]string{{"lag", "-h"}, {"lag", "--json"}, {"lag", "demo", "--json"}} {
		out, err := snipctl(t, environ, args...)
		if !errors.Is(err, errUsage) || strings.Contains(out, "no such group") {
			t.Errorf("snipctl %v: err = %v, want a usage error and no table\n%s", args, err, out)
		}
	}
}

// lag on a CLICKS without consumer groups says so, not a bare header.
func TestLagWithoutGroupsSaysSo(t *testing.T) {
	t.Parallel()
	environ, _ := appliedNATS(t)
	out, err := snipctl(t, environ, "lag")
	if err != nil || !strings.Contains(out, "no consumer groups on CLICKS yet") {
		t.Errorf("lag without groups: err = %v, want it to say there are none\n%s", err, out)
	}
}

// appliedNATS starts NATS, applies the topology (two partitions) with
// snipctl, and returns the environment snipctl runs with and a JetStream
// context on the server.
func appliedNATS(t *testing.T) ([]string, jetstream.JetStream) {
	t.Helper()
	n := testenv.StartNATS(t)
	environ := []string{"NATS_URL=" + n.URL, "SNIP_PARTITIONS=2"}
	if out, err := snipctl(t, environ, "topology", "apply"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return environ, n.JetStream(t)
}

// replay --wait of a group whose consumers are deleted and created again
// before any partition carried the replay out ends at once, saying the
// replay is void, and fails (exit status 1). Before, it waited until
// SNIPCTL_TIMEOUT for partitions that would never move back.
func TestReplayWaitOfAGroupCreatedAgainSaysTheReplayIsVoid(t *testing.T) {
	t.Parallel()
	environ, js := appliedNATS(t)
	environ = append(environ, "SNIPCTL_TIMEOUT=60s")
	publishClicks(t, js, 10)
	ctx := t.Context()
	downGroup(t, js, "demo") // the group, no member: nobody carries the replay out

	type result struct {
		out  string
		err  error
		took time.Duration
	}
	res := make(chan result, 1)
	go func() {
		start := time.Now()
		out, err := snipctl(t, environ, "replay", "demo", "--from-seq", "1", "--wait")
		res <- result{out, err, time.Since(start)}
	}()
	testenv.WaitFor(t, 30*time.Second, "the replay requested", func() bool {
		st, err := reader.LatestRewind(ctx, js, "demo")
		return err == nil && st.ID != ""
	})
	requested := time.Now()
	for p := range 2 {
		if err := js.DeleteConsumer(ctx, events.ClicksStream, topology.GroupConsumerName("demo", p)); err != nil {
			t.Fatal(err)
		}
	}
	downGroup(t, js, "demo")
	r := <-res
	if !errors.Is(r.err, reader.ErrRewindVoid) || exitStatus(r.err) != 1 || time.Since(requested) > 20*time.Second {
		t.Errorf("replay --wait = %v (exit status %d) after %v, want ErrRewindVoid, exit status 1, at once\n%s",
			r.err, exitStatus(r.err), r.took.Round(time.Millisecond), r.out)
	}
	if strings.Contains(r.out, "every partition has moved back") {
		t.Errorf("replay --wait says the replay was carried out:\n%s", r.out)
	}
}

// replay --wait of a replay another replay of the group replaced (a second
// operator's, a console click) ends as soon as it reads the newer request,
// saying so and naming it, and fails (exit status 1): the partitions carry
// out the latest request only. Before, it waited until SNIPCTL_TIMEOUT.
func TestReplayWaitOfAReplayRequestedAgainSaysItWasReplaced(t *testing.T) {
	t.Parallel()
	environ, js := appliedNATS(t)
	environ = append(environ, "SNIPCTL_TIMEOUT=60s")
	publishClicks(t, js, 10)
	downGroup(t, js, "demo") // the group, no member: nobody carries a replay out
	// The waiter's reads of the request, seen on the server: only it reads
	// the request here.
	var reads atomic.Int64
	sub, err := js.Conn().Subscribe("$JS.API.DIRECT.GET.KV_"+topology.MembersBucket+".$KV."+topology.MembersBucket+".demo.rewind",
		func(*nats.Msg) { reads.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()

	type result struct {
		out string
		err error
	}
	res := make(chan result, 1)
	go func() {
		out, err := snipctl(t, environ, "replay", "demo", "--from-seq", "1", "--wait")
		res <- result{out, err}
	}()
	testenv.WaitFor(t, 30*time.Second, "the first replay's wait reading it", func() bool { return reads.Load() >= 2 })
	out, err := snipctl(t, environ, "replay", "demo", "--from-seq", "2")
	if err != nil {
		t.Fatalf("the second replay: %v\n%s", err, out)
	}
	requested := time.Now()
	m := regexp.MustCompile(`replay (\S+) requested for group demo`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("the second replay printed no ID:\n%s", out)
	}
	r := <-res
	if !errors.Is(r.err, reader.ErrRewindSuperseded) || !strings.Contains(r.err.Error(), m[1]) || exitStatus(r.err) != 1 ||
		time.Since(requested) > 5*time.Second {
		t.Errorf("replay --wait = %v (exit status %d) %v after the second replay, want ErrRewindSuperseded naming %s, exit status 1, at once\n%s",
			r.err, exitStatus(r.err), time.Since(requested).Round(time.Millisecond), m[1], r.out)
	}
	if strings.Contains(r.out, "every partition has moved back") {
		t.Errorf("replay --wait says the replay was carried out:\n%s", r.out)
	}
}

// replay of the webhooks group, whose consumers start at new events, is
// refused before anything is requested: JetStream moves such consumers
// back only to their ack floor. snipctl says so, names the endpoint replay
// webhooks offers instead, and exits 1. Before, the request was stored and
// every partition of the group retried a refused move for ever, delivering
// nothing more. A group started at a time replays from its start at the
// earliest, and snipctl says which partitions start there.
func TestReplayOfAGroupThatCannotGoBackSaysSo(t *testing.T) {
	t.Parallel()
	environ, js := appliedNATS(t)
	publishClicks(t, js, 10)
	create := func(group string, gc topology.GroupConsumer) {
		t.Helper()
		gc.AckWait, gc.PinnedTTL, gc.MaxAckPending = time.Minute, 5*time.Second, 100
		for p := range 2 {
			if _, err := js.CreateOrUpdateConsumer(t.Context(), events.ClicksStream, topology.GroupConsumerConfig(group, p, gc)); err != nil {
				t.Fatal(err)
			}
		}
	}
	create(topology.GroupWebhooks, topology.GroupConsumer{DeliverPolicy: jetstream.DeliverNewPolicy})
	out, err := snipctl(t, environ, "replay", topology.GroupWebhooks, "--since", "1h")
	if !errors.Is(err, reader.ErrNotReplayable) || exitStatus(err) != 1 ||
		!strings.Contains(err.Error(), "/api/webhooks/endpoints/<id>/replay") {
		t.Errorf("replay webhooks = %v (exit status %d), want ErrNotReplayable naming the endpoint replay, exit status 1\n%s", err, exitStatus(err), out)
	}
	if st, err := reader.LatestRewind(t.Context(), js, topology.GroupWebhooks); err != nil || st.ID != "" {
		t.Errorf("latest replay of webhooks %q (%v), want none requested", st.ID, err)
	}

	start := time.Now()
	publishClicks(t, js, 10)
	create("late", topology.GroupConsumer{DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &start})
	out, err = snipctl(t, environ, "replay", "late", "--from-seq", "1")
	if err != nil {
		t.Fatalf("replay late: %v\n%s", err, out)
	}
	if !strings.Contains(out, "partitions [0 1] start at the group's first event") {
		t.Errorf("replay of a group started after the position does not say where it starts:\n%s", out)
	}
}

// A replay from before CLICKS' oldest event (its retention discarded the
// ones before) starts at that event: snipctl says so, naming it and the
// position asked for, instead of reporting the replay as asked. A position
// CLICKS still holds, and --from-seq 1 ("the oldest retained"), draw no
// warning.
func TestReplayFromBeforeTheOldestRetainedEventSaysWhereItStarts(t *testing.T) {
	t.Parallel()
	environ, js := appliedNATS(t)
	before := time.Now().Add(-time.Hour)
	publishClicks(t, js, 10)
	downGroup(t, js, "loader")
	s, err := js.Stream(t.Context(), events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	// As the age limit does: the first five are gone.
	if err := s.Purge(t.Context(), jetstream.WithPurgeSequence(6)); err != nil {
		t.Fatal(err)
	}
	const warning = "CLICKS' oldest event now is sequence 6"
	for _, tc := range []struct {
		args []string
		warn bool
	}{
		{[]string{"--since", "2h"}, true},
		{[]string{"--from", before.UTC().Format(time.RFC3339)}, true},
		{[]string{"--from-seq", "3"}, true},
		{[]string{"--from-seq", "1"}, false},
		{[]string{"--from-seq", "6"}, false},
		{[]string{"--from-seq", "8"}, false},
	} {
		out, err := snipctl(t, environ, append([]string{"replay", "loader"}, tc.args...)...)
		if err != nil {
			t.Fatalf("replay loader %v: %v\n%s", tc.args, err, out)
		}
		if got := strings.Contains(out, warning) && strings.Contains(out, "not at "+strings.Join(tc.args, " ")); got != tc.warn {
			t.Errorf("replay loader %v: says where it starts = %v, want %v:\n%s", tc.args, got, tc.warn, out)
		}
	}
}

// replay --wait that runs out of SNIPCTL_TIMEOUT before every partition
// moved back (here no member runs) says that the replay stays requested,
// names the partitions still to move, how to wait longer, and not to ask
// again; the request is indeed still the group's latest.
func TestReplayWaitOutOfTimeSaysTheReplayStaysRequested(t *testing.T) {
	t.Parallel()
	environ, js := appliedNATS(t)
	publishClicks(t, js, 10)
	downGroup(t, js, "idle")
	out, err := snipctl(t, append(environ, "SNIPCTL_TIMEOUT=2s"), "replay", "idle", "--from-seq", "1", "--wait")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("replay --wait of a group with no member: err = %v, want the wait out of time\n%s", err, out)
	}
	for _, want := range []string{"stays requested", "partitions [0 1] move back", "SNIPCTL_TIMEOUT (now 2s)", "snipctl lag idle", "a new replay replaces this one"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the wait's error %q does not say %q", err, want)
		}
	}
	id := regexp.MustCompile(`replay (\S+) requested for group idle`).FindStringSubmatch(out)
	if id == nil {
		t.Fatalf("no replay ID in the output:\n%s", out)
	}
	if st, err := reader.LatestRewind(t.Context(), js, "idle"); err != nil || st.ID != id[1] || st.Done() {
		t.Errorf("latest replay of idle = %q (done %v, %v), want %s still to carry out", st.ID, st.Done(), err, id[1])
	}
}

// A position that names nothing to replay is refused, naming the flag and
// what it wants, and nothing is requested: --since 0 or less and
// --from-seq 0 (before, "give exactly one of" although one was given), a
// --from in the future, and a position after CLICKS' last event (before,
// a replay of nothing was requested, and --wait said every partition had
// moved back).
func TestReplayRefusesAPositionWithNothingToReplay(t *testing.T) {
	t.Parallel()
	environ, js := appliedNATS(t)
	publishClicks(t, js, 10)
	downGroup(t, js, "loader")
	for _, tc := range []struct {
		args  []string
		usage bool
		says  string
	}{
		{[]string{"--since", "0s"}, true, "--since 0s: want a duration of more than 0"},
		{[]string{"--since", "-1h"}, true, "--since -1h0m0s: want a duration of more than 0"},
		{[]string{"--from-seq", "0"}, true, "--from-seq 0: CLICKS sequences start at 1"},
		{[]string{"--from", time.Now().Add(24 * time.Hour).UTC().Format(time.RFC3339)}, true, "is in the future"},
		{[]string{"--from-seq", "11"}, false, "--from-seq 11 is after CLICKS' last event (sequence 10): nothing to replay"},
		// A moment ago: after the last click, stored before it.
		{[]string{"--since", "1ns"}, false, "is after CLICKS' last event (sequence 10, stored "},
	} {
		out, err := snipctl(t, append(environ, "SNIPCTL_TIMEOUT=5s"), append([]string{"replay", "loader", "--wait"}, tc.args...)...)
		if err == nil || errors.Is(err, errUsage) != tc.usage || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("replay loader %v: err = %v, want %s saying %q\n%s", tc.args, err, map[bool]string{true: "a usage error", false: "an error"}[tc.usage], tc.says, out)
		}
	}
	if st, err := reader.LatestRewind(t.Context(), js, "loader"); err != nil || st.ID != "" {
		t.Errorf("latest replay of loader = %q (%v), want none requested", st.ID, err)
	}
	if out, err := snipctl(t, environ, "replay", "loader", "--from-seq", "10"); err != nil {
		t.Errorf("replay loader --from-seq 10, the last event: %v\n%s", err, out)
	}
}

// A replay requested while the group's previous one is not carried out yet
// (no member has taken it) says that it replaces that one, naming it and
// the partitions still to move.
func TestReplayOverAReplayUnderWaySaysItReplacesIt(t *testing.T) {
	t.Parallel()
	environ, js := appliedNATS(t)
	publishClicks(t, js, 10)
	downGroup(t, js, "idle")
	out, err := snipctl(t, environ, "replay", "idle", "--from-seq", "1")
	if err != nil {
		t.Fatalf("first replay: %v\n%s", err, out)
	}
	if strings.Contains(out, "replaces") {
		t.Errorf("the first replay of the group says it replaces one:\n%s", out)
	}
	first := regexp.MustCompile(`replay (\S+) requested`).FindStringSubmatch(out)
	if first == nil {
		t.Fatalf("no replay ID in the output:\n%s", out)
	}
	out, err = snipctl(t, environ, "replay", "idle", "--from-seq", "5")
	if err != nil {
		t.Fatalf("second replay: %v\n%s", err, out)
	}
	if !strings.Contains(out, "warning: replay "+first[1]+" of group idle") || !strings.Contains(out, "partitions [0 1]: this replay replaces it") {
		t.Errorf("the second replay does not say it replaces %s:\n%s", first[1], out)
	}
}

// Two replays of a group asked at once (snipctl and the console, two
// operators) both checked before either requested: the one that requests
// second is refused, naming the first, rather than replacing it with
// neither warned; run again, it says it replaces it.
func TestReplayRequestedMeanwhileIsNotReplacedUnsaid(t *testing.T) {
	t.Parallel()
	environ, js := appliedNATS(t)
	publishClicks(t, js, 10)
	downGroup(t, js, "raced")
	var other string
	var once sync.Once
	hook := func(group string) {
		if group != "raced" {
			return // another test's replay
		}
		once.Do(func() {
			// The other operator's replay, checked and requested now.
			id, err := reader.Rewind(t.Context(), js, "raced", reader.FromSeq(5))
			if err != nil {
				t.Error(err)
			}
			other = id
		})
	}
	replayChecked.Store(&hook)
	t.Cleanup(func() { replayChecked.Store(nil) })
	out, err := snipctl(t, environ, "replay", "raced", "--from-seq", "1")
	if err == nil || !errors.Is(err, reader.ErrReplayRequestedMeanwhile) || other == "" || !strings.Contains(err.Error(), "replay "+other+" (requested ") {
		t.Fatalf("replay checked before another was requested: %v\n%s\nwant refused, naming replay %q requested meanwhile (it replaced it, unwarned)", err, out, other)
	}
	if st, err := reader.LatestRewind(t.Context(), js, "raced"); err != nil || st.ID != other {
		t.Errorf("latest replay = %q (%v), want the other operator's %s", st.ID, err, other)
	}
	out, err = snipctl(t, environ, "replay", "raced", "--from-seq", "1")
	if err != nil {
		t.Fatalf("run again: %v\n%s", err, out)
	}
	if !strings.Contains(out, "warning: replay "+other+" of group raced") || !strings.Contains(out, "this replay replaces it") {
		t.Errorf("run again, the replay does not say it replaces %s:\n%s", other, out)
	}
}

// downGroup makes group's consumers on the two partitions of appliedNATS's
// CLICKS, as the reader runtime does, with no member: nobody carries a
// replay out.
func downGroup(t *testing.T, js jetstream.JetStream, group string) {
	t.Helper()
	for p := range 2 {
		cfg := topology.GroupConsumerConfig(group, p, topology.GroupConsumer{
			AckWait: time.Minute, PinnedTTL: 5 * time.Second, MaxAckPending: 100, DeliverPolicy: jetstream.DeliverAllPolicy,
		})
		if _, err := js.CreateOrUpdateConsumer(t.Context(), events.ClicksStream, cfg); err != nil {
			t.Fatal(err)
		}
	}
}
