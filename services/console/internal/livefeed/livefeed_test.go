package livefeed_test

import (
	"encoding/json"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/console/internal/consoletest"
	"github.com/snipdev/snip/services/console/internal/livefeed"
)

func startHub(t *testing.T, js jetstream.JetStream, cfg livefeed.Config) *livefeed.Hub {
	t.Helper()
	h := livefeed.New(js, cfg)
	done := make(chan error, 1)
	go func() { done <- h.Run(t.Context()) }() // t.Context ends before the cleanups run
	t.Cleanup(func() {
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("hub did not stop")
		}
	})
	return h
}

func receive(t *testing.T, s *livefeed.Subscription, n int) []livefeed.Click {
	t.Helper()
	var out []livefeed.Click
	for len(out) < n {
		select {
		case e := <-s.C():
			var c livefeed.Click
			if err := json.Unmarshal(e.Data, &c); err != nil {
				t.Fatal(err)
			}
			if e.ID != strconv.FormatUint(c.Seq, 10) || e.Name != "click" {
				t.Fatalf("event id %q name %q for click seq %d", e.ID, e.Name, c.Seq)
			}
			out = append(out, c)
		case <-time.After(30 * time.Second):
			t.Fatalf("received %d of %d clicks", len(out), n)
		}
	}
	return out
}

// A browser gets the last few clicks at once, then every click stored after
// it subscribed, in stream order, without the visitor's identity.
func TestBrowserGetsRecentThenLiveClicks(t *testing.T) {
	t.Parallel()
	_, js := consoletest.NATS(t)
	old := consoletest.Publish(t, js, consoletest.Clicks("acme", "old", 5)...)
	h := startHub(t, js, livefeed.Config{Recent: 3})
	s, err := h.Subscribe()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Unsubscribe(s)
	testenv.WaitFor(t, 30*time.Second, "the hub following CLICKS", func() bool { return h.Stats().LastSeq == old[4] })

	live := consoletest.Clicks("acme", "abc", 20)
	seqs := consoletest.Publish(t, js, live...)
	got := receive(t, s, 3+len(live)) // the three recent ones come through C: the hub started after Subscribe
	var gotSeqs []uint64
	for _, c := range got {
		gotSeqs = append(gotSeqs, c.Seq)
	}
	if d := cmp.Diff(append(old[2:], seqs...), gotSeqs); d != "" {
		t.Errorf("sequences (-want +got):\n%s", d)
	}
	last := got[len(got)-1]
	info, err := js.Stream(t.Context(), events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	want := livefeed.Click{Seq: seqs[19], Partition: events.Partition("abc", consoletest.Partitions), Time: live[19].Time,
		Code: "abc", Owner: "acme", Country: "DE", Bot: true, ReferrerHost: "news.example.org", StreamCreated: info.CachedInfo().Created.UTC()}
	if d := cmp.Diff(want, last); d != "" {
		t.Errorf("last click (-want +got):\n%s", d)
	}

	// A second browser gets the last three at once.
	s2, err := h.Subscribe()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Unsubscribe(s2)
	var recent []string
	for _, e := range s2.Recent() {
		recent = append(recent, e.ID)
	}
	if d := cmp.Diff([]string{strconv.FormatUint(seqs[17], 10), strconv.FormatUint(seqs[18], 10), strconv.FormatUint(seqs[19], 10)}, recent); d != "" {
		t.Errorf("recent clicks of a new browser (-want +got):\n%s", d)
	}
}

// A browser that does not read loses clicks beyond its queue, counted; the
// queue never grows past Buffer, and a browser that reads is not held up.
func TestSlowBrowserLosesClicksNotMemory(t *testing.T) {
	t.Parallel()
	_, js := consoletest.NATS(t)
	h := startHub(t, js, livefeed.Config{Buffer: 64, MaxRate: 1e6})
	slow, err := h.Subscribe()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Unsubscribe(slow)
	reading, err := h.Subscribe()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Unsubscribe(reading)
	testenv.WaitFor(t, 30*time.Second, "the hub following CLICKS", func() bool { return h.Stats().Following })

	received := make(chan int)
	go func() {
		n := 0
		deadline := time.Now().Add(30 * time.Second)
		for {
			select {
			case <-reading.C():
				n++
			case <-time.After(time.Second):
				// Quiet for a second: done once every click is accounted
				// for (received or dropped), or at the deadline; a late
				// start of the publishing is not the end.
				if uint64(n)+reading.Dropped() >= 200 || time.Now().After(deadline) {
					received <- n
					return
				}
			}
		}
	}()
	seqs := consoletest.Publish(t, js, consoletest.Clicks("acme", "abc", 200)...)
	testenv.WaitFor(t, 30*time.Second, "every click seen", func() bool { return h.Stats().LastSeq == seqs[199] })
	if n := len(slow.C()); n != 64 {
		t.Errorf("slow browser's queue holds %d clicks, want its buffer (64)", n)
	}
	if d := slow.Dropped(); d != 200-64 {
		t.Errorf("slow browser dropped %d clicks, want %d", d, 200-64)
	}
	if n := <-received; uint64(n)+reading.Dropped() != 200 || n < 64 {
		t.Errorf("reading browser received %d and dropped %d of 200", n, reading.Dropped())
	}
}

func TestBrowsersAreLimitedAndRateIsCapped(t *testing.T) {
	t.Parallel()
	_, js := consoletest.NATS(t)
	h := startHub(t, js, livefeed.Config{MaxBrowsers: 1, MaxRate: 1, Recent: 1, Buffer: 1000})
	s, err := h.Subscribe()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Subscribe(); !errors.Is(err, livefeed.ErrTooManyBrowsers) {
		t.Fatalf("second browser: err = %v, want ErrTooManyBrowsers", err)
	}
	testenv.WaitFor(t, 30*time.Second, "the hub following CLICKS", func() bool { return h.Stats().Following })
	began := time.Now()
	seqs := consoletest.Publish(t, js, consoletest.Clicks("acme", "abc", 100)...)
	testenv.WaitFor(t, 30*time.Second, "every click seen", func() bool { return h.Stats().LastSeq == seqs[99] })
	// The burst is max(Recent, MaxRate) = 1: one click, then one a second
	// while the clicks come in, however long a loaded machine takes to
	// publish and read them (at most the waits above, so most are
	// skipped); the rest are skipped, counted.
	took := time.Since(began)
	allowed := 2 + int(took.Seconds()) // the burst, and a token begun before the publishing
	if st := h.Stats(); len(s.C()) > allowed || uint64(len(s.C()))+st.Skipped != 100 {
		t.Errorf("forwarded %d, skipped %d of 100 in %s at 1 click/s; want at most %d forwarded and every click accounted for",
			len(s.C()), st.Skipped, took.Round(time.Millisecond), allowed)
	}
	h.Unsubscribe(s)
	if _, err := h.Subscribe(); err != nil {
		t.Fatalf("a browser after the first left: %v", err)
	}
}

// With nobody watching, the hub stops its consumer.
func TestHubStopsFollowingWhenNobodyWatches(t *testing.T) {
	t.Parallel()
	_, js := consoletest.NATS(t)
	h := startHub(t, js, livefeed.Config{Idle: 100 * time.Millisecond})
	consumers := func() int {
		s, err := js.Stream(t.Context(), events.ClicksStream)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Consumers
	}
	s, err := h.Subscribe()
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "a consumer on CLICKS", func() bool { return consumers() == 1 })
	h.Unsubscribe(s)
	testenv.WaitFor(t, 30*time.Second, "the consumer gone", func() bool { return consumers() == 0 && !h.Stats().Following })
}

