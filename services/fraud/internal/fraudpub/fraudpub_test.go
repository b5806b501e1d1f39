package fraudpub_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/fraud/internal/fraudpub"
)

// newServer starts NATS with the topology and returns it and a connection.
func newServer(t *testing.T) (*testenv.NATS, *nats.Conn, jetstream.JetStream) {
	t.Helper()
	n := testenv.StartNATS(t)
	nc := n.Connect(t)
	js, _ := jetstream.New(nc)
	o := topology.Defaults()
	o.Storage = jetstream.MemoryStorage
	if err := topology.Apply(t.Context(), js, o); err != nil {
		t.Fatal(err)
	}
	return n, nc, js
}

func TestPublishWaitsForAcksAndRepeatsAreDuplicates(t *testing.T) {
	t.Parallel()
	_, nc, js := newServer(t)
	ctx := t.Context()
	now := time.Now().UTC()
	alerts := []events.FraudAlert{{V: 1, ID: "visitor_burst:abc:x:1", Rule: "visitor_burst", Code: "abc", Owner: "acme", Time: now}}
	var labels []events.FraudVerdictLabel
	for i := range 1200 {
		labels = append(labels, events.FraudVerdictLabel{ClickID: events.NewID(), ClickSeq: uint64(i + 1), Code: "abc", Owner: "acme", Rule: "visitor_burst", Bot: true, ClickTime: now, Time: now})
	}
	// 1200 labels of partition 2: three messages of at most 500 labels.
	verdicts := events.SplitVerdicts(2, 1, 1200, labels)
	if len(verdicts) != 3 {
		t.Fatalf("%d verdict messages, want 3", len(verdicts))
	}
	// A window smaller than the batch: publishes wait for room.
	p, err := fraudpub.New(nc, 2, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if dups, err := p.Publish(ctx, alerts, verdicts); err != nil || dups != 0 {
		t.Fatalf("Publish = %d duplicates, %v", dups, err)
	}
	if dups, err := p.Publish(ctx, alerts, verdicts); err != nil || dups != 4 {
		t.Fatalf("second Publish = %d duplicates, %v; want 4", dups, err)
	}
	s, _ := js.Stream(ctx, events.FraudStream)
	info, err := s.Info(ctx, jetstream.WithSubjectFilter("fraud.>"))
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 || info.State.Subjects[events.FraudAlertSubject("abc")] != 1 {
		t.Fatalf("FRAUD holds %d messages by subject %v; want 1 alert", info.State.Msgs, info.State.Subjects)
	}
	vs, _ := js.Stream(ctx, events.FraudVerdictsStream)
	vinfo, err := vs.Info(ctx, jetstream.WithSubjectFilter("fraud.>"))
	if err != nil {
		t.Fatal(err)
	}
	if vinfo.State.Msgs != 3 || vinfo.State.Subjects[events.FraudVerdictBatchSubject(2)] != 3 {
		t.Fatalf("FRAUD_VERDICTS holds %d messages by subject %v; want 3 verdict messages", vinfo.State.Msgs, vinfo.State.Subjects)
	}
	last, err := vs.GetLastMsgForSubject(ctx, events.FraudVerdictBatchSubject(2))
	if err != nil {
		t.Fatal(err)
	}
	if got := last.Header.Get(jetstream.MsgIDHeader); got != verdicts[2].ID {
		t.Fatalf("last verdict message's Nats-Msg-Id = %q, want %q", got, verdicts[2].ID)
	}
	if b, err := events.DecodeFraudVerdictBatch(last.Data); err != nil || len(b.Labels) != 200 {
		t.Fatalf("last verdict message: %d labels, %v; want 200", len(b.Labels), err)
	}
	m, err := s.GetLastMsgForSubject(ctx, events.FraudAlertSubject("abc"))
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Header.Get(jetstream.MsgIDHeader); got != alerts[0].ID {
		t.Fatalf("Nats-Msg-Id = %q, want %q", got, alerts[0].ID)
	}
	if _, err := events.DecodeFraudAlert(m.Data); err != nil {
		t.Fatal(err)
	}
}

func TestPublishFailsWhenNATSIsDown(t *testing.T) {
	t.Parallel()
	n, nc, _ := newServer(t)
	p, _ := fraudpub.New(nc, 64, 500*time.Millisecond)
	n.Stop()
	_, err := p.Publish(t.Context(), nil, events.SplitVerdicts(0, 1, 1, []events.FraudVerdictLabel{{ClickID: events.NewID(), ClickSeq: 1, Code: "abc", Owner: "acme", Rule: "x", Bot: true, ClickTime: time.Now().UTC()}}))
	if err == nil {
		t.Fatal("Publish succeeded with NATS down")
	}
}
