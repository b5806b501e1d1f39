package main

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"time"

	"github.com/snipdev/snip/loadtest/internal/oracle"
	"github.com/snipdev/snip/loadtest/internal/truth"
)

// cmdVerify checks the readers against a saved truth: the same oracle as
// --verify, any time later (within CLICKS retention).
func cmdVerify(ctx context.Context, env *Env, args []string) error {
	fs := flag.NewFlagSet("verify", flag.ContinueOnError)
	var sf sinkFlags
	sf.register(fs)
	path := fs.String("truth", "", "truth.json of the run (required)")
	if err := parse(fs, args, env.Stderr); err != nil {
		return err
	}
	if *path == "" {
		return fmt.Errorf("--truth is required: %w", errUsage)
	}
	if err := sf.check(); err != nil {
		return err
	}
	require, err := sf.required()
	if err != nil {
		return err
	}
	tr, err := truth.Load(*path)
	if err != nil {
		return err
	}
	sys, err := connect(ctx, env, &sf)
	if err != nil {
		return err
	}
	defer sys.close()
	if sys.webhooksAPI != "" {
		// What an endpoint was delivered is known only to the receiver
		// of the run, in the run's process.
		sys.skip[oracle.KeyWebhooks] = "checked only in the run itself (loadtest http|events --verify): its receiver lived in the run's process"
	}
	sinks, closeSinks := sys.sinks(tr.Owner, tr.Started.Add(-time.Second), nil)
	defer closeSinks()
	rep, err := oracle.Verify(ctx, tr, sinks, oracle.Options{
		Deadline: sf.deadline, SetLimit: sf.setLimit, BurstThreshold: sf.burstThreshold, Require: require,
		Progress: func(s string) { fmt.Fprintln(env.Stderr, "verify:", s) },
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "run %s (%s, %d attempts, %d sent, %d refused, %d unanswered) from %s\n",
		tr.Tag, tr.Mode, tr.Attempts, tr.SentCount(), len(tr.Refused), len(tr.Uncertain), filepath.Base(filepath.Dir(*path)))
	if tr.LoadCut != "" {
		// The clicks it sent are known one by one, so they are judged
		// as any run's; what is not is the load it was asked for.
		fmt.Fprintf(env.Stdout, "a stopped run: %s, after %s of sending", tr.LoadCut, tr.Ended.Sub(tr.Started).Round(time.Millisecond))
		if tr.Duration > 0 {
			fmt.Fprintf(env.Stdout, " of its %s", tr.Duration)
		}
		fmt.Fprintln(env.Stdout, ". The rows judge the clicks it sent before then, not the load it was asked for; its keep-up verdict stays unknown")
	}
	fmt.Fprintln(env.Stdout)
	if err := oracle.WriteTable(env.Stdout, rep.Rows); err != nil {
		return err
	}
	if !rep.Passed {
		return errVerifyFailed
	}
	return nil
}
