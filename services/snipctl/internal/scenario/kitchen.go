package scenario

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/topology"
)

var kitchen = Scenario{
	Name:   "kitchen",
	Claim:  "a queue shares work out (two cooks, ~half each); a log gives every reader every event, in order",
	Needs:  "nats",
	Lesson: 3 * time.Second,
	run:    runKitchen,
}

const kitchenOrders = 100

func runKitchen(ctx context.Context, e *Env) error {
	js, err := e.NATS(ctx, 4)
	if err != nil {
		return err
	}

	// The queue: 100 jobs on PREVIEW_JOBS, two workers on the one durable
	// consumer every preview worker shares (topology.PreviewConsumerConfig).
	e.say("queue: 100 orders on %s, two workers on consumer %s", events.PreviewJobsStream, topology.PreviewConsumer)
	for i := range kitchenOrders {
		j := events.PreviewJob{V: events.PreviewJobVersion, ID: events.NewID(), Time: time.Now().UTC(),
			Code: fmt.Sprintf("order%d", i), Owner: owner, Target: "https://example.com/"}
		b, _ := json.Marshal(j)
		if _, err := js.PublishAsync(events.PreviewJobSubject, b, jetstream.WithMsgID(j.ID)); err != nil {
			return fmt.Errorf("publish job: %w", err)
		}
	}
	if err := waitPublished(ctx, js); err != nil {
		return err
	}
	var mu sync.Mutex
	perWorker := map[string]int{}
	seen := map[string]int{}
	cook := e.Real(20 * time.Millisecond) // each order takes 20 ms of lesson time
	// Both cooks connect first and start together: a cook that began while
	// the other was still connecting (a slow moment on a loaded machine)
	// would have the queue to itself and take more than its turn.
	cooks := map[string]jetstream.Consumer{}
	for _, w := range []string{"cook-1", "cook-2"} {
		wjs, err := e.Connect(w)
		if err != nil {
			return err
		}
		cons, err := wjs.Consumer(ctx, events.PreviewJobsStream, topology.PreviewConsumer)
		if err != nil {
			return fmt.Errorf("preview consumer: %w", err)
		}
		cooks[w] = cons
	}
	qctx, stopQueue := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for w, cons := range cooks {
		wg.Go(func() {
			for qctx.Err() == nil {
				b, err := cons.Fetch(1, jetstream.FetchMaxWait(200*time.Millisecond))
				if err != nil {
					continue
				}
				for m := range b.Messages() {
					var j events.PreviewJob
					_ = json.Unmarshal(m.Data(), &j)
					time.Sleep(cook) // the work itself
					// Counted as made whether or not the ack gets through: an
					// order whose ack is lost comes back and is made again,
					// and that is what "made twice" must see.
					_ = m.DoubleAck(qctx)
					mu.Lock()
					perWorker[w]++
					seen[j.ID]++
					mu.Unlock()
				}
			}
		})
	}
	err = waitFor(ctx, 60*time.Second, "the queue to empty", func() (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == kitchenOrders, nil
	})
	stopQueue()
	wg.Wait()
	if err != nil {
		return err
	}
	left, err := js.Stream(ctx, events.PreviewJobsStream)
	if err != nil {
		return fmt.Errorf("preview stream: %w", err)
	}
	info, err := left.Info(ctx)
	if err != nil {
		return fmt.Errorf("preview stream info: %w", err)
	}
	twice := 0
	for _, n := range seen {
		if n > 1 {
			twice++
		}
	}
	const fair = "pulls are served in turn, one order each; a worker that the scheduler favours may take a few more"
	e.within("queue: orders cook-1 made", "orders", 50, float64(perWorker["cook-1"]), 0.3, 0, fair)
	e.within("queue: orders cook-2 made", "orders", 50, float64(perWorker["cook-2"]), 0.3, 0, fair)
	e.exact("queue: orders made twice", "orders", 0, float64(twice), "a work queue hands each job to one worker")
	e.exact("queue: orders left in the stream", "msgs", 0, float64(info.State.Msgs), "work-queue retention deletes a job on its ack")

	// The log: 100 clicks on CLICKS, two consumer groups, one member each.
	e.say("log: 100 clicks on %s, groups waiters and accounts", events.ClicksStream)
	links := codes(5)
	for i := range kitchenOrders {
		if _, err := publishClick(js, newClick(links[i%len(links)], i/len(links))); err != nil {
			return err
		}
	}
	if err := waitPublished(ctx, js); err != nil {
		return err
	}
	groups := map[string]*tally{"waiters": newTally(), "accounts": newTally()}
	var members []*member
	for g, t := range groups {
		m, err := e.startMember(ctx, groupConfig(g, g+"-1"), func(_ context.Context, _ int, batch []reader.Event) error {
			for _, ev := range batch {
				t.add(g, ev.Click)
			}
			return nil
		})
		if err != nil {
			return err
		}
		members = append(members, m)
	}
	err = waitFor(ctx, 60*time.Second, "both groups to read every click", func() (bool, error) {
		for _, t := range groups {
			if h, _, _ := t.counts(); h < kitchenOrders {
				return false, nil
			}
		}
		return true, nil
	})
	var errs []error
	for _, m := range members {
		errs = append(errs, m.stop())
	}
	if err := errors.Join(append(errs, err)...); err != nil {
		return err
	}
	for _, g := range sortedKeys(groups) {
		h, _, disorder := groups[g].counts()
		e.exact("log: clicks group "+g+" read", "clicks", kitchenOrders, float64(h), "every group reads the whole log")
		e.exact("log: out-of-order clicks in "+g, "clicks", 0, float64(disorder), "a link's clicks stay in one partition, read by one member in order")
	}
	return nil
}
