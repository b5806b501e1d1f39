package scenario

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// Env is what a scenario runs in: its speed, its servers (started on first
// use, stopped when the run ends) and the result it fills in.
type Env struct {
	speed    float64
	progress io.Writer
	log      *slog.Logger
	res      *Result

	mu      sync.Mutex
	dir     string
	srv     *server.Server
	url     string
	conns   []*nats.Conn
	redis   *testenv.RedisServer
	clients []*redis.Client
}

// Real converts a lesson-time duration into the real duration at this speed.
func (e *Env) Real(lesson time.Duration) time.Duration {
	return time.Duration(float64(lesson) / e.speed)
}

// Rate converts a lesson-time rate (per second) into the real rate.
func (e *Env) Rate(perSecond float64) float64 { return perSecond * e.speed }

// Lesson converts a measured real duration into lesson seconds.
func (e *Env) Lesson(real time.Duration) float64 { return real.Seconds() * e.speed }

// LessonRate converts a measured real rate into a lesson-time rate.
func (e *Env) LessonRate(perSecond float64) float64 { return perSecond / e.speed }

func (e *Env) say(format string, a ...any) {
	if e.progress != nil {
		fmt.Fprintf(e.progress, "  · "+format+"\n", a...)
	}
}

func (e *Env) note(format string, a ...any) {
	e.res.Notes = append(e.res.Notes, fmt.Sprintf(format, a...))
}

func (e *Env) tempDir() (string, error) {
	if e.dir != "" {
		return e.dir, nil
	}
	d, err := os.MkdirTemp("", "snip-scenario-")
	if err != nil {
		return "", fmt.Errorf("temp dir: %w", err)
	}
	e.dir = d
	return d, nil
}

// NATS starts the embedded nats-server (once), applies Snip's topology with
// the given CLICKS partition count, and returns a JetStream client on a new
// connection named name.
func (e *Env) NATS(ctx context.Context, partitions int) (jetstream.JetStream, error) {
	e.mu.Lock()
	if e.srv == nil {
		dir, err := e.tempDir()
		if err != nil {
			e.mu.Unlock()
			return nil, err
		}
		port, err := testenv.FreePort()
		if err != nil {
			e.mu.Unlock()
			return nil, err
		}
		srv, err := testenv.RunNATSServer(testenv.NATSOptions(port, filepath.Join(dir, "jetstream")))
		if err != nil {
			e.mu.Unlock()
			return nil, err
		}
		e.srv, e.url = srv, srv.ClientURL()
		e.mu.Unlock()
		js, err := e.Connect("topology")
		if err != nil {
			return nil, err
		}
		o := topology.Defaults()
		o.Partitions = partitions
		// Memory storage: the lessons are about flow, not disks, and the
		// machine is shared; every other setting is production's.
		o.Storage = jetstream.MemoryStorage
		if err := topology.Apply(ctx, js, o); err != nil {
			return nil, err
		}
		return js, nil
	}
	e.mu.Unlock()
	return e.Connect("scenario")
}

// Connect opens another connection to the scenario's NATS server, as a
// separate process would.
func (e *Env) Connect(name string) (jetstream.JetStream, error) {
	nc, err := e.Conn(name)
	if err != nil {
		return nil, err
	}
	return jetstream.New(nc)
}

// Conn opens another core NATS connection.
func (e *Env) Conn(name string) (*nats.Conn, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.srv == nil {
		return nil, fmt.Errorf("connect %s: nats not started", name)
	}
	nc, err := nats.Connect(e.url, nats.Name("scenario-"+name), nats.MaxReconnects(-1))
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", name, err)
	}
	e.conns = append(e.conns, nc)
	return nc, nil
}

// Redis starts a redis-server (once) the way the tests do and returns a
// client on a fresh database.
func (e *Env) Redis(ctx context.Context) (*redis.Client, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.redis == nil {
		dir, err := e.tempDir()
		if err != nil {
			return nil, err
		}
		d := filepath.Join(dir, "redis")
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("redis dir: %w", err)
		}
		if e.redis, err = testenv.NewRedisServer(d); err != nil {
			return nil, err
		}
	}
	c := redis.NewClient(&redis.Options{Addr: e.redis.Addr, DB: len(e.clients)})
	if err := c.FlushDB(ctx).Err(); err != nil {
		c.Close()
		return nil, fmt.Errorf("redis flush: %w", err)
	}
	e.clients = append(e.clients, c)
	return c, nil
}

func (e *Env) close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, c := range e.clients {
		c.Close()
	}
	for _, nc := range e.conns {
		nc.Close()
	}
	if e.srv != nil {
		e.srv.Shutdown()
		e.srv.WaitForShutdown()
	}
	if e.redis != nil {
		e.redis.Close()
	}
	if e.dir != "" {
		os.RemoveAll(e.dir)
	}
}

// Checks. Each records a row of the table; the run passes when all are OK.

// within: |measured - predicted| <= rel x |predicted| (+ abs, for predictions
// near zero). A prediction that is not a number, or infinite ("never"), is
// within no tolerance of a measurement: rel x Inf would let any through.
func (e *Env) within(name, unit string, predicted, measured, rel, abs float64, why string) {
	ok := !math.IsInf(predicted, 0) && math.Abs(measured-predicted) <= rel*math.Abs(predicted)+abs
	tol := fmt.Sprintf("±%.0f%%", rel*100)
	switch {
	case rel == 0:
		tol = fmt.Sprintf("±%g", abs)
	case abs > 0:
		tol += fmt.Sprintf(" ±%g", abs)
	}
	e.res.Checks = append(e.res.Checks, Check{Name: name, Unit: unit, Predicted: predicted, Measured: measured, Tolerance: tol, Why: why, OK: ok})
}

