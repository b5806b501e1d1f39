package alerts_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
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
