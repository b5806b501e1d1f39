package scenario

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/events"
)

var crashPoints = Scenario{
	Name:   "crash-points",
	Claim:  "ack before work loses work at a crash (at most once); work before ack does it twice (at least once); work and idempotency key in one transaction, then ack, does it once (effectively once)",
	Needs:  "nats, redis",
	Lesson: 5 * time.Second,
	run:    runCrashPoints,
}

const (
	crashEvents = 60
	crashEvery  = 6 // crash at the first handling of every 6th event: 10 crashes
)

// crashLostDeliveries, when above zero (a test sets it), has each design's
// consumer deliver its first that many events once to a fetch that is gone
// before the worker starts: deliveries lost on their way, as a loaded
// machine loses them when a fetch ends (nats.go ends it 1 s after the
// pull's expiry) before its message arrives. They come again after the ack
// wait, the server counting a second delivery.
var crashLostDeliveries int

// The three designs. Each handles an event with "work" (HINCRBY work <id>)
// and an ack, and crashes between the two.
type crashMode struct {
	name    string
	durable string
	handle  func(ctx context.Context, rdb *redis.Client, m jetstream.Msg, id string, crash bool) (crashed bool, err error)
}

// once is the transaction the click counter runs per batch (a Lua script:
// the idempotency key and the work commit together or not at all).
var once = redis.NewScript(`
if redis.call('SET', KEYS[1], '1', 'NX', 'EX', 86400) then
  redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
  return 1
end
return 0`)

var crashModes = []crashMode{
	{name: "ack, then work (at most once)", durable: "crash-ack-first",
		handle: func(ctx context.Context, rdb *redis.Client, m jetstream.Msg, id string, crash bool) (bool, error) {
			if err := m.DoubleAck(ctx); err != nil {
				return false, err
			}
			if crash {
				return true, nil // crashed after the ack: the work is never done
			}
			return false, rdb.HIncrBy(ctx, "ackfirst:work", id, 1).Err()
		}},
	{name: "work, then ack (at least once)", durable: "crash-work-first",
		handle: func(ctx context.Context, rdb *redis.Client, m jetstream.Msg, id string, crash bool) (bool, error) {
			if err := rdb.HIncrBy(ctx, "workfirst:work", id, 1).Err(); err != nil {
				return false, err
			}
			if crash {
				return true, nil // crashed before the ack: redelivered, done again
			}
			return false, m.DoubleAck(ctx)
		}},
	{name: "work + idempotency key in one transaction, then ack (effectively once)", durable: "crash-tx",
		handle: func(ctx context.Context, rdb *redis.Client, m jetstream.Msg, id string, crash bool) (bool, error) {
			if err := once.Run(ctx, rdb, []string{"tx:done:" + id, "tx:work"}, id).Err(); err != nil {
				return false, err
			}
			if crash {
				return true, nil // crashed before the ack: redelivered, the key says done
			}
			return false, m.DoubleAck(ctx)
		}},
}

