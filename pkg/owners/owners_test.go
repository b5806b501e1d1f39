package owners_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

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
		TestEnsureFromSpecIsIdempotent, TestRotateAndRevoke, TestLimit, TestWritesWaitForReplicas,
		TestEnsureNeverMovesAKeyToAnotherOwner, TestEnsureFromSpecRefusesAKeyOfAnotherOwnerAndWritesNothing,
		TestStoreKeyRefusesAKeyTakenMeanwhile, TestEnsureRefusesAKeyAuthenticateRejects,
		TestEnsureFromSpecChecksEveryEntryFirstAndHidesKeys, TestRevokeAlsoRevokesAKeyRotatedInMeanwhile,
		TestRotateFromReturnsTheNewKeyWhenOnlyTheOtherKeysFail, TestRotateAlsoRevokesAKeyRotatedInMeanwhile,
		TestACreateCutOffAfterItsFirstWriteCanBeMadeAgain)
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

// TestWritesWaitForReplicas: with the replica wait on, an owner created, a
// key stored and a key revoked are on the replica of their master when the
// call returns. On Redis Cluster no wait falls short and the replica agrees
// at once (a revoked key is gone there too); on a single Redis (no replica)
// every wait falls short, is reported, and the writes stand on the master.
func TestWritesWaitForReplicas(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	ctx := t.Context()
	timeout, cluster := testenv.ReplicaWaitTimeout(rdb)
	s := owners.NewStore(rdb)
	var shorts testenv.ShortWaits
	s.WaitForReplicas(1, timeout, shorts.Record)
	first, err := s.Create(ctx, "waiter", "Waiter")
	if err != nil {
		t.Fatal(err)
	}
	second, err := s.Rotate(ctx, "waiter")
	if err != nil {
		t.Fatal(err)
	}
	if n, err := s.Revoke(ctx, "waiter"); err != nil || n != 1 {
		t.Fatalf("Revoke = %d, %v; want 1", n, err)
	}
	for _, key := range []string{first, second} {
		if _, err := s.Authenticate(ctx, key); !errors.Is(err, owners.ErrUnauthorized) {
			t.Fatalf("a revoked key authenticates: %v", err)
		}
	}
	if cluster {
		for _, key := range []string{first, second} {
			entry := "snip:apikey:" + sha256hex(key)
			if n := servers.RedisCluster.ReplicaClient(t, entry).Exists(ctx, entry).Val(); n != 0 {
				t.Errorf("the replica still has a revoked key's entry when Revoke returned")
			}
		}
		if n := servers.RedisCluster.ReplicaClient(t, "snip:owner:waiter").Exists(ctx, "snip:owner:waiter").Val(); n != 1 {
			t.Errorf("the replica does not have the owner")
		}
	}
	want := []string{
		"store_key:0:<nil>", "create_owner:0:<nil>", // Create: the key, then the owner
		"revoke_key:0:<nil>", "store_key:0:<nil>", // Rotate: the first revoked, the new key
		"revoke_key:0:<nil>", // Revoke: the second
	}
	if cluster {
		want = nil
	}
	if d := cmp.Diff(want, shorts.Got()); d != "" {
		t.Errorf("short waits reported (-want +got):\n%s", d)
	}
}

// Ensure refuses a key that Authenticate would never accept (over 128
// characters), rather than storing a key that cannot log in.
func TestEnsureRefusesAKeyAuthenticateRejects(t *testing.T) {
	testenv.Parallel(t)
	s := owners.NewStore(servers.RedisClient(t))
	long := owners.KeyPrefix + strings.Repeat("a", 124) // 129 characters
	if err := s.Ensure(t.Context(), "longkey", long); err == nil {
		_, aerr := s.Authenticate(t.Context(), long)
		t.Fatalf("Ensure accepted a %d-character key; Authenticate then says %v", len(long), aerr)
	}
}

// A bad entry in a bootstrap spec is refused before anything is written,
// and the error names the entry by its place, never by its text (a key).
func TestEnsureFromSpecChecksEveryEntryFirstAndHidesKeys(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	s := owners.NewStore(rdb)
	const secret = "snip_secret_key_0123456789abcdef"
	for _, spec := range []string{
		"first:snip_first_key_0123456789abcdef, " + secret,        // no id
		"first:snip_first_key_0123456789abcdef, bad.id:" + secret, // id not a token
		"first:snip_first_key_0123456789abcdef, x:" + secret[:10], // key too short
	} {
		err := s.EnsureFromSpec(t.Context(), spec)
		if err == nil || !strings.Contains(err.Error(), "entry 2") {
			t.Errorf("EnsureFromSpec(%q) = %v, want an error naming entry 2", spec, err)
		}
		if err != nil && strings.Contains(err.Error(), secret[:10]) {
			t.Errorf("EnsureFromSpec error shows the key: %v", err)
		}
	}
	if keys := testenv.Keys(t, rdb, "snip:owner:first*"); len(keys) != 0 {
		t.Fatalf("a refused spec wrote %v", keys)
	}
}

