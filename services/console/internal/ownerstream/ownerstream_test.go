package ownerstream_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/console/internal/consoletest"
	"github.com/snipdev/snip/services/console/internal/ownerstream"
	"github.com/snipdev/snip/services/console/internal/sse"
)

func TestParseStart(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name                         string
		lastEventID, sinceSeq, since string
		want                         ownerstream.Start
		wantErr                      bool
	}{
		{name: "nothing_is_new_clicks_only"},
		{name: "last_event_id_resumes_after_it", lastEventID: "41", want: ownerstream.Start{Seq: 42}},
		{name: "last_event_id_wins_over_the_query", lastEventID: "41", sinceSeq: "7", since: "2026-03-01T12:00:00Z", want: ownerstream.Start{Seq: 42}},
		{name: "since_seq_zero_is_everything_retained", sinceSeq: "0", want: ownerstream.Start{Seq: 1}},
		{name: "since_seq_is_after_it", sinceSeq: "7", want: ownerstream.Start{Seq: 8}},
		{name: "since_time", since: "2026-03-01T12:00:00Z", want: ownerstream.Start{Time: at}},
		{name: "both_query_forms_refused", sinceSeq: "7", since: "2026-03-01T12:00:00Z", wantErr: true},
		{name: "negative_id_refused", lastEventID: "-1", wantErr: true},
		{name: "text_id_refused", lastEventID: "abc", wantErr: true},
		{name: "max_id_refused", lastEventID: "18446744073709551615", wantErr: true},
		{name: "bad_time_refused", since: "yesterday", wantErr: true},
		{name: "year_9999_refused", since: "9999-12-31T23:59:59Z", wantErr: true},
		{name: "year_1_refused", since: "0001-01-01T00:00:00Z", wantErr: true},
		{name: "just_after_2262_refused", since: "2262-04-11T23:47:17Z", wantErr: true},
		{name: "just_before_1678_refused", since: "1677-09-21T00:12:43Z", wantErr: true},
		{name: "latest_accepted", since: "2262-04-11T23:47:16Z", want: ownerstream.Start{Time: time.Date(2262, 4, 11, 23, 47, 16, 0, time.UTC)}},
		{name: "earliest_accepted", since: "1677-09-21T00:12:44Z", want: ownerstream.Start{Time: time.Date(1677, 9, 21, 0, 12, 44, 0, time.UTC)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := ownerstream.ParseStart(tc.lastEventID, tc.sinceSeq, tc.since)
			if tc.wantErr {
				if !errors.Is(err, ownerstream.ErrBadStart) {
					t.Fatalf("err = %v, want ErrBadStart", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("start (-want +got):\n%s", d)
			}
		})
	}
}

// server serves the streams with the owner named in the X-Owner header: the
// HTTP layer's authentication is tested in the service's main_test.go.
func server(t testing.TB, s *ownerstream.Streams) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start, err := ownerstream.ParseStart(r.Header.Get("Last-Event-ID"), r.URL.Query().Get("since_seq"), r.URL.Query().Get("since"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if err := s.Serve(r.Context(), w, r.Header.Get("X-Owner"), start); err != nil {
			code := http.StatusServiceUnavailable
			if errors.Is(err, ownerstream.ErrOwnerLimit) {
				code = http.StatusTooManyRequests
			}
			http.Error(w, err.Error(), code)
		}
	}))
	t.Cleanup(func() { s.Close(); srv.Close() })
	return srv
}

// client is one connection of an owner's stream.
type client struct {
	resp *http.Response
	r    *sse.Reader
}

