package main

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/deadletter"
	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// dlqWorld is NATS with the topology, a parked preview job and a click
// stored in CLICKS that the click counter parked; environ points snipctl
// at it.
type dlqWorld struct {
	js               jetstream.JetStream
	environ          []string
	jobSeq, clickSeq uint64
	// origSeq is the parked click's sequence in CLICKS.
	origSeq uint64
	job     events.PreviewJob
}

func newDLQWorld(t *testing.T) *dlqWorld {
	t.Helper()
	n := testenv.StartNATS(t)
	environ := []string{"NATS_URL=" + n.URL, "SNIP_PARTITIONS=4"}
	if out, err := snipctl(t, environ, "topology", "apply"); err != nil {
		t.Fatalf("topology apply: %v\n%s", err, out)
	}
	w := &dlqWorld{js: n.JetStream(t), environ: environ}
	w.job = events.PreviewJob{V: 1, ID: events.NewID(), Time: time.Now().UTC(), Code: "abc", Owner: "acme", Target: "https://example.com/"}
	data, _ := json.Marshal(w.job)
	ack, err := deadletter.Publish(t.Context(), w.js, deadletter.Parcel{
		Source: "preview", Reason: "http_5xx", Stream: events.PreviewJobsStream, Subject: events.PreviewJobSubject,
		Seq: 9, Attempts: 5, Error: "get https://example.com/: http status 503 Service Unavailable", Consumer: topology.PreviewConsumer, Data: data,
	})
	if err != nil {
		t.Fatal(err)
	}
	w.jobSeq = ack.Sequence
	click, _ := json.Marshal(events.Click{V: 1, ID: events.NewID(), Time: time.Now().UTC(), Code: "xyz", Owner: "acme", Visitor: "v"})
	stored, err := w.js.Publish(t.Context(), events.ClickSubject("acme", "xyz"), click)
	if err != nil {
		t.Fatal(err)
	}
	w.origSeq = stored.Sequence
	ack, err = deadletter.Publish(t.Context(), w.js, deadletter.Parcel{
		Source: "click-counter", Reason: "unknown_version", Stream: events.ClicksStream, Subject: events.PartitionedClickSubject(4, "acme", "xyz"),
		Seq: w.origSeq, Attempts: 1, Error: "decode click: version 2", Consumer: "click-counter-p1", Data: click,
	})
	if err != nil {
		t.Fatal(err)
	}
	w.clickSeq = ack.Sequence
	return w
}

func (w *dlqWorld) msgs(t *testing.T, stream string) uint64 {
	t.Helper()
	s, err := w.js.Stream(t.Context(), stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

func TestDLQListAndShow(t *testing.T) {
	t.Parallel()
	w := newDLQWorld(t)
	out, err := snipctl(t, w.environ, "dlq", "list")
	if err != nil {
		t.Fatalf("dlq list: %v\n%s", err, out)
	}
	for _, want := range []string{
		"click-counter  unknown_version  1      " + strconv.FormatUint(w.clickSeq, 10),
		"preview        http_5xx         1      " + strconv.FormatUint(w.jobSeq, 10),
		"http status 503", "2 dead letters",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("dlq list output lacks %q:\n%s", want, out)
		}
	}
	out, err = snipctl(t, w.environ, "dlq", "show", strconv.FormatUint(w.clickSeq, 10))
	if err != nil {
		t.Fatalf("dlq show: %v\n%s", err, out)
	}
	for _, want := range []string{
		"subject:   dead.click-counter.unknown_version", "from:      CLICKS seq " + strconv.FormatUint(w.origSeq, 10) + " (" + events.PartitionedClickSubject(4, "acme", "xyz") + ")",
		"redrive:   to clicks.acme.xyz on CLICKS", "Snip-Dead-Reason: unknown_version", `"code": "xyz"`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("dlq show output lacks %q:\n%s", want, out)
		}
	}
	if _, err := snipctl(t, w.environ, "dlq", "show", "999"); !errors.Is(err, deadletter.ErrNotFound) {
		t.Errorf("dlq show 999: err = %v, want ErrNotFound", err)
	}
}