// Ensure never moves a key from the owner it belongs to: an operator's
// typo or a copied line would have another owner's integrations act as
// this one. The same owner and key again is fine.
func TestEnsureNeverMovesAKeyToAnotherOwner(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	s := owners.NewStore(rdb)
	const key = "snip_taken_key_0123456789abcdef"
	for range 2 {
		if err := s.Ensure(t.Context(), "keeper", key); err != nil {
			t.Fatalf("Ensure of the owner's own key: %v", err)
		}
	}
	err := s.Ensure(t.Context(), "taker", key)
	if !errors.Is(err, owners.ErrKeyTaken) {
		t.Fatalf("Ensure of another owner's key = %v, want ErrKeyTaken", err)
	}
	if strings.Contains(err.Error(), key[5:15]) {
		t.Errorf("Ensure error shows the key: %v", err)
	}
	if o, err := s.Authenticate(t.Context(), key); err != nil || o.ID != "keeper" {
		t.Errorf("the key authenticates as %+v, %v; want keeper", o, err)
	}
	if keys := testenv.Keys(t, rdb, "snip:owner:taker*"); len(keys) != 0 {
		t.Errorf("a refused Ensure wrote %v", keys)
	}
}

// A bootstrap spec with a key that belongs to another owner, in Redis or
// earlier in the spec, is refused naming the entry by its place, never the
// key, and nothing of it is written.
func TestEnsureFromSpecRefusesAKeyOfAnotherOwnerAndWritesNothing(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	s := owners.NewStore(rdb)
	const taken, fresh = "snip_taken_key_0123456789abcdef", "snip_fresh_key_0123456789abcdef"
	if err := s.Ensure(t.Context(), "holder", taken); err != nil {
		t.Fatal(err)
	}
	tests := []struct{ name, spec, entry string }{
		{"key_of_an_owner_in_redis", "newcomer:" + fresh + ", typo:" + taken, "entry 2"},
		{"one_key_for_two_owners_in_the_spec", "newcomer:" + fresh + ", holder:" + taken + ", copied:" + fresh, "entry 3"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := s.EnsureFromSpec(t.Context(), tc.spec)
			if !errors.Is(err, owners.ErrKeyTaken) || !strings.Contains(err.Error(), tc.entry) {
				t.Fatalf("EnsureFromSpec = %v, want ErrKeyTaken naming %s", err, tc.entry)
			}
			if strings.Contains(err.Error(), "_key_0123") {
				t.Errorf("EnsureFromSpec error shows a key: %v", err)
			}
			for _, id := range []string{"newcomer", "typo", "copied"} {
				if keys := testenv.Keys(t, rdb, "snip:owner:"+id+"*"); len(keys) != 0 {
					t.Errorf("a refused spec wrote %v", keys)
				}
			}
			if _, err := s.Authenticate(t.Context(), fresh); !errors.Is(err, owners.ErrUnauthorized) {
				t.Errorf("a refused spec's new key authenticates: %v", err)
			}
			if o, err := s.Authenticate(t.Context(), taken); err != nil || o.ID != "holder" {
				t.Errorf("the taken key authenticates as %+v, %v; want holder", o, err)
			}
		})
	}
	if err := s.EnsureFromSpec(t.Context(), "holder:"+taken+", holder:"+taken); err != nil {
		t.Errorf("a spec that repeats an owner's own key: %v", err)
	}
}

// The write itself refuses another owner's key, for a writer that comes
// between Ensure's check and its write (two services bootstrapping at once
// with different specs), and takes its set member back.
func TestStoreKeyRefusesAKeyTakenMeanwhile(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	s := owners.NewStore(rdb)
	const key = "snip_raced_key_0123456789abcdef"
	if err := s.Ensure(t.Context(), "first", key); err != nil {
		t.Fatal(err)
	}
	if err := owners.StoreKey(s, t.Context(), "second", key); !errors.Is(err, owners.ErrKeyTaken) {
		t.Fatalf("storeKey of another owner's key = %v, want ErrKeyTaken", err)
	}
	if o, err := s.Authenticate(t.Context(), key); err != nil || o.ID != "first" {
		t.Errorf("the key authenticates as %+v, %v; want first", o, err)
	}
	if n := rdb.SCard(t.Context(), "snip:owner:second:keys").Val(); n != 0 {
		t.Errorf("second's key set has %d members after the refused write", n)
	}
}

