package main

import (
	"regexp"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

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

// An event delivered again is received once. A consumer whose ack came
// after its ack wait is sent the message again, and counting deliveries
// it "received" more than was published: the run said it had not received
// everything. Here the ack wait (20 ms) passes many times within one fetch
// (which waits 200 ms for more), so the server delivers the one event
// again into the same fetch before it is acknowledged.
func TestCeilingCountsAnEventDeliveredAgainOnce(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	js := testenv.StartNATS(t).JetStream(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "CEILING", Subjects: []string{"ceiling.>"}}); err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "CEILING", jetstream.ConsumerConfig{
		Durable: "c", AckPolicy: jetstream.AckAllPolicy, AckWait: 20 * time.Millisecond, DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "ceiling.0", []byte("x")); err != nil {
		t.Fatal(err)
	}
	var published atomic.Uint64
	published.Store(1)
	pubDone := make(chan struct{})
	close(pubDone)
	out := ceilingConsumer{Group: "c"}
	if err := drainCeiling(ctx, cons, 500, &published, pubDone, time.Now(), &out); err != nil {
		t.Fatal(err)
	}
	ci, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ci.Delivered.Consumer < 2 {
		t.Fatalf("the event was delivered %d times; the test wants it delivered again", ci.Delivered.Consumer)
	}
	if r := (ceilingResult{Published: 1, Consumers: []ceilingConsumer{out}}); out.Received != 1 || !r.Complete() {
		t.Errorf("delivered %d times, received %d of 1 (complete %v); want 1, complete", ci.Delivered.Consumer, out.Received, r.Complete())
	}
}
