package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/deadletter"
	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/owners"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/console/internal/consoletest"
)

// syncBuffer is a log sink the console and the test share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *syncBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// The console does everything the page and the owners' streams offer as the
// least-privilege "console" user of deploy/nats, with no permission
// violation: the permissions there are enough, and this test fails when they
// stop being enough (or when the console starts needing more).
// It sets environment variables (the server reads the passwords from them),
// so it does not run in parallel.
func TestConsoleWorksAsTheDeployedNATSUser(t *testing.T) {
	url := testenv.StartNATSWithConfig(t, filepath.Join("..", "..", "deploy", "nats", "nats.conf"))

	// What other services and snipctl would have done, as admin.
	admin := connectAs(t, url, "admin")
	ctx := t.Context()
	o := topology.Defaults()
	o.Partitions = consoletest.Partitions
	if err := topology.Apply(ctx, admin, o); err != nil {
		t.Fatal(err)
	}
	for p := range consoletest.Partitions {
		cfg := topology.GroupConsumerConfig(topology.GroupWarehouseLoader, p, topology.GroupConsumer{
			AckWait: time.Minute, PinnedTTL: 5 * time.Second, MaxAckPending: 100, DeliverPolicy: jetstream.DeliverAllPolicy,
		})
		if _, err := admin.CreateOrUpdateConsumer(ctx, events.ClicksStream, cfg); err != nil {
			t.Fatal(err)
		}
	}
	clicks := consoletest.Clicks("acme", "abc", 3)
	seqs := consoletest.Publish(t, admin, clicks...)
	data, _ := json.Marshal(clicks[0])
	parked, err := deadletter.Publish(ctx, admin, deadletter.Parcel{
		Source: topology.GroupWarehouseLoader, Reason: "malformed", Stream: events.ClicksStream,
		Subject: events.PartitionedClickSubject(consoletest.Partitions, "acme", "abc"), Seq: seqs[0], Attempts: 1, Data: data,
	})
	if err != nil {
		t.Fatal(err)
	}
	consoletest.PublishAlert(t, admin, consoletest.Alert("acme", "abc", "link_flood", 0))

	// The console, as the console user.
	var logs syncBuffer
	s := startOn(t, admin, slog.New(slog.NewJSONHandler(&logs, nil)), func(c *Config) {
		withToken(c)
		c.NATS.User, c.NATS.Password = "console", "pw-console"
	})
	const key = "snip_acme_test_key_0123456789"
	if err := owners.NewStore(s.rdb).Ensure(ctx, "acme", key); err != nil {
		t.Fatal(err)
	}
	// The server counts the group's pending clicks after it acks their
	// publishes: read the panel until it shows the 3 published.
	testenv.WaitFor(t, 30*time.Second, "the readers panel as the console user to show the 3 clicks pending", func() bool {
		var readersPanel struct{ Groups []struct{ Pending uint64 } }
		getJSON(t, s, "/api/readers", &readersPanel)
		return len(readersPanel.Groups) == 1 && readersPanel.Groups[0].Pending == 3
	})
	var dlqPanel struct{ Total int }
	getJSON(t, s, "/api/dlq", &dlqPanel)
	getJSON(t, s, "/api/dlq/letters?source=warehouse-loader&reason=malformed", &struct{}{})
	getJSON(t, s, "/api/dlq/letters/"+strconv.FormatUint(parked.Sequence, 10), &struct{}{})
	if dlqPanel.Total != 1 {
		t.Errorf("dead letters as the console user: %d, want 1", dlqPanel.Total)
	}
	testenv.WaitFor(t, 30*time.Second, "the alert read as the console user", func() bool {
		var a struct{ Seen int }
		getJSON(t, s, "/api/alerts", &a)
		return a.Seen == 1
	})
	live := liveClient(t, s)
	_, owner := ownerClient(t, s, key, "?since_seq=0", "")
	consoletest.OwnerClicks(t, owner, "acme", 3)
	for {
		e, err := live.Next()
		if err != nil {
			t.Fatal(err)
		}
		if e.Name == "click" {
			break
		}
	}
	for _, body := range []map[string]any{{"since": "1h"}, {"from_seq": 1}} {
		body["confirm"] = topology.GroupWarehouseLoader
		if code, b := do(t, nil, http.MethodPost, s.url+"/api/readers/warehouse-loader/replay", body, bearer); code != http.StatusAccepted {
			t.Errorf("replay %v as the console user: %d %s", body, code, b)
		}
	}
	getJSON(t, s, "/api/readers/warehouse-loader/replay", &struct{}{})
	if code, b := do(t, nil, http.MethodPost, s.url+"/api/dlq/letters/"+strconv.FormatUint(parked.Sequence, 10)+"/redrive", nil, bearer); code != http.StatusOK {
		t.Errorf("redrive as the console user: %d %s", code, b)
	}
	// Sessions: one checked, ended by a logout, and every one revoked.
	session := logIn(t, s.url)
	if ok, code, b := sessionOpens(t, s.url, session); !ok {
		t.Errorf("a session as the console user: %d %s", code, b)
	}
	if resp := doResp(t, http.MethodPost, s.url+"/logout", withSession(s.url, session)); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("logout as the console user: %d", resp.StatusCode)
	}
	if ok, code, b := sessionOpens(t, s.url, session); ok || code != http.StatusUnauthorized {
		t.Errorf("a session logged out, as the console user: %d %s, want 401", code, b)
	}
	if code, b := do(t, nil, http.MethodPost, s.url+"/api/sessions/revoke", nil, bearer); code != http.StatusOK {
		t.Errorf("revoke every session as the console user: %d %s", code, b)
	}
	// What the console itself reported so far. Its NATS connection hears of
	// a violation in an asynchronous callback that may not have run yet;
	// the server's own record, read by testenv once every connection has
	// closed, is the check that cannot miss one.
	if l := logs.String(); strings.Contains(strings.ToLower(l), "permissions violation") {
		t.Errorf("the console met permission violations:\n%s", l)
	}
}

