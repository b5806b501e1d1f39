package workqueue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/snipdev/snip/pkg/deadletter"
	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/failure"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// testBackOff keeps the tests quick; the keep-alive tests use longer steps.
var testBackOff = []time.Duration{300 * time.Millisecond, 400 * time.Millisecond, 500 * time.Millisecond, 600 * time.Millisecond}

// setup starts NATS with PREVIEW_JOBS, DEAD_LETTER, PREVIEW_ADVISORIES and
// the preview consumers, with backOff as the workers' consumer's BackOff.
func setup(t *testing.T, backOff []time.Duration) jetstream.JetStream {
	t.Helper()
	return setupOn(t, testenv.StartNATS(t), backOff, jetstream.MemoryStorage)
}

func setupOn(t *testing.T, n *testenv.NATS, backOff []time.Duration, storage jetstream.StorageType) jetstream.JetStream {
	t.Helper()
	js := n.JetStream(t)
	o := topology.Defaults()
	o.Storage = storage
	for _, sc := range topology.Streams(o) {
		switch sc.Name {
		case events.PreviewJobsStream, events.DeadLetterStream, events.PreviewAdvisoriesStream:
			if _, err := js.CreateStream(t.Context(), sc); err != nil {
				t.Fatal(err)
			}
		}
	}
	cc := topology.PreviewConsumerConfig()
	cc.BackOff, cc.AckWait = backOff, backOff[0]
	if _, err := js.CreateConsumer(t.Context(), events.PreviewJobsStream, cc); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateConsumer(t.Context(), events.PreviewAdvisoriesStream, topology.PreviewRescueConsumerConfig()); err != nil {
		t.Fatal(err)
	}
	return js
}

func testConfig(t *testing.T) Config {
	return Config{
		Stream: events.PreviewJobsStream, Consumer: topology.PreviewConsumer, Source: "preview",
		Advisories: events.PreviewAdvisoriesStream, Rescuer: topology.PreviewRescueConsumer,
		Concurrency:     4,
		Backoff:         Backoff{Base: 20 * time.Millisecond, Max: time.Second, Jitter: 0.5, RetryAfterMax: time.Second},
		BacklogInterval: 100 * time.Millisecond,
		ShutdownTimeout: 10 * time.Second,
		OpTimeout:       5 * time.Second,
		PullWait:        200 * time.Millisecond,
		Logger:          slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func publishJob(t *testing.T, js jetstream.JetStream, id string) uint64 {
	t.Helper()
	data, _ := json.Marshal(map[string]any{"v": 1, "id": id})
	ack, err := js.Publish(t.Context(), events.PreviewJobSubject, data, jetstream.WithMsgID(id))
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

func jobID(data []byte) string { return deadletter.PayloadID(data) }

// start runs q until the returned stop is called; stop waits for Run.
func start(t *testing.T, q *Queue) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- q.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Error("Run did not return 30s after cancel")
			}
		})
	}
	t.Cleanup(stop)
	testenv.WaitFor(t, 10*time.Second, "queue consuming", func() bool { return q.Ready(ctx) == nil })
	return stop
}

