package linkstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/redirect/internal/outbox"
)

var servers *testenv.Servers

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, &servers, testenv.WithRedis(), testenv.WithRedisCluster()))
}

// TestOnRedisCluster runs the store's tests on a Redis Cluster: a link and
// its shard's outbox lanes share a slot, so WATCH and MULTI work there.
func TestOnRedisCluster(t *testing.T) {
	servers.RunOnRedisCluster(t,
		TestCreateWritesLinkEventAndJobTogether,
		TestGuarantee_AbortedExecLeavesNeitherLinkNorEvent,
		TestConcurrentCreatesOfOneCodeHaveOneWinner,
		TestGeneratedCodeCollisionIsRetriedNeverOverwritten,
		TestDeleteLeavesATombstone,
		TestCreateRefusesWhenOutboxFull,
		TestWritesWaitForReplicas,
		TestGuarantee_ConnectionKilledBeforeExecLeavesNeitherLinkNorEvent,
		TestGeneratedCodeIsNeverAReservedWord,
		TestConcurrentDeletesOfOneLinkHaveOneWinnerAndTheOtherIsNotFound,
	)
}

func newStore(tb testing.TB) (*Store, redis.UniversalClient) {
	tb.Helper()
	rdb := servers.RedisClient(tb)
	return New(rdb, outbox.NewLayout(4), 1000), rdb
}

// outboxEntries returns every entry of one lane over all shards.
func outboxEntries(tb testing.TB, s *Store, rdb redis.UniversalClient, lane outbox.Lane) []redis.XMessage {
	tb.Helper()
	var out []redis.XMessage
	for sh := range s.layout.Shards {
		msgs, err := rdb.XRange(context.Background(), s.layout.OutboxKey(sh, lane), "-", "+").Result()
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, msgs...)
	}
	return out
}

// assertNothingStored fails if the code's link or any outbox entry exists.
func assertNothingStored(tb testing.TB, s *Store, rdb redis.UniversalClient, code string) {
	tb.Helper()
	if n := rdb.Exists(context.Background(), s.layout.LinkKey(code)).Val(); n != 0 {
		tb.Fatalf("link %s exists after a failed transaction", code)
	}
	for _, lane := range outbox.Lanes {
		if got := outboxEntries(tb, s, rdb, lane); len(got) != 0 {
			tb.Fatalf("%d %s outbox entries after a failed transaction", len(got), lane.Name)
		}
	}
}

// TestCreateWritesLinkEventAndJobTogether: one Create stores the link, its
// link.created event (for LINKS) and its preview job (for PREVIEW_JOBS), in
// the link's shard.
func TestCreateWritesLinkEventAndJobTogether(t *testing.T) {
	testenv.Parallel(t)
	s, rdb := newStore(t)
	l, err := s.Create(t.Context(), "acme", "https://example.com/", "hello")
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(t.Context(), "hello")
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(l, got); d != "" {
		t.Fatalf("Get (-created +got):\n%s", d)
	}
	shard := s.layout.Shard("hello")
	evs, _ := rdb.XRange(t.Context(), s.layout.OutboxKey(shard, outbox.LaneLinks), "-", "+").Result()
	jobs, _ := rdb.XRange(t.Context(), s.layout.OutboxKey(shard, outbox.LaneJobs), "-", "+").Result()
	if len(evs) != 1 || len(jobs) != 1 {
		t.Fatalf("shard %d outbox: %d link events, %d jobs; want 1 and 1", shard, len(evs), len(jobs))
	}
	ev, err := events.DecodeLinkEvent([]byte(evs[0].Values["data"].(string)))
	if err != nil || ev.Kind != events.LinkCreated || ev.Code != "hello" || ev.Owner != "acme" || evs[0].Values["id"] != ev.ID ||
		evs[0].Values["subject"] != "links.created.hello" {
		t.Fatalf("link event entry %v: %+v, %v", evs[0].Values, ev, err)
	}
	job, err := events.DecodePreviewJob([]byte(jobs[0].Values["data"].(string)))
	if err != nil || job.Target != "https://example.com/" || jobs[0].Values["subject"] != events.PreviewJobSubject {
		t.Fatalf("job entry %v: %+v, %v", jobs[0].Values, job, err)
	}
}

