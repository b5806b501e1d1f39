package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/loadtest/internal/workload"
	"github.com/snipdev/snip/pkg/natsconn"
	"github.com/snipdev/snip/pkg/topology"
)

// cmdCeiling measures what the NATS server and the machine can carry with
// nothing of Snip's in the way: a bare publisher (JetStream publish with a
// Nats-Msg-Id, an async window, as the relay publishes) and three bare
// consumers, one per reader group, that fetch and ack and do nothing else,
// all against the same server, on a stream of the run's own (deleted at the
// end). The rate at which the three have received everything published is
// the ceiling the readers' rates are compared with.
func cmdCeiling(ctx context.Context, env *Env, args []string) error {
	fs := flag.NewFlagSet("ceiling", flag.ContinueOnError)
	var cfg ceilingConfig
	fs.DurationVar(&cfg.Duration, "duration", 20*time.Second, "how long to publish, as fast as the window allows")
	fs.IntVar(&cfg.Window, "window", 4096, "most publishes awaiting an ack at once")
	fs.IntVar(&cfg.Size, "size", 450, "payload bytes (a click event is about 450)")
	fs.IntVar(&cfg.Batch, "batch", 500, "messages per consumer fetch")
	deadline := fs.Duration("deadline", 2*time.Minute, "longest wait, after publishing, for the consumers to receive everything")
	if err := parse(fs, args, env.Stderr); err != nil {
		return err
	}
	if cfg.Duration <= 0 || cfg.Window < 1 || cfg.Size < 1 || cfg.Batch < 1 {
		return fmt.Errorf("--duration, --window, --size and --batch must be positive: %w", errUsage)
	}
	nc, err := natsconn.Connect(env.Cfg.nats("loadtest-ceiling"), env.Log)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(cfg.Window))
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	cfg.Tag = workload.NewTag().String()
	res, err := runCeiling(ctx, js, cfg, *deadline)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "loadtest ceiling against %s, %s of publishing, window %d, %d-byte events, fetches of %d\n",
		env.Cfg.NATSURL, cfg.Duration, cfg.Window, cfg.Size, cfg.Batch)
	fmt.Fprintf(env.Stdout, "published %d in %s (%.0f/s)\n", res.Published, res.PublishTime.Round(time.Millisecond), rate(res.Published, res.PublishTime))
	for _, c := range res.Consumers {
		fmt.Fprintf(env.Stdout, "consumer %s: received %d of %d, the last at %s\n", c.Group, c.Received, res.Published, c.Done.Round(time.Millisecond))
	}
	fmt.Fprintf(env.Stdout, "ceiling: %.0f events/s\n", res.Ceiling())
	if !res.Complete() {
		return errors.New("a consumer did not receive everything published within --deadline")
	}
	return nil
}

// ceilingConfig is one ceiling run.
type ceilingConfig struct {
	Duration time.Duration
	Window   int
	Size     int
	Batch    int
	// Tag names the run's stream and message IDs.
	Tag string
}

// ceilingResult is what a ceiling run measured.
type ceilingResult struct {
	Published   uint64
	PublishTime time.Duration
	Consumers   []ceilingConsumer
}

// ceilingConsumer is one bare consumer's outcome: what it received (acked,
// the ack confirmed by the server; distinct events, a redelivery counted
// once), and when the last of it came, from the start of the run.
type ceilingConsumer struct {
	Group    string
	Received uint64
	Done     time.Duration
}

// Complete reports whether every consumer received everything published.
func (r ceilingResult) Complete() bool {
	for _, c := range r.Consumers {
		if c.Received != r.Published {
			return false
		}
	}
	return r.Published > 0
}

// Ceiling is the rate at which events went in and all three consumers had
// them out: published over the time until the slowest consumer had all.
func (r ceilingResult) Ceiling() float64 {
	var last time.Duration
	for _, c := range r.Consumers {
		last = max(last, c.Done)
	}
	return rate(r.Published, last)
}