func runCrashPoints(ctx context.Context, e *Env) error {
	js, err := e.NATS(ctx, 4)
	if err != nil {
		return err
	}
	rdb, err := e.Redis(ctx)
	if err != nil {
		return err
	}
	pjs, err := e.Connect("producer")
	if err != nil {
		return err
	}
	var ids []string
	for i := range crashEvents {
		c := newClick(fmt.Sprintf("link%d", i%6), i)
		ids = append(ids, c.ID)
		if _, err := publishClick(pjs, c); err != nil {
			return err
		}
	}
	if err := waitPublished(ctx, pjs); err != nil {
		return err
	}
	ackWait := e.Real(time.Second)
	e.say("%d events, three workers, each crashing at its first handling of every %dth event; ack wait %s (real)", crashEvents, crashEvery, ackWait)
	var wg sync.WaitGroup
	errs := make([]error, len(crashModes))
	runs := make([]crashRun, len(crashModes))
	for k, mode := range crashModes {
		cons, err := js.CreateOrUpdateConsumer(ctx, events.ClicksStream, jetstream.ConsumerConfig{
			Durable: mode.durable, AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait,
			DeliverPolicy: jetstream.DeliverAllPolicy, MaxDeliver: -1,
		})
		if err != nil {
			return fmt.Errorf("consumer %s: %w", mode.durable, err)
		}
		if crashLostDeliveries > 0 {
			if err := loseDeliveries(ctx, e, cons, crashLostDeliveries); err != nil {
				return err
			}
		}
		wg.Go(func() { runs[k], errs[k] = crashWorker(ctx, e, rdb, mode) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	prefixes := []string{"ackfirst:work", "workfirst:work", "tx:work"}
	predicted := [][2]float64{{crashEvents / crashEvery, 0}, {0, crashEvents / crashEvery}, {0, 0}}
	for k, mode := range crashModes {
		work, err := rdb.HGetAll(ctx, prefixes[k]).Result()
		if err != nil {
			return fmt.Errorf("read work: %w", err)
		}
		lost, doubled := 0, 0
		for _, id := range ids {
			switch n := work[id]; {
			case n == "":
				lost++
			case n != "1":
				doubled++
			}
		}
		e.exact(mode.name+": crashes", "crashes", crashEvents/crashEvery, float64(runs[k].crashes), "one per 6 events")
		e.exact(mode.name+": lost", "events", predicted[k][0], float64(lost), "each crash after the ack and before the work loses one")
		e.exact(mode.name+": done twice", "events", predicted[k][1], float64(doubled), "each crash after the work and before the ack repeats one")
	}
	for k, mode := range crashModes {
		if n := runs[k].missed; n > 0 {
			e.note("%s: %d events first reached the worker at a second delivery or later (a delivery lost on its way, as a fetch that ended before its message arrived on a busy machine loses it); the worker crashes at its first handling of an event, whichever delivery that is", mode.name, n)
		}
	}
	return nil
}

// crashRun is what one design's worker did: its crashes, and how many
// events first reached it at a second delivery or later.
type crashRun struct {
	crashes, missed int
}

// crashWorker consumes mode's consumer until every event is acked, crashing
// as told: a crash drops the connection; a new incarnation takes over.
//
// The crash point is the worker's first handling of every 6th event, as
// the lesson's script keeps it (across incarnations), not the server's
// delivery count: a delivery can be lost on its way (a fetch that ended
// before its message arrived, on a loaded machine), and the event then
// first reaches the worker at its second delivery. Crashing only where
// the server counted one delivery would skip that event's crash, and the
// run would measure 9 crashes of the 10 the lesson stages.
func crashWorker(ctx context.Context, e *Env, rdb *redis.Client, mode crashMode) (crashRun, error) {
	var run crashRun
	handled := map[string]bool{} // events the worker has had in hand
	for incarnation := 0; ; incarnation++ {
		nc, err := e.Conn(fmt.Sprintf("%s-%d", mode.durable, incarnation))
		if err != nil {
			return run, err
		}
		js, err := jetstream.New(nc)
		if err != nil {
			return run, err
		}
		cons, err := js.Consumer(ctx, events.ClicksStream, mode.durable)
		if err != nil {
			nc.Close()
			return run, fmt.Errorf("consumer %s: %w", mode.durable, err)
		}
		crashed := false
		for !crashed {
			if ctx.Err() != nil {
				nc.Close()
				return run, ctx.Err()
			}
			finished, err := crashAllAcked(ctx, cons, 30*time.Second)
			if err != nil {
				nc.Close()
				return run, err
			}
			if finished {
				nc.Close()
				return run, nil
			}
			b, err := cons.Fetch(1, jetstream.FetchMaxWait(200*time.Millisecond))
			if err != nil {
				continue
			}
			for m := range b.Messages() {
				md, err := m.Metadata()
				if err != nil {
					continue
				}
				var c events.Click
				if err := json.Unmarshal(m.Data(), &c); err != nil {
					continue
				}
				first := !handled[c.ID]
				handled[c.ID] = true
				if first && md.NumDelivered > 1 {
					run.missed++
				}
				crash := indexOf(c)%crashEvery == crashEvery-1 && first
				if crashed, err = mode.handle(ctx, rdb, m, c.ID, crash); err != nil {
					nc.Close()
					return run, err
				}
				if crashed {
					run.crashes++
					break
				}
			}
		}
		nc.Close() // the crash: the connection goes, unacked work comes back after the ack wait
	}
}

// crashAllAcked reports whether cons has nothing left to deliver and
// nothing delivered unacknowledged: the worker is done. A read that fails
// (on a loaded machine a request can time out) is made again until one is
// read, and only one that keeps failing for timeout ends the lesson, with
// the read's error.
func crashAllAcked(ctx context.Context, cons jetstream.Consumer, timeout time.Duration) (bool, error) {
	var info *jetstream.ConsumerInfo
	err := waitFor(ctx, timeout, "the state of consumer "+cons.CachedInfo().Name, func() (bool, error) {
		var err error
		info, err = cons.Info(ctx)
		return err == nil, err
	})
	if err != nil {
		return false, err
	}
	return info.NumPending == 0 && info.NumAckPending == 0, nil
}

// loseDeliveries has cons deliver its next n events to a fetch on a
// connection that then closes without acking them (crashLostDeliveries):
// the server counts each delivered once, and delivers it again after the
// ack wait.
func loseDeliveries(ctx context.Context, e *Env, cons jetstream.Consumer, n int) error {
	name := cons.CachedInfo().Name
	nc, err := e.Conn(name + "-lost")
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	c, err := js.Consumer(ctx, events.ClicksStream, name)
	if err != nil {
		return fmt.Errorf("consumer %s: %w", name, err)
	}
	got := 0
	err = waitFor(ctx, 30*time.Second, fmt.Sprintf("%d deliveries of consumer %s", n, name), func() (bool, error) {
		b, err := c.Fetch(n-got, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return false, err
		}
		for range b.Messages() {
			got++
		}
		if got == n {
			return true, nil
		}
		return false, b.Error()
	})
	return err
}