// TestGuarantee_AbortedExecLeavesNeitherLinkNorEvent: a concurrent write to
// the link key between WATCH and EXEC aborts EXEC; none of the link, the
// event or the job is stored, and Create reports the code as taken.
func TestGuarantee_AbortedExecLeavesNeitherLinkNorEvent(t *testing.T) {
	testenv.Parallel(t)
	s, rdb := newStore(t)
	intruder := testenv.AnotherClient(t, rdb)
	s.beforeExec = func(ctx context.Context, _ *redis.Tx) error {
		// Touch the watched key from another connection, then undo it, so
		// the key is unchanged but EXEC must abort.
		intruder.Set(ctx, s.layout.LinkKey("race"), "x", 0)
		intruder.Del(ctx, s.layout.LinkKey("race"))
		return nil
	}
	_, err := s.Create(t.Context(), "acme", "https://example.com/", "race")
	if !errors.Is(err, ErrCodeTaken) {
		t.Fatalf("Create with an aborted EXEC: %v, want ErrCodeTaken", err)
	}
	assertNothingStored(t, s, rdb, "race")
}

// TestGuarantee_ConnectionKilledBeforeExecLeavesNeitherLinkNorEvent: the
// transaction's connection is killed after WATCH and before MULTI/EXEC (a
// crash or a network cut); nothing of the link is stored.
func TestGuarantee_ConnectionKilledBeforeExecLeavesNeitherLinkNorEvent(t *testing.T) {
	testenv.Parallel(t)
	s, rdb := newStore(t)
	// CLIENT KILL names a connection of one server: on a cluster, of the
	// master that serves the link's slot, where the transaction runs.
	opts := &redis.Options{}
	if c, ok := rdb.(*redis.Client); ok {
		opts = c.Options()
	} else {
		master, err := servers.RedisCluster.MasterOf(t.Context(), s.layout.LinkKey("cut"))
		if err != nil {
			t.Fatal(err)
		}
		opts.Addr = master.Addr
	}
	killer := redis.NewClient(opts)
	defer killer.Close()
	s.beforeExec = func(ctx context.Context, tx *redis.Tx) error {
		id, err := tx.ClientID(ctx).Result()
		if err != nil {
			return err
		}
		return killer.ClientKillByFilter(ctx, "ID", itoa(id)).Err()
	}
	_, err := s.Create(t.Context(), "acme", "https://example.com/", "cut")
	if err == nil {
		t.Fatal("Create succeeded on a killed connection")
	}
	assertNothingStored(t, s, rdb, "cut")
	// The store still works afterwards.
	s.beforeExec = nil
	if _, err := s.Create(t.Context(), "acme", "https://example.com/", "cut"); err != nil {
		t.Fatalf("Create after the cut: %v", err)
	}
}

func itoa(n int64) string { return string(appendInt(nil, n)) }

func appendInt(b []byte, n int64) []byte {
	if n >= 10 {
		b = appendInt(b, n/10)
	}
	return append(b, byte('0'+n%10))
}

// TestConcurrentCreatesOfOneCodeHaveOneWinner: of many concurrent creates
// of the same custom code exactly one succeeds, and exactly one event and
// one job are in the outbox.
func TestConcurrentCreatesOfOneCodeHaveOneWinner(t *testing.T) {
	testenv.Parallel(t)
	s, rdb := newStore(t)
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins, taken := 0, 0
	for range 16 {
		wg.Go(func() {
			_, err := s.Create(context.Background(), "acme", "https://example.com/", "contested")
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				wins++
			case errors.Is(err, ErrCodeTaken):
				taken++
			default:
				t.Errorf("Create: %v", err)
			}
		})
	}
	wg.Wait()
	if wins != 1 || taken != 15 {
		t.Fatalf("%d wins, %d taken; want 1 and 15", wins, taken)
	}
	if n, j := len(outboxEntries(t, s, rdb, outbox.LaneLinks)), len(outboxEntries(t, s, rdb, outbox.LaneJobs)); n != 1 || j != 1 {
		t.Fatalf("%d link events, %d jobs; want 1 and 1", n, j)
	}
}

