package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/snipdev/snip/pkg/webserver"
)

// Main is a service's main function:
//
//   - `<binary> healthcheck` (the distroless image's Docker HEALTHCHECK,
//     which has no shell or curl) loads the configuration and exits 0 if the
//     service answers /healthz at HTTP_ADDR (it does from the start, while
//     it waits for its servers too: Run), else 1;
//   - otherwise it loads the configuration from the environment and the
//     arguments (exit 2 when it is wrong), logs JSON to stderr at LOG_LEVEL,
//     and calls run with a context that ends on SIGINT or SIGTERM; an error
//     from run is logged and exits 1. With PPROF_ADDR set, the profiles'
//     listener is bound first: an address that cannot be bound is logged,
//     naming PPROF_ADDR, and exits 1 without calling run. A second SIGINT
//     or SIGTERM during the stop ends the process at once, logged, with
//     exit 1: what the stop had not finished is abandoned, as a SIGKILL
//     would abandon it.
//
// load is the service's loadConfig; run is its run, which tests call with
// a Config literal.
func Main[C Config](name string, load func(environ, args []string) (C, error), run func(context.Context, *slog.Logger, C) error) {
	os.Exit(exitCode(SignalContext(name), name, os.Args[1:], os.Environ(), os.Stderr, load, run))
}

// SignalContext is the context a command runs in: it ends on the first
// SIGINT or SIGTERM, and the second ends the process at once, with exit 1
// and a JSON line on stderr that names name and says so (what the stop had
// not finished, deferred calls included, is abandoned, as a SIGKILL would
// abandon it). Main uses it; so do the commands that are not services
// (snipctl, loadtest), whose stop can take as long.
func SignalContext(name string) context.Context {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	return onSignals(name, sigs, os.Stderr, os.Exit)
}

// onSignals is a context that ends on the first signal from sigs; the
// second calls exit(1), after a line on stderr that says so. A stop that
// hangs (a server that never answers a drain, a component that does not
// return) is then ended by whoever sent the signals, without a SIGKILL.
func onSignals(name string, sigs <-chan os.Signal, stderr io.Writer, exit func(int)) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-sigs
		cancel()
		s := <-sigs
		slog.New(slog.NewJSONHandler(stderr, nil)).Error(name+" exits at once: a second signal during the stop",
			"signal", s.String())
		exit(1)
	}()
	return ctx
}

func exitCode[C Config](ctx context.Context, name string, args, environ []string, stderr io.Writer,
	load func(environ, args []string) (C, error), run func(context.Context, *slog.Logger, C) error) int {
	if len(args) > 0 && args[0] == "healthcheck" {
		cfg, err := load(environ, nil)
		if err == nil {
			err = webserver.Probe(cfg.base().HTTPAddr)
		}
		if err != nil {
			fmt.Fprintf(stderr, "%s healthcheck: %v\n", name, err)
			return 1
		}
		return 0
	}
	cfg, err := load(environ, args)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 2
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: cfg.base().LogLevel}))
	if addr := cfg.base().PprofAddr; addr != "" {
		stop, err := servePprof(log, addr)
		if err != nil {
			log.Error(name+" stopped", "err", err)
			return 1
		}
		defer stop()
	}
	if err := run(ctx, log, cfg); err != nil {
		log.Error(name+" stopped", "err", err)
		return 1
	}
	return 0
}

// servePprof binds addr and serves the runtime's profiles (net/http/pprof)
// there until stop is called. It is off unless PPROF_ADDR is set: profiles
// show the code's internals, so bind it to loopback. An address that
// cannot be bound is an error naming PPROF_ADDR: the service does not
// start without the profiles it was asked to serve.
func servePprof(log *slog.Logger, addr string) (stop func(), err error) {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("PPROF_ADDR %s: %w", addr, err)
	}
	// The address listened on: with port 0, every process of a demo
	// started with the same PPROF_ADDR gets one of its own.
	log.Info("pprof listening", "addr", ln.Addr().String())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("pprof stopped", "addr", addr, "err", err)
		}
	}()
	return func() { _ = srv.Close(); <-done }, nil
}
