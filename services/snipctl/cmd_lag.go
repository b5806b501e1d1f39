package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
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
		if groups, err = clickGroups(ctx, js); err != nil {
			return err
		}
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "group\tpartition\tpending\tin flight\toldest unhandled\tack floor\towner pinned\t")
	now := time.Now()
	for _, g := range groups {
		lag, err := reader.Lag(ctx, js, g)
		if errors.Is(err, reader.ErrNoGroup) {
			fmt.Fprintf(tw, "%s\t-\tno such group\t\t\t\t\t\n", g)
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
	return tw.Flush()
}

// clickGroups lists the consumer groups that have consumers on CLICKS.
func clickGroups(ctx context.Context, js jetstream.JetStream) ([]string, error) {
	s, err := js.Stream(ctx, events.ClicksStream)
	if err != nil {
		return nil, fmt.Errorf("list groups: %w", err)
	}
	seen := map[string]bool{}
	l := s.ListConsumers(ctx)
	for ci := range l.Info() {
		if g := ci.Config.Metadata["snip.group"]; g != "" {
			seen[g] = true
		}
	}
	if err := l.Err(); err != nil {
		return nil, fmt.Errorf("list groups: %w", err)
	}
	groups := make([]string, 0, len(seen))
	for g := range seen {
		groups = append(groups, g)
	}
	slices.Sort(groups)
	return groups, nil
}
