package workqueue_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/deadletter"
	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/failure"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/pkg/workqueue"
)

// Competing workers on PREVIEW_JOBS: each job goes to one worker. The
// handler answers in the terms of package failure: nil (the job is acked and
// leaves the queue), a retryable error (it comes back after a backoff) or a
// permanent one (it is parked on DEAD_LETTER at once).
func Example() {
	ctx := context.Background()
	js, stop := exampleJetStream(ctx)
	defer stop()

	var mu sync.Mutex
	tries := map[string]int{}
	var done []string
	fetch := func(_ context.Context, data []byte) error {
		job, err := events.DecodePreviewJob(data)
		if err != nil {
			return err // malformed: permanent without wrapping
		}
		mu.Lock()
		defer mu.Unlock()
		tries[job.Code]++
		switch {
		case !strings.HasPrefix(job.Target, "https://"):
			return failure.Permanent("bad_target", fmt.Errorf("job %s: target %q", job.ID, job.Target))
		case job.Code == "slow" && tries[job.Code] == 1:
			return failure.Retryable("timeout", errors.New("GET: timeout"))
		}
		done = append(done, job.Code)
		return nil
	}
	q := workqueue.New(js, workqueue.Config{
		Stream: events.PreviewJobsStream, Consumer: topology.PreviewConsumer, Source: "preview",
		// Jobs whose worker crashed on the last try: their advisories, kept.
		Advisories: events.PreviewAdvisoriesStream, Rescuer: topology.PreviewRescueConsumer,
		Concurrency: 2,
		Backoff:     workqueue.Backoff{Base: 50 * time.Millisecond, Max: time.Second},
		PullWait:    100 * time.Millisecond, ShutdownTimeout: 5 * time.Second,
	}, fetch, nil)
	runCtx, shutdown := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- q.Run(runCtx) }()

	for _, j := range []struct{ code, target string }{{"abc", "https://example.com/"}, {"slow", "https://slow.example/"}, {"bad", "ftp://example.com/"}} {
		publishJob(ctx, js, j.code, j.target)
	}
	// A parked job is terminated without waiting for the server, which
	// removes it from the queue a moment later.
	waitUntil(func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(done) == 2 && msgs(ctx, js, events.DeadLetterStream) == 1 &&
			msgs(ctx, js, events.PreviewJobsStream) == 0
	})
	shutdown()
	if err := <-stopped; err != nil {
		log.Fatal(err)
	}

	fmt.Println("done:", len(done), "jobs; slow took", tries["slow"], "tries")
	_ = deadletter.Each(ctx, js, deadletter.Filter("preview", ""), func(l deadletter.Letter) error {
		fmt.Println("parked:", l.Subject, "after", l.Attempts, "attempt")
		return nil
	})
	fmt.Println("left in the queue:", msgs(ctx, js, events.PreviewJobsStream))
	// Output:
	// done: 2 jobs; slow took 2 tries
	// parked: dead.preview.bad_target after 1 attempt
	// left in the queue: 0
}

func publishJob(ctx context.Context, js jetstream.JetStream, code, target string) {
	job := events.PreviewJob{V: events.PreviewJobVersion, ID: events.NewID(), Time: time.Now().UTC(), Code: code, Owner: "acme", Target: target}
	data, err := json.Marshal(job)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := js.Publish(ctx, events.PreviewJobSubject, data, jetstream.WithMsgID(job.ID)); err != nil {
		log.Fatal(err)
	}
}

func msgs(ctx context.Context, js jetstream.JetStream, stream string) uint64 {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return 0
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0
	}
	return info.State.Msgs
}

// waitUntil polls cond until it holds, or gives up after a minute.
func waitUntil(cond func() bool) {
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			log.Fatal("example: condition not met within a minute")
		}
	}
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
