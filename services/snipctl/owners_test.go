package main

import (
	"errors"
	"regexp"
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
