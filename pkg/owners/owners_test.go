package owners_test

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/owners"
	"github.com/snipdev/snip/pkg/testenv"
)

var servers *testenv.Servers

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, &servers, testenv.WithRedis(), testenv.WithRedisCluster()))
}

// onServer is a database of its own on the shared redis-server.
func onServer(t *testing.T) redis.UniversalClient {
	rdb, _ := servers.Redis.NewDB(t)
	return rdb
}

// TestOnRedisCluster runs the store's tests on the shared Redis Cluster.
func TestOnRedisCluster(t *testing.T) {
	for name, f := range map[string]func(*testing.T, redis.UniversalClient){
		"CreateAndAuthenticate":      testCreateAndAuthenticate,
		"AuthenticateRejects":        testAuthenticateRejects,
		"EnsureFromSpecIsIdempotent": testEnsureFromSpecIsIdempotent,
		"RotateAndRevoke":            testRotateAndRevoke,
		"Limit":                      testLimit,
	} {
		t.Run(name, func(t *testing.T) { f(t, servers.RedisCluster.Client(t)) })
	}
}

func TestCreateAndAuthenticate(t *testing.T) {
	t.Parallel()
	testCreateAndAuthenticate(t, onServer(t))
}

func testCreateAndAuthenticate(t *testing.T, rdb redis.UniversalClient) {
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
	keys, _ := rdb.Keys(ctx, "*").Result()
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
	t.Parallel()
	testAuthenticateRejects(t, onServer(t))
}

func testAuthenticateRejects(t *testing.T, rdb redis.UniversalClient) {
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
	t.Parallel()
	testEnsureFromSpecIsIdempotent(t, onServer(t))
}

func testEnsureFromSpecIsIdempotent(t *testing.T, rdb redis.UniversalClient) {
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
