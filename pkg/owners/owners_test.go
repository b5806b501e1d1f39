package owners_test

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/snipdev/snip/pkg/owners"
	"github.com/snipdev/snip/pkg/testenv"
)

var servers *testenv.Servers

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, &servers, testenv.WithRedis(), testenv.WithRedisCluster()))
}

// TestOnRedisCluster runs the store's tests on a Redis Cluster.
func TestOnRedisCluster(t *testing.T) {
	servers.RunOnRedisCluster(t, TestCreateAndAuthenticate, TestAuthenticateRejects,
		TestEnsureFromSpecIsIdempotent, TestRotateAndRevoke, TestLimit)
}

func TestCreateAndAuthenticate(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	s := owners.NewStore(rdb)
	ctx := t.Context()
	key, err := s.Create(ctx, "acme", "Acme Inc")
	if err != nil {
		t.Fatal(err)
	}
	o, err := s.Authenticate(ctx, key)
	if err != nil || o.ID != "acme" || o.Name != "Acme Inc" {
		t.Fatalf("Authenticate = %+v, %v; want acme", o, err)
	}
	// The key is stored hashed: no Redis value or key contains it.
	keys := testenv.Keys(t, rdb, "*")
	for _, k := range keys {
		v, _ := rdb.Dump(ctx, k).Result()
		if strings.Contains(k, key) || strings.Contains(v, key) {
			t.Fatalf("API key found in clear in Redis key %q", k)
		}
	}
	if _, err := s.Create(ctx, "acme", "again"); !errors.Is(err, owners.ErrExists) {
		t.Fatalf("second Create err = %v, want ErrExists", err)
	}
}

func TestAuthenticateRejects(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	s := owners.NewStore(rdb)
	for _, key := range []string{"", "Bearer x", "snip_unknownunknownunknown", "nope"} {
		if _, err := s.Authenticate(t.Context(), key); !errors.Is(err, owners.ErrUnauthorized) {
			t.Errorf("Authenticate(%q) err = %v, want ErrUnauthorized", key, err)
		}
	}
	if _, err := s.Create(t.Context(), "bad.id", "x"); !errors.Is(err, owners.ErrInvalidID) {
		t.Errorf("Create(bad.id) err = %v, want ErrInvalidID", err)
	}
}

func TestEnsureFromSpecIsIdempotent(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	s := owners.NewStore(rdb)
	spec := "demo:snip_demo_key_0123456789abcdef, other:snip_other_key_0123456789abcdef"
	for range 2 {
		if err := s.EnsureFromSpec(t.Context(), spec); err != nil {
			t.Fatal(err)
		}
	}
	o, err := s.Authenticate(t.Context(), "snip_other_key_0123456789abcdef")
	if err != nil || o.ID != "other" {
		t.Fatalf("Authenticate = %+v, %v", o, err)
	}
	if err := s.EnsureFromSpec(t.Context(), "nocolon"); err == nil {
		t.Fatal("EnsureFromSpec accepted a pair without a key")
	}
}

func TestBearerKey(t *testing.T) {
	t.Parallel()
	tests := map[string]string{"Bearer abc": "abc", "bearer  abc ": "abc", "Basic abc": "", "Bearer": "", "": ""}
	for in, want := range tests {
		if got := owners.BearerKey(in); got != want {
			t.Errorf("BearerKey(%q) = %q, want %q", in, got, want)
		}
	}
}