func connect(t testing.TB, url, owner, lastEventID string) *client {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	req.Header.Set("X-Owner", owner)
	if lastEventID != "" {
		req.Header.Set("Last-Event-ID", lastEventID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("GET %s as %s: %d %s", url, owner, resp.StatusCode, b)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return &client{resp: resp, r: sse.NewReader(resp.Body)}
}

func (c *client) clicks(t testing.TB, owner string, n int) []uint64 {
	t.Helper()
	return consoletest.OwnerClicks(t, c.r, owner, n)
}

// publishMix publishes n clicks each for acme and globex, interleaved, and
// returns acme's sequences.
func publishMix(t testing.TB, js jetstream.JetStream, n int) (acme []uint64) {
	t.Helper()
	acme, _ = publishBoth(t, js, n)
	return acme
}

// publishBoth is publishMix, returning globex's sequences too.
func publishBoth(t testing.TB, js jetstream.JetStream, n int) (acme, globex []uint64) {
	t.Helper()
	var clicks []events.Click
	for i := range n {
		clicks = append(clicks, consoletest.Click("acme", "a"+strconv.Itoa(i%3), i), consoletest.Click("globex", "g"+strconv.Itoa(i%3), i))
	}
	seqs := consoletest.Publish(t, js, clicks...)
	for i := 0; i < len(seqs); i += 2 {
		acme, globex = append(acme, seqs[i]), append(globex, seqs[i+1])
	}
	return acme, globex
}

// A client that disconnects mid-stream and reconnects with Last-Event-ID
// gets every one of its owner's clicks exactly once, in order, and none of
// another owner's, on either connection.
func TestResumeLosesNothingRepeatsNothingAndShowsOnlyTheOwnersClicks(t *testing.T) {
	t.Parallel()
	_, js := consoletest.NATS(t)
	reg := prometheus.NewPedanticRegistry()
	s := ownerstream.New(js, ownerstream.Config{Metrics: reg})
	srv := server(t, s)
	var want, globex []uint64 // each owner's sequences, as published
	publish := func(n int) {
		a, g := publishBoth(t, js, n)
		want, globex = append(want, a...), append(globex, g...)
	}
	publish(20)

	first := connect(t, srv.URL+"?since_seq=0", "acme", "")
	got := first.clicks(t, "acme", 7)
	first.resp.Body.Close() // the client goes away mid-stream
	// Gone on the server too, so that only the second connection reads
	// (and counts) the invalid clicks below.
	testenv.WaitFor(t, 30*time.Second, "the first stream closed on the server", func() bool { return s.Open() == 0 })

	publish(15) // clicks while it is away
	// A click whose subject says acme but whose payload says globex: the
	// stream sends neither owner such a thing.
	forged := consoletest.Click("globex", "a1", 0)
	b, _ := json.Marshal(forged)
	if _, err := js.Publish(t.Context(), events.ClickSubject("acme", "a1"), b); err != nil {
		t.Fatal(err)
	}
	// A click every reader parks (dated 1999: implausible_time) is not sent
	// either: the owner stream applies the readers' rule of validity.
	old := consoletest.Click("acme", "a2", 0)
	old.Time = time.Date(1999, 1, 1, 0, 0, 0, 0, time.UTC)
	b, _ = json.Marshal(old)
	if _, err := js.Publish(t.Context(), events.ClickSubject("acme", "a2"), b); err != nil {
		t.Fatal(err)
	}
	publish(3)

	second := connect(t, srv.URL+"?since_seq=0", "acme", strconv.FormatUint(got[len(got)-1], 10))
	got = append(got, second.clicks(t, "acme", len(want)-len(got))...)
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("acme's sequences across the reconnect (-published +received):\n%s", d)
	}

	// globex, from the start, sees only its own (clicks() fails on acme's),
	// and not the forged click either, though its payload names globex.
	g := connect(t, srv.URL+"?since_seq=0", "globex", "")
	if d := cmp.Diff(globex, g.clicks(t, "globex", len(globex))); d != "" {
		t.Errorf("globex's sequences (-published +received):\n%s", d)
	}

	// Each is counted as skipped under the readers' reason, as decision
	// 0071 and the metric's help name them.
	const skipped = `
# HELP snip_console_owner_stream_skipped_total Messages an owner's stream did not send, by the readers' dead-letter reason (malformed, subject_mismatch, implausible_time, ...).
# TYPE snip_console_owner_stream_skipped_total counter
snip_console_owner_stream_skipped_total{reason="implausible_time"} 1
snip_console_owner_stream_skipped_total{reason="subject_mismatch"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(skipped), "snip_console_owner_stream_skipped_total"); err != nil {
		t.Error(err)
	}
}

func TestLiveClicksAndLimits(t *testing.T) {
	t.Parallel()
	_, js := consoletest.NATS(t)
	s := ownerstream.New(js, ownerstream.Config{PerOwner: 1, Heartbeat: 100 * time.Millisecond})
	srv := server(t, s)
	publishMix(t, js, 3) // before the stream: not sent without a start

	c := connect(t, srv.URL, "acme", "")
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL, nil)
	req.Header.Set("X-Owner", "acme")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("acme's second stream with PerOwner 1: %d, want 429", resp.StatusCode)
	}
	connect(t, srv.URL, "globex", "") // another owner is not limited by acme's

	want := publishMix(t, js, 4)
	if d := cmp.Diff(want, c.clicks(t, "acme", 4)); d != "" {
		t.Errorf("live clicks (-published +received):\n%s", d)
	}

	// Close ends the stream (graceful shutdown); the client sees the end.
	s.Close()
	for {
		if _, err := c.r.Next(); err != nil {
			break
		}
	}
}

// A start before what CLICKS retains gets a "gap" event first.
func TestStartBeforeRetentionSaysSo(t *testing.T) {
	t.Parallel()
	_, js := consoletest.NATS(t)
	s := ownerstream.New(js, ownerstream.Config{})
	srv := server(t, s)
	acme := publishMix(t, js, 5)
	st, err := js.Stream(t.Context(), events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Purge(t.Context(), jetstream.WithPurgeSequence(acme[2])); err != nil {
		t.Fatal(err)
	}
	c := connect(t, srv.URL+"?since_seq=0", "acme", "")
	e, err := c.r.Next()
	if err != nil {
		t.Fatal(err)
	}
	if e.Name != "gap" || string(e.Data) != `{"first_seq":`+strconv.FormatUint(acme[2], 10)+`,"requested_seq":1}` {
		t.Fatalf("first event = %s %s, want a gap from 1 to %d", e.Name, e.Data, acme[2])
	}
	if d := cmp.Diff(acme[2:], c.clicks(t, "acme", 3)); d != "" {
		t.Errorf("clicks after the gap (-want +got):\n%s", d)
	}
}

// A start beyond CLICKS' last sequence (CLICKS re-created, or a made-up
// Last-Event-ID) gets a "reset" event at once, and the stream goes on from
// CLICKS' end: it does not wait, silent, until the sequences pass the ID.
func TestStartBeyondTheEndSaysSoAndFollowsFromThere(t *testing.T) {
	t.Parallel()
	_, js := consoletest.NATS(t)
	s := ownerstream.New(js, ownerstream.Config{})
	srv := server(t, s)
	last := publishMix(t, js, 3)[2] + 1 // globex's, the last click CLICKS holds
	ahead := last + 1000

	// Without the reset the first read would wait for sequence ahead+1:
	// the request's deadline makes that a failure, not a hang.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	req.Header.Set("X-Owner", "acme")
	req.Header.Set("Last-Event-ID", strconv.FormatUint(ahead, 10))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("resume beyond the end: %d", resp.StatusCode)
	}
	r := sse.NewReader(resp.Body)
	e, err := r.Next()
	if err != nil {
		t.Fatalf("the first event of a resume beyond the end: %v", err)
	}
	want := `{"last_seq":` + strconv.FormatUint(last, 10) + `,"requested_seq":` + strconv.FormatUint(ahead+1, 10) + `}`
	if e.Name != "reset" || string(e.Data) != want {
		t.Fatalf("first event = %s %s, want reset %s", e.Name, e.Data, want)
	}
	// The clicks stored from then on arrive, with nothing before them.
	next := publishMix(t, js, 2)
	if d := cmp.Diff(next, consoletest.OwnerClicks(t, r, "acme", 2)); d != "" {
		t.Errorf("clicks after the reset (-published +received):\n%s", d)
	}
}

// The reset carries CLICKS' last sequence as its id, so a client that
// reconnects after it, before any click of its owner arrived, resumes where
// the reset left it: the clicks stored while it was away arrive. Without the
// id the client would come back with the same ID beyond the end, be reset
// again to the end of then, and never see the clicks in between.
func TestAReconnectAfterAResetLosesNothing(t *testing.T) {
	t.Parallel()
	_, js := consoletest.NATS(t)
	s := ownerstream.New(js, ownerstream.Config{})
	srv := server(t, s)
	last := publishMix(t, js, 3)[2] + 1
	ahead := strconv.FormatUint(last+1000, 10)

	first := connect(t, srv.URL, "acme", ahead)
	e, err := first.r.Next()
	if err != nil {
		t.Fatal(err)
	}
	if e.Name != "reset" {
		t.Fatalf("first event = %s %s, want reset", e.Name, e.Data)
	}
	// What an EventSource sends on its reconnect: the last id it was given,
	// else the one it resumed with.
	held := ahead
	if e.ID != "" {
		held = e.ID
	}
	first.resp.Body.Close() // the client goes away before a click of its own

	away := publishMix(t, js, 2) // acme's clicks while it is away
	second := connect(t, srv.URL, "acme", held)
	e, err = second.r.Next()
	if err != nil {
		t.Fatal(err)
	}
	if e.Name != "click" {
		t.Fatalf("reconnected with Last-Event-ID %s after the reset: first event %s %s, want acme's click %d", held, e.Name, e.Data, away[0])
	}
	var c ownerstream.Click
	if err := json.Unmarshal(e.Data, &c); err != nil {
		t.Fatal(err)
	}
	if got := append([]uint64{c.Seq}, second.clicks(t, "acme", 1)...); !cmp.Equal(away, got) {
		t.Errorf("acme's clicks after the reconnect = %v, want those published while it was away, %v", got, away)
	}
}
