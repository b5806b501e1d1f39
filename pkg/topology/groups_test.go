package topology_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// codeIn returns a link code stored in partition p of n, distinct per i.
func codeIn(t *testing.T, p, n, i int) string {
	t.Helper()
	for j := range 10_000 {
		c := fmt.Sprintf("c%d-%d", i, j)
		if events.Partition(c, n) == p {
			return c
		}
	}
	t.Fatalf("no code in partition %d", p)
	return ""
}

func TestGroupFilters(t *testing.T) {
	t.Parallel()
	const n = 4
	a0, a1 := codeIn(t, 0, n, 0), codeIn(t, 1, n, 1)
	cases := []struct {
		name string
		p    int
		in   topology.Interest
		want []string
	}{
		{"nil interest reads the partition", 2, nil, []string{"2.clicks.>"}},
		{"empty interest reads nothing", 2, topology.Interest{}, []string{"2.clicks.~.~"}},
		{"an owner wanting every link", 1, topology.Interest{"acme": nil}, []string{"1.clicks.acme.>"}},
		{"codes go to their own partition only", 0, topology.Interest{"bob": {a0, a1}}, []string{"0.clicks.bob." + a0}},
		{"and none elsewhere", 3, topology.Interest{"bob": {a0, a1}}, []string{"3.clicks.~.~"}},
		{"several, sorted", 0, topology.Interest{"zed": nil, "bob": {a0}, "acme": nil}, []string{"0.clicks.acme.>", "0.clicks.bob." + a0, "0.clicks.zed.>"}},
	}
	for _, c := range cases {
		if got := topology.GroupFilters(c.p, n, c.in); !slices.Equal(got, c.want) {
			t.Errorf("%s: GroupFilters(%d, %v) = %q, want %q", c.name, c.p, c.in, got, c.want)
		}
	}
	many := topology.Interest{}
	for i := range topology.MaxGroupFilters + 1 {
		many[fmt.Sprintf("o%d", i)] = nil
	}
	if got := topology.GroupFilters(1, n, many); !slices.Equal(got, []string{"1.clicks.>"}) {
		t.Errorf("more than MaxGroupFilters owners: %q, want the whole partition", got)
	}
}

// TestNarrowGroupFiltersOnTheServer narrows a group's consumers on a real
// server and reads what each would be sent (NumPending, which the server
// counts with the consumer's filters).
func TestNarrowGroupFiltersOnTheServer(t *testing.T) {
	t.Parallel()
	const n = 2
	js := testenv.StartNATS(t).JetStream(t)
	ctx := t.Context()
	opts := topology.Defaults()
	opts.Partitions, opts.Storage = n, jetstream.MemoryStorage
	if err := topology.Apply(ctx, js, opts); err != nil {
		t.Fatal(err)
	}
	const group = "g"
	for p := range n {
		cfg := topology.GroupConsumerConfig(group, p, topology.GroupConsumer{AckWait: time.Minute, PinnedTTL: 3 * time.Second, MaxAckPending: 1000})
		if _, err := js.CreateConsumer(ctx, events.ClicksStream, cfg); err != nil {
			t.Fatal(err)
		}
	}
	// Three clicks of acme and two of bob in each partition.
	codes := [n][]string{}
	for p := range n {
		for i := range 5 {
			owner := "acme"
			if i >= 3 {
				owner = "bob"
			}
			c := codeIn(t, p, n, i)
			codes[p] = append(codes[p], c)
			b, _ := json.Marshal(events.Click{V: events.ClickVersion, ID: events.NewID(), Time: time.Now().UTC(), Code: c, Owner: owner, Target: "https://example.com/"})
			if _, err := js.Publish(ctx, events.ClickSubject(owner, c), b); err != nil {
				t.Fatal(err)
			}
		}
	}
	pending := func() [n]uint64 {
		var out [n]uint64
		for p := range n {
			c, err := js.Consumer(ctx, events.ClicksStream, topology.GroupConsumerName(group, p))
			if err != nil {
				t.Fatal(err)
			}
			out[p] = c.CachedInfo().NumPending
		}
		return out
	}
	narrow := func(in topology.Interest, v int64, wantChanged int) {
		t.Helper()
		got, err := topology.NarrowGroup(ctx, js, group, n, in, v)
		if err != nil {
			t.Fatalf("narrow to %v at version %d: %v", in, v, err)
		}
		if got != wantChanged {
			t.Errorf("narrow to %v at version %d changed %d consumers, want %d", in, v, got, wantChanged)
		}
	}
	// The server counts a consumer's pending messages after it acks their
	// publishes, and again after each change of its filter: read until the
	// count is what it must be.
	waitPending := func(want [n]uint64, what string) {
		t.Helper()
		var got [n]uint64
		testenv.WaitFor(t, 10*time.Second, fmt.Sprintf("%s: pending %v", what, want), func() bool {
			got = pending()
			return got == want
		})
	}
	waitPending([n]uint64{5, 5}, "before narrowing")

	narrow(topology.Interest{"acme": nil}, 1, n)
	waitPending([n]uint64{3, 3}, "acme only")
	// An older or equal version is left alone, whatever it says.
	narrow(topology.Interest{}, 1, 0)
	narrow(nil, 0, 0)
	if got := pending(); got != [n]uint64{3, 3} {
		t.Errorf("after older versions: pending %v, want [3 3] still", got)
	}
	// One of bob's codes, in partition 1: only partition 1 reads it.
	narrow(topology.Interest{"bob": {codes[1][4]}}, 2, n)
	waitPending([n]uint64{0, 1}, "one of bob's links")
	narrow(topology.Interest{}, 3, 1) // partition 0 read nothing already
	waitPending([n]uint64{0, 0}, "nothing wanted")
	// Back to everything; the consumers kept their place (nothing was
	// delivered, so everything is pending again) and their other settings.
	narrow(nil, 4, n)
	waitPending([n]uint64{5, 5}, "everything again")
	c, err := js.Consumer(ctx, events.ClicksStream, topology.GroupConsumerName(group, 0))
	if err != nil {
		t.Fatal(err)
	}
	cfg := c.CachedInfo().Config
	if cfg.Metadata["snip.group"] != group || cfg.Metadata[topology.InterestMetadata] != "4" ||
		cfg.PriorityPolicy != jetstream.PriorityPolicyPinned || cfg.AckPolicy != jetstream.AckAllPolicy {
		t.Errorf("narrowed consumer lost settings: %+v", cfg)
	}
	// A group whose consumers do not exist yet is left to its reader.
	if got, err := topology.NarrowGroup(ctx, js, "nobody", n, topology.Interest{}, 1); err != nil || got != 0 {
		t.Errorf("narrow a group without consumers: %d, %v; want 0, nil", got, err)
	}
}
