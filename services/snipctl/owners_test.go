package main

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/snipdev/snip/pkg/owners"
)

// owners rotate prints a new key that works while the old one stops at
// once; owners revoke stops every key of the owner.
func TestOwnersRotateAndRevoke(t *testing.T) {
	t.Parallel()
	rdb, db := servers.Redis.NewDB(t)
	environ := []string{"REDIS_URL=" + servers.Redis.URL(db)}
	store := owners.NewStore(rdb)
	keyIn := regexp.MustCompile(`api key: (\S+)`)
	out, err := snipctl(t, environ, "owners", "create", "acme")
	if err != nil {
		t.Fatalf("owners create: %v\n%s", err, out)
	}
	old := keyIn.FindStringSubmatch(out)[1]

	out, err = snipctl(t, environ, "owners", "rotate", "acme")
	if err != nil {
		t.Fatalf("owners rotate: %v\n%s", err, out)
	}
	m := keyIn.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no new key in output:\n%s", out)
	}
	if _, err := store.Authenticate(t.Context(), old); !errors.Is(err, owners.ErrUnauthorized) {
		t.Errorf("old key after rotate: %v, want ErrUnauthorized", err)
	}
	if o, err := store.Authenticate(t.Context(), m[1]); err != nil || o.ID != "acme" {
		t.Errorf("new key: %+v, %v", o, err)
	}

	if out, err = snipctl(t, environ, "owners", "revoke", "acme"); err != nil {
		t.Fatalf("owners revoke: %v\n%s", err, out)
	}
	if _, err := store.Authenticate(t.Context(), m[1]); !errors.Is(err, owners.ErrUnauthorized) {
		t.Errorf("key after revoke: %v, want ErrUnauthorized", err)
	}
	if _, err := snipctl(t, environ, "owners", "revoke", "nosuch"); !errors.Is(err, owners.ErrUnknownOwner) {
		t.Errorf("revoke an unknown owner: %v, want ErrUnknownOwner", err)
	}
	for _, args := range [][]string{{"owners", "rotate"}, {"owners", "drop", "acme"}, {"owners", "revoke", "acme", "extra"}} {
		if _, err := snipctl(t, environ, args...); !errors.Is(err, errUsage) {
			t.Errorf("snipctl %v: %v, want a usage error", args, err)
		}
	}
}

// With -wait-replicas each write waits for the Redis replicas; on a Redis
// without any, every write is reported as on the master only, and still
// done. Without the flag nothing waits or warns.
func TestOwnersWaitForReplicas(t *testing.T) {
	t.Parallel()
	rdb, db := servers.Redis.NewDB(t)
	environ := []string{"REDIS_URL=" + servers.Redis.URL(db)}
	out, err := snipctl(t, environ, "owners", "create", "bob", "-name", "Bob", "-wait-replicas", "1")
	if err != nil {
		t.Fatalf("owners create: %v\n%s", err, out)
	}
	if !strings.Contains(out, "warning: 2 write(s) not confirmed") || !strings.Contains(out, "create_owner (0 of 1 replicas") || !strings.Contains(out, "store_key (0 of 1") {
		t.Errorf("owners create -wait-replicas 1 on a Redis without replicas; output:\n%s", out)
	}
	key := regexp.MustCompile(`api key: (\S+)`).FindStringSubmatch(out)[1]
	if o, err := owners.NewStore(rdb).Authenticate(t.Context(), key); err != nil || o.Name != "Bob" {
		t.Fatalf("the key of an owner created with a short wait: %+v, %v", o, err)
	}
	out, err = snipctl(t, environ, "owners", "revoke", "bob", "-wait-replicas", "1")
	if err != nil || !strings.Contains(out, "warning: 1 write(s) not confirmed") || !strings.Contains(out, "revoke_key") {
		t.Errorf("owners revoke -wait-replicas 1: %v; output:\n%s", err, out)
	}
	if out, err = snipctl(t, environ, "owners", "rotate", "bob"); err != nil || strings.Contains(out, "warning") {
		t.Errorf("owners rotate without the flag: %v; output:\n%s", err, out)
	}
	if _, err := snipctl(t, environ, "owners", "revoke", "bob", "-wait-replicas", "-1"); !errors.Is(err, errUsage) {
		t.Errorf("-wait-replicas -1: %v, want a usage error", err)
	}
}