// cutAfterFirstWrite fails every command of its client, while on, once one
// write has succeeded: Redis out of reach between a call's writes.
type cutAfterFirstWrite struct {
	on, wrote atomic.Bool
}

var errCut = errors.New("redis out of reach (test)")

func (c *cutAfterFirstWrite) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *cutAfterFirstWrite) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if err := c.pass([]redis.Cmder{cmd}); err != nil {
			return err
		}
		err := next(ctx, cmd)
		c.note([]redis.Cmder{cmd})
		return err
	}
}

func (c *cutAfterFirstWrite) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if err := c.pass(cmds); err != nil {
			return err
		}
		err := next(ctx, cmds)
		c.note(cmds)
		return err
	}
}

func (c *cutAfterFirstWrite) pass(cmds []redis.Cmder) error {
	if c.on.Load() && c.wrote.Load() {
		for _, cmd := range cmds {
			cmd.SetErr(errCut)
		}
		return errCut
	}
	return nil
}

func (c *cutAfterFirstWrite) note(cmds []redis.Cmder) {
	for _, cmd := range cmds {
		switch cmd.Name() {
		case "hset", "hsetnx", "sadd", "set", "eval", "evalsha":
			if cmd.Err() == nil && c.on.Load() {
				c.wrote.Store(true)
			}
		}
	}
}

// A Create whose Redis goes out of reach after its first write fails, and
// leaves no owner: the same Create made again succeeds, and its key
// authenticates. It stored the owner first, and then the owner had no key
// and the Create again was ErrExists (use rotate).
func TestACreateCutOffAfterItsFirstWriteCanBeMadeAgain(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	cut := &cutAfterFirstWrite{}
	rdb.AddHook(cut)
	s := owners.NewStore(rdb)
	ctx := t.Context()
	cut.on.Store(true)
	if _, err := s.Create(ctx, "cutoff", "Cut Off"); !errors.Is(err, errCut) {
		t.Fatalf("Create with Redis cut off after its first write: %v, want it to fail", err)
	}
	cut.on.Store(false)
	if _, err := s.Get(ctx, "cutoff"); !errors.Is(err, owners.ErrUnauthorized) {
		t.Errorf("the failed Create left an owner (Get: %v)", err)
	}
	key, err := s.Create(ctx, "cutoff", "Cut Off")
	if err != nil {
		t.Fatalf("the same Create again: %v (want it made, with a key)", err)
	}
	if o, err := s.Authenticate(ctx, key); err != nil || o.ID != "cutoff" || o.Name != "Cut Off" || o.Created.IsZero() {
		t.Errorf("the new owner's key authenticates as %+v, %v; want cutoff, named, with its creation time", o, err)
	}
}

// refuseWritesAfter makes a real Redis refuse every write from the moment
// a command of its client that step matches has succeeded: it sets
// min-replicas-to-write 1 on a server with no replica, so each write after
// it gets NOREPLICAS, as a master that lost its replicas answers. Redis
// failing at that step of a call.
type refuseWritesAfter struct {
	admin *redis.Client
	step  func(redis.Cmder) bool
	done  atomic.Bool
}

func (f *refuseWritesAfter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (f *refuseWritesAfter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		f.after(ctx, cmd)
		return err
	}
}

func (f *refuseWritesAfter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			f.after(ctx, cmd)
		}
		return err
	}
}

func (f *refuseWritesAfter) after(ctx context.Context, cmd redis.Cmder) {
	if cmd.Err() == nil && !f.done.Load() && f.step(cmd) {
		f.done.Store(true)
		if err := f.admin.ConfigSet(ctx, "min-replicas-to-write", "1").Err(); err != nil {
			panic(err)
		}
	}
}

// writesBack lets the Redis write again.
func (f *refuseWritesAfter) writesBack(t *testing.T) {
	t.Helper()
	if err := f.admin.ConfigSet(t.Context(), "min-replicas-to-write", "0").Err(); err != nil {
		t.Fatal(err)
	}
	f.done.Store(false)
}

// scriptOn matches a script run on a key that starts with prefix.
func scriptOn(prefix string) func(redis.Cmder) bool {
	return func(cmd redis.Cmder) bool {
		if n := cmd.Name(); n != "eval" && n != "evalsha" {
			return false
		}
		for _, a := range cmd.Args() {
			if s, ok := a.(string); ok && strings.HasPrefix(s, prefix) {
				return true
			}
		}
		return false
	}
}

// keysNaming returns the API key entries that name owner, and the members
// of its key set.
func keysNaming(t *testing.T, rdb *redis.Client, owner string) (entries []string, set []string) {
	t.Helper()
	for _, k := range testenv.Keys(t, rdb, "snip:apikey:*") {
		if v, _ := rdb.Get(t.Context(), k).Result(); v == owner {
			entries = append(entries, strings.TrimPrefix(k, "snip:apikey:"))
		}
	}
	set, err := rdb.SMembers(t.Context(), "snip:owner:"+owner+":keys").Result()
	if err != nil {
		t.Fatal(err)
	}
	return entries, set
}

