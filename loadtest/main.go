// Command loadtest drives Snip at a constant rate and checks that nothing
// was lost: `loadtest http` sends redirects to the redirect service,
// `loadtest events` publishes click events straight into CLICKS, and both
// (with --verify) or `loadtest verify --truth FILE` afterwards compare every
// reader with what was sent. `loadtest ramp` steps the rate up to find the
// highest one a service holds, `loadtest bare302` is the baseline server
// to compare the redirect service with, `loadtest chaos` injects faults
// under load and judges each run with the oracle, and `loadtest ceiling`
// measures what NATS carries to three bare consumers, the readers' baseline.
//
// Every command is a function of (ctx, Env, args) in its own cmd_*.go file,
// listed once in commands below.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/pprof"
	"sort"
	"strings"

	// Aliased: the chaos test's service is a service binary it runs.
	pkgservice "github.com/snipdev/snip/pkg/service"
)

// Env is what a command gets: configuration, output streams and a logger.
type Env struct {
	Cfg    Config
	Stdout io.Writer
	Stderr io.Writer
	Log    *slog.Logger
}

type command struct {
	usage string
	help  string
	run   func(ctx context.Context, env *Env, args []string) error
}

var commands = map[string]command{
	"http":    {usage: "[--rate N] [--duration D] [--verify] ...", help: "send GET /:code to the redirect service at a constant rate", run: cmdHTTP},
	"events":  {usage: "[--rate N] [--duration D] [--verify] ...", help: "publish click events straight into CLICKS at a constant rate", run: cmdEvents},
	"verify":  {usage: "--truth FILE [...]", help: "check every reader against a saved run's truth", run: cmdVerify},
	"ramp":    {usage: "--target URL --from N --to N --step N", help: "step the HTTP rate up until p99 or errors break the limit", run: cmdRamp},
	"bare302": {usage: "[--addr ADDR]", help: "serve a bare 302 for any code: the baseline for ramp", run: cmdBare302},
	"chaos":   {usage: "--fault SPEC [--fault SPEC ...] [--rate N] ...", help: "inject each fault under HTTP load and judge it with the oracle", run: cmdChaos},
	"ceiling": {usage: "[--duration D] [--window N]", help: "a bare publisher and three bare acking consumers on the same NATS: the rate readers are compared with", run: cmdCeiling},
}

var (
	// errUsage marks a mistake in the command line; main prints usage.
	errUsage = errors.New("usage")
	// errVerifyFailed means the oracle found a difference: exit status 1
	// with the table already printed.
	errVerifyFailed = errors.New("verification failed")
	// errNotJudged means the run was stopped before what it was asked to
	// judge was judged (a verified run stopped before its verification
	// ended): exit status 3, neither a pass nor a failure.
	errNotJudged = errors.New("not judged")
)

// Exit statuses of mainCode.
const (
	exitFailed    = 1 // a row failed, or an error
	exitUsage     = 2
	exitNotJudged = 3 // stopped before the verification asked for ended
)

func main() {
	os.Exit(mainCode())
}

// mainCode is main with its exit status returned, so that deferred work
// (a CPU profile) is done before the process exits. Ctrl-C ends the
// command early; a second Ctrl-C exits at once, abandoning what it had not
// written yet, the profile included.
func mainCode() int {
	ctx := pkgservice.SignalContext("loadtest")
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	// LOADTEST_CPUPROFILE=<file> profiles the generator itself: on the same
	// cores as the system it loads, its own cost per click is part of every
	// figure it reports.
	if path := os.Getenv("LOADTEST_CPUPROFILE"); path != "" {
		f, err := os.Create(path)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "loadtest: cpu profile:", err)
			return 1
		}
		defer f.Close()
		defer pprof.StopCPUProfile()
	}
	err := run(ctx, os.Args[1:], os.Environ(), os.Stdout, os.Stderr, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadtest:", err)
		if errors.Is(err, errUsage) {
			usage(os.Stderr)
		}
	}
	return exitCode(err)
}

// exitCode is the exit status of a command that returned err.
func exitCode(err error) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errUsage):
		return exitUsage
	case errors.Is(err, errNotJudged):
		return exitNotJudged
	}
	return exitFailed
}

// run dispatches to a command. Tests call it directly.
func run(ctx context.Context, args, environ []string, stdout, stderr io.Writer, log *slog.Logger) error {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(stdout)
		return nil
	}
	c, ok := commands[args[0]]
	if !ok {
		return fmt.Errorf("unknown command %q: %w", args[0], errUsage)
	}
	cfg, err := loadConfig(environ)
	if err != nil {
		return err
	}
	return c.run(ctx, &Env{Cfg: cfg, Stdout: stdout, Stderr: stderr, Log: log}, args[1:])
}

func usage(w io.Writer) {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintln(w, "usage: loadtest COMMAND [FLAGS]   (loadtest COMMAND -h lists the flags)\n\ncommands:")
	for _, n := range names {
		c := commands[n]
		fmt.Fprintf(w, "  %-55s %s\n", strings.TrimSpace(n+" "+c.usage), c.help)
	}
	fmt.Fprintln(w, "\nNATS comes from the environment: NATS_URL, NATS_USER, NATS_PASSWORD, NATS_CREDS (see README.md)")
}
