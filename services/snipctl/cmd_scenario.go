package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"text/tabwriter"

	"github.com/snipdev/snip/services/snipctl/internal/scenario"
)

// errScenarioFailed is returned when a scenario ran but a measurement missed
// its prediction; main exits 1 for it.
var errScenarioFailed = errors.New("measurements outside their tolerance")

// errScenarioInconclusive is returned when a scenario's judged rows passed
// but the machine did not meet a premise of the lesson, so the rows that need
// it were not judged; main exits 3 for it (exitInconclusive), so a script
// that reads only the exit status does not take it for a pass.
var errScenarioInconclusive = errors.New("inconclusive: the machine did not meet the lesson's premise, rows that need it were not judged")

// runScenario is scenario.Run; the exit-status test puts a fixed result in
// its place.
var runScenario = scenario.Run

// cmdScenario runs the lessons as experiments on real components:
//
//	snipctl scenario list
//	snipctl scenario run NAME [--speed X] [--json]
//
// run exits 0 on PASS, 1 on FAIL, 3 on INCONCLUSIVE (and 2 on a usage error).
func cmdScenario(ctx context.Context, env *Env, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("scenario: want list or run: %w", errUsage)
	}
	switch args[0] {
	case "list":
		if len(args) != 1 {
			return fmt.Errorf("scenario list takes no arguments: %w", errUsage)
		}
		tw := tabwriter.NewWriter(env.Stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tLESSON TIME\tNEEDS\tCLAIM")
		for _, s := range scenario.All() {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", s.Name, s.Lesson, s.Needs, s.Claim)
		}
		return tw.Flush()
	case "run":
		return scenarioRun(ctx, env, args[1:])
	default:
		return fmt.Errorf("scenario %q: want list or run: %w", args[0], errUsage)
	}
}

func scenarioRun(ctx context.Context, env *Env, args []string) error {
	fs := flag.NewFlagSet("scenario run", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	speed := fs.Float64("speed", 1, "time compression: rates x X, durations / X")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	// The name may come before or after the flags.
	var name string
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		name, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("scenario run: %v: %w", err, errUsage)
	}
	if name == "" && fs.NArg() == 1 {
		name = fs.Arg(0)
	} else if fs.NArg() != 0 || name == "" {
		return fmt.Errorf("scenario run: want one NAME (see snipctl scenario list): %w", errUsage)
	}
	s, err := scenario.Lookup(name)
	if err != nil {
		return fmt.Errorf("%w: %w", err, errUsage)
	}
	o := scenario.Options{Speed: *speed}
	if env.Log != nil {
		// The lesson's members log to stderr at Warn and above (a lease
		// that may have lapsed, a watch that ended): what explains a run
		// too busy for its lesson, without their routine lines.
		o.Log = slog.New(minLevel{env.Log.Handler(), slog.LevelWarn})
	}
	if !*asJSON {
		fmt.Fprintf(env.Stdout, "%s: %s\n  lesson time %s, speed %g: about %s of real time\n",
			s.Name, s.Claim, s.Lesson, *speed, scaled(s.Lesson.Seconds(), *speed))
		o.Progress = env.Stdout
	}
	res, err := runScenario(ctx, s, o)
	if err != nil {
		if errors.Is(err, scenario.ErrBadSpeed) {
			return fmt.Errorf("%w: %w", err, errUsage)
		}
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(env.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(res); err != nil {
			return err
		}
	} else {
		scenario.Print(env.Stdout, res)
	}
	if !res.Pass {
		return fmt.Errorf("scenario %s: %w", s.Name, errScenarioFailed)
	}
	if res.Inconclusive != "" {
		return fmt.Errorf("scenario %s: %w", s.Name, errScenarioInconclusive)
	}
	return nil
}

func scaled(lessonSeconds, speed float64) string {
	if speed <= 0 {
		speed = 1
	}
	return fmt.Sprintf("%.0fs plus start-up", lessonSeconds/speed)
}

// minLevel is a slog.Handler that drops records below min.
type minLevel struct {
	slog.Handler
	min slog.Level
}

func (h minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

func (h minLevel) WithAttrs(a []slog.Attr) slog.Handler {
	return minLevel{h.Handler.WithAttrs(a), h.min}
}

func (h minLevel) WithGroup(name string) slog.Handler {
	return minLevel{h.Handler.WithGroup(name), h.min}
}