// A flag where the owner ID goes ("owners create -name Acme" without the
// ID, "owners revoke --help") is a usage error that writes nothing: it is
// not taken for an owner named "-name" or "--help" (valid tokens). The
// error tells how to name such an owner: with -- before the ID.
func TestOwnersRefusesAFlagForTheID(t *testing.T) {
	t.Parallel()
	rdb, db := servers.Redis.NewDB(t)
	environ := []string{"REDIS_URL=" + servers.Redis.URL(db)}
	for _, args := range [][]string{
		{"owners", "create", "-name"},
		{"owners", "create", "--help"},
		{"owners", "rotate", "-wait-replicas"},
		{"owners", "revoke", "-h"},
	} {
		out, err := snipctl(t, environ, args...)
		if !errors.Is(err, errUsage) {
			t.Errorf("snipctl %v: err = %v, want a usage error\n%s", args, err, out)
			continue
		}
		if want := "owners " + args[1] + " -- " + args[2]; !strings.Contains(err.Error(), want) {
			t.Errorf("snipctl %v: err = %v, want it to suggest %q", args, err, want)
		}
	}
	for _, args := range [][]string{{"owners", "rotate", "--"}, {"owners", "create", "--", "-x", "extra"}} {
		if out, err := snipctl(t, environ, args...); !errors.Is(err, errUsage) {
			t.Errorf("snipctl %v: err = %v, want a usage error\n%s", args, err, out)
		}
	}
	if n, err := rdb.DBSize(t.Context()).Result(); err != nil || n != 0 {
		t.Errorf("Redis holds %d keys after the refused commands (err %v), want none", n, err)
	}
}

// An owner whose ID starts with "-" is named after "--": it can be
// created, rotated and revoked, and flags still follow the ID.
func TestOwnersIDAfterDoubleDash(t *testing.T) {
	t.Parallel()
	rdb, db := servers.Redis.NewDB(t)
	environ := []string{"REDIS_URL=" + servers.Redis.URL(db)}
	store := owners.NewStore(rdb)
	keyIn := regexp.MustCompile(`api key: (\S+)`)
	out, err := snipctl(t, environ, "owners", "create", "--", "-abc", "-name", "Dash")
	if err != nil {
		t.Fatalf("owners create -- -abc: %v\n%s", err, out)
	}
	old := keyIn.FindStringSubmatch(out)[1]
	if o, err := store.Authenticate(t.Context(), old); err != nil || o.ID != "-abc" || o.Name != "Dash" {
		t.Fatalf("the created owner: %+v, %v; want ID -abc, name Dash", o, err)
	}
	out, err = snipctl(t, environ, "owners", "rotate", "--", "-abc")
	if err != nil {
		t.Fatalf("owners rotate -- -abc: %v\n%s", err, out)
	}
	m := keyIn.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no new key in output:\n%s", out)
	}
	if _, err := store.Authenticate(t.Context(), old); !errors.Is(err, owners.ErrUnauthorized) {
		t.Errorf("old key after rotate: %v, want ErrUnauthorized", err)
	}
	if o, err := store.Authenticate(t.Context(), m[1]); err != nil || o.ID != "-abc" {
		t.Errorf("new key: %+v, %v", o, err)
	}
	if out, err := snipctl(t, environ, "owners", "revoke", "--", "-abc", "-wait-replicas", "0"); err != nil {
		t.Fatalf("owners revoke -- -abc: %v\n%s", err, out)
	}
	if _, err := store.Authenticate(t.Context(), m[1]); !errors.Is(err, owners.ErrUnauthorized) {
		t.Errorf("key after revoke: %v, want ErrUnauthorized", err)
	}
}

// An owner created again is refused, saying what gives it a key now
// (rotate: its first key was printed once, or never if that create failed
// after storing the owner); rotate and revoke of an owner that is not
// there say what creates it.
func TestOwnersErrorsSayWhatToDo(t *testing.T) {
	t.Parallel()
	_, db := servers.Redis.NewDB(t)
	environ := []string{"REDIS_URL=" + servers.Redis.URL(db)}
	if out, err := snipctl(t, environ, "owners", "create", "acme"); err != nil {
		t.Fatalf("owners create: %v\n%s", err, out)
	}
	out, err := snipctl(t, environ, "owners", "create", "acme")
	if !errors.Is(err, owners.ErrExists) || !strings.Contains(err.Error(), "snipctl owners rotate acme") {
		t.Errorf("owners create of an existing owner: err = %v, want ErrExists naming owners rotate acme\n%s", err, out)
	}
	for _, verb := range []string{"rotate", "revoke"} {
		out, err := snipctl(t, environ, "owners", verb, "nosuch")
		if !errors.Is(err, owners.ErrUnknownOwner) || !strings.Contains(err.Error(), "snipctl owners create nosuch") {
			t.Errorf("owners %s of an unknown owner: err = %v, want ErrUnknownOwner naming owners create nosuch\n%s", verb, err, out)
		}
	}
	// An ID that starts with "-" is named the way the command takes it.
	if out, err := snipctl(t, environ, "owners", "rotate", "--", "-x"); !strings.Contains(fmt.Sprint(err), "snipctl owners create -- -x") {
		t.Errorf("owners rotate -- -x: err = %v, want it naming owners create -- -x\n%s", err, out)
	}
}

