package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/snipdev/snip/loadtest/internal/httpload"
	"github.com/snipdev/snip/loadtest/internal/series"
	"github.com/snipdev/snip/loadtest/internal/truth"
	"github.com/snipdev/snip/loadtest/internal/workload"
)

// step is one rate of a ramp.
type step struct {
	Rate       int     `json:"rate"`
	Achieved   float64 `json:"achieved"`
	P50        float64 `json:"p50_ms"`
	P99        float64 `json:"p99_ms"`
	P999       float64 `json:"p999_ms"`
	Errors     uint64  `json:"errors"`
	Held       bool    `json:"held"`
	WhyNotHeld string  `json:"why_not_held,omitempty"`
}

// cmdRamp steps the HTTP rate up, a fixed time per step, until the p99 of
// a step passes the limit, errors appear, or the generator cannot send what
// is offered. The last step that held is the answer.
func cmdRamp(ctx context.Context, env *Env, args []string) error {
	fs := flag.NewFlagSet("ramp", flag.ContinueOnError)
	var wf workloadFlags
	wf.register(fs)
	target := fs.String("target", "http://127.0.0.1:8080", "base URL to drive (the redirect service or loadtest bare302)")
	from := fs.Int("from", 1000, "first rate")
	to := fs.Int("to", 50_000, "last rate")
	stepBy := fs.Int("step", 1000, "rate increment")
	each := fs.Duration("step-duration", 10*time.Second, "time per step")
	pause := fs.Duration("pause", 3*time.Second, "pause between steps (lets queues drain)")
	limit := fs.Duration("p99", 50*time.Millisecond, "the p99 a step must stay under")
	create := fs.Bool("create-links", true, "create the links through /api/links first (false for bare302)")
	out := fs.String("out", "", "where to write ramp.json (default: the report directory)")
	retries := fs.Int("retries", 1, "run a step that did not hold again, this many times, to tell a noisy neighbour from a limit")
	if err := parse(fs, args, env.Stderr); err != nil {
		return err
	}
	if *from < 1 || *to < *from || *stepBy < 1 {
		return fmt.Errorf("rates --from %d --to %d --step %d: %w", *from, *to, *stepBy, errUsage)
	}
	gen, err := workload.New(wf.spec(*to))
	if err != nil {
		return fmt.Errorf("%w: %w", err, errUsage)
	}
	tag := workload.NewTag()
	dir := *out
	if dir == "" {
		dir = reportDir("", time.Now(), tag)
	}
	if err := ensureDir(dir); err != nil {
		return err
	}
	if *create {
		if _, err := httpload.CreateLinks(ctx, *target, env.Cfg.APIKey, wf.linkBase, tag, gen.NumLinks()); err != nil {
			return err
		}
	}
	var steps []step
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "rate\tachieved\tp50 ms\tp99 ms\tp99.9 ms\terrors\theld\t")
	tries := 0
	for rate := *from; rate <= *to && ctx.Err() == nil; rate += *stepBy {
		start := time.Now()
		m := series.NewMeter(start, float64(rate))
		rec := truth.NewRecorder(int(float64(rate) * each.Seconds()))
		_, err := httpload.Run(ctx, httpload.Config{
			Base: *target, Rate: rate, Duration: *each, ForwardedFor: true, Tag: tag, Gen: gen,
		}, rec, m)
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			// Stopped during the step: what it ran of it is not the step.
			_ = tw.Flush()
			fmt.Fprintf(env.Stdout, "stopped during the step at %d/s after %s of %s: not judged\n", rate, time.Since(start).Round(time.Millisecond), *each)
			break
		}
		sum := m.Summarise(time.Since(start))
		s := step{Rate: rate, Achieved: sum.Throughput, P50: sum.P50, P99: sum.P99, P999: sum.P999, Errors: sum.Errors, Held: true}
		switch {
		case sum.Errors > 0:
			s.Held, s.WhyNotHeld = false, fmt.Sprintf("%d errors", sum.Errors)
		case sum.P99 > float64(*limit)/float64(time.Millisecond):
			s.Held, s.WhyNotHeld = false, fmt.Sprintf("p99 %.1fms over %s", sum.P99, *limit)
		case sum.Throughput < 0.97*float64(rate):
			s.Held, s.WhyNotHeld = false, fmt.Sprintf("only %.0f/s answered", sum.Throughput)
		}
		steps = append(steps, s)
		held := "yes"
		if !s.Held {
			held = "no: " + s.WhyNotHeld
		}
		fmt.Fprintf(tw, "%d\t%.0f\t%.2f\t%.2f\t%.2f\t%d\t%s\t\n", s.Rate, s.Achieved, s.P50, s.P99, s.P999, s.Errors, held)
		_ = tw.Flush()
		if !s.Held && tries < *retries {
			tries++
			rate -= *stepBy // the same rate again
		} else if !s.Held {
			break
		} else {
			tries = 0
		}
		select {
		case <-ctx.Done():
		case <-time.After(*pause):
		}
	}
	best := 0
	for _, s := range steps {
		if s.Held {
			best = s.Rate
		}
	}
	fmt.Fprintf(env.Stdout, "\nhighest rate held at p99 < %s without errors: %d/s (%s)\n", *limit, best, *target)
	b, _ := json.MarshalIndent(map[string]any{"target": *target, "p99_limit_ms": float64(*limit) / float64(time.Millisecond), "best": best, "steps": steps}, "", "  ")
	return os.WriteFile(filepath.Join(dir, "ramp.json"), append(b, '\n'), 0o644)
}
