// Command snipctl is Snip's operator tool: it applies the JetStream topology,
// creates owners, replays consumer groups, inspects and redrives dead
// letters, reports lag, ends every console session, and runs the whole
// system locally (demo).
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
	"sort"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/service"
)

// Env is what a command gets: configuration, output streams and a logger.
type Env struct {
	Cfg    Config
	Stdout io.Writer
	Stderr io.Writer
	Log    *slog.Logger
}

// command is one snipctl verb.
type command struct {
	usage string // arguments, shown by help
	help  string // one line
	run   func(ctx context.Context, env *Env, args []string) error
	// streams: the command reads the streams and bucket that `topology
	// apply` creates, on the system's NATS; one that is not there is
	// explained (missingTopology).
	streams bool
	// jetstream: the command calls JetStream on NATS_URL; a NATS where
	// nothing answers it is explained (noJetStream).
	jetstream bool
}

// commands lists every verb. Multi-word verbs ("topology apply") are matched
// on their first word and get the rest as args.
var commands = map[string]command{
	"topology": {usage: "apply [--shrink-retention] [--lower-replicas]", help: "create or update every stream, consumer and bucket (idempotent; a shorter retention, fewer replicas only when asked)", run: cmdTopology, jetstream: true},
	"owners":   {usage: "create [--] ID [-name NAME] | rotate [--] ID | revoke [--] ID, each [-wait-replicas N]", help: "create an owner and print its API key (shown once); rotate: a new key, every older one revoked; revoke: every key revoked", run: cmdOwners},
	"replay":   {usage: "GROUP (--since D | --from TIME | --from-seq N) [--wait] [--force]", help: "move a consumer group back and replay CLICKS", run: cmdReplay, streams: true, jetstream: true},
	"demo":     {usage: "[--dir .demo] [--bin .demo/bin] [--rate 5] [--cluster] [--shrink-retention] ...", help: "run the whole system on this machine (make demo); demo -h lists every flag", run: cmdDemo},
	"lag":      {usage: "[GROUP...]", help: "pending events and oldest-unhandled age per group and partition", run: cmdLag, streams: true, jetstream: true},
	"scenario": {usage: "list | run NAME [--speed X] [--json]", help: "run a messaging lesson as an experiment on real servers; exits 1 on FAIL, 3 on INCONCLUSIVE", run: cmdScenario},
	"console":  {usage: "revoke-sessions", help: "end every console session on every instance (as the console's POST /api/sessions/revoke), for a session cookie that may have been copied", run: cmdConsole, jetstream: true},
	"dlq":      {usage: "list | show SEQ | redrive SEQ...|--source S [--reason R]|--all", help: "inspect dead letters and send them back once the cause is fixed", run: cmdDLQ, streams: true, jetstream: true},
}

// errUsage marks a mistake in the command line; main prints usage for it.
var errUsage = errors.New("usage")

// errUsageShown is errUsage when the command has printed its own usage
// already: main exits 2 without printing it again.
var errUsageShown = fmt.Errorf("%w (shown above)", errUsage)

func main() {
	// Ctrl-C stops the command (the demo stops every service, each within
	// 30 s); a second Ctrl-C exits at once.
	ctx := service.SignalContext("snipctl")
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if err := run(ctx, os.Args[1:], os.Environ(), os.Stdout, os.Stderr, log); err != nil {
		fmt.Fprintln(os.Stderr, "snipctl:", err)
		if errors.Is(err, errUsage) && !errors.Is(err, errUsageShown) {
			usage(os.Stderr)
		}
		os.Exit(exitStatus(err))
	}
}

// The exit statuses: 0 when the command did what it was asked, 1 when it
// failed (a scenario whose measurement missed its tolerance included).
const (
	exitUsage        = 2 // a mistake in the command line
	exitInconclusive = 3 // scenario run: the machine did not meet a premise, rows were not judged
)

// exitStatus is the status main exits with for a command's error.
func exitStatus(err error) int {
	switch {
	case errors.Is(err, errUsage):
		return exitUsage
	case errors.Is(err, errScenarioInconclusive):
		return exitInconclusive
	default:
		return 1
	}
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
	err = c.run(ctx, &Env{Cfg: cfg, Stdout: stdout, Stderr: stderr, Log: log}, args[1:])
	switch {
	case c.streams && (errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrBucketNotFound)):
		return fmt.Errorf("%w (%s)", err, missingTopology)
	case c.jetstream && (errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrJetStreamNotEnabled) ||
		errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount)):
		return fmt.Errorf("%w (%s)", err, noJetStream)
	}
	return err
}

// noJetStream is what a command says when JetStream does not answer on
// NATS_URL: the client's "no responders available for request" alone
// names neither the server nor the account.
const noJetStream = "JetStream does not answer on NATS_URL: is it the system's NATS, a server with JetStream enabled, " +
	"and NATS_USER or NATS_CREDS a user of the account that has Snip's streams?"

// missingTopology is what a command that reads Snip's streams says when
// one is not there: the server's "stream not found" alone does not say
// whether snipctl reached the wrong NATS (or account) or the right one
// before anything created the streams.
const missingTopology = "is NATS_URL the system's NATS, and NATS_USER or NATS_CREDS a user of its account? " +
	"There, `snipctl topology apply` creates Snip's streams and bucket, as each service does at its start unless SNIP_APPLY_TOPOLOGY=false"

func usage(w io.Writer) {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintln(w, "usage: snipctl COMMAND [ARGS]\n\ncommands:")
	for _, n := range names {
		c := commands[n]
		fmt.Fprintf(w, "  %-40s %s\n", strings.TrimSpace(n+" "+c.usage), c.help)
	}
	fmt.Fprintln(w, "\nconfiguration comes from the environment: NATS_URL, REDIS_URL, SNIP_PARTITIONS, ... (see services/snipctl/README.md);")
	fmt.Fprintln(w, "SNIPCTL_TIMEOUT (30s) bounds each command, a replay's --wait and a dlq redrive included")
	fmt.Fprintln(w, "exit status: 0 done (scenario run: PASS), 1 failed (scenario run: FAIL), 2 usage error, 3 scenario run INCONCLUSIVE")
}
