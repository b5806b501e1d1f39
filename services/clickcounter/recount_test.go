package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/clickcounter/internal/counter"
)

// A release that counted every click twice is fixed: the group is replayed
// from the first event with the right code. The counts end right, and while
// the recount runs the API shows the old numbers or the new ones, never one
// in between.
func TestFixAndRecount(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	buggy := s.start(t, "buggy", func(c *Config) {
		c.Hooks.Weight = func(*events.Click) int64 { return 2 }
	})
	links := codes(6)
	cs := s.publishClicks(t, links, 40, nil)
	old, want := totals(cs, 2), totals(cs, 1)
	waitTotals(t, buggy.addr, old)
	buggy.stop(t)

	// The fixed release. Its first batch after the rewind waits for the test
	// to look at the API, so the test sees the recount in progress for sure.
	var armed atomic.Bool
	var pausedPartition atomic.Int64
	paused, resume := make(chan struct{}), make(chan struct{})
	var once sync.Once
	fixed := s.start(t, "fixed", func(c *Config) {
		c.BatchSize = 10 // every partition's recount takes several batches
		c.Hooks.AfterWrite = func(ctx context.Context, p int, _ uint64) error {
			if armed.Load() {
				once.Do(func() {
					pausedPartition.Store(int64(p))
					close(paused)
					select {
					case <-resume:
					case <-ctx.Done():
					}
				})
			}
			return nil
		}
	})
	waitTotals(t, fixed.addr, old)

	// Poll every link's stats from the start of the rewind to its end.
	stopPoll := make(chan struct{})
	var polls sync.WaitGroup
	var seen sync.Map // "code/total" -> true
	polls.Go(func() {
		for {
			select {
			case <-stopPoll:
				return
			default:
			}
			for _, code := range links {
				st, _ := statsOf(t, fixed.addr, code)
				if st.Totals != old[code] && st.Totals != want[code] {
					t.Errorf("%s during the recount: %+v, want the old %+v or the new %+v", code, st.Totals, old[code], want[code])
				}
				seen.Store(code, true)
			}
		}
	})

	armed.Store(true)
	id, err := reader.Rewind(t.Context(), s.js, topology.GroupClickCounter, reader.FromSeq(1))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-paused:
	case <-time.After(60 * time.Second):
		t.Fatal("the recount never wrote a batch")
	}
	// Partitions recount independently; the paused one has written one
	// batch of its new generation and must still show the old numbers.
	inPaused := 0
	for _, code := range links {
		if events.Partition(code, testPartitions) != int(pausedPartition.Load()) {
			continue
		}
		inPaused++
		st, _ := statsOf(t, fixed.addr, code)
		if st.Totals != old[code] || st.AsOf.Recount == nil {
			t.Errorf("%s mid-recount: %+v as of %+v, want the old %+v and a recount in progress", code, st.Totals, st.AsOf, old[code])
		}
	}
	if inPaused == 0 {
		t.Fatalf("no link in the paused partition %d", pausedPartition.Load())
	}
	close(resume)
	waitTotals(t, fixed.addr, want)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := reader.WaitRewind(ctx, s.js, topology.GroupClickCounter, id); err != nil {
		t.Fatal(err)
	}
	close(stopPoll)
	polls.Wait()
	for _, code := range links {
		st, _ := statsOf(t, fixed.addr, code)
		if st.AsOf.Recount != nil || st.AsOf.Generation != 2 {
			t.Errorf("%s after the recount: as_of %+v, want generation 2 and no recount", code, st.AsOf)
		}
	}
	// The janitor drops generation 1 once generation 2 serves the reads.
	testenv.WaitFor(t, 30*time.Second, "generation 1 to be dropped", func() bool {
		keys, err := s.rdb.Keys(t.Context(), "cc:{p*}:g1:*").Result()
		return err == nil && len(keys) == 0
	})
}

