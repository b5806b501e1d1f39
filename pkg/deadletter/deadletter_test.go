package deadletter_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/deadletter"
	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

func newJS(t *testing.T) jetstream.JetStream {
	t.Helper()
	js := testenv.StartNATS(t).JetStream(t)
	o := topology.Defaults()
	o.Partitions = 4
	o.Storage = jetstream.MemoryStorage
	if err := topology.Apply(t.Context(), js, o); err != nil {
		t.Fatal(err)
	}
	return js
}

func job(t *testing.T) []byte {
	t.Helper()
	b, err := json.Marshal(events.PreviewJob{V: events.PreviewJobVersion, ID: events.NewID(), Time: time.Now().UTC(), Code: "abc", Owner: "acme", Target: "https://example.com/"})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func parcel(data []byte, reason string, seq uint64) deadletter.Parcel {
	return deadletter.Parcel{
		Source: "preview", Reason: reason, Stream: events.PreviewJobsStream, Subject: events.PreviewJobSubject,
		Seq: seq, Attempts: 5, Error: "GET https://example.com/: 503 Service Unavailable", Consumer: topology.PreviewConsumer, Data: data,
	}
}

func streamMsgs(t *testing.T, js jetstream.JetStream, name string) uint64 {
	t.Helper()
	s, err := js.Stream(t.Context(), name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

func TestPublishTwiceStoresOnce(t *testing.T) {
	t.Parallel()
	js := newJS(t)
	p := parcel(job(t), "http_5xx", 7)
	first, err := deadletter.Publish(t.Context(), js, p)
	if err != nil {
		t.Fatal(err)
	}
	// The second path (an advisory handler) parks the same message with
	// another reason: same Nats-Msg-Id, so it is a duplicate.
	p.Reason = "max_deliveries"
	second, err := deadletter.Publish(t.Context(), js, p)
	if err != nil {
		t.Fatal(err)
	}
	if first.Duplicate || !second.Duplicate || second.Sequence != first.Sequence {
		t.Fatalf("acks = %+v, %+v; want the second to be a duplicate of the first", first, second)
	}
	if n := streamMsgs(t, js, events.DeadLetterStream); n != 1 {
		t.Fatalf("DEAD_LETTER holds %d messages, want 1", n)
	}
	l, err := deadletter.Get(t.Context(), js, first.Sequence)
	if err != nil {
		t.Fatal(err)
	}
	want := deadletter.Letter{
		Seq: first.Sequence, Subject: "dead.preview.http_5xx", Source: "preview", Reason: "http_5xx",
		Stream: events.PreviewJobsStream, OrigSubject: events.PreviewJobSubject, OrigSeq: 7, Attempts: 5,
		Error: p.Error, Consumer: topology.PreviewConsumer, ID: deadletter.PayloadID(p.Data), Data: p.Data,
	}
	if d := cmp.Diff(want, l, cmpLetter); d != "" {
		t.Fatalf("letter (-want +got):\n%s", d)
	}
}

var cmpLetter = cmp.FilterPath(func(p cmp.Path) bool {
	n := p.Last().String()
	return n == ".Time" || n == ".Header"
}, cmp.Ignore())

func TestPublishRejectsBadParcel(t *testing.T) {
	t.Parallel()
	js := newJS(t)
	ok := parcel(job(t), "timeout", 1)
	tests := []struct {
		name   string
		mutate func(*deadletter.Parcel)
	}{
		{"reason_with_dot", func(p *deadletter.Parcel) { p.Reason = "a.b" }},
		{"empty_source", func(p *deadletter.Parcel) { p.Source = "" }},
		{"no_origin_seq", func(p *deadletter.Parcel) { p.Seq = 0 }},
		{"position_with_colon", func(p *deadletter.Parcel) { p.Seq, p.Position = 0, "1-0:x" }},
		{"position_with_space", func(p *deadletter.Parcel) { p.Seq, p.Position = 0, "1 0" }},
		{"no_origin_stream", func(p *deadletter.Parcel) { p.Stream = "" }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := ok
			tc.mutate(&p)
			if _, err := deadletter.Publish(t.Context(), js, p); !errors.Is(err, deadletter.ErrInvalid) {
				t.Fatalf("Publish = %v, want ErrInvalid", err)
			}
		})
	}
}

func TestListGroupsBySourceAndReason(t *testing.T) {
	t.Parallel()
	js := newJS(t)
	ctx := t.Context()
	var newest uint64
	for i, reason := range []string{"not_found", "timeout", "not_found"} {
		ack, err := deadletter.Publish(ctx, js, parcel(job(t), reason, uint64(i+1)))
		if err != nil {
			t.Fatal(err)
		}
		if reason == "not_found" {
			newest = ack.Sequence
		}
	}
	click := parkClick(t, js, "click-counter", "malformed")
	groups, err := deadletter.List(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		Source, Reason string
		Count, Newest  uint64
	}
	var got []row
	for _, g := range groups {
		got = append(got, row{g.Source, g.Reason, g.Count, g.Newest.Seq})
	}
	want := []row{
		{"click-counter", "malformed", 1, click},
		{"preview", "not_found", 2, newest},
		{"preview", "timeout", 1, 2},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("groups (-want +got):\n%s", d)
	}
}

// parkClick parks a click the way the log readers do: the click is stored
// in CLICKS, and the letter names its stored subject (the partition in
// front) and sequence.
func parkClick(t *testing.T, js jetstream.JetStream, group, reason string) uint64 {
	t.Helper()
	data, seq := storeClick(t, js)
	ack, err := deadletter.Publish(t.Context(), js, deadletter.Parcel{
		Source: group, Reason: reason, Stream: events.ClicksStream, Subject: events.PartitionedClickSubject(4, "acme", "abc"),
		Seq: seq, Attempts: 1, Error: "decode click: malformed event", Consumer: group + "-p1", Data: data,
	})
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

// storeClick publishes a click of acme/abc to CLICKS and returns its
// payload and sequence.
func storeClick(t *testing.T, js jetstream.JetStream) ([]byte, uint64) {
	t.Helper()
	c := events.Click{V: events.ClickVersion, ID: events.NewID(), Time: time.Now().UTC(), Code: "abc", Owner: "acme", Target: "https://example.com/", Visitor: "v"}
	data, _ := json.Marshal(c)
	ack, err := js.Publish(t.Context(), events.ClickSubject("acme", "abc"), data, jetstream.WithMsgID(c.ID))
	if err != nil {
		t.Fatal(err)
	}
	return data, ack.Sequence
}

func TestRedrivePreviewJob(t *testing.T) {
	t.Parallel()
	js := newJS(t)
	ctx := t.Context()
	data := job(t)
	dead, err := deadletter.Publish(ctx, js, parcel(data, "timeout", 3))
	if err != nil {
		t.Fatal(err)
	}
	r, err := deadletter.Redrive(ctx, js, dead.Sequence)
	if err != nil {
		t.Fatal(err)
	}
	if r.Stream != events.PreviewJobsStream || r.Subject != events.PreviewJobSubject || r.Duplicate {
		t.Fatalf("redriven = %+v, want a fresh publish to %s", r, events.PreviewJobSubject)
	}
	s, _ := js.Stream(ctx, events.PreviewJobsStream)
	m, err := s.GetMsg(ctx, r.Seq)
	if err != nil {
		t.Fatal(err)
	}
	id := deadletter.PayloadID(data)
	if string(m.Data) != string(data) || m.Header.Get(events.HeaderMsgID) != id+":redrive:PREVIEW_JOBS:3" ||
		m.Header.Get(deadletter.HeaderRedriveOf) != itoa(dead.Sequence) || m.Header.Get(events.HeaderDeadReason) != "" {
		t.Fatalf("redriven message = %q %v", m.Data, m.Header)
	}
	if n := streamMsgs(t, js, events.DeadLetterStream); n != 0 {
		t.Fatalf("DEAD_LETTER holds %d after redrive, want 0", n)
	}
	if _, err := deadletter.Redrive(ctx, js, dead.Sequence); !errors.Is(err, deadletter.ErrNotFound) {
		t.Fatalf("second redrive = %v, want ErrNotFound", err)
	}
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }

func TestRedriveClickGoesBackToItsPartition(t *testing.T) {
	t.Parallel()
	js := newJS(t)
	ctx := t.Context()
	seq := parkClick(t, js, "click-counter", "unknown_version")
	r, err := deadletter.Redrive(ctx, js, seq)
	if err != nil {
		t.Fatal(err)
	}
	if r.Subject != events.ClickSubject("acme", "abc") || r.Stream != events.ClicksStream {
		t.Fatalf("redriven to %s on %s, want %s on CLICKS", r.Subject, r.Stream, events.ClickSubject("acme", "abc"))
	}
	s, _ := js.Stream(ctx, events.ClicksStream)
	m, err := s.GetMsg(ctx, r.Seq)
	if err != nil {
		t.Fatal(err)
	}
	if want := events.PartitionedClickSubject(4, "acme", "abc"); m.Subject != want {
		t.Fatalf("stored as %s, want %s", m.Subject, want)
	}
	orig, err := s.GetMsg(ctx, r.Letter.OrigSeq)
	if err != nil {
		t.Fatal(err)
	}
	if string(m.Data) != string(orig.Data) || r.Seq == r.Letter.OrigSeq {
		t.Fatalf("redriven copy at seq %d = %q; want a new copy of seq %d, %q", r.Seq, m.Data, r.Letter.OrigSeq, orig.Data)
	}
}

// TestRedriveClickParkedBeforeItReachedCLICKS: the outbox relay parks a
// click it will not publish under its position in the outbox (no stream
// sequence yet) and the subject it was to be published on, without a
// partition. Such a letter is stored once however often it is parked, and
// its redrive publishes it on that subject: CLICKS puts it in the partition
// its code hashes to.
func TestRedriveClickParkedBeforeItReachedCLICKS(t *testing.T) {
	t.Parallel()
	js := newJS(t)
	ctx := t.Context()
	data, _ := json.Marshal(events.Click{V: events.ClickVersion, ID: events.NewID(), Time: time.Now().UTC(), Code: "abc", Owner: "acme", Visitor: "v"})
	p := deadletter.Parcel{Source: "outbox", Reason: "too_large", Stream: events.ClicksStream, Subject: events.ClickSubject("acme", "abc"),
		Position: "1700000000000-0", Attempts: 1, Error: "message size exceeds maximum allowed", Consumer: "outbox", Data: data}
	first, err := deadletter.Publish(ctx, js, p)
	if err != nil {
		t.Fatal(err)
	}
	again, err := deadletter.Publish(ctx, js, p)
	if err != nil || !again.Duplicate || again.Sequence != first.Sequence {
		t.Fatalf("parking again = %+v, %v; want a duplicate of seq %d", again, err, first.Sequence)
	}
	l, err := deadletter.Get(ctx, js, first.Sequence)
	if err != nil {
		t.Fatal(err)
	}
	if want := deadletter.PositionMsgID("outbox", events.ClicksStream, "1700000000000-0", data); l.Header.Get(events.HeaderMsgID) != want || l.OrigSeq != 0 {
		t.Fatalf("letter Nats-Msg-Id %q, origin seq %d; want %q, 0", l.Header.Get(events.HeaderMsgID), l.OrigSeq, want)
	}
	r, err := deadletter.Redrive(ctx, js, first.Sequence)
	if err != nil {
		t.Fatal(err)
	}
	if r.Subject != events.ClickSubject("acme", "abc") || r.Stream != events.ClicksStream {
		t.Fatalf("redriven to %s on %s, want %s on CLICKS", r.Subject, r.Stream, events.ClickSubject("acme", "abc"))
	}
	s, _ := js.Stream(ctx, events.ClicksStream)
	m, err := s.GetMsg(ctx, r.Seq)
	if err != nil {
		t.Fatal(err)
	}
	if want := events.PartitionedClickSubject(4, "acme", "abc"); m.Subject != want {
		t.Fatalf("stored as %s, want %s", m.Subject, want)
	}
}

// TestRedriveLinkEventAndJobTheOutboxParked: the outbox relay parks the link
// events and preview jobs JetStream refused before they reached LINKS or
// PREVIEW_JOBS (dead.outbox.<reason>, a Redis position in place of a
// sequence), as it parks clicks: such a letter goes back to its stream.
func TestRedriveLinkEventAndJobTheOutboxParked(t *testing.T) {
	t.Parallel()
	js := newJS(t)
	ctx := t.Context()
	for i, f := range []struct{ stream, subject, data string }{
		{events.LinksStream, "links.created.abc", `{"v":1,"id":"link-event-1","kind":"created","code":"abc","owner":"acme"}`},
		{events.PreviewJobsStream, events.PreviewJobSubject, string(job(t))},
	} {
		p := deadletter.Parcel{Source: deadletter.OutboxSource, Reason: "unavailable", Stream: f.stream, Subject: f.subject,
			Position: "1700000000000-" + strconv.Itoa(i), Attempts: 1, Error: "refused", Consumer: deadletter.OutboxSource, Data: []byte(f.data)}
		dead, err := deadletter.Publish(ctx, js, p)
		if err != nil {
			t.Fatal(err)
		}
		r, err := deadletter.Redrive(ctx, js, dead.Sequence)
		if err != nil {
			t.Fatalf("redrive of the outbox's letter of %s: %v", f.stream, err)
		}
		if r.Stream != f.stream || r.Subject != f.subject {
			t.Fatalf("redriven to %s on %s, want %s on %s", r.Subject, r.Stream, f.subject, f.stream)
		}
	}
}

func TestRedriveRefusesLettersWithoutOrigin(t *testing.T) {
	t.Parallel()
	js := newJS(t)
	ctx := t.Context()
	tests := []struct {
		name   string
		header nats.Header
	}{
		{"no_headers", nats.Header{}},
		{"unknown_stream", nats.Header{events.HeaderDeadSource: {"ELSEWHERE"}, events.HeaderDeadSubject: {"x.y"}}},
		{"click_subject_too_short", nats.Header{events.HeaderDeadSource: {events.ClicksStream}, events.HeaderDeadSubject: {"clicks.acme"}}},
		{"click_subject_of_another_kind", nats.Header{events.HeaderDeadSource: {events.ClicksStream}, events.HeaderDeadSubject: {"links.created.abc"}}},
		// The headers are the publisher's word: a source that does not park
		// a stream's messages (a consumer group of CLICKS, "someone" here)
		// cannot have a job, a link event or an alert redriven there.
		{"preview_job_of_another_source", nats.Header{events.HeaderDeadSource: {events.PreviewJobsStream}, events.HeaderDeadSubject: {events.PreviewJobSubject}, events.HeaderDeadSeq: {"1"}}},
		{"link_event_of_another_source", nats.Header{events.HeaderDeadSource: {events.LinksStream}, events.HeaderDeadSubject: {"links.deleted.abc"}, events.HeaderDeadSeq: {"1"}}},
		{"verdicts_of_another_source", nats.Header{events.HeaderDeadSource: {events.FraudVerdictsStream}, events.HeaderDeadSubject: {events.FraudVerdictBatchSubject(0)}, events.HeaderDeadSeq: {"1"}}},
		{"alert", nats.Header{events.HeaderDeadSource: {events.FraudStream}, events.HeaderDeadSubject: {"fraud.alerts.abc"}, events.HeaderDeadSeq: {"1"}}},
	}
	for _, tc := range tests {
		m := nats.NewMsg("dead.someone." + tc.name)
		m.Header = tc.header
		m.Data = []byte("{}")
		ack, err := js.PublishMsg(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := deadletter.Redrive(ctx, js, ack.Sequence); !errors.Is(err, deadletter.ErrNotRedrivable) {
			t.Errorf("%s: Redrive = %v, want ErrNotRedrivable", tc.name, err)
		}
		if _, err := deadletter.Get(ctx, js, ack.Sequence); err != nil {
			t.Errorf("%s: the dead letter is gone after a refused redrive: %v", tc.name, err)
		}
	}
}

func TestEachStopsAtTheLetterStoredLastWhenItStarted(t *testing.T) {
	t.Parallel()
	js := newJS(t)
	ctx := t.Context()
	for i := range 3 {
		if _, err := deadletter.Publish(ctx, js, parcel(job(t), "timeout", uint64(i+1))); err != nil {
			t.Fatal(err)
		}
	}
	parkClick(t, js, "fraud-detection", "malformed")
	var seen []string
	err := deadletter.Each(ctx, js, deadletter.Filter("preview", ""), func(l deadletter.Letter) error {
		seen = append(seen, l.Subject)
		// A letter parked while Each runs is not visited.
		_, err := deadletter.Publish(ctx, js, parcel(job(t), "timeout", l.OrigSeq+100))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{"dead.preview.timeout", "dead.preview.timeout", "dead.preview.timeout"}, seen); d != "" {
		t.Fatalf("visited (-want +got):\n%s", d)
	}
}

func TestFilter(t *testing.T) {
	t.Parallel()
	tests := []struct{ source, reason, want string }{
		{"", "", "dead.*.*"}, {"preview", "", "dead.preview.*"}, {"", "timeout", "dead.*.timeout"}, {"preview", "timeout", "dead.preview.timeout"},
	}
	for _, tc := range tests {
		if got := deadletter.Filter(tc.source, tc.reason); got != tc.want {
			t.Errorf("Filter(%q, %q) = %q, want %q", tc.source, tc.reason, got, tc.want)
		}
	}
}

func TestMsgIDAndPayloadID(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, data, want string
	}{
		{"job_id", `{"v":1,"id":"0193c0de-0000-7000-8000-000000000001"}`, "0193c0de-0000-7000-8000-000000000001:dead:preview:9"},
		{"malformed_payload_uses_stream", `{not json`, "PREVIEW_JOBS:dead:preview:9"},
		{"id_with_colon_is_not_used", `{"id":"a:b"}`, "PREVIEW_JOBS:dead:preview:9"},
		{"id_with_space_is_not_used", `{"id":"a b"}`, "PREVIEW_JOBS:dead:preview:9"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := deadletter.MsgID("preview", events.PreviewJobsStream, 9, []byte(tc.data)); got != tc.want {
				t.Fatalf("MsgID = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestHeaderSafe(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", deadletter.MaxErrorLen) // 2 bytes each
	tests := []struct{ name, in, want string }{
		{"plain", "dial tcp: refused", "dial tcp: refused"},
		{"newlines", "a\r\nb\nc", "a  b c"},
		{"invalid_utf8", "a\xffb", "a?b"},
		{"long_cut_on_rune_boundary", long, strings.Repeat("é", deadletter.MaxErrorLen/2)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := deadletter.HeaderSafe(tc.in); got != tc.want {
				t.Fatalf("HeaderSafe = %q, want %q", got, tc.want)
			}
		})
	}
}

// A verdict message the click counter parked goes back to FRAUD_VERDICTS on
// the subject it had.
func TestRedriveSubjectOfAVerdictMessage(t *testing.T) {
	t.Parallel()
	l := deadletter.Letter{Seq: 7, Source: topology.GroupClickCounter, Stream: events.FraudVerdictsStream, OrigSubject: events.FraudVerdictBatchSubject(3)}
	got, err := l.RedriveSubject()
	if err != nil || got != events.FraudVerdictBatchSubject(3) {
		t.Fatalf("RedriveSubject() = %q, %v; want %q", got, err, events.FraudVerdictBatchSubject(3))
	}
}

// TestRedriveOfAnEventEveryGroupParkedPublishesItOnce: two consumer groups
// of CLICKS park the same event (an unknown version parks it in every
// group), so DEAD_LETTER holds a letter of each. Redriving both (dlq
// redrive --reason unknown_version) must put the event back on CLICKS once:
// every group reads every copy, so a copy per letter would have each group
// see the event twice.
func TestRedriveOfAnEventEveryGroupParkedPublishesItOnce(t *testing.T) {
	t.Parallel()
	js := newJS(t)
	ctx := t.Context()
	data, seq := storeClick(t, js)
	var letters []uint64
	for _, group := range []string{"click-counter", "fraud-detection"} {
		ack, err := deadletter.Publish(ctx, js, deadletter.Parcel{
			Source: group, Reason: "unknown_version", Stream: events.ClicksStream, Subject: events.PartitionedClickSubject(4, "acme", "abc"),
			Seq: seq, Attempts: 1, Error: "unknown version", Consumer: group + "-p1", Data: data,
		})
		if err != nil || ack.Duplicate {
			t.Fatalf("park by %s = %+v, %v; want a letter of its own", group, ack, err)
		}
		letters = append(letters, ack.Sequence)
	}
	var rs []deadletter.Redriven
	for _, seq := range letters {
		r, err := deadletter.Redrive(ctx, js, seq)
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, r)
	}
	if n := streamMsgs(t, js, events.ClicksStream); n != 2 {
		t.Fatalf("CLICKS holds %d copies of the event after redriving its %d letters (at seqs %d and %d), want 2: the original and one redriven", n, len(letters), rs[0].Seq, rs[1].Seq)
	}
	if rs[0].Duplicate || !rs[1].Duplicate || rs[1].Seq != rs[0].Seq {
		t.Fatalf("redriven to seq %d (duplicate %v) and %d (duplicate %v); want the second a duplicate of the first",
			rs[0].Seq, rs[0].Duplicate, rs[1].Seq, rs[1].Duplicate)
	}
	if n := streamMsgs(t, js, events.DeadLetterStream); n != 0 {
		t.Fatalf("DEAD_LETTER holds %d after redriving every letter, want 0", n)
	}
}

// plant publishes a letter on dead.webhooks.<reason>, as the webhooks
// service's NATS user may (every consumer group's user may publish its own
// dead.<group>.>): its headers and payload say whatever it likes.
func plant(t *testing.T, js jetstream.JetStream, reason, subject string, seq uint64, data []byte) uint64 {
	t.Helper()
	m := nats.NewMsg(events.DeadLetterSubject(topology.GroupWebhooks, reason))
	m.Header.Set(events.HeaderDeadSource, events.ClicksStream)
	m.Header.Set(events.HeaderDeadSubject, subject)
	if seq > 0 {
		m.Header.Set(events.HeaderDeadSeq, itoa(seq))
	}
	m.Data = data
	ack, err := js.PublishMsg(t.Context(), m)
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

// TestAClickAGroupPlantsIsNotRedriven: the webhooks' user (the one closest
// to owners' systems) plants letters saying a click came from CLICKS: one
// made up, with no sequence, at a sequence CLICKS never held, or at a real
// click's; a real click changed, or named on another subject. Redriven, any
// of them would be a click that never happened, counted by every reader. A
// group's letter is redriven only as the copy of the click CLICKS holds at
// its sequence, so each is refused, says why, stays on DEAD_LETTER, and
// CLICKS gains nothing.
func TestAClickAGroupPlantsIsNotRedriven(t *testing.T) {
	t.Parallel()
	js := newJS(t)
	ctx := t.Context()
	real, seq := storeClick(t, js)
	madeUp, _ := json.Marshal(events.Click{V: events.ClickVersion, ID: events.NewID(), Time: time.Now().UTC(), Code: "abc", Owner: "acme", Target: "https://example.com/", Visitor: "nobody"})
	var c events.Click
	if err := json.Unmarshal(real, &c); err != nil {
		t.Fatal(err)
	}
	c.Visitor = "someone else"
	changed, _ := json.Marshal(c)
	subject := events.PartitionedClickSubject(4, "acme", "abc")
	tests := []struct {
		name    string
		subject string
		seq     uint64
		data    []byte
		want    error
	}{
		{"made_up_without_a_sequence", subject, 0, madeUp, deadletter.ErrNotRedrivable},
		{"made_up_as_the_outbox_would_park_it", events.ClickSubject("acme", "abc"), 0, madeUp, deadletter.ErrNotRedrivable},
		{"made_up_unpartitioned_with_a_sequence", events.ClickSubject("acme", "abc"), seq, madeUp, deadletter.ErrNotRedrivable},
		{"made_up_at_a_sequence_CLICKS_never_held", subject, seq + 100, madeUp, deadletter.ErrOriginalGone},
		{"made_up_at_a_real_clicks_sequence", subject, seq, madeUp, deadletter.ErrOriginalDiffers},
		{"a_real_click_changed", subject, seq, changed, deadletter.ErrOriginalDiffers},
		{"a_real_click_on_another_subject", events.PartitionedClickSubject(4, "acme", "xyz"), seq, real, deadletter.ErrOriginalDiffers},
	}
	for _, tc := range tests {
		at := plant(t, js, "planted", tc.subject, tc.seq, tc.data)
		l, err := deadletter.Get(ctx, js, at)
		if err != nil {
			t.Fatal(err)
		}
		if subj, err := deadletter.Redrivable(ctx, js, l); !errors.Is(err, tc.want) {
			t.Errorf("%s: Redrivable = %q, %v; want %v", tc.name, subj, err, tc.want)
		}
		r, err := deadletter.Redrive(ctx, js, at)
		if !errors.Is(err, tc.want) || !errors.Is(err, deadletter.ErrNotRedrivable) {
			t.Errorf("%s: Redrive = %s on %s seq %d, %v; want %v", tc.name, r.Subject, r.Stream, r.Seq, err, tc.want)
		}
		if _, err := deadletter.Get(ctx, js, at); err != nil {
			t.Errorf("%s: the letter is gone after a refused redrive: %v", tc.name, err)
		}
	}
	if n := streamMsgs(t, js, events.ClicksStream); n != 1 {
		t.Errorf("CLICKS holds %d messages after the planted letters' redrives, want 1 (the real click)", n)
	}
}

// TestAGroupsLetterOfAClickCLICKSNoLongerHoldsIsNotRedriven: a genuine
// letter whose click is gone from CLICKS (its age limit passed, or it was
// deleted) cannot be told from a planted one: refused, saying its original
// is gone, and left in place.
func TestAGroupsLetterOfAClickCLICKSNoLongerHoldsIsNotRedriven(t *testing.T) {
	t.Parallel()
	js := newJS(t)
	ctx := t.Context()
	at := parkClick(t, js, topology.GroupWarehouseLoader, "bad_row")
	l, err := deadletter.Get(ctx, js, at)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteMsg(ctx, l.OrigSeq); err != nil {
		t.Fatal(err)
	}
	_, err = deadletter.Redrive(ctx, js, at)
	if !errors.Is(err, deadletter.ErrOriginalGone) || !errors.Is(err, deadletter.ErrNotRedrivable) || !strings.Contains(err.Error(), "gone") {
		t.Fatalf("Redrive = %v; want ErrOriginalGone, saying it is gone", err)
	}
	if _, err := deadletter.Get(ctx, js, at); err != nil {
		t.Errorf("the letter is gone after a refused redrive: %v", err)
	}
	if n := streamMsgs(t, js, events.ClicksStream); n != 0 {
		t.Errorf("CLICKS holds %d messages, want 0", n)
	}
}

// TestALetterTheReaderParkedIsRedriven: the reader runtime parks an event of
// a version it does not know, as every group does; its letter names the
// click's place in CLICKS, so it is redriven, as a copy of what CLICKS holds.
func TestALetterTheReaderParkedIsRedriven(t *testing.T) {
	t.Parallel()
	js := newJS(t)
	ctx := t.Context()
	c := events.Click{V: events.ClickVersion + 98, ID: events.NewID(), Time: time.Now().UTC(), Code: "abc", Owner: "acme", Target: "https://example.com/", Visitor: "v"}
	data, _ := json.Marshal(c)
	pub, err := js.Publish(ctx, events.ClickSubject("acme", "abc"), data)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- reader.Run(rctx, js, reader.Config{Group: "example-reader", Member: "m", LeaseTTL: time.Second},
			func(context.Context, int, []reader.Event) error { return nil })
	}()
	var letter deadletter.Letter
	testenv.WaitFor(t, 30*time.Second, "the reader to park the event", func() bool {
		err := deadletter.Each(ctx, js, deadletter.Filter("example-reader", reader.ReasonUnknownVersion), func(l deadletter.Letter) error {
			letter = l
			return nil
		})
		return err == nil && letter.Seq > 0
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if letter.OrigSeq != pub.Sequence {
		t.Fatalf("letter names CLICKS seq %d, want %d", letter.OrigSeq, pub.Sequence)
	}
	r, err := deadletter.Redrive(ctx, js, letter.Seq)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := js.Stream(ctx, events.ClicksStream)
	m, err := s.GetMsg(ctx, r.Seq)
	if err != nil {
		t.Fatal(err)
	}
	if r.Seq == pub.Sequence || string(m.Data) != string(data) || m.Subject != events.PartitionedClickSubject(4, "acme", "abc") {
		t.Fatalf("redriven to seq %d as %s %q; want a copy of seq %d", r.Seq, m.Subject, m.Data, pub.Sequence)
	}
	if _, err := deadletter.Get(ctx, js, letter.Seq); !errors.Is(err, deadletter.ErrNotFound) {
		t.Errorf("the letter after its redrive: %v, want ErrNotFound", err)
	}
}