func streamMsgs(t *testing.T, js jetstream.JetStream, name string) uint64 {
	t.Helper()
	s, err := js.Stream(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

func onlyLetter(t *testing.T, js jetstream.JetStream) deadletter.Letter {
	t.Helper()
	var got []deadletter.Letter
	if err := deadletter.Each(t.Context(), js, events.DeadLetterSubjects, func(l deadletter.Letter) error {
		got = append(got, l)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		t.Fatalf("DEAD_LETTER holds %d letters, want 1: %+v", len(got), got)
	}
	return got[0]
}

func TestTransientFailuresAreRetriedThenDeadLettered(t *testing.T) {
	t.Parallel()
	js := setup(t, testBackOff)
	var calls atomic.Int64
	var hooked []string
	var mu sync.Mutex
	q := New(js, testConfig(t), func(context.Context, []byte) error {
		calls.Add(1)
		return failure.Retryable("http_5xx", errors.New("503 Service Unavailable"))
	}, func(_ context.Context, data []byte, reason, detail string) {
		mu.Lock()
		defer mu.Unlock()
		hooked = append(hooked, jobID(data)+" "+reason)
	})
	start(t, q)
	id := events.NewID()
	seq := publishJob(t, js, id)
	testenv.WaitFor(t, 30*time.Second, "job dead-lettered", func() bool { return streamMsgs(t, js, events.DeadLetterStream) == 1 })
	l := onlyLetter(t, js)
	if l.Subject != "dead.preview.http_5xx" || l.Attempts != 5 || l.OrigSeq != seq || l.ID != id ||
		l.Error != "http_5xx: 503 Service Unavailable" || l.Consumer != topology.PreviewConsumer || l.Stream != events.PreviewJobsStream {
		t.Fatalf("letter = %+v", l)
	}
	testenv.WaitFor(t, 10*time.Second, "queue empty", func() bool { return streamMsgs(t, js, events.PreviewJobsStream) == 0 })
	if n := calls.Load(); n != 5 {
		t.Errorf("handler called %d times, want 5 (MaxDeliver)", n)
	}
	if got := testutil.ToFloat64(q.m.retries.WithLabelValues("http_5xx")); got != 4 {
		t.Errorf("retries = %v, want 4", got)
	}
	testenv.WaitFor(t, 10*time.Second, "dead-letter metric", func() bool {
		return testutil.ToFloat64(q.m.dead.WithLabelValues("http_5xx", "worker")) == 1
	})
	mu.Lock()
	defer mu.Unlock()
	if len(hooked) != 1 || hooked[0] != id+" http_5xx" {
		t.Errorf("dead hook calls = %q, want one for %s", hooked, id)
	}
}

func TestPermanentFailureIsDeadLetteredAtOnce(t *testing.T) {
	t.Parallel()
	js := setup(t, testBackOff)
	var calls atomic.Int64
	q := New(js, testConfig(t), func(context.Context, []byte) error {
		calls.Add(1)
		return fmt.Errorf("process: %w", failure.Permanent("not_found", errors.New("404 Not Found")))
	}, nil)
	start(t, q)
	publishJob(t, js, events.NewID())
	testenv.WaitFor(t, 10*time.Second, "job dead-lettered", func() bool { return streamMsgs(t, js, events.DeadLetterStream) == 1 })
	if l := onlyLetter(t, js); l.Reason != "not_found" || l.Attempts != 1 || l.Error != "process: not_found: 404 Not Found" {
		t.Fatalf("letter = %+v", l)
	}
	testenv.WaitFor(t, 10*time.Second, "queue empty", func() bool { return streamMsgs(t, js, events.PreviewJobsStream) == 0 })
	if n := calls.Load(); n != 1 {
		t.Fatalf("handler called %d times, want 1", n)
	}
}

func TestLongJobIsNotRedelivered(t *testing.T) {
	t.Parallel()
	// The ack deadline of the first delivery is 600ms; the job takes 2.4s.
	js := setup(t, []time.Duration{600 * time.Millisecond, time.Second})
	var calls atomic.Int64
	q := New(js, testConfig(t), func(ctx context.Context, _ []byte) error {
		calls.Add(1)
		select {
		case <-time.After(2400 * time.Millisecond):
		case <-ctx.Done():
		}
		return nil
	}, nil)
	start(t, q)
	publishJob(t, js, events.NewID())
	testenv.WaitFor(t, 20*time.Second, "job done", func() bool {
		return testutil.ToFloat64(q.m.deliveries.WithLabelValues("done")) == 1
	})
	if n := calls.Load(); n != 1 {
		t.Fatalf("a job longer than its ack deadline was delivered %d times, want 1", n)
	}
}

func TestSlowParkIsNotRedelivered(t *testing.T) {
	t.Parallel()
	// The ack deadline of the first delivery is 600ms; parking the job (the
	// dead-letter publish and the dead hook) takes 2.4s.
	js := setup(t, []time.Duration{600 * time.Millisecond, time.Second})
	var calls, hooks atomic.Int64
	q := New(js, testConfig(t), func(context.Context, []byte) error {
		calls.Add(1)
		return failure.Permanent("not_found", errors.New("404 Not Found"))
	}, func(ctx context.Context, _ []byte, _, _ string) {
		hooks.Add(1)
		select {
		case <-time.After(2400 * time.Millisecond):
		case <-ctx.Done():
		}
	})
	start(t, q)
	publishJob(t, js, events.NewID())
	testenv.WaitFor(t, 20*time.Second, "job dead-lettered and gone", func() bool {
		return testutil.ToFloat64(q.m.deliveries.WithLabelValues("dead_lettered")) >= 1 && streamMsgs(t, js, events.PreviewJobsStream) == 0
	})
	if n := calls.Load(); n != 1 {
		t.Fatalf("a job whose park took longer than its ack deadline was delivered %d times, want 1", n)
	}
	if n := hooks.Load(); n != 1 {
		t.Fatalf("dead hook called %d times, want 1", n)
	}
}

func TestSlowJobDoesNotHoldUpOthers(t *testing.T) {
	t.Parallel()
	js := setup(t, testBackOff)
	release := make(chan struct{})
	var fast atomic.Int64
	cfg := testConfig(t)
	cfg.Concurrency = 2
	slowID := events.NewID()
	q := New(js, cfg, func(ctx context.Context, data []byte) error {
		if jobID(data) == slowID {
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
			return nil
		}
		fast.Add(1)
		return nil
	}, nil)
	start(t, q)
	publishJob(t, js, slowID)
	testenv.WaitFor(t, 10*time.Second, "slow job taken", func() bool { return testutil.ToFloat64(q.m.inFlight) == 1 })
	for range 30 {
		publishJob(t, js, events.NewID())
	}
	// All 30 finish (and leave) while the slow job still holds its slot.
	testenv.WaitFor(t, 20*time.Second, "fast jobs done while the slow one runs", func() bool {
		return fast.Load() == 30 && testutil.ToFloat64(q.m.inFlight) == 1
	})
	close(release)
	testenv.WaitFor(t, 10*time.Second, "queue empty", func() bool { return streamMsgs(t, js, events.PreviewJobsStream) == 0 })
}

func TestShutdownLetsJobsInHandFinish(t *testing.T) {
	t.Parallel()
	js := setup(t, testBackOff)
	started, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int64
	q := New(js, testConfig(t), func(context.Context, []byte) error {
		calls.Add(1)
		close(started)
		<-release
		return nil
	}, nil)
	stop := start(t, q)
	publishJob(t, js, events.NewID())
	<-started
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	testenv.WaitFor(t, 10*time.Second, "intake stopped", func() bool { return q.Ready(context.Background()) != nil })
	close(release)
	<-stopped
	if got := testutil.ToFloat64(q.m.deliveries.WithLabelValues("done")); got != 1 {
		t.Fatalf("done = %v, want the job in hand finished and acked", got)
	}
	if n := streamMsgs(t, js, events.PreviewJobsStream); n != 0 || calls.Load() != 1 {
		t.Fatalf("queue holds %d, handler ran %d times; want 0 and 1", n, calls.Load())
	}
}

func TestShutdownHandsBackJobsThatDoNotFinish(t *testing.T) {
	t.Parallel()
	js := setup(t, testBackOff)
	started := make(chan struct{}, 1)
	cfg := testConfig(t)
	cfg.ShutdownTimeout = 200 * time.Millisecond
	a := New(js, cfg, func(ctx context.Context, _ []byte) error {
		started <- struct{}{}
		<-ctx.Done() // a fetch that hangs until aborted
		return ctx.Err()
	}, nil)
	stopA := start(t, a)
	id := events.NewID()
	publishJob(t, js, id)
	<-started
	stopA()
	if got := testutil.ToFloat64(a.m.deliveries.WithLabelValues("handed_back")); got != 1 {
		t.Fatalf("handed back = %v, want 1", got)
	}
	var doneBy atomic.Value
	b := New(js, testConfig(t), func(_ context.Context, data []byte) error {
		doneBy.Store(jobID(data))
		return nil
	}, nil)
	start(t, b)
	testenv.WaitFor(t, 10*time.Second, "job done by the second worker", func() bool { return doneBy.Load() == id })
	testenv.WaitFor(t, 10*time.Second, "queue empty", func() bool { return streamMsgs(t, js, events.PreviewJobsStream) == 0 })
}

// exhaust takes every delivery of the next job without deciding anything,
// as a worker that keeps crashing would.
func exhaust(t *testing.T, js jetstream.JetStream) *jetstream.MsgMetadata {
	t.Helper()
	cons, err := js.Consumer(t.Context(), events.PreviewJobsStream, topology.PreviewConsumer)
	if err != nil {
		t.Fatal(err)
	}
	var meta *jetstream.MsgMetadata
	for range topology.PreviewMaxDeliver {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		m, ok := <-batch.Messages()
		if !ok {
			t.Fatalf("no redelivery: %v", batch.Error())
		}
		meta = mustMeta(t, m)
	}
	return meta
}

// awaitGiveUp waits until the server gives up on the job exhaust took. The
// server notices that a job ran out of deliveries when it would redeliver
// it, which needs a waiting pull: wait in one until the job's last ack
// deadline has passed.
func awaitGiveUp(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	cons, err := js.Consumer(t.Context(), events.PreviewJobsStream, topology.PreviewConsumer)
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(3*testBackOff[len(testBackOff)-1]))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		t.Fatalf("delivery %d after MaxDeliver", mustMeta(t, m).NumDelivered)
	}
	info, err := cons.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if info.NumAckPending != 0 {
		t.Fatalf("the server did not give up on the job: %d ack pending, ack floor %+v", info.NumAckPending, info.AckFloor)
	}
}

func mustMeta(t *testing.T, m jetstream.Msg) *jetstream.MsgMetadata {
	t.Helper()
	meta, err := m.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	return meta
}

func TestAdvisoryParksJobsThatRanOutOfDeliveries(t *testing.T) {
	t.Parallel()
	js := setup(t, testBackOff)
	var hooks atomic.Int64
	q := New(js, testConfig(t), nil, func(context.Context, []byte, string, string) { hooks.Add(1) })
	ctx, cancel := context.WithCancel(context.Background())
	stopRescue := q.startRescue(ctx)
	defer func() { cancel(); stopRescue() }()
	if err := q.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	seq := publishJob(t, js, events.NewID())
	exhaust(t, js)
	awaitGiveUp(t, js)
	testenv.WaitFor(t, 10*time.Second, "job parked", func() bool {
		return testutil.ToFloat64(q.m.dead.WithLabelValues(ReasonMaxDeliveries, "advisory")) == 1
	})
	if l := onlyLetter(t, js); l.Reason != ReasonMaxDeliveries || l.Attempts != 5 || l.OrigSeq != seq {
		t.Fatalf("letter = %+v", l)
	}
	if n := streamMsgs(t, js, events.PreviewJobsStream); n != 0 || hooks.Load() != 1 {
		t.Fatalf("queue holds %d, dead hook ran %d times; want 0 and 1", n, hooks.Load())
	}
}

func TestJobParkedByWorkerAndAdvisoryIsParkedOnce(t *testing.T) {
	t.Parallel()
	js := setup(t, testBackOff)
	var hooks atomic.Int64
	q := New(js, testConfig(t), nil, func(context.Context, []byte, string, string) { hooks.Add(1) })
	ctx, cancel := context.WithCancel(context.Background())
	stopRescue := q.startRescue(ctx)
	defer func() { cancel(); stopRescue() }()
	if err := q.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(map[string]any{"v": 1, "id": events.NewID()})
	if _, err := js.Publish(t.Context(), events.PreviewJobSubject, data); err != nil {
		t.Fatal(err)
	}
	meta := exhaust(t, js)
	// The worker of the last delivery parked the job, then crashed before
	// terminating it: the server will announce MAX_DELIVERIES for it too.
	if _, err := deadletter.Publish(t.Context(), js, deadletter.Parcel{
		Source: "preview", Reason: "http_5xx", Stream: meta.Stream, Subject: events.PreviewJobSubject,
		Seq: meta.Sequence.Stream, Attempts: 5, Error: "503", Consumer: meta.Consumer, Data: data,
	}); err != nil {
		t.Fatal(err)
	}
	awaitGiveUp(t, js)
	testenv.WaitFor(t, 10*time.Second, "advisory handled: job deleted from the queue", func() bool {
		return streamMsgs(t, js, events.PreviewJobsStream) == 0
	})
	if l := onlyLetter(t, js); l.Reason != "http_5xx" {
		t.Fatalf("letter = %+v, want the worker's", l)
	}
	// Counted and hooked once, by the worker that parked it, not again here
	// (which would rewrite the failed marker's reason to max_deliveries).
	if n := testutil.ToFloat64(q.m.dead.WithLabelValues(ReasonMaxDeliveries, "advisory")); n != 0 || hooks.Load() != 0 {
		t.Fatalf("advisory counted %v, dead hook ran %d times; want 0 and 0 for a job parked already", n, hooks.Load())
	}
}

func TestJobWhoseWorkerCrashedIsParkedWhenAWorkerComesBack(t *testing.T) {
	t.Parallel()
	js := setup(t, testBackOff)
	seq := publishJob(t, js, events.NewID())
	// Every delivery went to a worker that crashed; none is running now, so
	// nothing asks for the job and the server has not given up on it yet.
	exhaust(t, js)
	var calls atomic.Int64
	q := New(js, testConfig(t), func(context.Context, []byte) error {
		calls.Add(1)
		return nil
	}, nil)
	start(t, q)
	testenv.WaitFor(t, 10*time.Second, "job parked", func() bool {
		return testutil.ToFloat64(q.m.dead.WithLabelValues(ReasonMaxDeliveries, "advisory")) == 1
	})
	if l := onlyLetter(t, js); l.OrigSeq != seq || l.Reason != ReasonMaxDeliveries || l.Attempts != 5 {
		t.Fatalf("letter = %+v", l)
	}
	// The rescue counts the park, then deletes the job from the queue.
	testenv.WaitFor(t, 10*time.Second, "job deleted from the queue", func() bool {
		return streamMsgs(t, js, events.PreviewJobsStream) == 0
	})
	if n := calls.Load(); n != 0 {
		t.Fatalf("handler ran %d times; want 0 (a sixth delivery)", n)
	}
	testenv.WaitFor(t, 10*time.Second, "backlog gauge", func() bool {
		return testutil.ToFloat64(q.m.backlog.WithLabelValues(ReasonMaxDeliveries)) == 1
	})
}

// The server announces a job that ran out of deliveries while no preview
// instance runs (the instance whose pull made it notice died at once): the
// advisory waits on PREVIEW_ADVISORIES and the next instance parks the job.
func TestAdvisoryPublishedWhileNoInstanceRunsIsRescuedByTheNext(t *testing.T) {
	t.Parallel()
	js := setup(t, testBackOff)
	seq := publishJob(t, js, events.NewID())
	exhaust(t, js)
	awaitGiveUp(t, js) // the announcement: nobody else listens
	testenv.WaitFor(t, 10*time.Second, "advisory kept", func() bool {
		return streamMsgs(t, js, events.PreviewAdvisoriesStream) == 1
	})
	var calls, hooks atomic.Int64
	q := New(js, testConfig(t), func(context.Context, []byte) error {
		calls.Add(1)
		return nil
	}, func(context.Context, []byte, string, string) { hooks.Add(1) })
	start(t, q)
	testenv.WaitFor(t, 10*time.Second, "job parked and deleted from the queue", func() bool {
		return testutil.ToFloat64(q.m.dead.WithLabelValues(ReasonMaxDeliveries, "advisory")) == 1 &&
			streamMsgs(t, js, events.PreviewJobsStream) == 0
	})
	if l := onlyLetter(t, js); l.OrigSeq != seq || l.Reason != ReasonMaxDeliveries || l.Attempts != topology.PreviewMaxDeliver {
		t.Fatalf("letter = %+v", l)
	}
	testenv.WaitFor(t, 10*time.Second, "advisory acked", func() bool {
		return streamMsgs(t, js, events.PreviewAdvisoriesStream) == 0
	})
	if calls.Load() != 0 || hooks.Load() != 1 {
		t.Fatalf("handler ran %d times, dead hook %d; want 0 (a sixth delivery) and 1", calls.Load(), hooks.Load())
	}
}

// An instance holding an advisory whose rescue keeps failing (DEAD_LETTER
// away) stops: the advisory is not lost with it, and the next instance
// parks the job once DEAD_LETTER is back.
func TestAdvisoryHeldByAStoppedInstanceIsRescuedByTheNext(t *testing.T) {
	t.Parallel()
	js := setup(t, testBackOff)
	var hooks atomic.Int64
	onDead := func(context.Context, []byte, string, string) { hooks.Add(1) }
	first := New(js, testConfig(t), nil, onDead)
	ctx, cancel := context.WithCancel(context.Background())
	stopFirst := first.startRescue(ctx)
	seq := publishJob(t, js, events.NewID())
	restore := deadLetterOutage(t, js)
	exhaust(t, js)
	awaitGiveUp(t, js)
	testenv.WaitFor(t, 20*time.Second, "the first instance failed to park twice", func() bool {
		return testutil.ToFloat64(first.m.parkErrors) >= 2
	})
	cancel()
	stopFirst()
	restore()
	if n := streamMsgs(t, js, events.PreviewJobsStream); n != 1 {
		t.Fatalf("queue holds %d jobs after the first instance stopped, want 1", n)
	}
	next := New(js, testConfig(t), nil, onDead)
	start(t, next)
	testenv.WaitFor(t, 20*time.Second, "job parked by the next instance", func() bool {
		return testutil.ToFloat64(next.m.dead.WithLabelValues(ReasonMaxDeliveries, "advisory")) == 1 &&
			streamMsgs(t, js, events.PreviewJobsStream) == 0
	})
	if l := onlyLetter(t, js); l.OrigSeq != seq || l.Reason != ReasonMaxDeliveries {
		t.Fatalf("letter = %+v", l)
	}
	testenv.WaitFor(t, 10*time.Second, "advisory acked", func() bool {
		return streamMsgs(t, js, events.PreviewAdvisoriesStream) == 0
	})
	if hooks.Load() != 1 {
		t.Fatalf("dead hook ran %d times, want 1", hooks.Load())
	}
}

// A rescue that cannot succeed (DEAD_LETTER refuses the job: too large)
// is retried with backoff and kept, and holds up no other advisory: a job
// that ran out of deliveries after it is parked.
func TestARescueThatCannotSucceedHoldsUpNoOther(t *testing.T) {
	t.Parallel()
	js := setup(t, testBackOff)
	s, err := js.Stream(t.Context(), events.DeadLetterStream)
	if err != nil {
		t.Fatal(err)
	}
	dlc := s.CachedInfo().Config
	dlc.MaxMsgSize = 1 << 10
	if _, err := js.UpdateStream(t.Context(), dlc); err != nil {
		t.Fatal(err)
	}
	big, _ := json.Marshal(map[string]any{"v": 1, "id": events.NewID(), "pad": strings.Repeat("x", 2<<10)})
	if _, err := js.Publish(t.Context(), events.PreviewJobSubject, big); err != nil {
		t.Fatal(err)
	}
	exhaust(t, js)
	awaitGiveUp(t, js)
	small := publishJob(t, js, events.NewID())
	exhaust(t, js)
	awaitGiveUp(t, js)
	testenv.WaitFor(t, 10*time.Second, "both advisories kept", func() bool {
		return streamMsgs(t, js, events.PreviewAdvisoriesStream) == 2
	})
	q := New(js, testConfig(t), nil, nil)
	start(t, q)
	testenv.WaitFor(t, 20*time.Second, "the later job parked while the first is retried", func() bool {
		return testutil.ToFloat64(q.m.dead.WithLabelValues(ReasonMaxDeliveries, "advisory")) == 1 &&
			testutil.ToFloat64(q.m.rescueRetries) >= 3
	})
	if l := onlyLetter(t, js); l.OrigSeq != small {
		t.Fatalf("letter = %+v, want job %d's", l, small)
	}
	if n, a := streamMsgs(t, js, events.PreviewJobsStream), streamMsgs(t, js, events.PreviewAdvisoriesStream); n != 1 || a != 1 {
		t.Fatalf("queue holds %d jobs and %d advisories; want the refused job and its advisory, kept", n, a)
	}
}

func TestRidesOutANATSRestart(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t)
	js := setupOn(t, n, testBackOff, jetstream.FileStorage) // the queue survives the restart
	var mu sync.Mutex
	done := map[string]int{}
	q := New(js, testConfig(t), func(_ context.Context, data []byte) error {
		mu.Lock()
		defer mu.Unlock()
		done[jobID(data)]++
		return nil
	}, nil)
	start(t, q)
	count := func(id string) int {
		mu.Lock()
		defer mu.Unlock()
		return done[id]
	}
	before := events.NewID()
	publishJob(t, js, before)
	testenv.WaitFor(t, 10*time.Second, "job before the restart", func() bool { return count(before) == 1 })
	n.Restart()
	after := events.NewID()
	testenv.WaitFor(t, 20*time.Second, "publish after the restart", func() bool {
		_, err := js.Publish(context.Background(), events.PreviewJobSubject, []byte(`{"v":1,"id":"`+after+`"}`), jetstream.WithMsgID(after))
		return err == nil
	})
	testenv.WaitFor(t, 20*time.Second, "both jobs done and acked", func() bool {
		return count(after) == 1 && testutil.ToFloat64(q.m.deliveries.WithLabelValues("done")) == 2
	})
	if count(before) != 1 {
		t.Fatalf("the job before the restart ran %d times, want 1", count(before))
	}
}

