package service

import (
	"context"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/snipdev/snip/pkg/webserver"
)

// listen binds HTTPAddr before setup, if the service has one, serving
// webserver.Starting there (what setup waits for, as Retry and Group.NATS
// report it; the process's metrics), calls Listening, and returns setup's
// context: ctx with the startup that Retry reports to.
func (g *Group) listen(ctx context.Context) (context.Context, error) {
	if g.base.HTTPAddr == "" {
		return ctx, nil
	}
	st := &startup{}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	front, err := webserver.Listen(g.log, g.base.HTTPAddr, webserver.Starting(g.log, reg, st.status))
	if err != nil {
		return nil, fmt.Errorf("http: %w", err)
	}
	g.front, g.startup = front, st
	if g.base.Listening != nil {
		g.base.Listening(front.Addr())
	}
	return context.WithValue(ctx, startupKey{}, st), nil
}

// closeFront closes the listener Run bound before setup unless an HTTP
// component is to serve on it (all: whether or not: setup failed, nothing
// runs). It was never ready: nothing waits for ShutdownReadyDelay.
func (g *Group) closeFront(all bool) {
	g.mu.Lock()
	front := g.front
	if front == nil || (g.frontTaken && !all) {
		front = nil
	}
	g.front = nil
	g.mu.Unlock()
	if front == nil {
		return
	}
	if err := front.Shutdown(g.base.ShutdownTimeout); err != nil {
		g.log.Warn("http (starting) stopped", "err", err)
	}
}

// startup is what a starting service waits for, as its /readyz says it
// (webserver.Starting): the Retry that setup is in, by name, that Retry's
// last failure, and the NATS connections Group.NATS opened that are not up
// yet. Run puts it in setup's context, where Retry finds it.
type startup struct {
	mu    sync.Mutex
	what  string
	err   error
	conns map[string]*nats.Conn
}

type startupKey struct{}

func (s *startup) status() webserver.Startup {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := webserver.Startup{WaitingFor: s.what, LastError: s.err, Down: map[string]string{}}
	for name, nc := range s.conns {
		if err := NATSReady(nc)(context.Background()); err != nil {
			st.Down[name] = err.Error()
		}
	}
	return st
}

// opened adds a NATS connection, named name, to what status reports while
// it is down.
func (s *startup) opened(name string, nc *nats.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conns == nil {
		s.conns = map[string]*nats.Conn{}
	}
	s.conns[name] = nc
}

// enter records that the Retry named what has begun, and returns what
// restores the wait before it (a Retry within a Retry).
func (s *startup) enter(what string) (restore func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	prevWhat, prevErr := s.what, s.err
	s.what, s.err = what, nil
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.what, s.err = prevWhat, prevErr
	}
}

// failed records the last failure of the Retry named what.
func (s *startup) failed(what string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.what == what {
		s.err = err
	}
}