// A recount whose last events are parked by the runtime (malformed: the
// counter never sees them), with no valid click after them in the
// partition: the replay's Until is one of them. The partition switches to
// the new generation all the same, with the right counts, once the runtime
// has passed them; it does not wait for a click that may never come.
func TestRecountWhoseLastEventsAreParkedSwitchesWithoutAnotherClick(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	buggy := s.start(t, "buggy", func(c *Config) {
		c.Hooks.Weight = func(*events.Click) int64 { return 2 }
	})
	const code = "quiet"
	cs := s.publishClicks(t, []string{code}, 5, nil)
	// The partition's last events: malformed, on the link's subject, so in
	// its partition; the second is the replay's Until.
	for _, data := range []string{`{not json`, `{"v":1}`} {
		if _, err := s.js.Publish(t.Context(), events.ClickSubject("acme", code), []byte(data)); err != nil {
			t.Fatal(err)
		}
	}
	old, want := totals(cs, 2), totals(cs, 1)
	waitTotals(t, buggy.addr, old)
	buggy.stop(t)

	// The fixed release recounts in batches of 5: the five clicks, then the
	// two parked events alone.
	fixed := s.start(t, "fixed", func(c *Config) { c.BatchSize = 5 })
	waitTotals(t, fixed.addr, old)
	id, err := reader.Rewind(t.Context(), s.js, topology.GroupClickCounter, reader.FromSeq(1))
	if err != nil {
		t.Fatal(err)
	}
	var last counter.Stats
	defer func() {
		if t.Failed() {
			t.Logf("last stats of %s: totals %+v as of %+v", code, last.Totals, last.AsOf)
		}
	}()
	testenv.WaitFor(t, 30*time.Second, "the partition to switch to generation 2 with the recounted totals", func() bool {
		last, _ = statsOf(t, fixed.addr, code)
		return last.AsOf.Generation == 2 && last.AsOf.Recount == nil && last.Totals == want[code]
	})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := reader.WaitRewind(ctx, s.js, topology.GroupClickCounter, id); err != nil {
		t.Fatal(err)
	}
	if got := metricValue(t, fixed.addr, `snip_clickcounter_recounts_total{result="finished"}`); got != 1 {
		t.Errorf("recounts_total{result=finished} = %v, want 1 (the partition with clicks)", got)
	}
	testenv.WaitFor(t, 30*time.Second, "generation 1 to be dropped", func() bool {
		keys, err := s.rdb.Keys(t.Context(), "cc:{p*}:g1:*").Result()
		return err == nil && len(keys) == 0
	})
}