// exact: measured == predicted.
func (e *Env) exact(name, unit string, predicted, measured float64, why string) {
	e.res.Checks = append(e.res.Checks, Check{Name: name, Unit: unit, Predicted: predicted, Measured: measured, Tolerance: "exact", Why: why, OK: measured == predicted})
}

// atMost: measured <= limit (the prediction is the limit).
func (e *Env) atMost(name, unit string, limit, measured float64, why string) {
	e.res.Checks = append(e.res.Checks, Check{Name: name, Unit: unit, Predicted: limit, Measured: measured, Tolerance: "≤", Why: why, OK: measured <= limit})
}

// atLeast: measured >= limit.
func (e *Env) atLeast(name, unit string, limit, measured float64, why string) {
	e.res.Checks = append(e.res.Checks, Check{Name: name, Unit: unit, Predicted: limit, Measured: measured, Tolerance: "≥", Why: why, OK: measured >= limit})
}

// premise marks the last row as a premise: it measures whether the machine
// could run the lesson (the load offered, a member at its capacity), and one
// not met makes the run inconclusive rather than failed.
func (e *Env) premise() { e.res.Checks[len(e.res.Checks)-1].Premise = true }

// needsPremise marks the last row as valid only on a machine that met every
// premise row: a rate or ratio that a starved machine distorts whatever the
// code does. It is not judged when a premise is not met.
func (e *Env) needsPremise() { e.res.Checks[len(e.res.Checks)-1].NeedsPremise = true }

// sampler records series at a fixed lesson-time step.
type sampler struct {
	e     *Env
	step  time.Duration // lesson time
	names []string
	units map[string]string
	vals  map[string][]float64
	mu    sync.Mutex
}

func (e *Env) newSampler(step time.Duration) *sampler {
	return &sampler{e: e, step: step, units: map[string]string{}, vals: map[string][]float64{}}
}

// add appends one sample of series name.
func (s *sampler) add(name, unit string, v float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.vals[name]; !ok {
		s.names = append(s.names, name)
		s.units[name] = unit
	}
	s.vals[name] = append(s.vals[name], v)
}

// start calls tick every step (real: step/speed) until ctx ends or the
// returned stop is called; stop waits for the last tick to finish, so what
// tick wrote can be read after it. stop may be called more than once.
func (s *sampler) start(ctx context.Context, tick func()) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(s.e.Real(s.step))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				tick()
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// flush moves the series into the result.
func (s *sampler) flush() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.names {
		s.e.res.Series = append(s.e.res.Series, Series{Name: n, Unit: s.units[n], Step: s.step.Seconds(), Values: s.vals[n]})
	}
}

// emit calls fn(i) for events i = 0, 1, ... at rate per real second for
// real duration d: every 5 ms it sends whatever is due by then (an open
// model: a slow fn does not lower the offered rate, it sends a burst after).
// It returns how many it sent.
func emit(ctx context.Context, rate float64, d time.Duration, fn func(i int) error) (int, error) {
	total := int(math.Round(rate * d.Seconds()))
	start := time.Now()
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	sent := 0
	for sent < total {
		due := min(total, int(time.Since(start).Seconds()*rate)+1)
		for ; sent < due; sent++ {
			if err := fn(sent); err != nil {
				return sent, err
			}
		}
		if sent >= total {
			break
		}
		select {
		case <-ctx.Done():
			return sent, ctx.Err()
		case <-t.C:
		}
	}
	return sent, nil
}

// waitFor polls cond every 10 ms until it is true, ctx ends or timeout
// (real time) passes. An error from cond is a read that failed this time
// (a KV or stream read that timed out on a loaded machine): cond is asked
// again at the next tick, and if the deadline passes the error says how
// many reads failed and with what, the last time.
func waitFor(ctx context.Context, timeout time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	var (
		lastErr       error
		reads, failed int
	)
	for {
		ok, err := cond()
		reads++
		if err != nil {
			lastErr = err
			failed++
		} else if ok {
			return nil
		}
		if time.Now().After(deadline) {
			if lastErr != nil {
				return fmt.Errorf("wait for %s: not after %s (%d of %d reads failed, the last with: %w)", what, timeout, failed, reads, lastErr)
			}
			return fmt.Errorf("wait for %s: not after %s", what, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// waitProgress polls cond every 10 ms until it reports done or ctx ends,
// and gives up only when the count cond reports (the work done so far:
// events read, say) has not grown for stall (real time). A loaded machine
// does a lesson's work slowly, not never: a wait with a fixed deadline
// guesses how slow, and fails a run that was still moving; this one fails
// only a run that stopped. An error from cond is a read that failed this
// time, as in waitFor: no progress, asked again at the next tick, and
// named if the wait gives up.
func waitProgress(ctx context.Context, stall time.Duration, what string, cond func() (done bool, n int, err error)) error {
	start := time.Now()
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	var (
		lastErr       error
		reads, failed int
		best          = -1
		moved         = start
	)
	for {
		done, n, err := cond()
		reads++
		switch {
		case err != nil:
			lastErr = err
			failed++
		case done:
			return nil
		case n > best:
			best, moved = n, time.Now()
		}
		if time.Since(moved) > stall {
			msg := fmt.Sprintf("wait for %s: no progress for %s (at %d after %s)", what, stall, max(best, 0), time.Since(start).Round(time.Millisecond))
			if lastErr != nil {
				return fmt.Errorf("%s (%d of %d reads failed, the last with: %w)", msg, failed, reads, lastErr)
			}
			return errors.New(msg)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