// A create whose revocation of an earlier cut-off create's key is refused
// still made the owner: snipctl prints its key, exits 1, and says that
// `snipctl owners rotate ID` revokes the keys left. Redis refuses by ACL:
// the cut-off create runs as a user that may neither write the owner (HSET)
// nor take its key back (DEL), the second as one that may not DEL.
//
// The error's command is run as printed, for an ID that starts with "-" too
// (which needs "--" before it): before, it said `snipctl owners rotate
// -leftover`, which snipctl refuses as a misplaced flag.
func TestOwnersCreateThatCannotRevokeLeftoverKeysPrintsItsKey(t *testing.T) {
	t.Parallel()
	for _, id := range []string{"leftover", "-leftover"} {
		t.Run(id, func(t *testing.T) {
			t.Parallel()
			createThatCannotRevokeLeftoverKeys(t, id)
		})
	}
}

func createThatCannotRevokeLeftoverKeys(t *testing.T, id string) {
	rdb, db := servers.Redis.NewDB(t)
	store := owners.NewStore(rdb)
	ctx := t.Context()
	user := func(name string, rules ...string) []string {
		t.Helper()
		name = fmt.Sprintf("%s-%d-%x", name, db, id)
		args := append([]any{"ACL", "SETUSER", name, "reset", "on", ">pw", "~*", "+@all"}, stringsToAny(rules)...)
		if err := rdb.Do(ctx, args...).Err(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = rdb.Do(context.Background(), "ACL", "DELUSER", name).Err() })
		return []string{fmt.Sprintf("REDIS_URL=redis://%s:pw@%s/%d", name, servers.Redis.Addr, db)}
	}

	out, err := snipctl(t, user("cutoff", "-hset", "-del"), "owners", "create", "--", id)
	if err == nil || strings.Contains(out, "api key") {
		t.Fatalf("a create that cannot write the owner: %v\n%s", err, out)
	}
	if _, err := store.Get(ctx, id); !errors.Is(err, owners.ErrUnauthorized) {
		t.Fatalf("the cut-off create made the owner (Get: %v)", err)
	}
	if n, err := rdb.SCard(ctx, "snip:owner:"+id+":keys").Result(); err != nil || n != 1 {
		t.Fatalf("the cut-off create left %d keys (%v), want its own", n, err)
	}

	out, err = snipctl(t, user("nodel", "-del"), "owners", "create", "--", id)
	if !errors.Is(err, owners.ErrLeftoverKeys) || exitStatus(err) != 1 {
		t.Fatalf("create whose revocation of the leftover key is refused: %v (exit %d), want ErrLeftoverKeys, exit 1\n%s", err, exitStatus(err), out)
	}
	cmd := regexp.MustCompile(`snipctl (owners rotate (?:-- )?\S+) revokes`).FindStringSubmatch(err.Error())
	if cmd == nil || !strings.HasSuffix(cmd[1], " "+id) {
		t.Fatalf("the error does not name `snipctl owners rotate %s`: %v", id, err)
	}
	m := regexp.MustCompile(`api key: (\S+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no key printed for the owner made:\n%s", out)
	}
	if o, err := store.Authenticate(ctx, m[1]); err != nil || o.ID != id {
		t.Fatalf("the printed key authenticates as %+v, %v; want %s", o, err, id)
	}

	// What the error says to run leaves only the rotated key.
	out, err = snipctl(t, []string{"REDIS_URL=" + servers.Redis.URL(db)}, strings.Fields(cmd[1])...)
	if err != nil {
		t.Fatalf("%s: %v\n%s", cmd[1], err, out)
	}
	n, err := rdb.SCard(ctx, "snip:owner:"+id+":keys").Result()
	if err != nil || n != 1 {
		t.Errorf("after the rotation the owner's key set holds %d keys (%v), want the rotated key only", n, err)
	}
}

func stringsToAny(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}
