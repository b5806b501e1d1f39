package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/snipdev/snip/pkg/owners"
	"github.com/snipdev/snip/pkg/redisconn"
)

const ownersUsage = "owners create [--] ID [-name NAME] [-wait-replicas N] | owners rotate [--] ID [-wait-replicas N] | owners revoke [--] ID [-wait-replicas N]"

// ownersWaitTimeout bounds each write's wait for Redis replicas.
const ownersWaitTimeout = time.Second

// cmdOwners creates owners and rotates or revokes their API keys. Keys are
// printed once: Redis keeps only their hashes. A rotated or revoked key
// fails at its next use in every service (none caches keys). With
// -wait-replicas N each write waits for N replicas of its Redis master, so
// a failover cannot bring a revoked key back; a write they did not confirm
// within a second is reported.
//
// The ID comes before the flags. An ID that starts with "-" is refused as a
// misplaced flag unless "--" stands before it ("owners rotate -- -abc"), so
// an owner with such an ID can still be named.
func cmdOwners(ctx context.Context, env *Env, args []string) error {
	if len(args) < 2 {
		return fmt.Errorf("%s: %w", ownersUsage, errUsage)
	}
	verb, id, rest := args[0], args[1], args[2:]
	switch verb {
	case "create", "rotate", "revoke":
	default:
		return fmt.Errorf("%s: %w", ownersUsage, errUsage)
	}
	switch {
	case id == "--":
		// "--" ends the flags: the next word is the ID, whatever it
		// starts with.
		if len(rest) == 0 {
			return fmt.Errorf("owners %s: no owner ID after --: %s: %w", verb, ownersUsage, errUsage)
		}
		id, rest = rest[0], rest[1:]
	case strings.HasPrefix(id, "-"):
		// A flag where the ID goes ("owners create -name Acme" without
		// the ID): "-name" is a valid owner ID, and would be created.
		return fmt.Errorf("owners %s: the owner ID comes first, before the flags (got %q; for an ID that starts with -, put -- before it: owners %s -- %s): %s: %w", verb, id, verb, id, ownersUsage, errUsage)
	}
	fs := flag.NewFlagSet("owners "+verb, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var name *string
	if verb == "create" {
		name = fs.String("name", id, "display name")
	}
	replicas := fs.Int("wait-replicas", 0, "replicas of each Redis master every write waits for (0: none)")
	switch err := fs.Parse(rest); {
	case err != nil:
		return fmt.Errorf("owners %s: %v: %s: %w", verb, err, ownersUsage, errUsage)
	case fs.NArg() > 0:
		return fmt.Errorf("owners %s %s: unexpected arguments %q (one owner at a time, flags after its ID): %s: %w", verb, id, fs.Args(), ownersUsage, errUsage)
	case *replicas < 0:
		return fmt.Errorf("owners %s: -wait-replicas %d: want 0 (no wait) or more: %s: %w", verb, *replicas, ownersUsage, errUsage)
	}
	ctx, cancel := context.WithTimeout(ctx, env.Cfg.Timeout)
	defer cancel()
	rdb, err := redisconn.Open(env.Cfg.Redis.URL)
	if err != nil {
		return err
	}
	defer rdb.Close()
	store := owners.NewStore(rdb)
	var short []string
	if *replicas > 0 {
		store.WaitForReplicas(*replicas, ownersWaitTimeout, func(op string, got int64, err error) {
			short = append(short, fmt.Sprintf("%s (%d of %d replicas, err %v)", op, got, *replicas, err))
		})
	}
	defer func() {
		if len(short) > 0 {
			fmt.Fprintf(env.Stdout, "warning: %d write(s) not confirmed by the Redis replicas within %s: %s; they are on the master only until its replicas catch up\n",
				len(short), ownersWaitTimeout, strings.Join(short, ", "))
		}
	}()
	switch verb {
	case "create":
		key, err := store.Create(ctx, id, *name)
		if errors.Is(err, owners.ErrExists) {
			// Its key was printed when it was created (a create that
			// failed stored no owner: it is stored last, once its key
			// is, and the same command again makes it): what gives it
			// one now is a rotation.
			return fmt.Errorf("%w: a key is printed only when it is made; `snipctl owners rotate %s` gives the owner a new one (every older key of it stops working)", err, idArg(id))
		}
		if err != nil && key == "" {
			return err
		}
		fmt.Fprintf(env.Stdout, "owner %s created\napi key: %s\n(store it now: Snip keeps only its hash)\n", id, key)
		if err != nil {
			// Made, with the key printed; what an earlier create that
			// was cut off stored is left (owners.ErrLeftoverKeys).
			return err
		}
	case "rotate":
		key, err := store.Rotate(ctx, id)
		if err != nil {
			return ownersUnknown(err, id)
		}
		fmt.Fprintf(env.Stdout, "owner %s: new api key: %s\n(store it now: Snip keeps only its hash; every older key of %s no longer works)\n", id, key, id)
	case "revoke":
		n, err := store.Revoke(ctx, id)
		if err != nil {
			return ownersUnknown(err, id)
		}
		fmt.Fprintf(env.Stdout, "owner %s: %d api key(s) revoked; none works now (owners rotate %s gives a new one)\n", id, n, idArg(id))
	}
	return nil
}

// ownersUnknown adds to an error for an owner that is not there what
// creates it.
func ownersUnknown(err error, id string) error {
	if errors.Is(err, owners.ErrUnknownOwner) {
		return fmt.Errorf("%w: `snipctl owners create %s` creates it (and prints its key)", err, idArg(id))
	}
	return err
}

// idArg is id as the owners commands take it: after "--" when it starts
// with "-".
func idArg(id string) string {
	if strings.HasPrefix(id, "-") {
		return "-- " + id
	}
	return id
}
