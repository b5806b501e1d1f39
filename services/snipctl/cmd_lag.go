package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/snipdev/snip/pkg/reader"
)

// cmdLag prints, per consumer group and partition, how far behind it is:
// the two alarms of a log reader are lag (events not yet handled) and the
// age of the oldest unhandled event.
func cmdLag(ctx context.Context, env *Env, args []string) error {
	ctx, cancel := context.WithTimeout(ctx, env.Cfg.Timeout)
	defer cancel()
	js, closeJS, err := connectJetStream(env)
	if err != nil {
		return err
	}
	defer closeJS()
	groups := args
	if len(groups) == 0 {
		if groups, err = reader.Groups(ctx, js); err != nil {
			return err
		}
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "group\tpartition\tpending\tin flight\toldest unhandled\tack floor\towner pinned\t")
	now := time.Now()
	var unknown []string
	for _, g := range groups {
		lag, err := reader.Lag(ctx, js, g)
		if errors.Is(err, reader.ErrNoGroup) {
			fmt.Fprintf(tw, "%s\t-\tno such group\t\t\t\t\t\n", g)
			unknown = append(unknown, g)
			continue
		}
		if err != nil {
			return err
		}
		for _, pl := range lag {
			age := "-"
			if !pl.OldestUnprocessed.IsZero() {
				age = now.Sub(pl.OldestUnprocessed).Truncate(time.Millisecond).String()
			}
			pinned := "no"
			if pl.Pinned != "" {
				pinned = "yes"
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%d\t%s\t\n", g, pl.Partition, pl.Pending, pl.AckPending, age, pl.AckFloor, pinned)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(unknown) > 0 {
		// The table shows the groups that exist; the exit status says that
		// some asked for do not.
		return fmt.Errorf("lag: no such group: %s", strings.Join(unknown, ", "))
	}
	return nil
}
