package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/topology"
)

// cmdReplay moves a consumer group back: every partition's owner finishes
// its batch, calls the reader's OnRewind hook, and goes on from the new
// position. What "replay" means for a reader's state is the reader's choice
// (the click counter recounts into a new generation; the warehouse's rows and
// fraud's alert IDs are idempotent).
//
// The click counter keeps all-time totals: it recounts only a replay that
// starts at the oldest event CLICKS retains, and skips any other (decision
// 0021). Such a replay would reread events for nothing while the operator
// believes the counts are being rebuilt, so snipctl refuses it, saying what
// to do instead, unless --force (reader.CheckRecount, which the console's
// replay asks too). A group that has no consumers is reported as such
// first, whatever the position and --force. A group started at new events
// (the webhooks group) cannot be replayed (reader.ErrNotReplayable): the
// error says so and nothing is requested; a group started at a time
// replays each partition from its first event since then at the earliest,
// and snipctl says which partitions start there.
func cmdReplay(ctx context.Context, env *Env, args []string) error {
	if len(args) < 1 || args[0] == "" || args[0][0] == '-' {
		return fmt.Errorf("replay GROUP (--since DURATION | --from TIME | --from-seq N) [--wait] [--force]: %w", errUsage)
	}
	group := args[0]
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	since := fs.Duration("since", 0, "replay the events of the last DURATION (e.g. 24h)")
	from := fs.String("from", "", "replay from this time (RFC 3339)")
	fromSeq := fs.Uint64("from-seq", 0, "replay from this CLICKS stream sequence (1 = the oldest retained)")
	wait := fs.Bool("wait", false, "wait until every partition has moved back")
	force := fs.Bool("force", false, "replay the click counter even from a position it will not recount from")
	if err := fs.Parse(args[1:]); err != nil {
		return fmt.Errorf("replay: %v: %w", err, errUsage)
	}
	if fs.NArg() > 0 {
		// Go's flags stop at the first word that is not one: the flags
		// after it would be dropped silently.
		return fmt.Errorf("replay %s: unexpected arguments %q (replay one group at a time, flags after it): %w", group, fs.Args(), errUsage)
	}
	// Which position flags were given, whatever their values: a value
	// that names no position (--since 0, --from-seq 0) is refused as
	// such, not as a missing flag.
	set, given := 0, ""
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "since", "from", "from-seq":
			set, given = set+1, f.Name
		}
	})
	if set != 1 {
		return fmt.Errorf("replay: give exactly one of --since, --from, --from-seq: %w", errUsage)
	}
	var pos reader.Position
	var start string // the position as given, for messages
	switch given {
	case "from":
		t, err := time.Parse(time.RFC3339, *from)
		if err != nil {
			return fmt.Errorf("replay: --from %q is not an RFC 3339 time: %w", *from, errUsage)
		}
		if now := time.Now(); t.After(now) {
			// Nothing is stored after now: the replay would move nothing
			// back, and --wait would say every partition had.
			return fmt.Errorf("replay: --from %s is in the future (now %s): nothing to replay: %w", *from, now.UTC().Format(time.RFC3339), errUsage)
		}
		start = "--from " + *from
		pos = reader.FromTime(t)
	case "from-seq":
		if *fromSeq == 0 {
			return fmt.Errorf("replay: --from-seq 0: CLICKS sequences start at 1 (the oldest retained): %w", errUsage)
		}
		start = "--from-seq " + strconv.FormatUint(*fromSeq, 10)
		pos = reader.FromSeq(*fromSeq)
	default: // since
		if *since <= 0 {
			return fmt.Errorf("replay: --since %s: want a duration of more than 0 (24h: the last day): %w", since, errUsage)
		}
		start = "--since " + since.String()
		pos = reader.FromTime(time.Now().Add(-*since))
	}
	ctx, cancel := context.WithTimeout(ctx, env.Cfg.Timeout)
	defer cancel()
	js, closeJS, err := connectJetStream(env)
	if err != nil {
		return err
	}
	defer closeJS()
	// A position after CLICKS' last event replays nothing; --wait would
	// say every partition had moved back. One before its oldest replays
	// less than asked: said once the replay is requested. The partitions
	// carry out the group's latest request only: one still under way is
	// replaced, and its partitions that did move back move back again for
	// this one.
	w, err := reader.CheckReplay(ctx, js, group, pos, start, *force)
	switch {
	case errors.Is(err, reader.ErrNoGroup):
		return fmt.Errorf("replay %s: %w", group, reader.ErrNoGroup)
	case errors.Is(err, reader.ErrNotARecount):
		return fmt.Errorf("replay %s: %w: %w", group, err, errNotARecount)
	case errors.Is(err, reader.ErrNothingToReplay):
		return fmt.Errorf("replay %s: %w, nothing requested", group, err)
	case err != nil:
		return fmt.Errorf("replay %s: %w", group, err)
	}
	if w.Forced != "" {
		fmt.Fprintf(env.Stdout, "warning: %s; replaying anyway (--force)\n", w.Forced)
	} else if group == topology.GroupClickCounter {
		fmt.Fprintln(env.Stdout, "click-counter: a recount: each partition rebuilds its counts into a new generation; the stats keep the old counts until it has caught up")
	}
	if w.Replaces != "" {
		fmt.Fprintf(env.Stdout, "warning: %s\n", w.Replaces)
	}
	if f := replayChecked.Load(); f != nil {
		(*f)(group)
	}
	// Requested only if no other replay was since the check: one that
	// was (another operator, the console) is not replaced without the
	// warning above saying so. That is reader.ErrReplayRequestedMeanwhile,
	// naming it; nothing is requested, and run again the command warns
	// that it replaces it.
	id, err := reader.RewindAfter(ctx, js, group, pos, w.Revision)
	if err != nil {
		// A group started at new events (the webhooks group) is
		// reader.ErrNotReplayable: the error says so, and what webhooks
		// offers instead.
		return err
	}
	fmt.Fprintf(env.Stdout, "replay %s requested for group %s\n", id, group)
	if w.StartsAt != "" {
		fmt.Fprintf(env.Stdout, "warning: %s\n", w.StartsAt)
	}
	if st, err := reader.LatestRewind(ctx, js, group); err == nil && st.ID == id {
		var atStart []int
		for _, p := range st.Partitions {
			if p.AtGroupStart {
				atStart = append(atStart, p.Partition)
			}
		}
		if len(atStart) > 0 {
			fmt.Fprintf(env.Stdout, "partitions %v start at the group's first event: the group started after %s, and a replay goes back no further\n", atStart, start)
		}
	}
	if !*wait {
		fmt.Fprintln(env.Stdout, "each partition moves back when its owner takes the request (a partition with no live member, when one joins)")
		return nil
	}
	if err := reader.WaitRewind(ctx, js, group, id); err != nil {
		if ctx.Err() != nil {
			// Out of time, or Ctrl-C: the request stays, and is carried
			// out as ever; say so, which partitions it waits for, and
			// how to wait longer, before the operator asks again (a new
			// request replaces it, and the partitions already moved back
			// move back again).
			return fmt.Errorf("%w; %s", err, stillRequested(ctx, env, js, group, id))
		}
		return err
	}
	fmt.Fprintln(env.Stdout, "every partition has moved back")
	return nil
}

// stillRequested is what an operator whose --wait ended before the replay
// was carried out needs to know: it stays requested, the partitions still
// to move back, and how to follow or wait longer. The partitions are read
// anew, for a second at most: the command's own time is over.
func stillRequested(ctx context.Context, env *Env, js jetstream.JetStream, group, id string) string {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	which := "its partitions"
	if st, err := reader.LatestRewind(rctx, js, group); err == nil && st.ID == id {
		which = fmt.Sprintf("partitions %v", st.Pending())
	}
	return fmt.Sprintf("replay %s stays requested: %s move back when their owner takes it (one with no live member, when one joins); "+
		"snipctl lag %s shows the group, and a larger SNIPCTL_TIMEOUT (now %s) waits longer; "+
		"do not ask again to wait for it: a new replay replaces this one, and the partitions already moved back move back again",
		id, which, group, env.Cfg.Timeout)
}

// replayChecked, when set (by a test), is called with the group between
// the replay's checks and its request.
var replayChecked atomic.Pointer[func(group string)]

// errNotARecount is a click-counter replay refused because it would
// recount nothing (reader.CheckRecount says why).
var errNotARecount = errors.New("use --from-seq 1 to recount, or --force to replay anyway")