func rate(n uint64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

// ceilingGroups are the reader groups that read CLICKS.
var ceilingGroups = []string{topology.GroupClickCounter, topology.GroupFraudDetection, topology.GroupWarehouseLoader}

// runCeiling creates the run's stream and consumers, publishes for
// cfg.Duration while the consumers drain, waits for them (at most deadline
// after publishing ends), and deletes the stream.
func runCeiling(ctx context.Context, js jetstream.JetStream, cfg ceilingConfig, deadline time.Duration) (ceilingResult, error) {
	name := "LOADTEST_CEILING_" + strings.ToUpper(cfg.Tag)
	subject := "loadtest.ceiling." + cfg.Tag
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: name, Subjects: []string{subject + ".>"}, Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute,
	}); err != nil {
		return ceilingResult{}, fmt.Errorf("create stream %s: %w", name, err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = js.DeleteStream(dctx, name)
	}()

	var published atomic.Uint64
	pubDone := make(chan struct{})
	start := time.Now()
	cctx, stopConsumers := context.WithCancel(ctx)
	defer stopConsumers()
	res := ceilingResult{Consumers: make([]ceilingConsumer, len(ceilingGroups))}
	var wg sync.WaitGroup
	errs := make([]error, len(ceilingGroups))
	for i, g := range ceilingGroups {
		cons, err := js.CreateOrUpdateConsumer(ctx, name, jetstream.ConsumerConfig{
			Durable: g, AckPolicy: jetstream.AckAllPolicy, AckWait: time.Minute,
			MaxAckPending: 4 * cfg.Batch, DeliverPolicy: jetstream.DeliverAllPolicy,
		})
		if err != nil {
			return ceilingResult{}, fmt.Errorf("create consumer %s: %w", g, err)
		}
		res.Consumers[i].Group = g
		wg.Go(func() {
			errs[i] = drainCeiling(cctx, cons, cfg.Batch, &published, pubDone, start, &res.Consumers[i])
		})
	}

	payload := []byte(strings.Repeat("x", cfg.Size))
	var pubErr error
	var n uint64
	for time.Since(start) < cfg.Duration && ctx.Err() == nil {
		n++
		id := cfg.Tag + "-" + strconv.FormatUint(n, 10)
		if _, err := js.PublishAsync(subject+"."+strconv.FormatUint(n%8, 10), payload, jetstream.WithMsgID(id),
			jetstream.WithStallWait(time.Minute)); err != nil {
			pubErr = fmt.Errorf("publish: %w", err)
			break
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		pubErr = errors.Join(pubErr, errors.New("publishes not acknowledged within a minute"))
	case <-ctx.Done():
		pubErr = errors.Join(pubErr, ctx.Err())
	}
	res.PublishTime = time.Since(start)
	// What the stream holds is what was published: a publish that failed
	// (none should) is not waited for.
	info, err := js.Stream(ctx, name)
	if err != nil {
		pubErr = errors.Join(pubErr, fmt.Errorf("stream info: %w", err))
	} else if i, err := info.Info(ctx); err != nil {
		pubErr = errors.Join(pubErr, fmt.Errorf("stream info: %w", err))
	} else {
		published.Store(i.State.Msgs)
	}
	res.Published = published.Load()
	close(pubDone)
	if pubErr != nil {
		stopConsumers()
		wg.Wait()
		return res, pubErr
	}

	waitDone := make(chan struct{})
	go func() { wg.Wait(); close(waitDone) }()
	select {
	case <-waitDone:
	case <-time.After(deadline):
		stopConsumers()
		<-waitDone
	}
	return res, errors.Join(errs...)
}

// drainCeiling fetches and acks (the last message of each fetch, AckAll,
// confirmed by the server) until it has received everything published, or
// ctx ends. It counts distinct stream sequences: a message delivered again
// (its ack wait passed before the ack came) is not more received, and
// counted twice it made a consumer that had everything "receive" more than
// was published, which the run reported as not receiving everything.
func drainCeiling(ctx context.Context, cons jetstream.Consumer, batch int, published *atomic.Uint64, pubDone <-chan struct{}, start time.Time, out *ceilingConsumer) error {
	var seen seqSet
	seqs := make([]uint64, 0, batch)
	for ctx.Err() == nil {
		select {
		case <-pubDone:
			if out.Received >= published.Load() {
				return nil
			}
		default:
		}
		mb, err := cons.Fetch(batch, jetstream.FetchMaxWait(200*time.Millisecond))
		if err != nil {
			continue
		}
		var last jetstream.Msg
		seqs = seqs[:0]
		for m := range mb.Messages() {
			last = m
			if md, err := m.Metadata(); err == nil {
				seqs = append(seqs, md.Sequence.Stream)
			}
		}
		if last == nil {
			continue
		}
		if err := last.DoubleAck(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("consumer %s: ack: %w", out.Group, err)
		}
		k := 0
		for _, seq := range seqs {
			if seen.add(seq) {
				k++
			}
		}
		if k > 0 {
			out.Received += uint64(k)
			out.Done = time.Since(start)
		}
	}
	return nil
}

// seqSet is a set of stream sequences, a bit each (a run's stream starts
// at 1: a million events are 125 KB).
type seqSet []uint64

// add adds seq and reports whether it was not in the set.
func (s *seqSet) add(seq uint64) bool {
	i, bit := seq/64, uint64(1)<<(seq%64)
	if n := uint64(len(*s)); i >= n {
		*s = append(*s, make([]uint64, i-n+1)...)
	}
	if (*s)[i]&bit != 0 {
		return false
	}
	(*s)[i] |= bit
	return true
}