// Verdicts travel FRAUD to the counter: a verdict before its click, the
// same verdict stored twice, and a reclassification back to human.
func TestVerdictsFromFraud(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	svc := s.start(t, "m1", nil)
	const code = "promo"
	c := events.Click{V: events.ClickVersion, ID: events.NewID(), Time: time.Now().UTC(), Code: code, Owner: "acme",
		Target: "https://example.com/", Visitor: "v1", Country: "NL", Referrer: "https://t.co/x"}
	p := events.Partition(code, testPartitions)
	// The fraud service knows the click's place; here it is the next
	// sequence the stream will give (nothing else is published meanwhile).
	info, err := s.js.Stream(t.Context(), events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	seq := info.CachedInfo().State.LastSeq + 1
	verdict := func(bot bool, id string) {
		t.Helper()
		v := events.FraudVerdict{V: events.FraudVersion, ID: id, Partition: p,
			FraudVerdictLabel: events.FraudVerdictLabel{ClickID: c.ID, ClickSeq: seq, Code: code, Owner: "acme", Rule: "visitor_burst", Bot: bot, ClickTime: c.Time, Country: c.Country, Referrer: c.Referrer, Time: time.Now().UTC()}}
		b, _ := json.Marshal(v)
		if _, err := s.js.Publish(t.Context(), events.FraudVerdictSubject("acme", code), b, jetstream.WithMsgID(id+"-"+events.NewID())); err != nil {
			t.Fatal(err)
		}
	}
	verdict(true, "bot-1")
	verdict(true, "bot-1") // stored twice
	testenv.WaitFor(t, 30*time.Second, "the verdicts to be handled", func() bool {
		return metricValue(t, svc.addr, `snip_clickcounter_feed_messages_total{feed="verdicts",result="ok"}`) == 2
	})
	if got := s.publish(t, c, c.ID); got != seq {
		t.Fatalf("click stored at %d, want %d", got, seq)
	}
	s.publishClicks(t, []string{code}, 2, nil)
	waitTotals(t, svc.addr, map[string]counter.Pair{code: {Human: 2, Bot: 1}})
	verdict(false, "human-2")
	waitTotals(t, svc.addr, map[string]counter.Pair{code: {Human: 3}})
	verdict(false, "human-2")
	verdict(true, "bot-3")
	waitTotals(t, svc.addr, map[string]counter.Pair{code: {Human: 2, Bot: 1}})
	st, _ := statsOf(t, svc.addr, code)
	if len(st.TopCountries) != 1 || st.TopCountries[0].Pair != (counter.Pair{Human: 2, Bot: 1}) {
		t.Errorf("countries = %+v, want NL 2 human 1 bot", st.TopCountries)
	}
}

// A flood of verdicts through FRAUD (fraud detection's link_flood labels
// every click of a link), some published twice, then some reversed: the
// batched feed applies each change once, in FRAUD order.
func TestVerdictFloodThroughFraud(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	svc := s.start(t, "m1", nil)
	const code, n = "flooded", 60
	p := events.Partition(code, testPartitions)
	cs := s.publishClicks(t, []string{code}, n, nil)
	waitTotals(t, svc.addr, map[string]counter.Pair{code: {Human: n}})
	seqs := clickSeqs(t, s.js, n)
	verdict := func(c events.Click, bot bool) {
		t.Helper()
		v := events.FraudVerdict{V: events.FraudVersion, ID: "v-" + events.NewID(), Partition: p,
			FraudVerdictLabel: events.FraudVerdictLabel{ClickID: c.ID, ClickSeq: seqs[c.ID], Code: code, Owner: "acme", Rule: "link_flood", Bot: bot, ClickTime: c.Time, Country: c.Country, Referrer: c.Referrer, Time: time.Now().UTC()}}
		b, _ := json.Marshal(v)
		if _, err := s.js.PublishAsync(events.FraudVerdictSubject("acme", code), b, jetstream.WithMsgID(v.ID)); err != nil {
			t.Fatal(err)
		}
	}
	for i, c := range cs {
		verdict(c, true)
		if i%4 == 0 {
			verdict(c, true) // published twice
		}
	}
	for _, c := range cs[:10] {
		verdict(c, false)
	}
	select {
	case <-s.js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		t.Fatal("verdicts not stored")
	}
	waitTotals(t, svc.addr, map[string]counter.Pair{code: {Human: 10, Bot: n - 10}})
	testenv.WaitFor(t, 30*time.Second, "every verdict handled", func() bool {
		return metricValue(t, svc.addr, `snip_clickcounter_feed_messages_total{feed="verdicts",result="ok"}`) == n+n/4+10
	})
	// Which copy counts as the change and which as unchanged or stale depends
	// on how the two workers' batches interleave; every verdict is one of them.
	var sum float64
	for _, result := range []string{"relabelled", "unchanged", "stale"} {
		sum += metricValue(t, svc.addr, `snip_clickcounter_corrections_total{result="`+result+`"}`)
	}
	if sum != n+n/4+10 {
		t.Errorf("corrections = %v, want one per verdict (%d)", sum, n+n/4+10)
	}
}

// A link created with no clicks is known from LINKS: its stats are zeros,
// not a 404; once deleted it is a 404.
func TestLinksFeedKnowsLinksWithoutClicks(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	svc := s.start(t, "m1", nil)
	publish := func(kind events.LinkEventKind) {
		e := events.LinkEvent{V: events.LinkVersion, ID: events.NewID(), Kind: kind, Time: time.Now(), Code: "fresh", Owner: "acme"}
		b, _ := json.Marshal(e)
		if _, err := s.js.Publish(t.Context(), events.LinkSubject(kind, "fresh"), b, jetstream.WithMsgID(e.ID)); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := statsOf(t, svc.addr, "fresh"); ok {
		t.Fatal("unknown link answered 200")
	}
	publish(events.LinkCreated)
	testenv.WaitFor(t, 30*time.Second, "the link to be known", func() bool {
		st, ok := statsOf(t, svc.addr, "fresh")
		return ok && st.Totals == counter.Pair{}
	})
	publish(events.LinkDeleted)
	testenv.WaitFor(t, 30*time.Second, "the deleted link to be a 404", func() bool {
		_, ok := statsOf(t, svc.addr, "fresh")
		return !ok
	})
}

// The negative count, end to end: a click published on one link's subject
// whose payload names a link of another partition (stored in the first
// link's partition, parked by every reader), and verdicts naming it with the
// partition and sequence it was stored at. The counter applies none of them,
// although its own partition for the named code has counted past that
// sequence: the code's counts never go negative.
func TestVerdictsAboutAClickStoredInAnotherPartitionMoveNothing(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	svc := s.start(t, "m1", nil)
	const code = "hac-neg-b"
	other := "carrier"
	for events.Partition(other, testPartitions) == events.Partition(code, testPartitions) {
		other += "x"
	}
	cs := s.publishClicks(t, []string{code}, 3, nil)
	waitTotals(t, svc.addr, map[string]counter.Pair{code: {Human: 3}})

	const strays = 13
	for i := range strays {
		c := events.Click{V: events.ClickVersion, ID: events.NewID(), Time: time.Now().UTC(), Code: code, Owner: "acme",
			Target: "https://example.com/", Visitor: "v1", Country: "US"}
		b, _ := json.Marshal(c)
		ack, err := s.js.Publish(t.Context(), events.ClickSubject("acme", other), b, jetstream.WithMsgID(c.ID))
		if err != nil {
			t.Fatal(err)
		}
		v := events.FraudVerdict{V: events.FraudVersion, ID: fmt.Sprintf("stray-%d", i), Partition: events.Partition(other, testPartitions),
			FraudVerdictLabel: events.FraudVerdictLabel{ClickID: c.ID, ClickSeq: ack.Sequence, // where it was stored
				Code: code, Owner: "acme", Rule: "link_flood", Bot: true, ClickTime: c.Time, Country: c.Country, Time: time.Now().UTC()}}
		vb, _ := json.Marshal(v)
		if _, err := s.js.Publish(t.Context(), events.FraudVerdictSubject("acme", code), vb, jetstream.WithMsgID(v.ID)); err != nil {
			t.Fatal(err)
		}
	}
	// More traffic on the code's own partition, past the strays' sequences.
	cs = append(cs, s.publishClicks(t, []string{code}, 2, nil)...)
	testenv.WaitFor(t, 30*time.Second, "the verdicts to be handled", func() bool {
		return metricValue(t, svc.addr, `snip_clickcounter_feed_messages_total{feed="verdicts",result="ok"}`) == strays
	})
	waitTotals(t, svc.addr, map[string]counter.Pair{code: {Human: int64(len(cs))}})
	if got := metricValue(t, svc.addr, `snip_clickcounter_corrections_total{result="not_counted"}`); got != strays {
		t.Errorf("corrections_total{result=not_counted} = %v, want %d", got, strays)
	}
	st, _ := statsOf(t, svc.addr, code)
	for _, c := range st.TopCountries {
		if c.Pair.Human < 0 || c.Pair.Bot < 0 {
			t.Errorf("country %s has negative counts %+v", c.Name, c.Pair)
		}
	}
}

// Verdict messages of many labels, as fraud detection publishes them: the
// same message delivered twice, and two messages cut differently (as two
// members judging overlapping batches cut them) labelling overlapping
// clicks. Each click moves to bot once.
func TestBulkVerdictsCountEachClickOnce(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	svc := s.start(t, "m1", nil)
	const code, n = "viral", 60
	p := events.Partition(code, testPartitions)
	cs := s.publishClicks(t, []string{code}, n, nil)
	waitTotals(t, svc.addr, map[string]counter.Pair{code: {Human: n}})
	seqs := clickSeqs(t, s.js, n)
	labels := func(cs []events.Click) []events.FraudVerdictLabel {
		out := make([]events.FraudVerdictLabel, len(cs))
		for i, c := range cs {
			out[i] = events.FraudVerdictLabel{ClickID: c.ID, ClickSeq: seqs[c.ID], Code: code, Owner: "acme",
				Rule: "link_flood", Bot: true, ClickTime: c.Time, Country: c.Country, Referrer: c.Referrer, Time: time.Now().UTC()}
		}
		return out
	}
	send := func(b events.FraudVerdictBatch, msgID string) {
		t.Helper()
		data, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.js.Publish(t.Context(), events.FraudVerdictBatchSubject(p), data, jetstream.WithMsgID(msgID)); err != nil {
			t.Fatal(err)
		}
	}
	a := events.SplitVerdicts(p, seqs[cs[0].ID], seqs[cs[39].ID], labels(cs[:40]))
	b := events.SplitVerdicts(p, seqs[cs[20].ID], seqs[cs[n-1].ID], labels(cs[20:]))
	if len(a) != 1 || len(b) != 1 {
		t.Fatalf("%d and %d messages, want one each", len(a), len(b))
	}
	send(a[0], a[0].ID)
	send(a[0], a[0].ID+"-again") // stored twice: delivered twice
	send(b[0], b[0].ID)
	waitTotals(t, svc.addr, map[string]counter.Pair{code: {Bot: n}})
	testenv.WaitFor(t, 30*time.Second, "every verdict message handled", func() bool {
		return metricValue(t, svc.addr, `snip_clickcounter_feed_messages_total{feed="verdicts",result="ok"}`) == 3
	})
	// 120 labels delivered; each of the 60 clicks moved once, the other 60
	// labels changed nothing.
	if got := metricValue(t, svc.addr, `snip_clickcounter_corrections_total{result="relabelled"}`); got != n {
		t.Errorf("%v relabelled, want %d (each click once)", got, n)
	}
	var rest float64
	for _, result := range []string{"unchanged", "stale"} {
		rest += metricValue(t, svc.addr, `snip_clickcounter_corrections_total{result="`+result+`"}`)
	}
	if rest != 60 {
		t.Errorf("%v labels unchanged or stale, want 60", rest)
	}
	waitTotals(t, svc.addr, map[string]counter.Pair{code: {Bot: n}})
}
