package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/snipdev/snip/pkg/owners"
	"github.com/snipdev/snip/pkg/redisconn"
)

const ownersUsage = "owners create ID [-name NAME] | owners rotate ID | owners revoke ID"

// cmdOwners creates owners and rotates or revokes their API keys. Keys are
// printed once: Redis keeps only their hashes. A rotated or revoked key
// fails at its next use in every service (none caches keys).
func cmdOwners(ctx context.Context, env *Env, args []string) error {
	if len(args) < 2 {
		return fmt.Errorf("%s: %w", ownersUsage, errUsage)
	}
	verb, id := args[0], args[1]
	name := id
	switch verb {
	case "create":
		fs := flag.NewFlagSet("owners create", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		n := fs.String("name", id, "display name")
		if err := fs.Parse(args[2:]); err != nil {
			return fmt.Errorf("owners create: %v: %w", err, errUsage)
		}
		name = *n
	case "rotate", "revoke":
		if len(args) > 2 {
			return fmt.Errorf("%s: %w", ownersUsage, errUsage)
		}
	default:
		return fmt.Errorf("%s: %w", ownersUsage, errUsage)
	}
	ctx, cancel := context.WithTimeout(ctx, env.Cfg.Timeout)
	defer cancel()
	rdb, err := redisconn.Open(env.Cfg.Redis.URL)
	if err != nil {
		return err
	}
	defer rdb.Close()
	store := owners.NewStore(rdb)
	switch verb {
	case "create":
		key, err := store.Create(ctx, id, name)
		if err != nil {
			return err
		}
		fmt.Fprintf(env.Stdout, "owner %s created\napi key: %s\n(store it now: Snip keeps only its hash)\n", id, key)
	case "rotate":
		key, err := store.Rotate(ctx, id)
		if err != nil {
			return err
		}
		fmt.Fprintf(env.Stdout, "owner %s: new api key: %s\n(store it now: Snip keeps only its hash; every older key of %s no longer works)\n", id, key, id)
	case "revoke":
		n, err := store.Revoke(ctx, id)
		if err != nil {
			return err
		}
		fmt.Fprintf(env.Stdout, "owner %s: %d api key(s) revoked; none works now (owners rotate %s gives a new one)\n", id, n, id)
	}
	return nil
}