// The console's NATS user may publish clicks and preview jobs only: a letter
// from another stream (the click counter's LINKS feed here) is not offered
// for redrive, a redrive of it is refused with 409 before anything is
// published, and a group redrive leaves it in place and redrives the click
// letters behind it. No permission violation either (testenv checks).
func TestConsoleRefusesRedrivesItsUserMayNotPublish(t *testing.T) {
	url := testenv.StartNATSWithConfig(t, filepath.Join("..", "..", "deploy", "nats", "nats.conf"))
	admin := connectAs(t, url, "admin")
	ctx := t.Context()
	o := topology.Defaults()
	o.Partitions = consoletest.Partitions
	if err := topology.Apply(ctx, admin, o); err != nil {
		t.Fatal(err)
	}
	const source, reason = topology.GroupClickCounter, "malformed"
	park := func(p deadletter.Parcel) uint64 {
		t.Helper()
		p.Source, p.Reason, p.Attempts = source, reason, 1
		ack, err := deadletter.Publish(ctx, admin, p)
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}
	// The LINKS letter first, so that a group redrive meets it before the clicks.
	linkSeq := park(deadletter.Parcel{Stream: events.LinksStream, Subject: "links.created.abc", Seq: 1, Data: []byte(`{"code":"abc"}`)})
	clicks := consoletest.Clicks("acme", "abc", 2)
	seqs := consoletest.Publish(t, admin, clicks...)
	for i, c := range clicks {
		data, _ := json.Marshal(c)
		park(deadletter.Parcel{Stream: events.ClicksStream,
			Subject: events.PartitionedClickSubject(consoletest.Partitions, c.Owner, c.Code), Seq: seqs[i], Data: data})
	}

	var logs syncBuffer
	s := startOn(t, admin, slog.New(slog.NewJSONHandler(&logs, nil)), func(c *Config) {
		withToken(c)
		c.NATS.User, c.NATS.Password = "console", "pw-console"
	})
	letterPath := "/api/dlq/letters/" + strconv.FormatUint(linkSeq, 10)
	var letter struct {
		RedriveTo      string `json:"redrive_to"`
		RedriveRefused string `json:"redrive_refused"`
	}
	getJSON(t, s, letterPath, &letter)
	if letter.RedriveTo != "" || !strings.Contains(letter.RedriveRefused, events.LinksStream) {
		t.Errorf("the LINKS letter: redrive_to %q, redrive_refused %q; want none, and why", letter.RedriveTo, letter.RedriveRefused)
	}
	start := time.Now()
	if code, b := do(t, nil, http.MethodPost, s.url+letterPath+"/redrive", nil, bearer); code != http.StatusConflict {
		t.Errorf("redrive of the LINKS letter: %d %s, want 409", code, b)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("the refusal took %v", d)
	}
	code, b := do(t, nil, http.MethodPost, s.url+"/api/dlq/redrive", map[string]string{"source": source, "reason": reason}, bearer)
	var g struct {
		Redriven   int
		Refused    []struct{ Seq uint64 }
		Incomplete bool
		Error      string
	}
	if err := json.Unmarshal(b, &g); err != nil || code != http.StatusOK {
		t.Fatalf("group redrive: %d %s (%v)", code, b, err)
	}
	if g.Redriven != 2 || len(g.Refused) != 1 || g.Refused[0].Seq != linkSeq || g.Incomplete {
		t.Errorf("group redrive: %s; want the 2 clicks redriven and the LINKS letter refused", b)
	}
	var left struct{ Letters []struct{ Seq uint64 } }
	getJSON(t, s, "/api/dlq/letters?source="+source+"&reason="+reason, &left)
	if len(left.Letters) != 1 || left.Letters[0].Seq != linkSeq {
		t.Errorf("letters left: %+v, want only the LINKS letter %d", left.Letters, linkSeq)
	}
	if l := logs.String(); strings.Contains(strings.ToLower(l), "permissions violation") {
		t.Errorf("the console met permission violations:\n%s", l)
	}
}