// deadLetterOutage deletes DEAD_LETTER; the returned restore creates it
// again as the topology defines it.
func deadLetterOutage(t *testing.T, js jetstream.JetStream) (restore func()) {
	t.Helper()
	if err := js.DeleteStream(context.Background(), events.DeadLetterStream); err != nil {
		t.Error(err)
	}
	return func() {
		o := topology.Defaults()
		o.Storage = jetstream.MemoryStorage
		for _, sc := range topology.Streams(o) {
			if sc.Name == events.DeadLetterStream {
				if _, err := js.CreateOrUpdateStream(context.Background(), sc); err != nil {
					t.Error(err)
				}
			}
		}
	}
}

// A DEAD_LETTER outage on the last try: the worker keeps the job and
// retries the park, rather than NAK it and leave it to one advisory.
func TestLastTryRidesOutADeadLetterOutage(t *testing.T) {
	t.Parallel()
	js := setup(t, testBackOff)
	var calls, hooks atomic.Int64
	restored := make(chan func(), 1)
	q := New(js, testConfig(t), func(context.Context, []byte) error {
		if calls.Add(1) == topology.PreviewMaxDeliver {
			restored <- deadLetterOutage(t, js)
		}
		return failure.Retryable("http_5xx", errors.New("503 Service Unavailable"))
	}, func(context.Context, []byte, string, string) { hooks.Add(1) })
	start(t, q)
	seq := publishJob(t, js, events.NewID())
	restore := <-restored
	// The outage lasts until the park has failed three times: retried, not
	// given up after one.
	testenv.WaitFor(t, 20*time.Second, "three parks failed", func() bool { return testutil.ToFloat64(q.m.parkErrors) >= 3 })
	restore()
	testenv.WaitFor(t, 20*time.Second, "job parked", func() bool {
		return streamMsgs(t, js, events.DeadLetterStream) == 1 && streamMsgs(t, js, events.PreviewJobsStream) == 0
	})
	if l := onlyLetter(t, js); l.OrigSeq != seq || l.Reason != "http_5xx" || l.Attempts != 5 {
		t.Fatalf("letter = %+v", l)
	}
	testenv.WaitFor(t, 10*time.Second, "dead hook ran", func() bool { return hooks.Load() == 1 })
	if n := calls.Load(); n != 5 {
		t.Errorf("handler ran %d times, want 5", n)
	}
}

