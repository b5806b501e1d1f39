package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/deadletter"
	"github.com/snipdev/snip/pkg/events"
)

const dlqUsage = "dlq list | show SEQ | redrive SEQ... | redrive --source S [--reason R] | redrive --all"

// cmdDLQ inspects DEAD_LETTER and sends dead letters home once their cause
// is fixed: preview jobs back to PREVIEW_JOBS, parked clicks back to CLICKS.
func cmdDLQ(ctx context.Context, env *Env, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("%s: %w", dlqUsage, errUsage)
	}
	var run func(context.Context, *Env, jetstream.JetStream, []string) error
	switch args[0] {
	case "list":
		if len(args) != 1 {
			return fmt.Errorf("dlq list takes no arguments: %w", errUsage)
		}
		run = dlqList
	case "show":
		if len(args) != 2 {
			return fmt.Errorf("dlq show SEQ: %w", errUsage)
		}
		run = dlqShow
	case "redrive":
		run = dlqRedrive
	default:
		return fmt.Errorf("unknown dlq command %q (%s): %w", args[0], dlqUsage, errUsage)
	}
	// Check the arguments before connecting.
	if args[0] == "show" {
		if _, err := parseSeq(args[1]); err != nil {
			return err
		}
	}
	if args[0] == "redrive" {
		if _, err := parseRedrive(args[1:]); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, env.Cfg.Timeout)
	defer cancel()
	js, closeJS, err := connectJetStream(env)
	if err != nil {
		return err
	}
	defer closeJS()
	return run(ctx, env, js, args[1:])
}

func parseSeq(s string) (uint64, error) {
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("%q is not a dead-letter sequence: %w", s, errUsage)
	}
	return n, nil
}

func dlqList(ctx context.Context, env *Env, js jetstream.JetStream, _ []string) error {
	groups, err := deadletter.List(ctx, js)
	if err != nil {
		return err
	}
	if len(groups) == 0 {
		fmt.Fprintln(env.Stdout, "no dead letters")
		return nil
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SOURCE\tREASON\tCOUNT\tNEWEST SEQ\tNEWEST PARKED\tNEWEST ERROR")
	var total uint64
	for _, g := range groups {
		total += g.Count
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\n", g.Source, g.Reason, g.Count, g.Newest.Seq,
			g.Newest.Time.UTC().Format(time.RFC3339), clip(g.Newest.Error, 80))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "%d dead letters\n", total)
	return nil
}

func dlqShow(ctx context.Context, env *Env, js jetstream.JetStream, args []string) error {
	seq, _ := parseSeq(args[0])
	l, err := deadletter.Get(ctx, js, seq)
	if err != nil {
		return err
	}
	w := env.Stdout
	fmt.Fprintf(w, "seq:       %d\nsubject:   %s\nparked:    %s\n", l.Seq, l.Subject, l.Time.UTC().Format(time.RFC3339Nano))
	from := fmt.Sprintf("seq %d", l.OrigSeq)
	if l.OrigSeq == 0 { // parked before it reached its stream (the outbox relay)
		from = "never stored"
	}
	fmt.Fprintf(w, "from:      %s %s (%s)\nconsumer:  %s\nattempts:  %d\nreason:    %s\nerror:     %s\n",
		l.Stream, from, l.OrigSubject, l.Consumer, l.Attempts, l.Reason, l.Error)
	// Redrivable also reads a consumer group's click from CLICKS: a letter
	// whose click is gone, or differs (planted), is not redriven.
	switch subj, err := deadletter.Redrivable(ctx, js, l); {
	case err == nil:
		fmt.Fprintf(w, "redrive:   to %s on %s\n", subj, l.Stream)
	case errors.Is(err, deadletter.ErrNotRedrivable):
		fmt.Fprintf(w, "redrive:   not possible: %v\n", err)
	default:
		fmt.Fprintf(w, "redrive:   not known: %v\n", err)
	}
	fmt.Fprintln(w, "headers:")
	keys := make([]string, 0, len(l.Header))
	for k := range l.Header {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		for _, v := range l.Header[k] {
			fmt.Fprintf(w, "  %s: %s\n", k, v)
		}
	}
	fmt.Fprintf(w, "payload (%d bytes):\n", len(l.Data))
	var pretty bytes.Buffer
	if json.Indent(&pretty, l.Data, "  ", "  ") == nil {
		fmt.Fprintf(w, "  %s\n", pretty.String())
	} else {
		fmt.Fprintf(w, "  %q\n", l.Data)
	}
	return nil
}

// redriveArgs is what `dlq redrive` was asked to send back.
type redriveArgs struct {
	seqs           []uint64
	source, reason string
	all            bool
}

