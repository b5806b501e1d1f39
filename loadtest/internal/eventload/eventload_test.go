package eventload_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/loadtest/internal/eventload"
	"github.com/snipdev/snip/loadtest/internal/series"
	"github.com/snipdev/snip/loadtest/internal/truth"
	"github.com/snipdev/snip/loadtest/internal/workload"
	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

const (
	tag    = workload.Tag(0x2b67c1d3e)
	owner  = "acme"
	target = "https://example.test/articles"
)

func generator(t *testing.T) *workload.Generator {
	t.Helper()
	g, err := workload.New(workload.Spec{Seed: 11, Links: 6, ZipfS: 1.1, BotShare: 0.2, Visitors: 500, CountryShare: 0.8, ProbeEvery: 10})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// clicks starts a NATS server with Snip's topology (CLICKS in 8
// partitions) and returns a connection to it.
func clicks(t *testing.T) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	n := testenv.StartNATS(t)
	js := n.JetStream(t)
	if err := topology.Apply(t.Context(), js, topology.Defaults()); err != nil {
		t.Fatalf("topology: %v", err)
	}
	return n.Connect(t), js
}

// stored is one message of a stream, decoded the way every reader decodes
// it, by click sequence.
type stored struct {
	subject, msgID string
	click          events.Click
}

// readStream returns every message of stream by its click's sequence,
// failing on a message a reader would refuse or one stored twice.
func readStream(t *testing.T, js jetstream.JetStream, name string) map[uint64]stored {
	t.Helper()
	s, err := js.Stream(t.Context(), name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	partitions := topology.Defaults().Partitions
	out := map[uint64]stored{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(t.Context(), seq)
		if err != nil {
			t.Fatalf("message %d: %v", seq, err)
		}
		var c events.Click
		if name == events.ClicksStream {
			c, err = events.ReadClick(m.Data, m.Subject, partitions, m.Time)
		} else { // not partitioned
			c, err = events.DecodeClick(m.Data)
		}
		if err != nil {
			t.Fatalf("message %d on %s: a reader refuses it: %v", seq, m.Subject, err)
		}
		n, ok := tag.ParseEventID(c.ID)
		if !ok {
			t.Fatalf("message %d: event ID %s is not the run's", seq, c.ID)
		}
		if _, dup := out[n]; dup {
			t.Fatalf("click %d stored twice", n)
		}
		out[n] = stored{subject: m.Subject, msgID: m.Header.Get(events.HeaderMsgID), click: c}
	}
	return out
}

// wantClick is the click the workload says seq is, published at at.
func wantClick(g *workload.Generator, seq uint64, at time.Time) events.Click {
	v := g.Visit(seq)
	code := tag.LinkCode(v.Link)
	return events.Click{
		V: events.ClickVersion, ID: tag.EventID(seq, at), Time: at,
		Code: code, Owner: owner, Target: target + "/" + code,
		IPPrefix: workload.IPPrefix(v.IP), Visitor: g.VisitorHash(&v),
		UserAgent: v.UserAgent, Referrer: v.Referrer, Country: v.Country,
		RequestID: tag.RequestID(seq), Bot: v.Kind == workload.Bot,
	}
}

// runTotals are a run's meter and truth, as a comparable value.
type runTotals struct {
	Sent, OK, Errors uint64
	Probes           int
	Refused          []uint64
	Uncertain        []uint64
	Answers          map[string]uint64
	StoredSeqs       int
}

func TestWhatItPublishesIsWhatItRecords(t *testing.T) {
	t.Parallel()
	const rate, total = 500, 500
	tests := []struct {
		name string
		drop func(seq uint64) bool
	}{
		{name: "every_event"},
		// The injected fault: recorded as sent, never published.
		{name: "dropped_events_are_recorded_sent_but_not_published", drop: func(seq uint64) bool { return seq%7 == 3 }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			nc, js := clicks(t)
			g := generator(t)
			rec := truth.NewRecorder(total)
			m := series.NewMeter(time.Now(), rate)
			attempts, err := eventload.Run(t.Context(), nc, eventload.Config{
				Rate: rate, Duration: time.Second, Owner: owner, Target: target + "/", Tag: tag, Gen: g, Drop: tc.drop,
			}, rec, m)
			if err != nil {
				t.Fatal(err)
			}
			if attempts != total {
				t.Fatalf("attempted %d, want rate x duration = %d", attempts, total)
			}
			got := readStream(t, js, events.ClicksStream)
			var dropped, probes uint64
			for seq := range attempts {
				if tc.drop != nil && tc.drop(seq) {
					dropped++
					if _, ok := got[seq]; ok {
						t.Errorf("click %d dropped by the fault, but stored", seq)
					}
					continue
				}
				if g.Visit(seq).Kind == workload.Probe {
					probes++
				}
				s, ok := got[seq]
				if !ok {
					t.Errorf("click %d recorded sent, not stored", seq)
					continue
				}
				want := wantClick(g, seq, s.click.Time)
				if diff := cmp.Diff(want, s.click); diff != "" {
					t.Errorf("click %d (-the workload's +stored):\n%s", seq, diff)
				}
				if !strings.HasSuffix(s.subject, "."+events.ClickSubject(owner, want.Code)) || s.msgID != want.ID {
					t.Errorf("click %d on %s with Nats-Msg-Id %q, want on %s with %q", seq, s.subject, s.msgID, events.ClickSubject(owner, want.Code), want.ID)
				}
			}
			refused, uncertain, answers := rec.Finish(attempts)
			sm := m.Summarise(time.Second)
			gotTotals := runTotals{Sent: sm.Sent, OK: sm.OK, Errors: sm.Errors, Probes: m.ProbesSent(),
				Refused: refused, Uncertain: uncertain, Answers: answers, StoredSeqs: len(got)}
			wantAnswers := map[string]uint64{"ack": attempts - dropped}
			if dropped > 0 {
				wantAnswers["dropped (fault)"] = dropped
			}
			wantTotals := runTotals{Sent: attempts, OK: attempts - dropped, Probes: int(probes),
				Answers: wantAnswers, StoredSeqs: int(attempts - dropped)}
			if diff := cmp.Diff(wantTotals, gotTotals); diff != "" {
				t.Errorf("meter, truth and stream (-want +got):\n%s", diff)
			}
		})
	}
}

// The schedule is open and paced: event seq is due at seq/rate after the
// start, and never published before. Counted over the run's quarters, the
// events published by the end of each quarter are at most what was due
// (plus the one due at its end) and at least what was due a quarter
// earlier: the publisher keeps to the rate within a quarter of the run
// (half a second), whatever the machine's load does to single events.
func TestPublishesAtTheRateOverTheRun(t *testing.T) {
	t.Parallel()
	const rate, duration = 400, 2 * time.Second
	nc, js := clicks(t)
	rec := truth.NewRecorder(rate * 2)
	start := time.Now()
	m := series.NewMeter(start, rate)
	attempts, err := eventload.Run(t.Context(), nc, eventload.Config{
		Rate: rate, Duration: duration, Owner: owner, Tag: tag, Gen: generator(t),
	}, rec, m)
	if err != nil {
		t.Fatal(err)
	}
	got := readStream(t, js, events.ClicksStream)
	if attempts != rate*2 || len(got) != rate*2 {
		t.Fatalf("attempted %d, stored %d: want %d", attempts, len(got), rate*2)
	}
	const quarters = 4
	var by [quarters]int
	var early int
	var earliest time.Duration
	for seq, s := range got {
		// The click's time is taken as it is published; the wall clock,
		// to the nanosecond, as Run's schedule reads it.
		if d := start.Add(time.Duration(seq) * time.Second / rate).Sub(s.click.Time); d > time.Millisecond {
			early++
			earliest = max(earliest, d)
		}
		q := int(s.click.Time.Sub(start) * quarters / duration)
		for i := max(0, q); i < quarters; i++ {
			by[i]++
		}
	}
	if early > 0 {
		t.Errorf("%d clicks published before they were due, one %s early", early, earliest)
	}
	for i := range quarters {
		due := rate * (i + 1) * int(duration/time.Second) / quarters
		if by[i] > due+1 || by[i] < due-rate*int(duration/time.Second)/quarters {
			t.Errorf("by the end of quarter %d: %d published, want %d (at most one more, at most a quarter's %d fewer); per quarter: %v",
				i+1, by[i], due, rate*int(duration/time.Second)/quarters, by)
		}
	}
}