// A permanent failure that DEAD_LETTER refuses (an outage) before the last
// try is NAKed with backoff and comes back: a retry, counted in
// retries_total with its reason as in deliveries_total{outcome="retried"}.
// It was counted as a retried delivery only, so the two disagreed.
func TestAPermanentFailureWhoseParkFailedIsCountedAsARetry(t *testing.T) {
	t.Parallel()
	js := setup(t, testBackOff)
	restore := deadLetterOutage(t, js)
	var calls atomic.Int64
	q := New(js, testConfig(t), func(context.Context, []byte) error {
		calls.Add(1)
		return failure.Permanent("not_found", errors.New("404 Not Found"))
	}, nil)
	start(t, q)
	publishJob(t, js, events.NewID())
	testenv.WaitFor(t, 20*time.Second, "two parks failed", func() bool { return testutil.ToFloat64(q.m.parkErrors) >= 2 })
	restore()
	testenv.WaitFor(t, 20*time.Second, "job parked", func() bool {
		return testutil.ToFloat64(q.m.deliveries.WithLabelValues("dead_lettered")) == 1 && streamMsgs(t, js, events.PreviewJobsStream) == 0
	})
	retried := testutil.ToFloat64(q.m.deliveries.WithLabelValues("retried"))
	if retried < 2 || retried != float64(calls.Load()-1) {
		t.Errorf("deliveries{retried} = %v after %d tries, want every try but the last (at least 2)", retried, calls.Load())
	}
	if got := testutil.ToFloat64(q.m.retries.WithLabelValues("not_found")); got != retried {
		t.Errorf("retries_total{reason=not_found} = %v, want deliveries{retried}'s %v", got, retried)
	}
	if n := testutil.CollectAndCount(q.m.retries); n != 1 {
		t.Errorf("retries_total has %d series, want 1 (not_found)", n)
	}
}

