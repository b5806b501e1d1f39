package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/snipdev/snip/pkg/reader"
)

// cmdLag prints, per consumer group and partition, how far behind it is:
// the two alarms of a log reader are lag (events not yet handled) and the
// age of the oldest unhandled event.
func cmdLag(ctx context.Context, env *Env, args []string) error {
	for _, a := range args {
		if strings.HasPrefix(a, "-") {
			// lag takes no flags (-h, --json): as a group name it would
			// only be "no such group".
			return fmt.Errorf("lag [GROUP...]: %q: lag takes group names, no flags: %w", a, errUsage)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, env.Cfg.Timeout)
	defer cancel()
	js, closeJS, err := connectJetStream(env)
	if err != nil {
		return err
	}
	defer closeJS()
	groups := args
	var all map[string][]reader.PartitionLag // every group's, from one listing, when none is named
	if len(groups) == 0 {
		if all, err = reader.LagAll(ctx, js); err != nil {
			return err
		}
		groups = slices.Sorted(maps.Keys(all))
		if len(groups) == 0 {
			// A header alone reads as a table that failed to fill.
			fmt.Fprintln(env.Stdout, "no consumer groups on CLICKS yet: a group appears when its first member (a reader service) starts")
			return nil
		}
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "group\tpartition\tpending\tin flight\toldest unhandled\tack floor\towner pinned\t")
	now := time.Now()
	var unknown []string
	for _, g := range groups {
		lag, err := all[g], error(nil)
		if all == nil {
			lag, err = reader.Lag(ctx, js, g)
		}
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
