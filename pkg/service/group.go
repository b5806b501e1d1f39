package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/natsconn"
	"github.com/snipdev/snip/pkg/redisconn"
	"github.com/snipdev/snip/pkg/webserver"
)

// Stage is when a running component is told to stop.
type Stage int

const (
	// Intake is what takes work in: HTTP servers that take requests,
	// consumers. Told to stop first, as soon as the service stops.
	Intake Stage = iota
	// Work is what finishes work the intake took, and what serves the
	// stop itself: background loops, senders, an operational HTTP server
	// that should show the drain. Told to stop once every intake
	// component has returned.
	Work
)

func (s Stage) String() string {
	if s == Intake {
		return "intake"
	}
	return "work"
}

// Group is a service's named components and the clients they use, stopped
// in stages. Run makes one and hands it to the service's setup.
type Group struct {
	log  *slog.Logger
	base Base

	components [2][]component
	steps      [2][]step
	conns      []*nats.Conn
	closers    []step

	// front is the listener Run bound at HTTPAddr before setup, serving
	// webserver.Starting until the first HTTP component takes it over
	// (frontTaken). webs are the servers HTTP serves; stopOnce marks them
	// stopping when the stop begins, at stopBegan.
	mu         sync.Mutex
	front      *webserver.Listener
	frontTaken bool
	startup    *startup
	webs       []*webserver.Server
	stopOnce   sync.Once
	stopBegan  time.Time
}

type component struct {
	name string
	run  func(ctx context.Context) error
}

type step struct {
	name string
	f    func() error
}

// Go adds a component that Run starts once setup has returned, and stops
// (by ending its context) in its stage. It should return nil once its
// context has ended and it has finished what it holds, each wait bounded
// (by ShutdownTimeout, where it takes one). An error stops the service: the
// first failure tells every component to stop, in the stages.
func (g *Group) Go(stage Stage, name string, run func(ctx context.Context) error) {
	g.components[stage] = append(g.components[stage], component{name, run})
}

// OnStop adds a step that runs, in the order added, when the stage begins,
// before the stage's components are told to stop: at Intake, as the stop
// begins (end what would hold the HTTP server's shutdown, such as event
// streams); at Work, once the intake has stopped (write out what the intake
// left in buffers, wait a bounded while for a relay to empty an outbox).
func (g *Group) OnStop(stage Stage, name string, f func()) {
	g.steps[stage] = append(g.steps[stage], step{name, func() error { f(); return nil }})
}

// Close adds a client to close in the last stage, after NATS: the stores.
// They close in the reverse order of adding, as deferred calls would.
func (g *Group) Close(name string, f func() error) {
	g.closers = append(g.closers, step{name, f})
}

// Drain adds a NATS connection to drain in the third stage, within
// ShutdownTimeout: subscriptions finish what they hold, publishes and acks
// go out. A connection that is down is closed at once (nothing would drain).
func (g *Group) Drain(nc *nats.Conn) { g.conns = append(g.conns, nc) }