// A last try whose park DEAD_LETTER refuses until the worker stops is
// handed to the rescuer (a NAK that exhausts it): a hand-back at shutdown,
// not a retry, since the job is not delivered again. It was counted as
// deliveries{retried}.
func TestALastTryWhoseParkFailedUntilTheStopIsHandedBack(t *testing.T) {
	t.Parallel()
	js := setup(t, testBackOff)
	var calls atomic.Int64
	restored := make(chan func(), 1)
	cfg := testConfig(t)
	cfg.ShutdownTimeout = 200 * time.Millisecond
	cfg.Advisories = "" // nothing rescues here: the job is left to the server
	q := New(js, cfg, func(context.Context, []byte) error {
		if calls.Add(1) == topology.PreviewMaxDeliver {
			restored <- deadLetterOutage(t, js)
		}
		return failure.Retryable("http_5xx", errors.New("503 Service Unavailable"))
	}, nil)
	stop := start(t, q)
	publishJob(t, js, events.NewID())
	restore := <-restored
	t.Cleanup(restore)
	testenv.WaitFor(t, 20*time.Second, "a park of the last try failed", func() bool { return testutil.ToFloat64(q.m.parkErrors) >= 1 })
	stop()
	retried := testutil.ToFloat64(q.m.deliveries.WithLabelValues("retried"))
	if handedBack := testutil.ToFloat64(q.m.deliveries.WithLabelValues("handed_back")); handedBack != 1 || retried != topology.PreviewMaxDeliver-1 {
		t.Errorf("deliveries: handed_back %v, retried %v; want 1 (the last try) and %d (the others)", handedBack, retried, topology.PreviewMaxDeliver-1)
	}
	if got := testutil.ToFloat64(q.m.retries.WithLabelValues("http_5xx")); got != retried {
		t.Errorf("retries_total{reason=http_5xx} = %v, want deliveries{retried}'s %v", got, retried)
	}
}

