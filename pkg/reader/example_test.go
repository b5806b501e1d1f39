package reader_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/deadletter"
	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// A consumer group of one member counts clicks per link. The handler gets
// each partition's events in order, in batches; it answers nil (the batch
// is acked), a plain error (the batch is retried with backoff) or
// reader.Poison for an event it can never handle, which the runtime parks on
// DEAD_LETTER as dead.<group>.<reason> before going on.
func Example() {
	ctx := context.Background()
	js, stop := exampleJetStream(ctx)
	defer stop()
	for i, link := range []string{"abc", "abc", "xyz", "abc", "bad", "xyz"} {
		publishClick(ctx, js, link, i)
	}

	var mu sync.Mutex
	counts := map[string]int{}
	count := func(_ context.Context, _ int, batch []reader.Event) error {
		mu.Lock()
		defer mu.Unlock()
		for i, ev := range batch {
			if !strings.HasPrefix(ev.Click.Target, "https://") {
				// The events before i are done; this one is parked.
				return reader.Poison(i, "bad_target", fmt.Errorf("click %s: target %q", ev.Click.ID, ev.Click.Target))
			}
			counts[ev.Click.Code]++
		}
		return nil
	}

	runCtx, leave := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- reader.Run(runCtx, js, reader.Config{Group: "example-counter", Member: "m1", Linger: 10 * time.Millisecond}, count)
	}()
	waitUntil(func() bool {
		mu.Lock()
		defer mu.Unlock()
		return counts["abc"]+counts["xyz"] == 5 && deadLetters(ctx, js) == 1
	})
	leave() // a graceful leave: finish, ack, unpin
	if err := <-done; err != nil {
		log.Fatal(err)
	}

	codes := make([]string, 0, len(counts))
	for code := range counts {
		codes = append(codes, code)
	}
	sort.Strings(codes)
	for _, code := range codes {
		fmt.Println(code, counts[code])
	}
	_ = deadletter.Each(ctx, js, deadletter.Filter("example-counter", ""), func(l deadletter.Letter) error {
		fmt.Println("parked:", l.Subject, "from", l.Stream)
		return nil
	})
	// Output:
	// abc 3
	// xyz 2
	// parked: dead.example-counter.bad_target from CLICKS
}

// Where a new group starts, said in configuration: the last three days
// first, then live.
func ExampleParseStart() {
	start, err := reader.ParseStart("72h")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(start)
	cfg := reader.Config{Group: "warehouse-loader", Start: start}
	fmt.Println(cfg.Group, "starts within", cfg.Start)
	// Output:
	// 72h0m0s
	// warehouse-loader starts within 72h0m0s
}

func publishClick(ctx context.Context, js jetstream.JetStream, code string, i int) {
	target := "https://example.com/" + code
	if code == "bad" {
		target = "ftp://example.com/"
	}
	c := events.Click{V: events.ClickVersion, ID: events.NewID(), Time: time.Now().UTC(), Code: code, Owner: "acme",
		Target: target, Visitor: fmt.Sprint("v", i)}
	data, err := json.Marshal(c)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := js.Publish(ctx, events.ClickSubject(c.Owner, c.Code), data, jetstream.WithMsgID(c.ID)); err != nil {
		log.Fatal(err)
	}
}

func deadLetters(ctx context.Context, js jetstream.JetStream) uint64 {
	s, err := js.Stream(ctx, events.DeadLetterStream)
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

// exampleJetStream starts an embedded NATS server with Snip's topology (4
// partitions) and returns a client and a function that stops both.
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
	o.Partitions = 4
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