func TestDLQRedrive(t *testing.T) {
	t.Parallel()
	// CLICKS holds the parked click's original, and its redriven copy.
	tests := []struct {
		name                           string
		args                           func(w *dlqWorld) []string
		wantJobs, wantClicks, wantLeft uint64
	}{
		{"by_sequence", func(w *dlqWorld) []string { return []string{strconv.FormatUint(w.jobSeq, 10)} }, 1, 1, 1},
		{"by_source", func(*dlqWorld) []string { return []string{"--source", "click-counter"} }, 0, 2, 1},
		{"by_reason", func(*dlqWorld) []string { return []string{"--reason", "http_5xx"} }, 1, 1, 1},
		{"by_source_and_reason_matching_nothing", func(*dlqWorld) []string { return []string{"--source", "preview", "--reason", "timeout"} }, 0, 1, 2},
		{"all", func(*dlqWorld) []string { return []string{"--all"} }, 1, 2, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := newDLQWorld(t)
			out, err := snipctl(t, w.environ, append([]string{"dlq", "redrive"}, tc.args(w)...)...)
			if err != nil {
				t.Fatalf("dlq redrive: %v\n%s", err, out)
			}
			got := [3]uint64{w.msgs(t, events.PreviewJobsStream), w.msgs(t, events.ClicksStream), w.msgs(t, events.DeadLetterStream)}
			if want := [3]uint64{tc.wantJobs, tc.wantClicks, tc.wantLeft}; got != want {
				t.Fatalf("jobs, clicks, dead letters = %v, want %v\n%s", got, want, out)
			}
			if tc.wantJobs == 1 {
				s, _ := w.js.Stream(t.Context(), events.PreviewJobsStream)
				m, err := s.GetLastMsgForSubject(t.Context(), events.PreviewJobSubject)
				if err != nil {
					t.Fatal(err)
				}
				if j, err := events.DecodePreviewJob(m.Data); err != nil || j.ID != w.job.ID {
					t.Fatalf("redriven job = %+v, %v; want job %s", j, err, w.job.ID)
				}
				if !strings.Contains(out, "-> jobs.preview, PREVIEW_JOBS seq 1") {
					t.Errorf("output:\n%s", out)
				}
			}
		})
	}
}

func TestDLQListEmptyAndUsage(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t)
	environ := []string{"NATS_URL=" + n.URL}
	if _, err := snipctl(t, environ, "topology", "apply"); err != nil {
		t.Fatal(err)
	}
	if out, err := snipctl(t, environ, "dlq", "list"); err != nil || !strings.Contains(out, "no dead letters") {
		t.Fatalf("dlq list on empty = %q, %v", out, err)
	}
	for _, args := range [][]string{
		{"dlq"}, {"dlq", "drop"}, {"dlq", "list", "x"}, {"dlq", "show"}, {"dlq", "show", "x"}, {"dlq", "show", "0"},
		{"dlq", "redrive"}, {"dlq", "redrive", "1", "--all"}, {"dlq", "redrive", "--all", "--source", "preview"},
		{"dlq", "redrive", "1", "--source", "preview"}, {"dlq", "redrive", "--nope"},
	} {
		if _, err := snipctl(t, nil, args...); !errors.Is(err, errUsage) {
			t.Errorf("snipctl %v: err = %v, want a usage error", args, err)
		}
	}
}