// A DEAD_LETTER outage when the advisory arrives: the rescuer retries the
// park until DEAD_LETTER is back.
func TestAdvisoryRescueRidesOutADeadLetterOutage(t *testing.T) {
	t.Parallel()
	js := setup(t, testBackOff)
	var hooks atomic.Int64
	q := New(js, testConfig(t), nil, func(context.Context, []byte, string, string) { hooks.Add(1) })
	ctx, cancel := context.WithCancel(context.Background())
	stopRescue := q.startRescue(ctx)
	defer func() { cancel(); stopRescue() }()
	if err := q.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	seq := publishJob(t, js, events.NewID())
	restore := deadLetterOutage(t, js)
	exhaust(t, js)
	awaitGiveUp(t, js)
	// The outage lasts until the park has failed three times: retried, not
	// given up after one.
	testenv.WaitFor(t, 20*time.Second, "three parks failed", func() bool { return testutil.ToFloat64(q.m.parkErrors) >= 3 })
	restore()
	testenv.WaitFor(t, 20*time.Second, "job parked", func() bool {
		return testutil.ToFloat64(q.m.dead.WithLabelValues(ReasonMaxDeliveries, "advisory")) == 1
	})
	if l := onlyLetter(t, js); l.OrigSeq != seq || l.Reason != ReasonMaxDeliveries {
		t.Fatalf("letter = %+v", l)
	}
	if n := streamMsgs(t, js, events.PreviewJobsStream); n != 0 || hooks.Load() != 1 {
		t.Fatalf("queue holds %d, dead hook ran %d times; want 0 and 1", n, hooks.Load())
	}
}

// Jobs waiting out a long retry delay do not stop a fresh job. The consumer
// is the topology's (setup), with its MaxAckPending: the waiting retries
// are more than the 1000 a bounded limit allowed before.
func TestWaitingRetriesDoNotStopFreshJobs(t *testing.T) {
	t.Parallel()
	js := setup(t, testBackOff)
	const waiting = 1001
	fresh := events.NewID()
	var done atomic.Bool
	cfg := testConfig(t)
	cfg.Concurrency = 16
	cfg.Backoff.RetryAfterMax = time.Hour
	q := New(js, cfg, func(_ context.Context, data []byte) error {
		if jobID(data) == fresh {
			done.Store(true)
			return nil
		}
		return failure.RetryableAfter("http_429", time.Hour, errors.New("429 Too Many Requests"))
	}, nil)
	start(t, q)
	for range waiting {
		publishJob(t, js, events.NewID())
	}
	testenv.WaitFor(t, 30*time.Second, "1000 jobs waiting for their retry", func() bool {
		return testutil.ToFloat64(q.m.retries.WithLabelValues("http_429")) >= 1000
	})
	publishJob(t, js, fresh)
	testenv.WaitFor(t, 10*time.Second, "fresh job done and every other job waiting", func() bool {
		return done.Load() && testutil.ToFloat64(q.m.retries.WithLabelValues("http_429")) == waiting
	})
}

// A job aborted at shutdown on its last delivery is run by the next
// instance, not parked for running out of tries it never used.
func TestLastTryHandedBackAtShutdownIsRunAgain(t *testing.T) {
	t.Parallel()
	js := setup(t, testBackOff)
	id := events.NewID()
	publishJob(t, js, id)
	// Deliveries 1 to 4 went to workers that crashed.
	cons, err := js.Consumer(t.Context(), events.PreviewJobsStream, topology.PreviewConsumer)
	if err != nil {
		t.Fatal(err)
	}
	for range topology.PreviewMaxDeliver - 1 {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := <-batch.Messages(); !ok {
			t.Fatalf("no redelivery: %v", batch.Error())
		}
	}
	started := make(chan uint64, 1)
	cfg := testConfig(t)
	cfg.ShutdownTimeout = 200 * time.Millisecond
	a := New(js, cfg, func(ctx context.Context, _ []byte) error {
		started <- 1
		<-ctx.Done() // a fetch that hangs until aborted
		return ctx.Err()
	}, nil)
	stopA := start(t, a)
	<-started
	stopA()
	var doneBy atomic.Value
	b := New(js, testConfig(t), func(_ context.Context, data []byte) error {
		doneBy.Store(jobID(data))
		return nil
	}, nil)
	start(t, b)
	testenv.WaitFor(t, 10*time.Second, "job done by the next instance", func() bool { return doneBy.Load() == id })
	testenv.WaitFor(t, 10*time.Second, "queue empty", func() bool { return streamMsgs(t, js, events.PreviewJobsStream) == 0 })
	if n := streamMsgs(t, js, events.DeadLetterStream); n != 0 {
		t.Fatalf("%d dead letters, want 0", n)
	}
}

