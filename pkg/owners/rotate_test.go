package owners_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/owners"
	"github.com/snipdev/snip/pkg/testenv"
)

// Rotating gives a working key and the old one fails at once; revoking makes
// every key of the owner fail, including a key stored before owners kept a
// set of their keys; other owners are untouched.
func TestRotateAndRevoke(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	s := owners.NewStore(rdb)
	ctx := t.Context()
	first, err := s.Create(ctx, "acme", "Acme")
	if err != nil {
		t.Fatal(err)
	}
	other, err := s.Create(ctx, "globex", "Globex")
	if err != nil {
		t.Fatal(err)
	}
	second, err := s.Rotate(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if second == first {
		t.Fatal("rotate returned the same key")
	}
	if _, err := s.Authenticate(ctx, first); !errors.Is(err, owners.ErrUnauthorized) {
		t.Errorf("old key after rotate: %v, want ErrUnauthorized", err)
	}
	if o, err := s.Authenticate(ctx, second); err != nil || o.ID != "acme" {
		t.Errorf("new key: %+v %v", o, err)
	}

	// A key stored the old way (no set member), as a deployment from before
	// rotation would have it.
	const legacy = "snip_legacy_key_0123456789abcdef"
	legacyHash := "snip:apikey:" + sha256hex(legacy)
	if err := rdb.Set(ctx, legacyHash, "acme", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(ctx, legacy); err != nil {
		t.Fatal(err)
	}
	n, err := s.Revoke(ctx, "acme")
	if err != nil || n != 2 {
		t.Fatalf("Revoke = %d, %v; want 2 keys", n, err)
	}
	for _, k := range []string{first, second, legacy} {
		if _, err := s.Authenticate(ctx, k); !errors.Is(err, owners.ErrUnauthorized) {
			t.Errorf("key after revoke: %v, want ErrUnauthorized", err)
		}
	}
	if o, err := s.Authenticate(ctx, other); err != nil || o.ID != "globex" {
		t.Errorf("another owner's key after acme's revoke: %+v %v", o, err)
	}
	// The owner stays and can get a key again.
	again, err := s.Rotate(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(ctx, again); err != nil {
		t.Errorf("key after revoke and rotate: %v", err)
	}
	if _, err := s.Rotate(ctx, "nosuch"); !errors.Is(err, owners.ErrUnknownOwner) {
		t.Errorf("rotate an unknown owner: %v, want ErrUnknownOwner", err)
	}
	if _, err := s.Revoke(ctx, "nosuch"); !errors.Is(err, owners.ErrUnknownOwner) {
		t.Errorf("revoke an unknown owner: %v, want ErrUnknownOwner", err)
	}
}

// A rotation that comes between Revoke's read of the owner's keys and its
// deletes, with a key that still works then, leaves no key once Revoke has
// returned: Revoke reads the set again and revokes what was stored
// meanwhile. A rotation whose key Revoke deleted first gets
// ErrUnauthorized and no key.
func TestRevokeAlsoRevokesAKeyRotatedInMeanwhile(t *testing.T) {
	testenv.Parallel(t)
	s := owners.NewStore(servers.RedisClient(t))
	ctx := t.Context()
	first, err := s.Create(ctx, "acme", "Acme")
	if err != nil {
		t.Fatal(err)
	}
	var rotated string
	var rotateErr error
	owners.BeforeRevoke(s, func() {
		if rotated == "" && rotateErr == nil {
			rotated, rotateErr = s.RotateFrom(ctx, "acme", first)
		}
	})
	n, err := s.Revoke(ctx, "acme")
	if err != nil || rotateErr != nil {
		t.Fatalf("Revoke = %d, %v; the rotation in its window: %v", n, err, rotateErr)
	}
	if n != 2 {
		t.Errorf("Revoke = %d keys, want 2 (the first and the one rotated in meanwhile)", n)
	}
	for _, k := range []string{first, rotated} {
		if _, err := s.Authenticate(ctx, k); !errors.Is(err, owners.ErrUnauthorized) {
			t.Errorf("key after revoke: %v, want ErrUnauthorized", err)
		}
	}
	owners.BeforeRevoke(s, nil)
	if _, err := s.RotateFrom(ctx, "acme", first); !errors.Is(err, owners.ErrUnauthorized) {
		t.Errorf("rotation with the revoked key: %v, want ErrUnauthorized", err)
	}
	if n, err := s.Revoke(ctx, "acme"); err != nil || n != 0 {
		t.Errorf("a second Revoke found %d keys (%v): the refused rotation left one behind", n, err)
	}
}

// The limit allows Max calls per window per owner, says how long until the
// next window, and counts each owner apart.
func TestLimit(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	l := owners.NewLimit(rdb, "links.create", 3, time.Minute)
	ctx := t.Context()
	now := time.Date(2026, 3, 1, 12, 0, 10, 0, time.UTC)
	for i := range 3 {
		if ok, _, err := l.Allow(ctx, "acme", now); !ok || err != nil {
			t.Fatalf("call %d: %v %v", i+1, ok, err)
		}
	}
	ok, wait, err := l.Allow(ctx, "acme", now)
	if ok || err != nil || wait != 50*time.Second {
		t.Fatalf("fourth call: %v, wait %s, %v; want refused with 50s to wait", ok, wait, err)
	}
	if ok, _, _ := l.Allow(ctx, "globex", now); !ok {
		t.Error("another owner refused")
	}
	if ok, _, _ := l.Allow(ctx, "acme", now.Add(50*time.Second)); !ok {
		t.Error("refused in the next window")
	}
	if ok, _, _ := owners.NewLimit(rdb, "x", 0, time.Minute).Allow(ctx, "acme", now); !ok {
		t.Error("no limit (max 0) refused")
	}
}

func sha256hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// Once a rotation has revoked its caller's key, the new key is the caller's
// only one: a failure revoking the owner's other keys after that still
// returns it (with the error), or the owner would be locked out. The
// failure is forced by giving another key's entry the wrong type just then.
func TestRotateFromReturnsTheNewKeyWhenOnlyTheOtherKeysFail(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	s := owners.NewStore(rdb)
	ctx := t.Context()
	first, err := s.Create(ctx, "acme", "Acme")
	if err != nil {
		t.Fatal(err)
	}
	other := sha256hex("another key of acme")
	if err := rdb.SAdd(ctx, "snip:owner:acme:keys", other).Err(); err != nil {
		t.Fatal(err)
	}
	var hookErr error
	owners.AfterClaim(s, func() { hookErr = rdb.HSet(ctx, "snip:apikey:"+other, "not", "a string").Err() })
	key, err := s.RotateFrom(ctx, "acme", first)
	if hookErr != nil {
		t.Fatal(hookErr)
	}
	if err == nil || key == "" {
		t.Fatalf("RotateFrom = %q, %v; want the new key and the error revoking the other", key, err)
	}
	if o, err := s.Authenticate(ctx, key); err != nil || o.ID != "acme" {
		t.Errorf("the new key: %+v %v", o, err)
	}
	if _, err := s.Authenticate(ctx, first); !errors.Is(err, owners.ErrUnauthorized) {
		t.Errorf("the caller's key: %v, want ErrUnauthorized", err)
	}
}

// An operator's rotation is the owner's only key once it returns: a
// rotation through the API that comes between its read of the owner's keys
// and its deletes, with a key that still works then, keeps nothing (the
// operator rotating after a leak would otherwise leave the leaker a key).
func TestRotateAlsoRevokesAKeyRotatedInMeanwhile(t *testing.T) {
	testenv.Parallel(t)
	s := owners.NewStore(servers.RedisClient(t))
	ctx := t.Context()
	first, err := s.Create(ctx, "acme", "Acme")
	if err != nil {
		t.Fatal(err)
	}
	var leaked string
	var leakErr error
	owners.BeforeRevoke(s, func() {
		if leaked == "" && leakErr == nil {
			leaked, leakErr = s.RotateFrom(ctx, "acme", first)
		}
	})
	key, err := s.Rotate(ctx, "acme")
	if err != nil || leakErr != nil {
		t.Fatalf("Rotate: %v; the rotation in its window: %v", err, leakErr)
	}
	for _, k := range []string{first, leaked} {
		if _, err := s.Authenticate(ctx, k); !errors.Is(err, owners.ErrUnauthorized) {
			t.Errorf("a key other than the operator's after Rotate: %v, want ErrUnauthorized", err)
		}
	}
	if o, err := s.Authenticate(ctx, key); err != nil || o.ID != "acme" {
		t.Errorf("the operator's new key: %+v %v", o, err)
	}
}