// A publish whose ack fails is published again, then recorded uncertain
// and counted as an error: here the stream is full (DiscardNew) after its
// first 50 messages.
func TestAFailedAckIsAnErrorAndUncertain(t *testing.T) {
	t.Parallel()
	const rate, limit = 400, 50
	n := testenv.StartNATS(t)
	js := n.JetStream(t)
	if _, err := js.CreateStream(t.Context(), jetstream.StreamConfig{
		Name: "FULL", Subjects: []string{"clicks.>"}, MaxMsgs: limit, Discard: jetstream.DiscardNew, Storage: jetstream.MemoryStorage,
	}); err != nil {
		t.Fatal(err)
	}
	rec := truth.NewRecorder(rate / 2)
	m := series.NewMeter(time.Now(), rate)
	attempts, err := eventload.Run(t.Context(), n.Connect(t), eventload.Config{
		Rate: rate, Duration: 500 * time.Millisecond, Owner: owner, Tag: tag, Gen: generator(t),
		MaxAttempts: 2, AckTimeout: 5 * time.Second,
	}, rec, m)
	if err != nil {
		t.Fatal(err)
	}
	if attempts != rate/2 {
		t.Fatalf("attempted %d, want %d", attempts, rate/2)
	}
	got := readStream(t, js, "FULL")
	refused, uncertain, answers := rec.Finish(attempts)
	sm := m.Summarise(time.Second)
	var wantUncertain []uint64
	for seq := range attempts {
		if _, ok := got[seq]; !ok {
			wantUncertain = append(wantUncertain, seq)
		}
	}
	// The acked are the stored, the rest uncertain; the meter says so too.
	gotTotals := runTotals{Sent: sm.Sent, OK: sm.OK, Errors: sm.Errors,
		Refused: refused, Uncertain: uncertain, Answers: answers, StoredSeqs: len(got)}
	wantTotals := runTotals{Sent: attempts, OK: limit, Errors: attempts - limit,
		Uncertain: wantUncertain, Answers: map[string]uint64{"ack": limit, "no ack": attempts - limit}, StoredSeqs: limit}
	if diff := cmp.Diff(wantTotals, gotTotals); diff != "" {
		t.Errorf("meter, truth and stream (-want +got):\n%s", diff)
	}
}

func TestCancelStopsPublishingAndKeepsEveryOutcome(t *testing.T) {
	t.Parallel()
	const rate = 500
	nc, js := clicks(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	rec := truth.NewRecorder(rate * 10)
	m := series.NewMeter(time.Now(), rate)
	go func() {
		testenv.Poll(30*time.Second, func() bool { return ctx.Err() != nil || m.Summarise(0).OK >= 100 })
		cancel()
	}()
	attempts, err := eventload.Run(ctx, nc, eventload.Config{
		Rate: rate, Duration: 10 * time.Second, Owner: owner, Tag: tag, Gen: generator(t),
	}, rec, m)
	if err != nil {
		t.Fatal(err)
	}
	if attempts < 100 || attempts >= rate*10 {
		t.Fatalf("attempted %d: want the run cut short after 100 acks", attempts)
	}
	got := readStream(t, js, events.ClicksStream)
	refused, uncertain, answers := rec.Finish(attempts)
	sm := m.Summarise(time.Second)
	gotTotals := runTotals{Sent: sm.Sent, OK: sm.OK, Refused: refused, Uncertain: uncertain, Answers: answers, StoredSeqs: len(got)}
	wantTotals := runTotals{Sent: attempts, OK: attempts, Answers: map[string]uint64{"ack": attempts}, StoredSeqs: int(attempts)}
	if diff := cmp.Diff(wantTotals, gotTotals); diff != "" {
		t.Errorf("every attempt acked, recorded and stored, none beyond (-want +got):\n%s", diff)
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	nc, _ := clicks(t)
	tests := []struct {
		name   string
		change func(*eventload.Config)
		want   string
	}{
		{name: "no_rate", change: func(c *eventload.Config) { c.Rate = 0 }, want: "rate 0"},
		{name: "no_duration", change: func(c *eventload.Config) { c.Duration = 0 }, want: "duration 0s"},
		{name: "owner_not_a_token", change: func(c *eventload.Config) { c.Owner = "ac.me" }, want: `owner "ac.me"`},
		{name: "no_generator", change: func(c *eventload.Config) { c.Gen = nil }, want: "no workload generator"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := eventload.Config{Rate: 10, Duration: time.Second, Owner: owner, Tag: tag, Gen: generator(t)}
			tc.change(&cfg)
			m := series.NewMeter(time.Now(), 10)
			n, err := eventload.Run(t.Context(), nc, cfg, truth.NewRecorder(1), m)
			if err == nil || !strings.Contains(err.Error(), tc.want) || n != 0 || m.Summarise(0).Sent != 0 {
				t.Errorf("Run = %d, %v (sent %d): want nothing sent and an error saying %q", n, err, m.Summarise(0).Sent, tc.want)
			}
		})
	}
}
