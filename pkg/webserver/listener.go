package webserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Listener is an HTTP server bound before the handler it is for exists: it
// serves a first handler (Starting, while a service waits for its servers)
// from the moment it is bound, and a Server's from Serve on, on the same
// listener and the same connections: nothing is refused in between, and
// nothing binds twice.
type Listener struct {
	log  *slog.Logger
	ln   net.Listener
	srv  *http.Server
	h    atomic.Pointer[handlerBox]
	errc chan error // srv.Serve's return
}

type handlerBox struct{ http.Handler }

// Listen binds addr (":0" picks a free port) and serves first there until
// Serve or Shutdown is called.
func Listen(log *slog.Logger, addr string, first http.Handler) (*Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	l := &Listener{log: log, ln: ln, errc: make(chan error, 1)}
	l.h.Store(&handlerBox{first})
	l.srv = &http.Server{
		// One atomic load per request, and no allocation: the handler
		// changes once, from first to the Server's.
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { l.h.Load().ServeHTTP(w, r) }),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	go func() { l.errc <- l.srv.Serve(ln) }()
	log.Info("http listening", "addr", l.Addr())
	return l, nil
}

// Addr is the address the listener is bound to (host:port).
func (l *Listener) Addr() string { return l.ln.Addr().String() }

// Serve serves s's handler (Server.Handler) from now on, calls ready with
// the address, and serves until ctx ends. Then it stops accepting, waits up
// to shutdownTimeout for requests in flight, and returns. It returns an
// error only if serving failed (before it was called, too).
func (l *Listener) Serve(ctx context.Context, s *Server, ready func(addr string), shutdownTimeout time.Duration) error {
	l.h.Store(&handlerBox{s.Handler()})
	if ready != nil {
		ready(l.Addr())
	}
	select {
	case err := <-l.errc:
		return fmt.Errorf("serve http: %w", err)
	case <-ctx.Done():
	}
	return l.Shutdown(shutdownTimeout)
}

// Shutdown stops accepting, waits up to timeout for requests in flight
// (then closes what is left), and returns once the server has stopped: an
// error only if serving had failed.
func (l *Listener) Shutdown(timeout time.Duration) error {
	sctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := l.srv.Shutdown(sctx); err != nil {
		l.log.Warn("http shutdown incomplete", "err", err)
		_ = l.srv.Close()
	}
	if err := <-l.errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve http: %w", err)
	}
	return nil
}

// CodeStarting is the envelope code of every route but the probes while a
// service starts (Starting).
const CodeStarting = "starting"

// Startup is what a starting service waits for, as Starting's /readyz
// says it.
type Startup struct {
	// WaitingFor names the wait the service is in ("apply topology"), and
	// LastError is that wait's last failure; empty and nil when none.
	WaitingFor string
	LastError  error
	// Down are its connections that are not up yet, by name, each with
	// why ("nats clickcounter": "nats RECONNECTING: dial tcp ...").
	Down map[string]string
}

// Starting is what a service's listener serves while the service starts,
// before its routes exist: /healthz answers 200 (the process is alive: a
// liveness probe must not restart it for waiting on a server); /readyz
// answers 503 with what status says,
//
//	{"starting": "the service is starting", "waiting_for": "apply topology",
//	 "last_error": "...", "nats clickcounter": "nats RECONNECTING: ..."}
//
// (waiting_for and last_error left out while empty, then one field for
// each connection that is down); /metrics serves reg (nil: no /metrics);
// and every other route answers 503 {"error": {"code": "starting", ...}}.
// The probes answer HEAD as GET, status only. Requests get an ID and panic
// recovery, as Server.Handler's do.
func Starting(log *slog.Logger, reg *prometheus.Registry, status func() Startup) http.Handler {
	var metrics http.Handler
	if reg != nil {
		metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
	}
	writeJSON := func(w http.ResponseWriter, r *http.Request, code int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		if r.Method == http.MethodHead {
			return
		}
		if err := json.NewEncoder(w).Encode(v); err != nil {
			log.Debug("write starting response", "err", err)
		}
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st := status()
		probe := r.Method == http.MethodGet || r.Method == http.MethodHead
		switch {
		case probe && r.URL.Path == "/healthz":
			writeJSON(w, r, http.StatusOK, map[string]string{"status": "ok"})
		case probe && r.URL.Path == "/readyz":
			body := make(map[string]string, len(st.Down)+3)
			for name, why := range st.Down {
				body[name] = why
			}
			body["starting"] = "the service is starting"
			if st.WaitingFor != "" {
				body["waiting_for"] = st.WaitingFor
			}
			if st.LastError != nil {
				body["last_error"] = st.LastError.Error()
			}
			writeJSON(w, r, http.StatusServiceUnavailable, body)
		case probe && r.URL.Path == "/metrics" && metrics != nil:
			metrics.ServeHTTP(w, r)
		default:
			msg := "the service is starting"
			if st.WaitingFor != "" {
				msg += " (" + st.WaitingFor + ")"
			}
			writeJSON(w, r, http.StatusServiceUnavailable, ErrorBody{Error: ErrorDetail{Code: CodeStarting, Message: msg + "; try again shortly"}})
		}
	})
	return withRequestID(recoverer(h, log))
}
