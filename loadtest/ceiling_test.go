package main

import (
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/testenv"
)

// A short ceiling run publishes, every one of the three consumers receives
// everything published, the output says so with the rate, and the run's
// stream is gone afterwards.
func TestCeilingPublishesAndEveryConsumerReceivesEverything(t *testing.T) {
	t.Parallel()
	ns := testenv.StartNATS(t)
	out, err := loadtest(t, []string{"NATS_URL=" + ns.URL}, "ceiling", "--duration", "1s", "--window", "256")
	if err != nil {
		t.Fatalf("loadtest ceiling: %v\n%s", err, out)
	}
	t.Log(out)
	m := regexp.MustCompile(`published (\d+) in `).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no published line:\n%s", out)
	}
	published, _ := strconv.Atoi(m[1])
	if published == 0 {
		t.Fatalf("published nothing:\n%s", out)
	}
	for _, g := range ceilingGroups {
		re := regexp.MustCompile(`consumer ` + g + `: received (\d+) of (\d+)`)
		c := re.FindStringSubmatch(out)
		if c == nil || c[1] != m[1] || c[2] != m[1] {
			t.Errorf("consumer %s: %v, want %d of %d\n%s", g, c, published, published, out)
		}
	}
	if !regexp.MustCompile(`ceiling: [1-9]\d* events/s`).MatchString(out) {
		t.Errorf("no ceiling rate in the output:\n%s", out)
	}
	js := ns.JetStream(t)
	names := js.StreamNames(t.Context())
	for name := range names.Name() {
		t.Errorf("stream %s left after the run", name)
	}
	// A listing that failed lists nothing either.
	if err := names.Err(); err != nil {
		t.Errorf("list the streams left after the run: %v", err)
	}
}

// The result is complete only when every consumer received everything, and
// its ceiling is set by the slowest consumer.
func TestCeilingIsTheSlowestConsumersRate(t *testing.T) {
	t.Parallel()
	r := ceilingResult{Published: 1000, Consumers: []ceilingConsumer{
		{Group: "a", Received: 1000, Done: time.Second},
		{Group: "b", Received: 1000, Done: 2 * time.Second},
		{Group: "c", Received: 999, Done: time.Second},
	}}
	if r.Complete() {
		t.Error("Complete with a consumer one short")
	}
	r.Consumers[2].Received = 1000
	if !r.Complete() {
		t.Error("not Complete with every consumer done")
	}
	if got := r.Ceiling(); got != 500 {
		t.Errorf("Ceiling = %v, want 500 (1000 events by the slowest consumer at 2 s)", got)
	}
}
