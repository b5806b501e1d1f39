package main

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/loadtest/internal/jsread"
	"github.com/snipdev/snip/loadtest/internal/truth"
	"github.com/snipdev/snip/loadtest/internal/workload"
	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// The count of the run's clicks in CLICKS reaches the sent count while a
// sent click is still held back in the redirect's outbox when a copy stored
// twice, or a timed-out click recorded late, makes up the count. Targets
// taken then are below the held click: the readers pass them, and the run
// would be caught up, and its catch-up time measured, before the click is
// even stored. The watch waits until every sent click is read back by ID,
// then judges the readers against targets at or past all of them.
func TestCatchUpWaitsForEverySentClickNotTheCount(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		attempts  uint64
		uncertain []uint64
		// stored are published before the watch starts (a sequence twice
		// is stored twice); held is published once the readers passed
		// the targets taken on the count.
		stored []uint64
		held   uint64
	}{
		{name: "a_timed_out_click_recorded_late_makes_up_the_count", attempts: 3, uncertain: []uint64{2}, stored: []uint64{0, 2}, held: 1},
		{name: "a_copy_stored_twice_makes_up_the_count", attempts: 2, stored: []uint64{0, 0}, held: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			js, tr, publish := newCatchUpRun(t, tc.attempts, tc.uncertain)
			for _, seq := range tc.stored {
				publish(seq, nil)
			}

			sys := &system{js: js, readers: jsread.NewReaders(js)}
			end := time.Now()
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			c, err := startCatchUp(ctx, sys, tr, end, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer c.stop()
			var d time.Duration
			var done bool
			testenv.WaitFor(t, 30*time.Second, "the reader past the targets taken on the count", func() bool {
				d, done = c.step(ctx)
				return done || c.passed >= 0
			})
			if done {
				t.Fatalf("caught up %s after the load, targets %v, while sent click %d is held back", d, c.targets.Clicks, tc.held)
			}

			released := time.Since(end)
			heldSeq := publish(tc.held, nil)
			testenv.WaitFor(t, 30*time.Second, "the run caught up once the held click is stored", func() bool {
				d, done = c.step(ctx)
				return done
			})
			if d < released {
				t.Errorf("catch-up time %s, before the held click was stored (%s after the load)", d, released)
			}
			if got := slices.Max(append(slices.Collect(maps.Values(c.targets.Clicks)), 0)); got < heldSeq {
				t.Errorf("targets %v, all below the held click at %d", c.targets.Clicks, heldSeq)
			}
		})
	}
}

// An invalid click is stored where the readers park it: the watch, like the
// oracle's log read, counts it as accounted for, so the run is judged caught
// up once the readers passed it, not left "not reached" until the deadline.
func TestCatchUpCountsAnInvalidClickTheReadersPark(t *testing.T) {
	t.Parallel()
	js, tr, publish := newCatchUpRun(t, 2, nil)
	publish(0, nil)
	invalidSeq := publish(1, func(c *events.Click) { c.Country = "not a country" })

	sys := &system{js: js, readers: jsread.NewReaders(js)}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	c, err := startCatchUp(ctx, sys, tr, time.Now(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.stop()
	testenv.WaitFor(t, 30*time.Second, "the run caught up with its invalid click stored", func() bool {
		_, done := c.step(ctx)
		return done
	})
	if got := slices.Max(append(slices.Collect(maps.Values(c.targets.Clicks)), 0)); got < invalidSeq {
		t.Errorf("targets %v, all below the invalid click at %d", c.targets.Clicks, invalidSeq)
	}
}

// newCatchUpRun starts NATS with Snip's topology (two partitions) and a
// reader that processes everything at once, and returns the truth of a run
// of attempts clicks (uncertain timed out) and how to store its click seq,
// changed by spoil when not nil (to store it invalid), returning its stream
// sequence.
func newCatchUpRun(t *testing.T, attempts uint64, uncertain []uint64) (jetstream.JetStream, *truth.Truth, func(seq uint64, spoil func(*events.Click)) uint64) {
	t.Helper()
	js := testenv.StartNATS(t).JetStream(t)
	opts := topology.Defaults()
	opts.Partitions = 2
	if err := topology.Apply(t.Context(), js, opts); err != nil {
		t.Fatalf("topology: %v", err)
	}
	// A reader that processes everything at once.
	rctx, stopReader := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		cfg := reader.Config{Group: topology.GroupClickCounter, Linger: 10 * time.Millisecond, Start: reader.StartAtOldest()}
		err := reader.Run(rctx, js, cfg, func(context.Context, int, []reader.Event) error { return nil })
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("reader: %v", err)
		}
	})
	t.Cleanup(func() { stopReader(); wg.Wait() })

	spec := workload.Spec{Seed: 7, Links: 5, ZipfS: 1, BotShare: 0.2, Visitors: 1000, CountryShare: 0.5}
	gen, err := workload.New(spec)
	if err != nil {
		t.Fatal(err)
	}
	tag := workload.NewTag()
	start := time.Now()
	tr := &truth.Truth{Version: truth.Version, Mode: truth.ModeEvents, Tag: tag.String(), Owner: "own-catchup",
		Spec: spec, Started: start, Ended: start, Attempts: attempts, Uncertain: uncertain}
	publish := func(seq uint64, spoil func(*events.Click)) uint64 {
		t.Helper()
		v := gen.Visit(seq)
		code := tag.LinkCode(v.Link)
		now := time.Now().UTC()
		c := events.Click{V: events.ClickVersion, ID: tag.EventID(seq, now), Time: now, Code: code, Owner: tr.Owner,
			Target: "https://example.com/" + code, IPPrefix: workload.IPPrefix(v.IP), Visitor: gen.VisitorHash(&v),
			Country: v.Country, RequestID: tag.RequestID(seq), Bot: v.Kind == workload.Bot}
		if spoil != nil {
			spoil(&c)
		}
		data, err := json.Marshal(&c)
		if err != nil {
			t.Fatal(err)
		}
		// No message ID: a copy is stored as the relay's retry
		// after a lost ack stores it.
		ack, err := js.PublishMsg(t.Context(), &nats.Msg{Subject: events.ClickSubject(tr.Owner, code), Data: data})
		if err != nil {
			t.Fatalf("publish click %d: %v", seq, err)
		}
		return ack.Sequence
	}
	return js, tr, publish
}