// A stop asks for no more jobs: once the pull outstanding when the stop
// began has ended, no other is sent (README: "stop asking for jobs, let the
// outstanding pull request end"). The pull loop waits for a free slot and
// for the stop together; were both being ready a coin toss, about every
// second stop would send one pull more (and take a job it brings). Each of
// 8 stops, on servers of their own, counts the pull requests the server
// got: one, the outstanding pull.
func TestStopSendsNoPullAfterTheOutstandingOne(t *testing.T) {
	t.Parallel()
	for i := range 8 {
		t.Run(fmt.Sprint("stop_", i), func(t *testing.T) {
			t.Parallel()
			n := testenv.StartNATS(t)
			js := setupOn(t, n, testBackOff, jetstream.MemoryStorage)
			// Every pull request of the workers' consumer, as the server
			// receives it (a plain subscriber on the API subject gets a copy).
			var pulls atomic.Int64
			watcher := n.Connect(t)
			sub, err := watcher.Subscribe("$JS.API.CONSUMER.MSG.NEXT."+events.PreviewJobsStream+"."+topology.PreviewConsumer,
				func(*nats.Msg) { pulls.Add(1) })
			if err != nil {
				t.Fatal(err)
			}
			if err := watcher.Flush(); err != nil {
				t.Fatal(err)
			}
			cfg := testConfig(t)
			cfg.Concurrency = 1
			cfg.PullWait = 2 * time.Second // the stop comes well within the first pull
			q := New(js, cfg, func(context.Context, []byte) error { return nil }, nil)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- q.Run(ctx) }()
			testenv.WaitFor(t, 10*time.Second, "the first pull request", func() bool { return pulls.Load() >= 1 })
			cancel() // while that pull is outstanding (it waits a second)
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("Run: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("Run did not return 30s after cancel")
			}
			if err := watcher.Flush(); err != nil {
				t.Fatal(err)
			}
			_ = sub.Unsubscribe()
			if got := pulls.Load(); got != 1 {
				t.Fatalf("the server got %d pull requests; want 1, the one outstanding at the stop", got)
			}
		})
	}
}

// A TERM waits for the server, as an ack does: once term returns the job is
// gone from the consumer and the work queue, and a TERM nobody can confirm
// (its consumer deleted meanwhile) is counted and logged, not taken on
// trust.
func TestTermWaitsForTheServersConfirmation(t *testing.T) {
	t.Parallel()
	js := setup(t, testBackOff)
	q := New(js, testConfig(t), func(context.Context, []byte) error { return nil }, nil)
	fetch := func() jetstream.Msg {
		t.Helper()
		c, err := js.Consumer(t.Context(), events.PreviewJobsStream, topology.PreviewConsumer)
		if err != nil {
			t.Fatal(err)
		}
		b, err := c.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range b.Messages() {
			return m
		}
		t.Fatalf("no job fetched: %v", b.Error())
		return nil
	}

	publishJob(t, js, "0193c0de-0000-7000-8000-000000000001")
	q.term(fetch(), "not_found", q.log)
	c, err := js.Consumer(t.Context(), events.PreviewJobsStream, topology.PreviewConsumer)
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if info.NumAckPending != 0 || streamMsgs(t, js, events.PreviewJobsStream) != 0 {
		t.Errorf("after term returned: %d jobs pending an ack, %d in the queue; want 0 and 0", info.NumAckPending, streamMsgs(t, js, events.PreviewJobsStream))
	}
	if n := testutil.ToFloat64(q.m.termsUnconfirmed); n != 0 {
		t.Errorf("terms_unconfirmed_total = %v after a confirmed TERM, want 0", n)
	}

	publishJob(t, js, "0193c0de-0000-7000-8000-000000000002")
	m := fetch()
	if err := js.DeleteConsumer(t.Context(), events.PreviewJobsStream, topology.PreviewConsumer); err != nil {
		t.Fatal(err)
	}
	q.term(m, "not_found", q.log)
	if n := testutil.ToFloat64(q.m.termsUnconfirmed); n != 1 {
		t.Errorf("terms_unconfirmed_total = %v after a TERM whose consumer was gone, want 1", n)
	}
}

// noticed is a slog handler that passes records on to next and closes seen
// once a record's message is msg.
type noticed struct {
	next slog.Handler
	msg  string
	seen chan struct{}
	once *sync.Once
}

func (h noticed) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }
func (h noticed) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.once.Do(func() { close(h.seen) })
	}
	return h.next.Handle(ctx, r)
}
func (h noticed) WithAttrs(a []slog.Attr) slog.Handler { h.next = h.next.WithAttrs(a); return h }
func (h noticed) WithGroup(g string) slog.Handler      { h.next = h.next.WithGroup(g); return h }

// updatePreviewConsumer sets the workers' consumer's MaxDeliver on the
// server, as snipctl topology apply does after an operator's edit.
func updatePreviewConsumer(t *testing.T, js jetstream.JetStream, backOff []time.Duration, maxDeliver int) {
	t.Helper()
	cc := topology.PreviewConsumerConfig()
	cc.BackOff, cc.AckWait, cc.MaxDeliver = backOff, backOff[0], maxDeliver
	if _, err := js.UpdateConsumer(t.Context(), events.PreviewJobsStream, cc); err != nil {
		t.Fatal(err)
	}
}

