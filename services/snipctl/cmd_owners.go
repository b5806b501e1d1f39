package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/snipdev/snip/pkg/owners"
	"github.com/snipdev/snip/pkg/redisconn"
)

func cmdOwners(ctx context.Context, env *Env, args []string) error {
	if len(args) < 2 || args[0] != "create" {
		return fmt.Errorf("owners create ID [-name NAME]: %w", errUsage)
	}
	id := args[1]
	fs := flag.NewFlagSet("owners create", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	name := fs.String("name", id, "display name")
	if err := fs.Parse(args[2:]); err != nil {
		return fmt.Errorf("owners create: %v: %w", err, errUsage)
	}
	ctx, cancel := context.WithTimeout(ctx, env.Cfg.Timeout)
	defer cancel()
	rdb, err := redisconn.Open(env.Cfg.RedisURL)
	if err != nil {
		return err
	}
	defer rdb.Close()
	key, err := owners.NewStore(rdb).Create(ctx, id, *name)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "owner %s created\napi key: %s\n(store it now: Snip keeps only its hash)\n", id, key)
	return nil
}
