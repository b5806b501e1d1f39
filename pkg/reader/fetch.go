// Fetching: the worker reads batches ahead of the handler, one at a time,
// and tells JetStream they are in progress while they wait.

package reader

import (
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/topology"
)

// fetched is one fetch's outcome.
type fetched struct {
	msgs []jetstream.Msg
	err  error
}

// fetcher reads batches ahead of the handler, one at a time.
type fetcher struct {
	out  chan fetched
	quit chan struct{}
	done chan struct{}
	// held is a batch fetched but not yet handed over when quit came; it is
	// written before done is closed and read after.
	held []jetstream.Msg
}

// startFetcher starts reading batches; errors back off inside it and are
// passed on for the caller to see.
//
// The backoff is capped at idleWait, under the pin's TTL (LeaseTTL), not
// at MaxRetryDelay: a fetcher that pulls nothing for a PinnedTTL loses its
// pin, and its next pull, carrying the old pin ID, is refused (423, the
// wrong pin ID, once an event waits) and backs off once more. Fetch
// errors that went on for a few seconds (a NATS leader election, a
// consumer's priority group changed) then stalled the partition, its owner
// unchanged, up to twice MaxRetryDelay (10s each by default) after they
// ended. No second member reads it meanwhile (one that is not assigned the
// partition does not pull it, and one that pulled it would be pinned in
// turn), but nobody does: an owner keeps pulling at least as often as an
// idle one does.
func (w *worker) startFetcher() *fetcher {
	f := &fetcher{out: make(chan fetched), quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(f.done)
		bo := w.m.cfg.newBackoff()
		bo.MaxInterval = min(bo.MaxInterval, w.m.cfg.idleWait())
		for {
			select {
			case <-f.quit:
				return
			default:
			}
			msgs, err := w.fetch()
			if err != nil {
				if !errors.Is(err, jetstream.ErrPinIDMismatch) {
					w.log.Debug("fetch", "err", err)
				}
				select {
				case f.out <- fetched{err: err}:
				case <-f.quit:
					return
				}
				select {
				case <-time.After(bo.NextBackOff()):
				case <-f.quit:
					return
				}
				continue
			}
			bo.Reset()
			if len(msgs) == 0 {
				continue
			}
			if !f.handOver(w, msgs) {
				return
			}
		}
	}()
	return f
}

// handOver waits for the worker to take msgs. While it waits (the handler
// may be retrying the batch before them for a long time) it tells JetStream
// these are in progress, or they would be redelivered behind later ones.
func (f *fetcher) handOver(w *worker, msgs []jetstream.Msg) bool {
	t := time.NewTicker(w.m.cfg.AckWait / 3)
	defer t.Stop()
	for {
		select {
		case f.out <- fetched{msgs: msgs}:
			return true
		case <-f.quit:
			f.held = msgs // for stop to hand over
			return false
		case <-t.C:
			for _, msg := range msgs {
				_ = msg.InProgress()
			}
		}
	}
}

// stop ends the fetcher, waiting for a fetch in progress, and returns the
// batch it was holding, if any.
func (f *fetcher) stop() (fetched, bool) {
	select {
	case <-f.quit:
	default:
		close(f.quit)
	}
	<-f.done
	if len(f.held) == 0 {
		return fetched{}, false
	}
	return fetched{msgs: f.held}, true
}

// fetch returns the next batch: when the partition was idle it first waits
// (up to idleWait) for one event, then gives the rest of the batch Linger to
// arrive; when busy it asks for a full batch at once. A fetch that brings
// nothing leaves the partition idle, so one that falls quiet after a burst
// pulls once per idleWait, not once per Linger.
func (w *worker) fetch() ([]jetstream.Msg, error) {
	cfg := w.m.cfg
	group := jetstream.FetchPriorityGroup(topology.PriorityGroup)
	var msgs []jetstream.Msg
	want, wait := cfg.BatchSize, cfg.Linger
	if w.idle {
		// Messages that arrived are kept even if the fetch then failed:
		// dropping them would leave them in flight until AckWait.
		first, err := collect(w.cons.Fetch(1, jetstream.FetchMaxWait(cfg.idleWait()), group))
		if len(first) == 0 {
			return nil, err
		}
		msgs = first
		want--
	}
	if want > 0 {
		more, err := collect(w.cons.Fetch(want, jetstream.FetchMaxWait(wait), group))
		if len(msgs)+len(more) == 0 {
			w.idle = true
			return nil, err
		}
		msgs = append(msgs, more...)
	}
	w.idle = len(msgs) < cfg.BatchSize/2
	if drop, ok := dropForTest.Load(cfg.Group); ok {
		kept := msgs[:0]
		for _, msg := range msgs {
			if md, err := msg.Metadata(); err == nil && drop.(func(uint64) bool)(md.Sequence.Stream) {
				continue
			}
			kept = append(kept, msg)
		}
		msgs = kept
	}
	return msgs, nil
}

// collect drains a fetch; it returns what arrived and the fetch's error.
func collect(b jetstream.MessageBatch, err error) ([]jetstream.Msg, error) {
	if err != nil {
		return nil, err
	}
	var out []jetstream.Msg
	for m := range b.Messages() {
		out = append(out, m)
	}
	return out, b.Error()
}

// dropForTest holds, by group, a func(streamSeq uint64) bool set by a test
// (export_test.go): fetch loses the deliveries it returns true for, as a
// client that gave up on a fetch too early would. One per group, so tests
// of different groups run in parallel.
var dropForTest sync.Map
