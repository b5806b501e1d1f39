// Package webserver is the HTTP shell every Snip service shares: an echo
// instance with panic recovery and request IDs, the operational endpoints
// (/healthz, /readyz, /metrics), and Serve, which runs it until the context
// ends and then shuts it down gracefully under a deadline. A Listener is
// bound before the Server exists, serving Starting (the probes, and 503 to
// everything else) while a service waits for its servers, then the
// Server's routes on the same connections.
//
// It also holds the one error envelope of every Snip API (ErrorBody,
// {"error": {"code", "message"}}) and the error handler that writes it
// (ErrorHandler). Routes, and the table from the service's sentinel errors to
// statuses (an ErrorTable), are the service's own; this package only
// provides what is the same everywhere.
package webserver

import (
	"context"
	"log/slog"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Check is a readiness probe: nil means the dependency is usable.
type Check func(ctx context.Context) error

// Server is an echo instance with the operational endpoints mounted.
type Server struct {
	// Echo is where the service adds its routes and error handler.
	Echo *echo.Echo
	log  *slog.Logger

	mu     sync.Mutex
	checks map[string]Check
	// stopping, once set (Stopping), makes /readyz answer 503.
	stopping atomic.Bool
}

// New builds the echo instance, registers Go runtime and process collectors
// on reg, and mounts /healthz, /readyz and /metrics (served from reg; GET
// and HEAD).
func New(log *slog.Logger, reg *prometheus.Registry) *Server {
	e := echo.New()
	e.HideBanner = true
	e.HidePort = true
	// Panic recovery and request IDs wrap the whole handler once (Serve),
	// not as echo middleware, which echo rebuilds on every request: the
	// redirect hot path measured 5 allocations per request saved.
	s := &Server{Echo: e, log: log, checks: map[string]Check{}}

	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// The probes answer HEAD as GET (status only): load balancers often
	// probe with HEAD, and beside a catch-all route (the redirect's
	// "/:code") echo would otherwise hand HEAD /healthz to it.
	probe := []string{http.MethodGet, http.MethodHead}
	e.Match(probe, "/healthz", func(c echo.Context) error {
		return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
	})
	e.Match(probe, "/readyz", s.readyz)
	e.Match(probe, "/metrics", echo.WrapHandler(promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})))
	return s
}

// AddReadiness adds a named check to /readyz.
func (s *Server) AddReadiness(name string, c Check) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.checks[name] = c
}

// Stopping makes /readyz answer 503, {"stopping": "the service is
// stopping"}, from now on, without running the checks: a load balancer
// that probes it sends no new connections to an instance that is going
// away, while the server still serves what it is sent (service.Group.HTTP
// calls it when the stop begins). /healthz still answers 200: the process
// is not broken.
func (s *Server) Stopping() { s.stopping.Store(true) }

func (s *Server) readyz(c echo.Context) error {
	if s.stopping.Load() {
		return c.JSON(http.StatusServiceUnavailable, map[string]string{"stopping": "the service is stopping"})
	}
	s.mu.Lock()
	names := make([]string, 0, len(s.checks))
	for n := range s.checks {
		names = append(names, n)
	}
	checks := make(map[string]Check, len(s.checks))
	for n, ch := range s.checks {
		checks[n] = ch
	}
	s.mu.Unlock()
	sort.Strings(names)

	// The checks run at once, each with its own 2 s: run one after another
	// under one deadline, a slow check used the others' time and they
	// reported its timeout as their own failure.
	results := make([]string, len(names))
	var wg sync.WaitGroup
	for i, n := range names {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(c.Request().Context(), 2*time.Second)
			defer cancel()
			results[i] = "ok"
			if err := checks[n](ctx); err != nil {
				results[i] = err.Error()
			}
		})
	}
	wg.Wait()
	status, code := make(map[string]string, len(names)), http.StatusOK
	for i, n := range names {
		status[n] = results[i]
		if results[i] != "ok" {
			code = http.StatusServiceUnavailable
		}
	}
	return c.JSON(code, status)
}

// Serve listens on addr (":0" picks a free port), calls ready with the bound
// address once it accepts connections, and serves until ctx ends. Then it
// stops accepting, waits up to shutdownTimeout for requests in flight, and
// returns. It returns an error only if listening or serving failed.
func (s *Server) Serve(ctx context.Context, addr string, ready func(addr string), shutdownTimeout time.Duration) error {
	l, err := Listen(s.log, addr, s.Handler())
	if err != nil {
		return err
	}
	return l.Serve(ctx, s, ready, shutdownTimeout)
}
