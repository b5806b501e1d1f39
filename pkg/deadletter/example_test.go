package deadletter_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/deadletter"
	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// A preview job ran out of tries: its worker parks it, an operator looks at
// it, fixes the cause, and sends it back to the queue. This is what the work
// queue, the log readers and `snipctl dlq` do.
func Example() {
	ctx := context.Background()
	js, stop := exampleJetStream(ctx)
	defer stop()

	job := []byte(`{"v":1,"id":"0193c0de-0000-7000-8000-000000000001","code":"abc","owner":"acme","target":"https://example.com/"}`)
	ack, err := deadletter.Publish(ctx, js, deadletter.Parcel{
		Source: "preview", Reason: "http_5xx",
		Stream: events.PreviewJobsStream, Subject: events.PreviewJobSubject, Seq: 42,
		Attempts: 5, Error: "GET https://example.com/: 503 Service Unavailable",
		Consumer: topology.PreviewConsumer, Data: job,
	})
	if err != nil {
		log.Fatal(err)
	}

	l, err := deadletter.Get(ctx, js, ack.Sequence)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("parked on", l.Subject, "after", l.Attempts, "attempts:", l.Error)
	fmt.Println("Nats-Msg-Id:", l.Header.Get(events.HeaderMsgID))

	r, err := deadletter.Redrive(ctx, js, ack.Sequence)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("redriven to", r.Subject, "on", r.Stream)
	_, err = deadletter.Get(ctx, js, ack.Sequence)
	fmt.Println(err)
	// Output:
	// parked on dead.preview.http_5xx after 5 attempts: GET https://example.com/: 503 Service Unavailable
	// Nats-Msg-Id: 0193c0de-0000-7000-8000-000000000001:dead:preview:42
	// redriven to jobs.preview on PREVIEW_JOBS
	// get dead letter 1: dead letter not found
}

// MsgID is how one message parked twice by one source (a worker and its
// rescuer, a retried park) is stored once.
func ExampleMsgID() {
	job := []byte(`{"v":1,"id":"0193c0de-0000-7000-8000-000000000001"}`)
	fmt.Println(deadletter.MsgID("preview", events.PreviewJobsStream, 42, job))
	fmt.Println(deadletter.MsgID("preview", events.PreviewJobsStream, 43, []byte("not json")))
	// Output:
	// 0193c0de-0000-7000-8000-000000000001:dead:preview:42
	// PREVIEW_JOBS:dead:preview:43
}

// Filter selects dead letters by source and reason, for List, Each and
// `snipctl dlq redrive --source S --reason R`.
func ExampleFilter() {
	fmt.Println(deadletter.Filter("", ""))
	fmt.Println(deadletter.Filter("click-counter", ""))
	fmt.Println(deadletter.Filter("", "malformed"))
	// Output:
	// dead.*.*
	// dead.click-counter.*
	// dead.*.malformed
}

// exampleJetStream starts an embedded NATS server with Snip's topology and
// returns a client and a function that stops both.
func exampleJetStream(ctx context.Context) (jetstream.JetStream, func()) {
	dir, err := os.MkdirTemp("", "snip-example-")
	if err != nil {
		log.Fatal(err)
	}
	srv, err := testenv.RunNATSServer(testenv.NATSOptions(-1, dir))
	if err != nil {
		log.Fatal(err)
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		log.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	o := topology.Defaults()
	o.Storage = jetstream.MemoryStorage
	if err := topology.Apply(ctx, js, o); err != nil {
		log.Fatal(err)
	}
	return js, func() {
		nc.Close()
		srv.Shutdown()
		_ = os.RemoveAll(dir)
	}
}