// NATS connects as cfg says, in a connection named name (natsconn.Connect:
// it connects in the background when the server is not up yet), calls
// cfg.Connected, and drains the connection in the third stage.
//
// A connection closed before the service stops fails the service (an
// Intake component, "nats <name>", returns an error naming why): nats.go
// reconnects forever, but closes a connection for good on some errors from
// the server (a control line over its limit, an error it does not know),
// and a service left with it would run on, never ready, until restarted.
// Failing lets the orchestrator restart it.
func (g *Group) NATS(cfg NATS, name string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := natsconn.Connect(cfg.Conn(name), g.log, append(slices.Clone(cfg.Options), opts...)...)
	if err != nil {
		return nil, nil, err
	}
	g.Drain(nc)
	if g.startup != nil {
		g.startup.opened("nats "+name, nc)
	}
	closed := nc.StatusChanged(nats.CLOSED)
	g.Go(Intake, "nats "+name, func(ctx context.Context) error {
		defer nc.RemoveStatusListener(closed)
		if !nc.IsClosed() { // closed before the listener was there: no event
			select {
			case <-ctx.Done():
				return nil
			case <-closed:
			}
		}
		if ctx.Err() != nil { // closed by the stop
			return nil
		}
		if err := nc.LastError(); err != nil {
			return fmt.Errorf("connection closed for good, it will not reconnect: %w", err)
		}
		return errors.New("connection closed for good, it will not reconnect")
	})
	if cfg.Connected != nil {
		cfg.Connected(nc)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	return nc, js, nil
}

// Redis opens a client as cfg says (redisconn.Open: it does not connect)
// and closes it in the last stage. Once Redis answers, a component checks
// that it never evicts keys (checkEviction).
func (g *Group) Redis(cfg Redis) (redis.UniversalClient, error) {
	rdb, err := redisconn.Open(cfg.URL)
	if err != nil {
		return nil, err
	}
	g.Close("redis", rdb.Close)
	g.Go(Intake, "redis eviction check", func(ctx context.Context) error {
		checkEviction(ctx, g.log, rdb, 30*time.Second)
		return nil
	})
	return rdb, nil
}

// checkEviction reads every Redis server's maxmemory-policy, retrying
// every few seconds (up to every) until one read succeeds or ctx ends, and
// logs an error for each server that may evict keys (redisconn.NoEviction
// says what that breaks). A Redis that refuses CONFIG GET (managed
// services often do) is logged once as unchecked.
func checkEviction(ctx context.Context, log *slog.Logger, rdb redis.UniversalClient, every time.Duration) {
	for wait := 500 * time.Millisecond; ; wait = min(2*wait, every) {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		evicting, err := redisconn.EvictingServers(cctx, rdb)
		cancel()
		var rerr redis.Error
		switch {
		case err == nil:
			for addr, policy := range evicting {
				log.Error("redis may evict keys: set maxmemory-policy to noeviction, or outbox entries, records of event IDs and leases can vanish when it is full (clicks lost or counted twice)",
					"server", addr, "maxmemory_policy", policy)
			}
			if len(evicting) == 0 {
				log.Info("redis evicts no keys", "maxmemory_policy", redisconn.NoEviction)
			}
			return
		case errors.As(err, &rerr):
			log.Warn("redis maxmemory-policy not checked (CONFIG GET refused): it must be noeviction", "err", err)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// HTTP is the component that serves web at HTTPAddr, calls Ready once it
// does, and when told to stop, stops taking connections and lets requests
// in flight finish within ShutdownTimeout. The first HTTP of a service
// serves on the listener Run bound before setup (the same listener and
// connections, whose handler changes from the starting one to web's: no
// connection is refused in between); another binds HTTPAddr itself. From
// the moment the stop begins (whatever the component's stage), web's
// /readyz answers 503 (webserver.Server.Stopping), and the listener stays
// open until ShutdownReadyDelay has passed since then: a load balancer
// probing /readyz stops sending new connections before they would be
// refused.
func (g *Group) HTTP(web *webserver.Server) func(ctx context.Context) error {
	g.mu.Lock()
	g.webs = append(g.webs, web)
	var front *webserver.Listener
	if !g.frontTaken {
		front, g.frontTaken = g.front, true
	}
	g.mu.Unlock()
	return func(ctx context.Context) error {
		serveCtx, stopServing := context.WithCancel(context.WithoutCancel(ctx))
		defer stopServing()
		go func() {
			select {
			case <-serveCtx.Done(): // Serve returned: it failed
				return
			case <-ctx.Done():
			}
			if d := time.Until(g.beginStop().Add(g.base.ShutdownReadyDelay)); d > 0 {
				t := time.NewTimer(d)
				defer t.Stop()
				select {
				case <-serveCtx.Done():
				case <-t.C:
				}
			}
			stopServing()
		}()
		if front != nil {
			return front.Serve(serveCtx, web, g.base.Ready, g.base.ShutdownTimeout)
		}
		return web.Serve(serveCtx, g.base.HTTPAddr, g.base.Ready, g.base.ShutdownTimeout)
	}
}

// beginStop marks every server HTTP serves as stopping, the first time it
// is called, and returns when that was.
func (g *Group) beginStop() time.Time {
	g.stopOnce.Do(func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		g.stopBegan = time.Now()
		for _, w := range g.webs {
			w.Stopping()
		}
	})
	return g.stopBegan
}

// NATSReady is a readiness check: the connection is up. When it is not, it
// says its status and why its last attempt to connect failed
// (natsconn.ConnectError), as in "nats RECONNECTING: dial tcp
// 127.0.0.1:4222: connect: connection refused", or, once the connection
// is closed for good, the client's last error: a service's own retries
// see only their requests time out.
func NATSReady(nc *nats.Conn) webserver.Check {
	return func(context.Context) error {
		if st := nc.Status(); st != nats.CONNECTED {
			err := natsconn.ConnectError(nc)
			if err == nil {
				err = nc.LastError()
			}
			if err != nil {
				return fmt.Errorf("nats %s: %w", st, err)
			}
			return fmt.Errorf("nats %s", st)
		}
		return nil
	}
}

// RedisReady is a readiness check: Redis answers PING.
func RedisReady(rdb redis.UniversalClient) webserver.Check {
	return func(ctx context.Context) error { return redisconn.Ping(ctx, rdb) }
}

// Run is a service's life. It logs cfg (LogValue: secrets masked), binds
// HTTPAddr (if set; then calls Listening), calls setup to open clients and
// add components, starts the components, and runs them until ctx ends or
// one of them fails.
//
// While setup runs (it may wait minutes for NATS, Redis or the topology)
// the listener answers already (webserver.Starting): /healthz 200, so that
// a liveness probe does not restart a process that only waits; /readyz
// 503 with what it waits for (the Retry that setup is in, its last
// failure, the NATS connections that are down); /metrics, the process's; every other route 503 "starting". The
// first HTTP component then serves the service's routes on the same
// listener. A service that adds none closes it once setup returns.
//
// Then it stops in four stages, each bounded:
//
//  1. stop intake: every HTTP server's /readyz answers 503, the
//     OnStop(Intake) steps run, then the Intake components are told to stop
//     (the HTTP server takes connections for ShutdownReadyDelay more, then
//     finishes requests in flight; consumers finish and ack the batch in
//     hand), and Run waits for them;
//  2. finish in-flight work: the OnStop(Work) steps, then the Work
//     components are told to stop, and Run waits for them;
//  3. drain NATS: every connection, each within ShutdownTimeout;
//  4. close stores: what Close added, last added first.
//
// What setup added is stopped in the same stages when setup fails (the
// listener closes at once: it was never ready). Run
// returns setup's error, or every component's error joined, each prefixed
// with the component's name; nil after a clean stop. An error that wraps
// the context's own once that context has ended (a Retry or a wait cut
// short by the stop) is a clean stop, not a failure.
func Run(ctx context.Context, log *slog.Logger, name string, cfg Config, setup func(ctx context.Context, g *Group) error) error {
	g := &Group{log: log, base: cfg.base()}
	log.Info("starting "+name, "config", LogValue(cfg))
	setupCtx, err := g.listen(ctx)
	if err != nil {
		return err
	}
	if err := setup(setupCtx, g); err != nil {
		g.closeFront(true)
		g.stop(nil, nil)
		if stoppedBy(ctx, err) {
			return nil
		}
		return err
	}
	g.closeFront(false)

	intakeCtx, stopIntake := context.WithCancel(ctx)
	defer stopIntake()
	// Work outlives ctx: it is told to stop only once the intake has.
	workCtx, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWork()
	var mu sync.Mutex
	var errs []error
	var wgs [2]sync.WaitGroup
	for stage, ctx := range [2]context.Context{intakeCtx, workCtx} {
		for _, c := range g.components[stage] {
			wgs[stage].Go(func() {
				if err := c.run(ctx); err != nil && !stoppedBy(ctx, err) {
					mu.Lock()
					errs = append(errs, fmt.Errorf("%s: %w", c.name, err))
					mu.Unlock()
					stopIntake() // the first failure stops the service
				}
			})
		}
	}
	<-intakeCtx.Done()
	g.beginStop()
	log.Info("stopping " + name)
	g.stop([]func(){stopIntake, stopWork}, wgs[:])
	log.Info(name + " stopped")
	return errors.Join(errs...)
}

// stop runs the four stages: stops[i] tells stage i's components to stop,
// and wgs[i] waits for them (both nil when setup failed: nothing runs).
func (g *Group) stop(stops []func(), wgs []sync.WaitGroup) {
	for stage := range g.steps {
		for _, s := range g.steps[stage] {
			g.run(s)
		}
		if stops != nil {
			stops[stage]()
			wgs[stage].Wait()
		}
	}
	for _, nc := range g.conns {
		if !nc.IsConnected() { // nothing to drain from a connection that is down
			nc.Close()
			continue
		}
		natsconn.DrainWithin(nc, g.base.ShutdownTimeout, g.log)
	}
	for _, s := range slices.Backward(g.closers) {
		g.run(s)
	}
}

func (g *Group) run(s step) {
	start := time.Now()
	if err := s.f(); err != nil {
		g.log.Warn("stop: "+s.name, "err", err, "took", time.Since(start).Round(time.Millisecond))
	}
}

// stoppedBy reports whether err is ctx's own error after ctx ended.
func stoppedBy(ctx context.Context, err error) bool {
	return ctx.Err() != nil && errors.Is(err, ctx.Err())
}
