package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/snipdev/snip/pkg/reader"
)

// cmdReplay moves a consumer group back: every partition's owner finishes
// its batch, calls the reader's OnRewind hook, and goes on from the new
// position. What "replay" means for a reader's state is the reader's choice
// (the click counter recounts into a new generation; the warehouse's rows and
// fraud's alert IDs are idempotent).
func cmdReplay(ctx context.Context, env *Env, args []string) error {
	if len(args) < 1 || args[0] == "" || args[0][0] == '-' {
		return fmt.Errorf("replay GROUP (--since DURATION | --from TIME | --from-seq N) [--wait]: %w", errUsage)
	}
	group := args[0]
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	since := fs.Duration("since", 0, "replay the events of the last DURATION (e.g. 24h)")
	from := fs.String("from", "", "replay from this time (RFC 3339)")
	fromSeq := fs.Uint64("from-seq", 0, "replay from this CLICKS stream sequence (1 = the oldest retained)")
	wait := fs.Bool("wait", false, "wait until every partition has moved back")
	if err := fs.Parse(args[1:]); err != nil {
		return fmt.Errorf("replay: %v: %w", err, errUsage)
	}
	var pos reader.Position
	set := 0
	if *since > 0 {
		pos, set = reader.FromTime(time.Now().Add(-*since)), set+1
	}
	if *from != "" {
		t, err := time.Parse(time.RFC3339, *from)
		if err != nil {
			return fmt.Errorf("replay: --from %q is not an RFC 3339 time: %w", *from, errUsage)
		}
		pos, set = reader.FromTime(t), set+1
	}
	if *fromSeq > 0 {
		pos, set = reader.FromSeq(*fromSeq), set+1
	}
	if set != 1 {
		return fmt.Errorf("replay: give exactly one of --since, --from, --from-seq: %w", errUsage)
	}
	ctx, cancel := context.WithTimeout(ctx, env.Cfg.Timeout)
	defer cancel()
	js, closeJS, err := connectJetStream(env)
	if err != nil {
		return err
	}
	defer closeJS()
	id, err := reader.Rewind(ctx, js, group, pos)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "replay %s requested for group %s\n", id, group)
	if !*wait {
		fmt.Fprintln(env.Stdout, "each partition moves back when its owner takes the request (a partition with no live member, when one joins)")
		return nil
	}
	if err := reader.WaitRewind(ctx, js, group, id); err != nil {
		return err
	}
	fmt.Fprintln(env.Stdout, "every partition has moved back")
	return nil
}
