package alerts_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/console/internal/alerts"
	"github.com/snipdev/snip/services/console/internal/consoletest"
)

func TestFollowerKeepsTheNewestAlertsAndFollowsNewOnes(t *testing.T) {
	t.Parallel()
	_, js := consoletest.NATS(t)
	var sent []events.FraudAlert
	for i := range 3 {
		a := consoletest.Alert("acme", "abc", "link_flood", i)
		consoletest.PublishAlert(t, js, a)
		sent = append(sent, a)
	}
	if _, err := js.Publish(t.Context(), events.FraudAlertSubject("abc"), []byte(`{"v":1,"id":"broken"}`)); err != nil {
		t.Fatal(err)
	}
	// A verdict on the same stream is not an alert.
	if _, err := js.Publish(t.Context(), events.FraudVerdictSubject("acme", "abc"), []byte(`{"v":1}`)); err != nil {
		t.Fatal(err)
	}
	f := alerts.New(js, alerts.Config{Keep: 2})
	done := make(chan error, 1)
	go func() { done <- f.Run(t.Context()) }()
	t.Cleanup(func() { <-done })

	testenv.WaitFor(t, 30*time.Second, "the alerts read", func() bool { return f.Snapshot().Seen == 3 })
	a := consoletest.Alert("globex", "xyz", "visitor_burst", 9)
	seq := consoletest.PublishAlert(t, js, a)
	sent = append(sent, a)
	testenv.WaitFor(t, 30*time.Second, "the new alert", func() bool { return f.Snapshot().Seen == 4 })

	snap := f.Snapshot()
	var got []events.FraudAlert
	for _, a := range snap.Alerts {
		got = append(got, a.FraudAlert)
	}
	if d := cmp.Diff([]events.FraudAlert{sent[3], sent[2]}, got); d != "" {
		t.Errorf("alerts, newest first, the newest 2 kept (-want +got):\n%s", d)
	}
	if snap.Alerts[0].Seq != seq || !snap.Following || snap.Error != "" {
		t.Errorf("snapshot %+v: want the newest at seq %d, following", snap, seq)
	}
}

// A FRAUD deleted and created again (its sequences start at 1 again) is
// followed: the follower, which resumes after the last alert it read,
// would otherwise wait for the new stream's sequences to pass the old ones
// and show no new alert until then.
func TestFollowerFollowsAFRAUDCreatedAgain(t *testing.T) {
	t.Parallel()
	_, js := consoletest.NATS(t)
	for i := range 5 {
		consoletest.PublishAlert(t, js, consoletest.Alert("acme", "abc", "link_flood", i))
	}
	f := alerts.New(js, alerts.Config{})
	done := make(chan error, 1)
	go func() { done <- f.Run(t.Context()) }()
	t.Cleanup(func() { <-done })
	testenv.WaitFor(t, 30*time.Second, "the alerts read", func() bool { return f.Snapshot().Seen == 5 })

	if err := js.DeleteStream(t.Context(), events.FraudStream); err != nil {
		t.Fatal(err)
	}
	o := topology.Defaults()
	o.Partitions = consoletest.Partitions
	o.Storage = jetstream.MemoryStorage
	if err := topology.Apply(t.Context(), js, o); err != nil {
		t.Fatal(err)
	}
	a := consoletest.Alert("globex", "xyz", "visitor_burst", 9)
	seq := consoletest.PublishAlert(t, js, a)
	if !testenv.Poll(45*time.Second, func() bool {
		s := f.Snapshot()
		return len(s.Alerts) > 0 && s.Alerts[0].ID == a.ID
	}) {
		t.Fatalf("45 s after FRAUD was created again its alert (seq %d) is not the newest shown: %+v", seq, f.Snapshot())
	}
	if s := f.Snapshot(); s.Seen != 6 || s.Alerts[0].Seq != seq || !s.Following {
		t.Errorf("snapshot %+v: want 6 seen, the new alert at seq %d first, following", s, seq)
	}
}
