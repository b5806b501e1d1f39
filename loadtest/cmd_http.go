package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/snipdev/snip/loadtest/internal/httpload"
	"github.com/snipdev/snip/loadtest/internal/series"
	"github.com/snipdev/snip/loadtest/internal/truth"
	"github.com/snipdev/snip/loadtest/internal/workload"
)

// cmdHTTP creates the run's links through the API, then sends redirects at
// a constant rate.
func cmdHTTP(ctx context.Context, env *Env, args []string) error {
	fs := flag.NewFlagSet("http", flag.ContinueOnError)
	var wf workloadFlags
	var rf runFlags
	var sf sinkFlags
	wf.register(fs)
	rf.register(fs, 2000)
	sf.register(fs)
	target := fs.String("target", "http://127.0.0.1:8080", "the redirect service's base URL")
	timeout := fs.Duration("timeout", 10*time.Second, "per-request timeout")
	maxConns := fs.Int("max-conns", 0, "most connections to the service (0: as many as the rate needs)")
	xff := fs.Bool("xff", true, "send each visitor's address in X-Forwarded-For (the redirect believes it only from SNIP_TRUSTED_PROXIES)")
	country := fs.String("country-header", "X-Country", "header carrying the country: X-Country or CF-IPCountry")
	if err := parse(fs, args, env.Stderr); err != nil {
		return err
	}
	if err := checkHTTPFlags(*timeout, *maxConns, *country); err != nil {
		return err
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
	fmt.Fprintf(env.Stderr, "creating %d links through %s/api/links, pointing at %s/...\n", gen.NumLinks(), *target, strings.TrimSuffix(wf.linkBase, "/"))
	owner, err := httpload.CreateLinks(ctx, *target, env.Cfg.APIKey, wf.linkBase, tag, gen.NumLinks())
	if err != nil {
		return err
	}
	cfg := httpload.Config{
		Base: *target, Rate: rf.rate, Duration: rf.duration, Timeout: *timeout, MaxConns: *maxConns,
		ForwardedFor: *xff, CountryHeader: *country, Tag: tag, Gen: gen,
	}
	return runLoad(ctx, env, sys, load{
		mode: truth.ModeHTTP, command: "loadtest http " + strings.Join(args, " "), target: *target,
		rate: rf.rate, owner: owner, tag: tag, gen: gen, forwardedFor: *xff,
		drive: func(ctx context.Context, rec *truth.Recorder, m *series.Meter) (uint64, error) {
			return httpload.Run(ctx, cfg, rec, m)
		},
	}, &rf, &sf)
}

// checkHTTPFlags refuses the HTTP driver's flags it would otherwise replace
// (a timeout of 0 was 10 s) or pass on unchecked (a country header the
// redirect does not read leaves every click without a country).
func checkHTTPFlags(timeout time.Duration, maxConns int, countryHeader string) error {
	switch {
	case timeout <= 0:
		return fmt.Errorf("--timeout %s: want more than 0: %w", timeout, errUsage)
	case maxConns < 0:
		return fmt.Errorf("--max-conns %d: want 0 (as many as the rate needs) or more: %w", maxConns, errUsage)
	case countryHeader != "X-Country" && countryHeader != "CF-IPCountry":
		return fmt.Errorf("--country-header %q: want X-Country or CF-IPCountry: %w", countryHeader, errUsage)
	}
	return nil
}