// TestDLQRedriveClickTheRelayParked: the outbox relay parks a click it will
// not publish before CLICKS ever stored it (so the dead letter names the
// subject it was published on, clicks.<owner>.<code>, and the outbox entry
// instead of a sequence). dlq show says where it would go, and dlq redrive
// sends it there: CLICKS stores it in the partition its code hashes to.
func TestDLQRedriveClickTheRelayParked(t *testing.T) {
	t.Parallel()
	w := newDLQWorld(t)
	click := events.Click{V: events.ClickVersion, ID: events.NewID(), Time: time.Now().UTC(), Code: "rel", Owner: "acme", Visitor: "v"}
	data, _ := json.Marshal(click)
	ack, err := deadletter.Publish(t.Context(), w.js, deadletter.Parcel{
		Source: "outbox", Reason: "too_large", Stream: events.ClicksStream, Subject: events.ClickSubject("acme", "rel"),
		Position: "1700000000000-3", Attempts: 1, Error: "nats: maximum payload exceeded", Consumer: "outbox", Data: data,
	})
	if err != nil {
		t.Fatal(err)
	}
	seq := strconv.FormatUint(ack.Sequence, 10)
	out, err := snipctl(t, w.environ, "dlq", "show", seq)
	if err != nil || !strings.Contains(out, "redrive:   to clicks.acme.rel on CLICKS") || !strings.Contains(out, "from:      CLICKS never stored (clicks.acme.rel)") {
		t.Fatalf("dlq show %s: %v\n%s", seq, err, out)
	}
	out, err = snipctl(t, w.environ, "dlq", "redrive", seq)
	if err != nil {
		t.Fatalf("dlq redrive %s: %v\n%s", seq, err, out)
	}
	s, err := w.js.Stream(t.Context(), events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(t.Context(), events.PartitionedClickSubject(4, "acme", "rel"))
	if err != nil {
		t.Fatalf("the redriven click is not in its partition: %v\n%s", err, out)
	}
	if c, err := events.ReadClick(m.Data, m.Subject, 4, m.Time); err != nil || c.ID != click.ID {
		t.Fatalf("redriven click = %+v, %v; want click %s", c, err, click.ID)
	}
	if _, err := deadletter.Get(t.Context(), w.js, ack.Sequence); !errors.Is(err, deadletter.ErrNotFound) {
		t.Errorf("dead letter after the redrive: %v, want ErrNotFound", err)
	}
}

// A --source or --reason that is not one subject token ("click-counter.x",
// "a b", a wildcard) could only match nothing, or more than named: it is a
// usage error, and nothing is redriven.
func TestDLQRedriveRefusesAFilterThatIsNotAToken(t *testing.T) {
	t.Parallel()
	w := newDLQWorld(t)
	for _, args := range [][]string{
		{"--source", "click-counter.x"},
		{"--source", "a b"},
		{"--source", ">"},
		{"--source", "*"},
		{"--reason", "http_5xx.>"},
	} {
		out, err := snipctl(t, w.environ, append([]string{"dlq", "redrive"}, args...)...)
		if !errors.Is(err, errUsage) {
			t.Errorf("dlq redrive %v: err = %v, want a usage error\n%s", args, err, out)
		}
	}
	if got := w.msgs(t, events.DeadLetterStream); got != 2 {
		t.Errorf("%d dead letters left, want the 2 parked", got)
	}
}

// A consumer group's user may publish its own dead.<group>.> letters: the
// webhooks' plants one saying a made-up click came from CLICKS, at the
// parked click's sequence. dlq show says it cannot be redriven and why;
// redrive --all leaves it in place, says why, redrives the others and exits
// with an error; CLICKS gains the genuine letter's click only. A genuine
// letter whose click is gone from CLICKS is refused by sequence, saying so.
func TestDLQRedriveLeavesAPlantedClickAndSaysWhy(t *testing.T) {
	t.Parallel()
	w := newDLQWorld(t)
	ctx := t.Context()
	madeUp, _ := json.Marshal(events.Click{V: 1, ID: events.NewID(), Time: time.Now().UTC(), Code: "xyz", Owner: "acme", Visitor: "nobody"})
	m := nats.NewMsg(events.DeadLetterSubject(topology.GroupWebhooks, "planted"))
	m.Header.Set(events.HeaderDeadSource, events.ClicksStream)
	m.Header.Set(events.HeaderDeadSubject, events.PartitionedClickSubject(4, "acme", "xyz"))
	m.Header.Set(events.HeaderDeadSeq, strconv.FormatUint(w.origSeq, 10))
	m.Data = madeUp
	ack, err := w.js.PublishMsg(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	planted := strconv.FormatUint(ack.Sequence, 10)
	out, err := snipctl(t, w.environ, "dlq", "show", planted)
	if err != nil || !strings.Contains(out, "redrive:   not possible: ") || !strings.Contains(out, "differs from what CLICKS holds there") {
		t.Errorf("dlq show %s: %v\n%s", planted, err, out)
	}
	out, err = snipctl(t, w.environ, "dlq", "redrive", "--all")
	if !errors.Is(err, deadletter.ErrOriginalDiffers) {
		t.Errorf("dlq redrive --all: err = %v, want ErrOriginalDiffers\n%s", err, out)
	}
	for _, want := range []string{"dead letter " + planted + ": ", "differs from what CLICKS holds there", "(left in place)", "2 redriven"} {
		if !strings.Contains(out, want) {
			t.Errorf("dlq redrive --all output lacks %q:\n%s", want, out)
		}
	}
	if got := [3]uint64{w.msgs(t, events.PreviewJobsStream), w.msgs(t, events.ClicksStream), w.msgs(t, events.DeadLetterStream)}; got != [3]uint64{1, 2, 1} {
		t.Errorf("jobs, clicks, dead letters = %v, want [1 2 1]: the planted letter left, its click not published", got)
	}

	// The genuine letter's click deleted from CLICKS (as its age limit would).
	w2 := newDLQWorld(t)
	s, err := w2.js.Stream(ctx, events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteMsg(ctx, w2.origSeq); err != nil {
		t.Fatal(err)
	}
	seq := strconv.FormatUint(w2.clickSeq, 10)
	out, err = snipctl(t, w2.environ, "dlq", "redrive", seq)
	if !errors.Is(err, deadletter.ErrOriginalGone) || !strings.Contains(out, "dead letter "+seq+": ") || !strings.Contains(out, "is gone from CLICKS") {
		t.Errorf("dlq redrive %s of a click gone from CLICKS: err = %v, want ErrOriginalGone\n%s", seq, err, out)
	}
	if n := w2.msgs(t, events.DeadLetterStream); n != 2 {
		t.Errorf("DEAD_LETTER holds %d, want 2 (the letter refused left in place)", n)
	}
}

// A letter whose redrive fails for its own reason (here its stream,
// PREVIEW_JOBS, answers no publish) does not stop `redrive --all`: it is
// left in place and named, the letters after it are redriven, and the
// command exits 1. Before, the first such letter ended the run, the later
// ones untried, and the summary counted one letter not redriven.
func TestDLQRedriveAllGoesOnPastALetterItCannotPublish(t *testing.T) {
	t.Parallel()
	w := newDLQWorld(t) // the preview job's letter first, then the click's
	if err := w.js.DeleteStream(t.Context(), events.PreviewJobsStream); err != nil {
		t.Fatal(err)
	}
	out, err := snipctl(t, w.environ, "dlq", "redrive", "--all")
	if err == nil || exitStatus(err) != 1 {
		t.Errorf("dlq redrive --all with a letter it cannot publish: err = %v, want exit status 1\n%s", err, out)
	}
	job := strconv.FormatUint(w.jobSeq, 10)
	for _, want := range []string{"dead letter " + job + ": ", "redriven " + strconv.FormatUint(w.clickSeq, 10) + " ", "1 redriven"} {
		if !strings.Contains(out, want) {
			t.Errorf("dlq redrive --all output lacks %q:\n%s", want, out)
		}
	}
	if got := [2]uint64{w.msgs(t, events.ClicksStream), w.msgs(t, events.DeadLetterStream)}; got != [2]uint64{2, 1} {
		t.Errorf("clicks, dead letters = %v, want [2 1]: the click redriven past the job's letter, which stays\n%s", got, out)
	}
}

// A redrive that runs out of time (SNIPCTL_TIMEOUT) or is stopped says so,
// and that the letters after were not tried, not that one letter was not
// redriven.
func TestDLQRedriveStoppedSaysTheRestWasNotTried(t *testing.T) {
	t.Parallel()
	w := newDLQWorld(t)
	out, err := snipctl(t, append(w.environ, "SNIPCTL_TIMEOUT=1ns"), "dlq", "redrive", "--all")
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "the rest not tried") || strings.Contains(err.Error(), "1 dead letters not redriven") {
		t.Errorf("dlq redrive --all out of time: err = %v, want one saying it stopped and the rest was not tried\n%s", err, out)
	}
	if got := w.msgs(t, events.DeadLetterStream); got != 2 {
		t.Errorf("%d dead letters left, want the 2 parked", got)
	}
}

// A filter that matches no dead letter (a mistyped source) says so, naming
// it and where the sources are listed, instead of a bare "0 redriven" that
// reads as if the letters had been dealt with; nothing is redriven, and
// the command succeeds: there was nothing to do.
func TestDLQRedriveOfAFilterMatchingNothingSaysSo(t *testing.T) {
	t.Parallel()
	w := newDLQWorld(t)
	out, err := snipctl(t, w.environ, "dlq", "redrive", "--source", "previw")
	if err != nil || !strings.Contains(out, "no dead letter matches --source previw") || !strings.Contains(out, "dlq list") {
		t.Errorf("dlq redrive --source previw: err = %v, want it to say nothing matches and name dlq list\n%s", err, out)
	}
	if got := w.msgs(t, events.DeadLetterStream); got != 2 {
		t.Errorf("%d dead letters left, want the 2 parked", got)
	}
}
