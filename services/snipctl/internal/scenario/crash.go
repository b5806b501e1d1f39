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
	crashEvery  = 6 // crash on the first delivery of every 6th event: 10 crashes
)

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
	e.say("%d events, three workers, each crashing on the first delivery of every %dth event; ack wait %s (real)", crashEvents, crashEvery, ackWait)
	var wg sync.WaitGroup
	errs := make([]error, len(crashModes))
	crashes := make([]int, len(crashModes))
	for k, mode := range crashModes {
		if _, err := js.CreateOrUpdateConsumer(ctx, events.ClicksStream, jetstream.ConsumerConfig{
			Durable: mode.durable, AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait,
			DeliverPolicy: jetstream.DeliverAllPolicy, MaxDeliver: -1,
		}); err != nil {
			return fmt.Errorf("consumer %s: %w", mode.durable, err)
		}
		wg.Go(func() { crashes[k], errs[k] = crashWorker(ctx, e, rdb, mode) })
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
		e.exact(mode.name+": crashes", "crashes", crashEvents/crashEvery, float64(crashes[k]), "one per 6 events")
		e.exact(mode.name+": lost", "events", predicted[k][0], float64(lost), "each crash after the ack and before the work loses one")
		e.exact(mode.name+": done twice", "events", predicted[k][1], float64(doubled), "each crash after the work and before the ack repeats one")
	}
	return nil
}

// crashWorker consumes mode's consumer until every event is acked, crashing
// as told: a crash drops the connection; a new incarnation takes over.
func crashWorker(ctx context.Context, e *Env, rdb *redis.Client, mode crashMode) (int, error) {
	crashes := 0
	for incarnation := 0; ; incarnation++ {
		nc, err := e.Conn(fmt.Sprintf("%s-%d", mode.durable, incarnation))
		if err != nil {
			return crashes, err
		}
		js, err := jetstream.New(nc)
		if err != nil {
			return crashes, err
		}
		cons, err := js.Consumer(ctx, events.ClicksStream, mode.durable)
		if err != nil {
			nc.Close()
			return crashes, fmt.Errorf("consumer %s: %w", mode.durable, err)
		}
		crashed := false
		for !crashed {
			if ctx.Err() != nil {
				nc.Close()
				return crashes, ctx.Err()
			}
			finished, err := crashAllAcked(ctx, cons, 30*time.Second)
			if err != nil {
				nc.Close()
				return crashes, err
			}
			if finished {
				nc.Close()
				return crashes, nil
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
				crash := indexOf(c)%crashEvery == crashEvery-1 && md.NumDelivered == 1
				if crashed, err = mode.handle(ctx, rdb, m, c.ID, crash); err != nil {
					nc.Close()
					return crashes, err
				}
				if crashed {
					crashes++
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