// TestGeneratedCodeCollisionIsRetriedNeverOverwritten: when a random code
// is taken, Create draws another; the existing link is untouched.
func TestGeneratedCodeCollisionIsRetriedNeverOverwritten(t *testing.T) {
	testenv.Parallel(t)
	s, _ := newStore(t)
	if _, err := s.Create(t.Context(), "other", "https://other.example/", "Abc1234"); err != nil {
		t.Fatal(err)
	}
	draws := []string{"Abc1234", "Abc1234", "Xyz9876"}
	s.newCode = func() string { c := draws[0]; draws = draws[1:]; return c }
	l, err := s.Create(t.Context(), "acme", "https://example.com/", "")
	if err != nil || l.Code != "Xyz9876" {
		t.Fatalf("Create after two collisions = %+v, %v; want code Xyz9876", l, err)
	}
	got, err := s.Get(t.Context(), "Abc1234")
	if err != nil || got.Owner != "other" || got.Target != "https://other.example/" {
		t.Fatalf("existing link after the collisions: %+v, %v", got, err)
	}
	s.newCode = func() string { return "Abc1234" }
	if _, err := s.Create(t.Context(), "acme", "https://example.com/", ""); !errors.Is(err, ErrCodeTaken) {
		t.Fatalf("Create when every draw collides: %v, want ErrCodeTaken", err)
	}
}

// TestGeneratedCodeIsNeverAReservedWord: a random code is 7 characters, as
// healthz, metrics, console, favicon and sitemap are (in any case): a draw
// that is one is drawn again, never stored (GET /metrics would answer the
// service's metrics, not the link).
func TestGeneratedCodeIsNeverAReservedWord(t *testing.T) {
	testenv.Parallel(t)
	s, _ := newStore(t)
	draws := []string{"metrics", "HealthZ", "Xyz9876"}
	s.newCode = func() string { c := draws[0]; draws = draws[1:]; return c }
	l, err := s.Create(t.Context(), "acme", "https://example.com/", "")
	if err != nil || l.Code != "Xyz9876" {
		t.Fatalf("Create after drawing two reserved words = %+v, %v; want code Xyz9876", l, err)
	}
	for _, code := range []string{"metrics", "HealthZ"} {
		if _, err := s.Get(t.Context(), code); !errors.Is(err, ErrNotFound) {
			t.Errorf("Get(%q) = %v, want ErrNotFound: a reserved word was stored as a link", code, err)
		}
	}
}