// A browser that comes after the consumer stopped (nobody watched for Idle)
// gets the recent clicks once each: not the ones the stopped consumer had
// forwarded, which the new consumer forwards again.
func TestABrowserAfterTheConsumerStoppedGetsTheRecentClicksOnce(t *testing.T) {
	t.Parallel()
	_, js := consoletest.NATS(t)
	h := startHub(t, js, livefeed.Config{Recent: 3, Idle: 100 * time.Millisecond})
	first := consoletest.Publish(t, js, consoletest.Clicks("acme", "first", 5)...)
	s, err := h.Subscribe()
	if err != nil {
		t.Fatal(err)
	}
	receive(t, s, 3)
	h.Unsubscribe(s)
	testenv.WaitFor(t, 30*time.Second, "the consumer stopped", func() bool { return !h.Stats().Following })

	later := consoletest.Publish(t, js, consoletest.Clicks("acme", "later", 2)...)
	s2, err := h.Subscribe()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Unsubscribe(s2)
	var got []uint64
	for _, e := range s2.Recent() {
		seq, _ := strconv.ParseUint(e.ID, 10, 64)
		got = append(got, seq)
	}
	for len(got) == 0 || got[len(got)-1] != later[1] {
		got = append(got, receive(t, s2, 1)[0].Seq)
	}
	if d := cmp.Diff([]uint64{first[4], later[0], later[1]}, got); d != "" {
		t.Errorf("the second browser's clicks, recent then live (-want +got):\n%s", d)
	}
}

// A CLICKS deleted and created again while browsers watch (snipctl, a
// restore) starts at sequence 1: the hub's consumer, which nats.go resumes
// after the last click it had, would wait for the new stream's sequences to
// pass the old ones and show nothing until then. The hub notices the new
// stream and follows it from its newest clicks, marked with the new
// stream's creation time, so a page tells them from the old ones.
func TestHubFollowsACLICKSCreatedAgain(t *testing.T) {
	t.Parallel()
	_, js := consoletest.NATS(t)
	h := startHub(t, js, livefeed.Config{Recent: 10}) // the new stream's 5 clicks are within its recent ones
	s, err := h.Subscribe()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Unsubscribe(s)
	testenv.WaitFor(t, 30*time.Second, "the hub following CLICKS", func() bool { return h.Stats().Following })
	consoletest.Publish(t, js, consoletest.Clicks("acme", "old", 30)...)
	old := receive(t, s, 30)

	if err := js.DeleteStream(t.Context(), events.ClicksStream); err != nil {
		t.Fatal(err)
	}
	o := topology.Defaults()
	o.Partitions = consoletest.Partitions
	o.Storage = jetstream.MemoryStorage
	if err := topology.Apply(t.Context(), js, o); err != nil {
		t.Fatal(err)
	}
	seqs := consoletest.Publish(t, js, consoletest.Clicks("acme", "new", 5)...)
	var got []livefeed.Click
	deadline := time.After(30 * time.Second)
	for len(got) < len(seqs) {
		select {
		case e := <-s.C():
			var c livefeed.Click
			if err := json.Unmarshal(e.Data, &c); err != nil {
				t.Fatal(err)
			}
			got = append(got, c)
		case <-deadline:
			t.Fatalf("30 s after CLICKS was created again the page got %d of its %d new clicks (sequences %v), want them all: %+v",
				len(got), len(seqs), seqs, got)
		}
	}
	for i, c := range got {
		if c.Seq != seqs[i] || c.Code != "new" || !c.StreamCreated.After(old[0].StreamCreated) {
			t.Errorf("new click %d: seq %d code %s of the CLICKS created %s, want seq %d code new of the one created after %s",
				i, c.Seq, c.Code, c.StreamCreated, seqs[i], old[0].StreamCreated)
		}
	}
}