// A MaxDeliver raised on the server while the workers run is followed
// without a restart: a job that always fails gets every try the consumer
// now allows and is parked on the last. The workers read the consumer's
// settings once per pull loop (only a pull error made them read again),
// so they parked the job on the 5th of its 7 tries.
func TestARaisedMaxDeliverIsFollowedWithoutARestart(t *testing.T) {
	t.Parallel()
	js := setup(t, testBackOff)
	const raised = topology.PreviewMaxDeliver + 2
	cfg := testConfig(t)
	cfg.PolicyRefresh = 50 * time.Millisecond
	changed := make(chan struct{})
	cfg.Logger = slog.New(noticed{next: cfg.Logger.Handler(), msg: "consumer settings changed on the server; following them", seen: changed, once: &sync.Once{}})
	var calls atomic.Int64
	q := New(js, cfg, func(context.Context, []byte) error {
		if calls.Add(1) == 1 {
			// Fail the first try only once the workers saw the change (or
			// after 10s: the job is kept in hand meanwhile).
			select {
			case <-changed:
			case <-time.After(10 * time.Second):
			}
		}
		return failure.Retryable("http_5xx", errors.New("503 Service Unavailable"))
	}, nil)
	start(t, q)
	updatePreviewConsumer(t, js, testBackOff, raised)
	seq := publishJob(t, js, events.NewID())
	testenv.WaitFor(t, 40*time.Second, "job dead-lettered and gone from the queue", func() bool {
		return streamMsgs(t, js, events.DeadLetterStream) == 1 && streamMsgs(t, js, events.PreviewJobsStream) == 0
	})
	if l := onlyLetter(t, js); l.OrigSeq != seq || l.Reason != "http_5xx" || l.Attempts != raised {
		t.Errorf("letter: seq %d, reason %s, attempts %d; want %d, http_5xx, %d (the raised MaxDeliver)", l.OrigSeq, l.Reason, l.Attempts, seq, raised)
	}
	if n := calls.Load(); n != raised {
		t.Errorf("handler ran %d times, want %d", n, raised)
	}
}

// A delivery numbered beyond the MaxDeliver the worker read shows that it
// was raised since: the worker reads the settings again before it
// decides, and retries a transient failure rather than park it. (Here
// the pull loop does not read them again before the job comes.)
func TestADeliveryBeyondTheMaxDeliverReadHasTheSettingsReadAgain(t *testing.T) {
	t.Parallel()
	js := setup(t, testBackOff)
	const raised = topology.PreviewMaxDeliver + 2
	cfg := testConfig(t)
	cfg.PolicyRefresh = time.Hour
	var calls atomic.Int64
	q := New(js, cfg, func(context.Context, []byte) error {
		calls.Add(1)
		return failure.Retryable("http_5xx", errors.New("503 Service Unavailable"))
	}, nil)
	q.setPolicy(consumerPolicy{maxDeliver: topology.PreviewMaxDeliver, ackWait: testBackOff[0], backoff: testBackOff})
	updatePreviewConsumer(t, js, testBackOff, raised)
	seq := publishJob(t, js, events.NewID())
	cons, err := js.Consumer(t.Context(), events.PreviewJobsStream, topology.PreviewConsumer)
	if err != nil {
		t.Fatal(err)
	}
	// Deliveries 1 to 5 went to workers that crashed.
	for range topology.PreviewMaxDeliver {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := <-batch.Messages(); !ok {
			t.Fatalf("no redelivery: %v", batch.Error())
		}
	}
	for want := uint64(topology.PreviewMaxDeliver + 1); want <= raised; want++ {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		m, ok := <-batch.Messages()
		if !ok {
			t.Fatalf("no delivery %d: %v", want, batch.Error())
		}
		if n := mustMeta(t, m).NumDelivered; n != want {
			t.Fatalf("delivery %d, want %d", n, want)
		}
		q.work(t.Context(), cons, m)
		if want < raised && streamMsgs(t, js, events.DeadLetterStream) != 0 {
			t.Fatalf("parked on delivery %d of %d", want, raised)
		}
	}
	testenv.WaitFor(t, 10*time.Second, "job gone from the queue", func() bool { return streamMsgs(t, js, events.PreviewJobsStream) == 0 })
	if l := onlyLetter(t, js); l.OrigSeq != seq || l.Attempts != raised {
		t.Errorf("letter: seq %d, attempts %d; want %d, %d", l.OrigSeq, l.Attempts, seq, raised)
	}
}

// The rescuer asks Config.Done before parking a job that ran out of
// deliveries: a job done already is removed without a dead letter, and
// one whose record cannot be read (an error) is parked as before.
func TestTheRescuerParksOnlyAJobNotDone(t *testing.T) {
	t.Parallel()
	js := setup(t, testBackOff)
	var doneID atomic.Value
	doneID.Store("")
	cfg := testConfig(t)
	cfg.Done = func(_ context.Context, data []byte) (bool, error) {
		if jobID(data) == doneID.Load() {
			return true, nil
		}
		return false, errors.New("record unreadable")
	}
	var hooks atomic.Int64
	q := New(js, cfg, nil, func(context.Context, []byte, string, string) { hooks.Add(1) })
	ctx, cancel := context.WithCancel(context.Background())
	stopRescue := q.startRescue(ctx)
	defer func() { cancel(); stopRescue() }()

	done := events.NewID()
	doneID.Store(done)
	publishJob(t, js, done)
	exhaust(t, js)
	awaitGiveUp(t, js)
	testenv.WaitFor(t, 10*time.Second, "the done job removed", func() bool { return streamMsgs(t, js, events.PreviewJobsStream) == 0 })
	if n := streamMsgs(t, js, events.DeadLetterStream); n != 0 || testutil.ToFloat64(q.m.rescuedDone) != 1 || hooks.Load() != 0 {
		t.Fatalf("done job: %d dead letters, rescued_done %v, dead hook %d; want 0, 1, 0", n, testutil.ToFloat64(q.m.rescuedDone), hooks.Load())
	}

	seq := publishJob(t, js, events.NewID())
	exhaust(t, js)
	awaitGiveUp(t, js)
	testenv.WaitFor(t, 10*time.Second, "the job parked", func() bool {
		return testutil.ToFloat64(q.m.dead.WithLabelValues(ReasonMaxDeliveries, "advisory")) == 1
	})
	if l := onlyLetter(t, js); l.OrigSeq != seq || l.Reason != ReasonMaxDeliveries {
		t.Fatalf("letter = %+v", l)
	}
}