// TestDeleteLeavesATombstone: Delete hides the link, writes link.deleted,
// refuses other owners and a second delete, and the code stays taken.
func TestDeleteLeavesATombstone(t *testing.T) {
	testenv.Parallel(t)
	s, rdb := newStore(t)
	if _, err := s.Create(t.Context(), "acme", "https://example.com/", "bye"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(t.Context(), "other", "bye"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("delete by another owner: %v, want ErrNotFound", err)
	}
	if err := s.Delete(t.Context(), "acme", "bye"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(t.Context(), "acme", "bye"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second delete: %v, want ErrNotFound", err)
	}
	if _, err := s.Get(t.Context(), "bye"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get after delete: %v, want ErrNotFound", err)
	}
	if _, err := s.Create(t.Context(), "other", "https://evil.example/", "bye"); !errors.Is(err, ErrCodeTaken) {
		t.Fatalf("re-create a deleted code: %v, want ErrCodeTaken", err)
	}
	evs := outboxEntries(t, s, rdb, outbox.LaneLinks)
	if len(evs) != 2 || evs[1].Values["subject"] != "links.deleted.bye" {
		t.Fatalf("link events: %v", evs)
	}
}

// TestConcurrentDeletesOfOneLinkHaveOneWinnerAndTheOtherIsNotFound: a
// delete whose transaction another delete of the link got ahead of (the
// only other write to a link's key) is ErrNotFound, as a delete after it
// is, not ErrUnavailable: nothing was unavailable, and trying again would
// only find the link gone.
func TestConcurrentDeletesOfOneLinkHaveOneWinnerAndTheOtherIsNotFound(t *testing.T) {
	testenv.Parallel(t)
	s, rdb := newStore(t)
	if _, err := s.Create(t.Context(), "acme", "https://example.com/", "twice"); err != nil {
		t.Fatal(err)
	}
	other := New(rdb, s.layout, s.maxOutbox)
	var otherErr error
	s.beforeExec = func(ctx context.Context, _ *redis.Tx) error {
		if otherErr == nil {
			otherErr = other.Delete(ctx, "acme", "twice") // gets ahead, between WATCH and EXEC
			if otherErr == nil {
				otherErr = errors.New("done") // once
			}
		}
		return nil
	}
	err := s.Delete(t.Context(), "acme", "twice")
	if otherErr.Error() != "done" {
		t.Fatalf("the delete that got ahead: %v", otherErr)
	}
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("delete that lost the race: %v, want ErrNotFound", err)
	}
	if evs := outboxEntries(t, s, rdb, outbox.LaneLinks); len(evs) != 2 {
		t.Fatalf("%d link events, want 2 (created, deleted once)", len(evs))
	}
}

// TestCreateRefusesWhenOutboxFull: at the lane limit Create refuses with
// outbox.ErrFull and stores nothing.
func TestCreateRefusesWhenOutboxFull(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	s := New(rdb, outbox.NewLayout(1), 2)
	for _, c := range []string{"one", "two"} {
		if _, err := s.Create(t.Context(), "acme", "https://example.com/", c); err != nil {
			t.Fatal(err)
		}
	}
	before := map[string]int{}
	for _, lane := range outbox.Lanes {
		before[lane.Name] = len(outboxEntries(t, s, rdb, lane))
	}
	if _, err := s.Create(t.Context(), "acme", "https://example.com/", "three"); !errors.Is(err, outbox.ErrFull) {
		t.Fatalf("Create on a full outbox: %v, want ErrFull", err)
	}
	if n := rdb.Exists(t.Context(), s.layout.LinkKey("three")).Val(); n != 0 {
		t.Fatal("link stored although the outbox was full")
	}
	// Nothing of the refused link in any lane either: its event and its
	// preview job go with it or not at all.
	for _, lane := range outbox.Lanes {
		if n := len(outboxEntries(t, s, rdb, lane)); n != before[lane.Name] {
			t.Errorf("%s lane holds %d entries after the refused create, %d before", lane.Name, n, before[lane.Name])
		}
	}
}

// TestWritesWaitForReplicas: with the replica wait on, Create and Delete
// return once the link's master's replica has the write. On Redis Cluster
// (a replica per master) the replica holds it the moment the call returns,
// and no wait falls short; on a single Redis (no replica) every write's wait
// falls short, is reported, and the write stands on the master.
func TestWritesWaitForReplicas(t *testing.T) {
	testenv.Parallel(t)
	s, rdb := newStore(t)
	timeout, cluster := testenv.ReplicaWaitTimeout(rdb)
	var shorts testenv.ShortWaits
	s.WaitForReplicas(1, timeout, shorts.Record)
	if _, err := s.Create(t.Context(), "acme", "https://example.com/", "waited"); err != nil {
		t.Fatal(err)
	}
	key := s.layout.LinkKey("waited")
	var replica *redis.Client
	if cluster {
		replica = servers.RedisCluster.ReplicaClient(t, key)
		if n := replica.Exists(t.Context(), key).Val(); n != 1 {
			t.Fatalf("the replica does not have the link when Create returns")
		}
	}
	if err := s.Delete(t.Context(), "acme", "waited"); err != nil {
		t.Fatal(err)
	}
	if cluster && replica.HExists(t.Context(), key, "deleted").Val() != true {
		t.Fatalf("the replica does not have the tombstone when Delete returns")
	}
	want := []string{"create_link:0:<nil>", "delete_link:0:<nil>"}
	if cluster {
		want = nil
	}
	if d := cmp.Diff(want, shorts.Got()); d != "" {
		t.Errorf("short waits reported (-want +got):\n%s", d)
	}
}

// BenchmarkCreateOnTheCluster measures what the replica wait adds to a link
// creation on Redis Cluster (a replica per master, loopback): the same
// Create with the wait off and with WAIT 1, alternating, one op each.
func BenchmarkCreateOnTheCluster(b *testing.B) {
	rdb := servers.RedisCluster.Client(b)
	for _, n := range []int{0, 1} {
		b.Run(fmt.Sprintf("wait_replicas=%d", n), func(b *testing.B) {
			s := New(rdb, outbox.NewLayout(4), 1<<40)
			s.WaitForReplicas(n, time.Second, func(op string, got int64, err error) {
				b.Errorf("%s: wait fell short: %d, %v", op, got, err)
			})
			i := 0
			for b.Loop() {
				i++
				if _, err := s.Create(b.Context(), "acme", "https://example.com/", fmt.Sprintf("bench%d-%d", n, i)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
