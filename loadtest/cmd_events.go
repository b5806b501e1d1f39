package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/snipdev/snip/loadtest/internal/eventload"
	"github.com/snipdev/snip/loadtest/internal/series"
	"github.com/snipdev/snip/loadtest/internal/truth"
	"github.com/snipdev/snip/loadtest/internal/workload"
)

// cmdEvents publishes click events straight into CLICKS: the readers' load
// without the redirect service in front.
func cmdEvents(ctx context.Context, env *Env, args []string) error {
	fs := flag.NewFlagSet("events", flag.ContinueOnError)
	var wf workloadFlags
	var rf runFlags
	var sf sinkFlags
	wf.register(fs)
	rf.register(fs, 5000)
	sf.register(fs)
	owner := fs.String("owner", "demo", "owner of the clicks (the stats API answers this owner's key)")
	window := fs.Int("window", 4096, "most publishes awaiting an ack at once")
	loss := fs.Uint64("inject-loss", 0, "fault injection: every Nth event is recorded as sent but never published, to see the oracle fail")
	if err := parse(fs, args, env.Stderr); err != nil {
		return err
	}
	if *window < 1 {
		return fmt.Errorf("--window %d: want at least 1: %w", *window, errUsage)
	}
	if err := rf.check(); err != nil {
		return err
	}
	if err := sf.check(); err != nil {
		return err
	}
	gen, err := workload.New(wf.spec(rf.rate))
	if err != nil {
		return fmt.Errorf("%w: %w", err, errUsage)
	}
	sys, err := connect(ctx, env, &sf)
	if err != nil {
		return err
	}
	defer sys.close()
	tag := workload.NewTag()
	cfg := eventload.Config{
		Rate: rf.rate, Duration: rf.duration, Window: *window, Owner: *owner, Tag: tag, Gen: gen,
		Target: wf.linkBase,
	}
	if *loss > 0 {
		n := *loss
		cfg.Drop = func(seq uint64) bool { return seq%n == n-1 }
	}
	return runLoad(ctx, env, sys, load{
		mode: truth.ModeEvents, command: "loadtest events " + strings.Join(args, " "), target: env.Cfg.NATSURL,
		rate: rf.rate, owner: *owner, tag: tag, gen: gen,
		drive: func(ctx context.Context, rec *truth.Recorder, m *series.Meter) (uint64, error) {
			return eventload.Run(ctx, sys.nc, cfg, rec, m)
		},
	}, &rf, &sf)
}

// ensureDir creates the report directory dir and checks that a file can be
// written in it. A driver calls it before the load, so a directory it cannot
// write fails at once, naming it, rather than after a whole run.
func ensureDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("report directory %s: %w", dir, err)
	}
	f, err := os.CreateTemp(dir, ".write-check-*")
	if err != nil {
		return fmt.Errorf("report directory %s is not writable: %w", dir, err)
	}
	f.Close()
	return os.Remove(f.Name())
}