// Every consumer group's NATS user may publish its own dead.<group>.>
// letters: the webhooks' plants one saying a made-up click came from
// CLICKS, at a real click's sequence, beside a genuine letter of its group.
// As the console's user, the planted letter shows why it cannot be
// redriven (in the list and on its own), its redrive is 409 saying why, and
// Redrive all redrives the genuine letter and leaves the planted one: CLICKS
// gains one copy, of the real click.
func TestConsoleRefusesAClickAGroupPlanted(t *testing.T) {
	url := testenv.StartNATSWithConfig(t, filepath.Join("..", "..", "deploy", "nats", "nats.conf"))
	admin := connectAs(t, url, "admin")
	ctx := t.Context()
	o := topology.Defaults()
	o.Partitions = consoletest.Partitions
	if err := topology.Apply(ctx, admin, o); err != nil {
		t.Fatal(err)
	}
	const source, reason = topology.GroupWebhooks, "bad_endpoint"
	clicks := consoletest.Clicks("acme", "abc", 1)
	seqs := consoletest.Publish(t, admin, clicks...)
	subject := events.PartitionedClickSubject(consoletest.Partitions, "acme", "abc")
	data, _ := json.Marshal(clicks[0])
	genuine, err := deadletter.Publish(ctx, admin, deadletter.Parcel{Source: source, Reason: reason, Attempts: 1,
		Stream: events.ClicksStream, Subject: subject, Seq: seqs[0], Data: data})
	if err != nil {
		t.Fatal(err)
	}
	madeUp := consoletest.Clicks("acme", "abc", 1)[0]
	madeUp.Visitor = "nobody"
	m := nats.NewMsg(events.DeadLetterSubject(source, reason))
	m.Header.Set(events.HeaderDeadSource, events.ClicksStream)
	m.Header.Set(events.HeaderDeadSubject, subject)
	m.Header.Set(events.HeaderDeadSeq, strconv.FormatUint(seqs[0], 10))
	m.Data, _ = json.Marshal(madeUp)
	// The service users have inboxes of their own (deploy/check).
	wnc, err := nats.Connect(url, nats.UserInfo("webhooks", "pw-webhooks"), nats.CustomInboxPrefix("_INBOX_webhooks"))
	if err != nil {
		t.Fatal(err)
	}
	defer wnc.Close()
	wjs, _ := jetstream.New(wnc)
	planted, err := wjs.PublishMsg(ctx, m)
	if err != nil {
		t.Fatalf("webhooks: publish a letter on its own subject: %v", err)
	}

	var logs syncBuffer
	s := startOn(t, admin, slog.New(slog.NewJSONHandler(&logs, nil)), func(c *Config) {
		withToken(c)
		c.NATS.User, c.NATS.Password = "console", "pw-console"
	})
	type letter struct {
		Seq            uint64
		RedriveTo      string `json:"redrive_to"`
		RedriveRefused string `json:"redrive_refused"`
	}
	var list struct{ Letters []letter }
	getJSON(t, s, "/api/dlq/letters?source="+source+"&reason="+reason, &list)
	var one letter
	letterPath := "/api/dlq/letters/" + strconv.FormatUint(planted.Sequence, 10)
	getJSON(t, s, letterPath, &one)
	if len(list.Letters) != 2 || list.Letters[0].RedriveTo == "" || list.Letters[1].RedriveTo != "" ||
		!strings.Contains(list.Letters[1].RedriveRefused, "differs from what CLICKS holds") ||
		one.RedriveTo != "" || one.RedriveRefused != list.Letters[1].RedriveRefused {
		t.Errorf("letters %+v, the planted one %+v; want the genuine one offered for redrive, the planted one refused, saying why", list.Letters, one)
	}
	if code, b := do(t, nil, http.MethodPost, s.url+letterPath+"/redrive", nil, bearer); code != http.StatusConflict || !strings.Contains(string(b), "differs from what CLICKS holds") {
		t.Errorf("redrive of the planted letter: %d %s, want 409 saying why", code, b)
	}
	code, b := do(t, nil, http.MethodPost, s.url+"/api/dlq/redrive", map[string]string{"source": source, "reason": reason}, bearer)
	var g struct {
		Redriven int
		Refused  []struct {
			Seq   uint64
			Error string
		}
	}
	if err := json.Unmarshal(b, &g); err != nil || code != http.StatusOK {
		t.Fatalf("group redrive: %d %s (%v)", code, b, err)
	}
	if g.Redriven != 1 || len(g.Refused) != 1 || g.Refused[0].Seq != planted.Sequence || !strings.Contains(g.Refused[0].Error, "differs") {
		t.Errorf("group redrive: %s; want letter %d redriven and the planted %d refused", b, genuine.Sequence, planted.Sequence)
	}
	cs, err := admin.Stream(ctx, events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	if n := cs.CachedInfo().State.Msgs; n != 2 {
		t.Errorf("CLICKS holds %d messages, want 2: the click and the genuine letter's redrive", n)
	}
	if l := logs.String(); strings.Contains(strings.ToLower(l), "permissions violation") {
		t.Errorf("the console met permission violations:\n%s", l)
	}
}

// connectAs connects to url as a user of deploy/nats (the test's passwords,
// "pw-<user>") and returns a JetStream context; the connection closes with
// the test.
func connectAs(t *testing.T, url, user string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url, nats.UserInfo(user, "pw-"+user))
	if err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	return js
}