// A Create cut off after it stored its key, with Redis refusing writes
// before it made the owner (so its take-back of the key failed too), left
// a working lookup entry for an owner ID: once the same Create was made
// again, the owner had that key too, which no one was ever shown, until a
// rotation. The Create that makes the owner now revokes it: the owner's
// only key is the one it printed.
func TestACreateCutOffBeforeItMadeTheOwnerLeavesNoKeyOnceMadeAgain(t *testing.T) {
	testenv.Parallel(t)
	r := testenv.StartRedis(t)
	rdb, _ := r.NewDB(t)
	refuse := &refuseWritesAfter{admin: redis.NewClient(&redis.Options{Addr: r.Addr}), step: scriptOn("snip:apikey:")}
	t.Cleanup(func() { _ = refuse.admin.Close() })
	rdb.AddHook(refuse)
	s := owners.NewStore(rdb)
	ctx := t.Context()

	if _, err := s.Create(ctx, "halfway", "Half Way"); err == nil || !strings.Contains(err.Error(), "NOREPLICAS") {
		t.Fatalf("Create with Redis refusing writes after the key was stored: %v, want NOREPLICAS", err)
	}
	refuse.writesBack(t)
	if entries, set := keysNaming(t, rdb, "halfway"); len(entries) != 1 || len(set) != 1 {
		t.Fatalf("after the cut-off Create: %d key entries and %d set members, want the 1 key it could not take back", len(entries), len(set))
	}
	if _, err := s.Get(ctx, "halfway"); !errors.Is(err, owners.ErrUnauthorized) {
		t.Fatalf("the cut-off Create made the owner (Get: %v)", err)
	}

	refuse.step = func(redis.Cmder) bool { return false }
	key, err := s.Create(ctx, "halfway", "Half Way")
	if err != nil {
		t.Fatalf("the same Create again: %v", err)
	}
	if o, err := s.Authenticate(ctx, key); err != nil || o.ID != "halfway" {
		t.Fatalf("the new key authenticates as %+v, %v; want halfway", o, err)
	}
	if entries, set := keysNaming(t, rdb, "halfway"); len(entries) != 1 || len(set) != 1 {
		t.Errorf("the owner has %d key entries and %d set members, want 1: the printed key only (the cut-off Create's is left)", len(entries), len(set))
	}
}

// When the Create that makes the owner cannot revoke an earlier cut-off
// Create's key (Redis refuses writes once the owner is written), it says
// so with ErrLeftoverKeys and still returns the new owner's key, which
// works; a rotation then leaves only its new key.
func TestACreateThatCannotRevokeLeftoverKeysSaysSoAndReturnsItsKey(t *testing.T) {
	testenv.Parallel(t)
	r := testenv.StartRedis(t)
	rdb, _ := r.NewDB(t)
	refuse := &refuseWritesAfter{admin: redis.NewClient(&redis.Options{Addr: r.Addr}), step: scriptOn("snip:apikey:")}
	t.Cleanup(func() { _ = refuse.admin.Close() })
	rdb.AddHook(refuse)
	s := owners.NewStore(rdb)
	ctx := t.Context()
	if _, err := s.Create(ctx, "leftover", "Left Over"); err == nil {
		t.Fatal("Create with Redis refusing writes after the key was stored succeeded")
	}
	refuse.writesBack(t)

	refuse.step = scriptOn("snip:owner:leftover")
	key, err := s.Create(ctx, "leftover", "Left Over")
	if !errors.Is(err, owners.ErrLeftoverKeys) || key == "" {
		t.Fatalf("Create whose revocation of the leftover key is refused: %q, %v; want its key and ErrLeftoverKeys", key, err)
	}
	refuse.writesBack(t)
	refuse.step = func(redis.Cmder) bool { return false }
	if o, err := s.Authenticate(ctx, key); err != nil || o.ID != "leftover" {
		t.Fatalf("the key returned with ErrLeftoverKeys authenticates as %+v, %v; want leftover", o, err)
	}
	rotated, err := s.Rotate(ctx, "leftover")
	if err != nil {
		t.Fatal(err)
	}
	if entries, set := keysNaming(t, rdb, "leftover"); len(entries) != 1 || len(set) != 1 {
		t.Errorf("after the rotation: %d key entries and %d set members, want the rotated key only", len(entries), len(set))
	}
	if _, err := s.Authenticate(ctx, rotated); err != nil {
		t.Errorf("the rotated key: %v", err)
	}
}