func parseRedrive(args []string) (redriveArgs, error) {
	fs := flag.NewFlagSet("dlq redrive", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var a redriveArgs
	fs.StringVar(&a.source, "source", "", "only dead letters of this source (preview, click-counter, ...)")
	fs.StringVar(&a.reason, "reason", "", "only dead letters with this reason")
	fs.BoolVar(&a.all, "all", false, "every dead letter")
	if err := fs.Parse(args); err != nil {
		return a, fmt.Errorf("dlq redrive: %v: %w", err, errUsage)
	}
	for _, s := range fs.Args() {
		seq, err := parseSeq(s)
		if err != nil {
			return a, err
		}
		a.seqs = append(a.seqs, seq)
	}
	filtered := a.source != "" || a.reason != ""
	for _, f := range []struct{ flag, v string }{{"--source", a.source}, {"--reason", a.reason}} {
		// One subject token, as Publish requires of both: anything else
		// (a dot, a blank, a wildcard) would match nothing, or more than
		// it names.
		if f.v != "" && !events.ValidToken(f.v) {
			return a, fmt.Errorf("dlq redrive %s %q: want one name of letters, digits, '-' and '_' (dlq list shows them): %w", f.flag, f.v, errUsage)
		}
	}
	switch {
	case len(a.seqs) > 0 && (filtered || a.all):
		return a, fmt.Errorf("dlq redrive takes sequences or a filter, not both: %w", errUsage)
	case a.all && filtered:
		return a, fmt.Errorf("dlq redrive --all takes no --source or --reason: %w", errUsage)
	case len(a.seqs) == 0 && !filtered && !a.all:
		return a, fmt.Errorf("%s: %w", dlqUsage, errUsage)
	}
	return a, nil
}

func dlqRedrive(ctx context.Context, env *Env, js jetstream.JetStream, args []string) error {
	a, _ := parseRedrive(args)
	n := 0
	report := func(r deadletter.Redriven) {
		n++
		dup := ""
		if r.Duplicate {
			dup = " (already there: redriven before, from this letter or another source's letter of it)"
		}
		fmt.Fprintf(env.Stdout, "redriven %d (%s) -> %s, %s seq %d%s\n", r.Letter.Seq, r.Letter.Subject, r.Subject, r.Stream, r.Seq, dup)
	}
	var errs []error
	if len(a.seqs) > 0 {
		for _, seq := range a.seqs {
			r, err := deadletter.Redrive(ctx, js, seq)
			if err != nil {
				fmt.Fprintf(env.Stderr, "dead letter %d: %v\n", seq, err)
				errs = append(errs, err)
				continue
			}
			report(r)
		}
	} else {
		// A letter that fails (its stream refuses the publish, say) is
		// left in place and said, as one named by sequence is, and the
		// others are still redriven; only the end of the command's time
		// (or Ctrl-C), or a failed read of DEAD_LETTER, stops the run,
		// and the letters after it are not tried.
		seen := 0
		stop := deadletter.Each(ctx, js, deadletter.Filter(a.source, a.reason), func(l deadletter.Letter) error {
			seen++
			r, err := deadletter.RedriveLetter(ctx, js, l)
			switch {
			case err == nil:
				report(r)
				return nil
			case ctx.Err() != nil:
				return err
			case errors.Is(err, deadletter.ErrNotRedrivable):
				fmt.Fprintf(env.Stderr, "dead letter %d: %v (left in place)\n", l.Seq, err)
			default:
				fmt.Fprintf(env.Stderr, "dead letter %d: %v\n", l.Seq, err)
			}
			errs = append(errs, err)
			return nil
		})
		if errors.Is(stop, jetstream.ErrStreamNotFound) {
			return stop // no DEAD_LETTER: nothing was tried, nothing to run again
		}
		if stop != nil {
			fmt.Fprintf(env.Stdout, "%d redriven\n", n)
			not := ""
			if len(errs) > 0 {
				not = fmt.Sprintf(" and %d not (%v)", len(errs), errors.Join(errs...))
			}
			return fmt.Errorf("dlq redrive stopped before the last dead letter: %w; %d redriven%s, the rest not tried: run it again (dlq list shows what is left)", stop, n, not)
		}
		if seen == 0 {
			// A mistyped source or reason matches nothing: say so,
			// rather than a bare "0 redriven".
			what := "no dead letters"
			if a.source != "" || a.reason != "" {
				what = fmt.Sprintf("no dead letter matches%s%s", flagIf(" --source", a.source), flagIf(" --reason", a.reason))
			}
			fmt.Fprintf(env.Stdout, "%s (dlq list shows the sources and reasons there are)\n", what)
		}
	}
	fmt.Fprintf(env.Stdout, "%d redriven\n", n)
	if len(errs) > 0 {
		return fmt.Errorf("%d dead letters not redriven: %w", len(errs), errors.Join(errs...))
	}
	return nil
}

// flagIf is " flag v", or "" when v is.
func flagIf(flag, v string) string {
	if v == "" {
		return ""
	}
	return flag + " " + v
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !isRuneStart(s[n]) {
		n--
	}
	return strings.TrimSpace(s[:n]) + "…"
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }
