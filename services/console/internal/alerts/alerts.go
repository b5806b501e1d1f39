// Package alerts keeps the recent fraud alerts for the console: it reads
// fraud.alerts.* on the FRAUD stream from a while back (Since) at start, then
// follows new ones, and keeps the newest Keep in memory.
//
// FRAUD drops a repeated alert by its deterministic ID (rule, link, key,
// period), so each alert is read once; after a reconnect the follower goes
// on from the last sequence it read, unless FRAUD no longer reaches it
// (deleted and created again): then it reads from Since back again.
package alerts

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/services/console/internal/ordered"
)

// Alert is one fraud alert with where FRAUD stored it.
type Alert struct {
	events.FraudAlert
	// Seq is its FRAUD stream sequence.
	Seq uint64 `json:"seq"`
}

// Config tunes the follower.
type Config struct {
	// Keep is how many alerts are kept (default 100).
	Keep int
	// Since is how far back the first read starts (default 24h).
	Since time.Duration
	// Logger receives the follower's logs (default: discard).
	Logger *slog.Logger
}

// Follower follows the FRAUD stream's alerts.
type Follower struct {
	js  jetstream.JetStream
	cfg Config

	mu        sync.Mutex
	alerts    []Alert // oldest first, at most Keep
	seen      uint64
	lastSeq   uint64
	following bool
	lastErr   string
}

// New returns a follower; Run makes it follow.
func New(js jetstream.JetStream, cfg Config) *Follower {
	if cfg.Keep <= 0 {
		cfg.Keep = 100
	}
	if cfg.Since <= 0 {
		cfg.Since = 24 * time.Hour
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Follower{js: js, cfg: cfg}
}

// Snapshot is the alerts panel.
type Snapshot struct {
	// Alerts are the newest first.
	Alerts []Alert `json:"alerts"`
	// Seen counts the alerts read since the console started (within Since
	// at first).
	Seen      uint64 `json:"seen"`
	Following bool   `json:"following"`
	// Error is why the follower is not following, if it is not.
	Error string `json:"error,omitempty"`
}

// Snapshot returns the recent alerts, newest first.
func (f *Follower) Snapshot() Snapshot {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]Alert, len(f.alerts))
	for i, a := range f.alerts {
		out[len(out)-1-i] = a
	}
	return Snapshot{Alerts: out, Seen: f.seen, Following: f.following, Error: f.lastErr}
}

// Run follows the alerts until ctx ends; failures are retried. It returns nil.
func (f *Follower) Run(ctx context.Context) error {
	wait := time.Second
	for {
		err := f.follow(ctx)
		if ctx.Err() != nil {
			return nil
		}
		f.mu.Lock()
		f.following, f.lastErr = false, err.Error()
		f.mu.Unlock()
		f.cfg.Logger.Warn("fraud alerts: following FRAUD failed; retrying", "err", err, "in", wait)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		wait = min(2*wait, 30*time.Second)
	}
}

func (f *Follower) follow(ctx context.Context) error {
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{events.FraudAlertSubjects}}
	s, err := f.js.Stream(ctx, events.FraudStream)
	if err != nil {
		return fmt.Errorf("follow fraud alerts: %w", err)
	}
	f.mu.Lock()
	last := f.lastSeq
	f.mu.Unlock()
	if last > 0 && f.createdAgain(ctx, s, last) {
		// Resuming after last would wait for the new stream's sequences
		// to pass it.
		last = 0
		f.mu.Lock()
		f.lastSeq = 0
		f.mu.Unlock()
	}
	if last > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, last+1
	} else {
		t := time.Now().Add(-f.cfg.Since)
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &t
	}
	it, err := ordered.Open(ctx, f.js, events.FraudStream, cfg, 100)
	if err != nil {
		return fmt.Errorf("follow fraud alerts: %w", err)
	}
	defer it.Close()
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	f.mu.Lock()
	f.following, f.lastErr = true, ""
	f.mu.Unlock()
	// The watcher checks, after a while without an alert, that FRAUD
	// still reaches the last one read; the ordered consumer, which nats.go
	// resumes after it, would wait silently on a FRAUD created again.
	var recreated atomic.Bool
	watchDone := make(chan struct{})
	defer close(watchDone)
	go func() {
		t := time.NewTicker(recreateCheck)
		defer t.Stop()
		f.mu.Lock()
		prev := f.lastSeq
		f.mu.Unlock()
		for {
			select {
			case <-watchDone:
				return
			case <-t.C:
			}
			f.mu.Lock()
			seq := f.lastSeq
			f.mu.Unlock()
			if seq == prev && seq > 0 && f.createdAgain(ctx, s, seq) {
				recreated.Store(true)
				it.Stop()
				return
			}
			prev = seq
		}
	}()
	for {
		msg, err := it.Next()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if recreated.Load() {
				return fmt.Errorf("follow fraud alerts: %s was created again; reading it from %s back", events.FraudStream, f.cfg.Since)
			}
			return fmt.Errorf("follow fraud alerts: %w", err)
		}
		md, err := msg.Metadata()
		if err != nil {
			continue
		}
		a, err := events.DecodeFraudAlert(msg.Data())
		f.mu.Lock()
		f.lastSeq = md.Sequence.Stream
		if err == nil {
			f.seen++
			if len(f.alerts) == f.cfg.Keep {
				copy(f.alerts, f.alerts[1:])
				f.alerts = f.alerts[:len(f.alerts)-1]
			}
			f.alerts = append(f.alerts, Alert{FraudAlert: a, Seq: md.Sequence.Stream})
		}
		f.mu.Unlock()
	}
}

// recreateCheck is how long the follower may read no alert before it
// checks that FRAUD still reaches the last one it read.
const recreateCheck = 10 * time.Second

// createdAgain reports whether FRAUD's last sequence is below last, the
// last alert read: FRAUD was deleted and created again since (a restore
// keeps its sequences, and is followed on). A failed read is not.
func (f *Follower) createdAgain(ctx context.Context, s jetstream.Stream, last uint64) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	info, err := s.Info(ctx)
	if err != nil || info.State.LastSeq >= last {
		return false
	}
	f.cfg.Logger.Warn("fraud alerts: FRAUD was created again; reading it again from the start of the window",
		"last_read", last, "last_seq", info.State.LastSeq, "since", f.cfg.Since)
	return true
}
