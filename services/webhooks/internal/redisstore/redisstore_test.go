package redisstore_test

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/webhooks/internal/endpoint"
	"github.com/snipdev/snip/services/webhooks/internal/redisstore"
)

var servers *testenv.Servers

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, &servers, testenv.WithRedis(), testenv.WithRedisCluster()))
}

// TestOnRedisCluster runs the store's tests on a Redis Cluster.
func TestOnRedisCluster(t *testing.T) {
	servers.RunOnRedisCluster(t,
		TestEnqueueSkipsWhatAPartitionAlreadyQueued,
		TestBacklogIsBoundedDroppingTheOldest,
		TestBatchesAreCutBySizeAndInflightIsReadBack,
		TestLeaseIsExclusiveUntilReleased,
		TestLeasesTakeAndRenewManyAtOnce,
		TestWritesWaitForReplicas,
		TestEndpointsArePutListedAndDeleted,
		TestOnlyKeptDeliveriesKeepTheirBodies,
		TestDeleteLeavesNoDeliveryBodies,
		TestClearUpToKeepsWhatCameAfterTheCut,
		TestNothingIsQueuedForADeletedEndpoint,
		TestLiveIntakeQueuesNothingAtOrBelowTheStoredCut,
		TestOnlyTheLatestReplayWritesItsState,
		TestAReplayWhoseLeaseLapsedReadsInterrupted,
		TestAReplayQueuesOnlyWhileItIsTheLatestAndHoldsItsLease,
		TestOnlyTheLatestReplayHoldingItsLeaseCutsAndClears,
		TestInterleavedUpdatesKeepEachOthersChanges,
		TestNoWriteBringsBackADeletedEndpoint,
		TestAFailingRunEndsWithADeliveryOrAResume,
		TestASenderWritesOnlyWhileItHoldsItsLease,
	)
}

func ev(seq uint64, id string) redisstore.Event {
	return redisstore.Event{Seq: seq, ID: id, Type: "click", Time: time.Unix(0, int64(seq)).UTC(), Data: []byte(`{"id":"` + id + `"}`)}
}

func ids(evs []redisstore.Event) []string {
	out := []string{}
	for _, e := range evs {
		out = append(out, e.ID)
	}
	return out
}

// put stores endpoint id (of owner acme): Enqueue and SetInflight write only
// for an endpoint that exists.
func put(t *testing.T, s *redisstore.Store, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if err := s.Put(t.Context(), endpoint.Endpoint{ID: id, Owner: "acme", URL: "https://example.com/" + id}); err != nil {
			t.Fatal(err)
		}
	}
}

// senderLease takes endpoint id's lease for a sender of instance "a" and
// returns its token, which the sender's writes give.
func senderLease(t *testing.T, s *redisstore.Store, id string) string {
	t.Helper()
	held, err := s.Leases(t.Context(), []string{id}, nil, "a", time.Hour)
	if err != nil || held[id] == "" {
		t.Fatalf("lease %s for a sender of a: %v, %v", id, held, err)
	}
	return held[id]
}

// TestEnqueueSkipsWhatAPartitionAlreadyQueued: a batch handed again (a
// crash before the ack, a new owner) queues nothing twice.
func TestEnqueueSkipsWhatAPartitionAlreadyQueued(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	s := redisstore.New(rdb, 1000)
	put(t, s, "ep")
	ctx := t.Context()
	if _, _, err := s.Enqueue(ctx, redisstore.DedupSeq, 0, map[string][]redisstore.Event{"ep": {ev(1, "a"), ev(2, "b")}}); err != nil {
		t.Fatal(err)
	}
	added, _, err := s.Enqueue(ctx, redisstore.DedupSeq, 0, map[string][]redisstore.Event{"ep": {ev(2, "b"), ev(3, "c")}})
	if err != nil {
		t.Fatal(err)
	}
	if added["ep"] != 1 {
		t.Errorf("added %d, want 1 (seq 2 was queued already)", added["ep"])
	}
	// Another partition has its own sequence mark.
	if _, _, err := s.Enqueue(ctx, redisstore.DedupSeq, 1, map[string][]redisstore.Event{"ep": {ev(2, "p1")}}); err != nil {
		t.Fatal(err)
	}
	// Alerts: by ID.
	for range 2 {
		if _, _, err := s.Enqueue(ctx, redisstore.DedupID, 0, map[string][]redisstore.Event{"ep": {ev(0, "alert-1")}}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.Read(ctx, "ep", "0", 100, 1<<20, 0)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"a", "b", "c", "p1", "alert-1"}, ids(got)); diff != "" {
		t.Errorf("queue (-want +got):\n%s", diff)
	}
}

// TestBacklogIsBoundedDroppingTheOldest: the stated policy when an
// endpoint's queue is full.
func TestBacklogIsBoundedDroppingTheOldest(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	s := redisstore.New(rdb, 3)
	put(t, s, "ep")
	ctx := t.Context()
	var dropped int64
	for i := range 5 {
		_, d, err := s.Enqueue(ctx, redisstore.DedupNone, 0, map[string][]redisstore.Event{"ep": {ev(uint64(i+1), string(rune('a'+i)))}})
		if err != nil {
			t.Fatal(err)
		}
		dropped += d["ep"]
	}
	got, err := s.Read(ctx, "ep", "0", 100, 1<<20, 0)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"c", "d", "e"}, ids(got)); diff != "" {
		t.Errorf("queue (-want +got):\n%s", diff)
	}
	if dropped != 2 {
		t.Errorf("dropped %d, want 2", dropped)
	}
}

// TestDeliveredRemovesOnlyWhatTheBoundLeft: a batch in flight whose oldest
// events the backlog bound dropped meanwhile (Enqueue counted them as
// dropped) is delivered; Delivered removes, and reports, only the events
// still queued, so that each event is counted once.
func TestDeliveredRemovesOnlyWhatTheBoundLeft(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	s := redisstore.New(rdb, 3)
	put(t, s, "ep")
	ctx := t.Context()
	if _, _, err := s.Enqueue(ctx, redisstore.DedupNone, 0, map[string][]redisstore.Event{"ep": {ev(1, "a"), ev(2, "b"), ev(3, "c")}}); err != nil {
		t.Fatal(err)
	}
	batch, err := s.Read(ctx, "ep", "0", 100, 1<<20, 0)
	if err != nil || len(batch) != 3 {
		t.Fatalf("read %d events, %v; want 3", len(batch), err)
	}
	token := senderLease(t, s, "ep")
	if err := s.SetInflight(ctx, "ep", token, batch[0].Entry, batch[2].Entry); err != nil {
		t.Fatal(err)
	}
	_, dropped, err := s.Enqueue(ctx, redisstore.DedupNone, 0, map[string][]redisstore.Event{"ep": {ev(4, "d")}})
	if err != nil || dropped["ep"] != 1 {
		t.Fatalf("enqueue at the bound: dropped %d, %v; want 1", dropped["ep"], err)
	}
	entries := []string{batch[0].Entry, batch[1].Entry, batch[2].Entry}
	if n, err := s.Delivered(ctx, "ep", token, entries); err != nil || n != 2 {
		t.Errorf("delivered the batch {a, b, c} after the bound dropped a: removed %d, %v; want 2 (b, c)", n, err)
	}
	got, err := s.Read(ctx, "ep", "0", 100, 1<<20, 0)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"d"}, ids(got)); diff != "" {
		t.Errorf("queue after the delivery (-want +got):\n%s", diff)
	}
}

// TestBatchesAreCutBySize and the in-flight batch is read back exactly.
func TestBatchesAreCutBySizeAndInflightIsReadBack(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	s := redisstore.New(rdb, 1000)
	put(t, s, "ep")
	ctx := t.Context()
	var evs []redisstore.Event
	for i := range 10 {
		evs = append(evs, ev(uint64(i+1), string(rune('a'+i))))
	}
	if _, _, err := s.Enqueue(ctx, redisstore.DedupNone, 0, map[string][]redisstore.Event{"ep": evs}); err != nil {
		t.Fatal(err)
	}
	one := evs[0].Size()
	got, err := s.Read(ctx, "ep", "0", 100, 3*one, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("read %d events within 3 events' bytes, want 3", len(got))
	}
	token := senderLease(t, s, "ep")
	if err := s.SetInflight(ctx, "ep", token, got[0].Entry, got[2].Entry); err != nil {
		t.Fatal(err)
	}
	first, last, ok, err := s.Inflight(ctx, "ep")
	if err != nil || !ok {
		t.Fatalf("inflight: %v %v", ok, err)
	}
	back, err := s.ReadRange(ctx, "ep", first, last)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(ids(got), ids(back)); diff != "" {
		t.Errorf("in-flight batch read back (-want +got):\n%s", diff)
	}
	if n, err := s.Delivered(ctx, "ep", token, []string{got[0].Entry, got[1].Entry, got[2].Entry}); err != nil || n != 3 {
		t.Fatalf("delivered: removed %d, %v; want the batch's 3", n, err)
	}
	if n, _, _ := s.Backlog(ctx, "ep"); n != 7 {
		t.Errorf("backlog %d after delivering 3 of 10, want 7", n)
	}
	if _, _, ok, _ := s.Inflight(ctx, "ep"); ok {
		t.Error("in-flight mark left after delivery")
	}
}

func TestLeaseIsExclusiveUntilReleased(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	s := redisstore.New(rdb, 10)
	ctx := t.Context()
	for _, step := range []struct {
		who  string
		want bool
	}{{"a", true}, {"b", false}, {"a", true}} {
		if ok, err := s.Lease(ctx, "ep", step.who, time.Minute); err != nil || ok != step.want {
			t.Fatalf("Lease(%s) = %v, %v; want %v", step.who, ok, err, step.want)
		}
	}
	if err := s.Release(ctx, "ep", "a"); err != nil {
		t.Fatal(err)
	}
	if ok, _ := s.Lease(ctx, "ep", "b", time.Minute); !ok {
		t.Error("b could not take the lease a released")
	}
}

// TestLeasesTakeAndRenewManyAtOnce: Leases, one pipeline for many
// endpoints (in many slots on a cluster), keeps the lease's rules for each:
// a free lease is taken, one the instance holds is taken again (extended)
// under a new token, another instance's stays, and a running sender's is
// renewed only while it still holds that sender's token (not once another
// sender's, nor once lapsed). The server lacking the script (flushed) does
// not fail it: a pipeline does not fall back from EVALSHA, so Leases loads
// it.
func TestLeasesTakeAndRenewManyAtOnce(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	s := redisstore.New(rdb, 10)
	ctx := t.Context()
	if ok, err := s.Lease(ctx, "mine", "a", time.Second); err != nil || !ok {
		t.Fatalf("Lease(mine, a) = %v, %v", ok, err)
	}
	if ok, err := s.Lease(ctx, "theirs", "b", time.Minute); err != nil || !ok {
		t.Fatalf("Lease(theirs, b) = %v, %v", ok, err)
	}
	// A sender's token of instance "a/b", not of instance a.
	if err := rdb.Set(ctx, "snip:wh:{lookalike}:lease", "a/b/0123", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	ids := []string{"mine", "theirs", "lookalike"}
	for i := range 50 {
		ids = append(ids, fmt.Sprintf("free%d", i))
	}
	put(t, s, ids...) // no lease of an endpoint that is not there is taken
	held, err := s.Leases(ctx, ids, nil, "a", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	var want, got []string
	for _, id := range ids {
		if id != "theirs" && id != "lookalike" {
			want = append(want, id)
		}
	}
	tokens := map[string]bool{}
	for id, token := range held {
		got = append(got, id)
		if !strings.HasPrefix(token, "a/") || tokens[token] {
			t.Errorf("lease of %s taken under token %q: want a/ and a token of its own", id, token)
		}
		tokens[token] = true
		if v := rdb.Get(ctx, "snip:wh:{"+id+"}:lease").Val(); v != token {
			t.Errorf("lease of %s holds %q, want the token answered, %q", id, v, token)
		}
	}
	slices.Sort(want)
	slices.Sort(got)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("leases a holds (-want +got):\n%s", diff)
	}
	if left := rdb.PTTL(ctx, "snip:wh:{mine}:lease").Val(); left <= time.Minute {
		t.Errorf("a's own lease has %s left after Leases for an hour; want it extended", left)
	}
	if ok, _ := s.Lease(ctx, "theirs", "b", time.Minute); !ok {
		t.Error("b lost its lease to a's Leases")
	}
	if v := rdb.Get(ctx, "snip:wh:{lookalike}:lease").Val(); v != "a/b/0123" {
		t.Errorf("instance a/b's lease holds %q after a's Leases, want its token", v)
	}

	// Senders of a run for free0, free1 and free2 under the tokens taken;
	// free1's lease passed to another sender of a meanwhile, and free2's
	// lapsed. free3's sender stopped: its lease is taken again.
	if err := rdb.Set(ctx, "snip:wh:{free1}:lease", "a/newer", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Del(ctx, "snip:wh:{free2}:lease").Err(); err != nil {
		t.Fatal(err)
	}
	running := map[string]string{"free0": held["free0"], "free1": held["free1"], "free2": held["free2"]}
	again, err := s.Leases(ctx, []string{"free0", "free1", "free2", "free3"}, running, "a", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if again["free0"] != held["free0"] {
		t.Errorf("free0's running sender's lease renewed under %q, want its token %q", again["free0"], held["free0"])
	}
	if tok, ok := again["free3"]; !ok || tok == held["free3"] {
		t.Errorf("free3's lease, its sender stopped, taken again under %q (ok %v), want a new token (not %q)", tok, ok, held["free3"])
	}
	for _, id := range []string{"free1", "free2"} {
		if tok, ok := again[id]; ok {
			t.Errorf("%s's lease renewed for a sender whose token it no longer holds, under %q", id, tok)
		}
	}
	if v := rdb.Get(ctx, "snip:wh:{free1}:lease").Val(); v != "a/newer" {
		t.Errorf("free1's lease holds %q after the renewal, want the newer sender's token", v)
	}
	if n := rdb.Exists(ctx, "snip:wh:{free2}:lease").Val(); n != 0 {
		t.Error("free2's lapsed lease was taken again by the renewal of the sender it lapsed for")
	}
}

// TestEndpointsArePutListedAndDeleted: an endpoint's configuration, its
// owner's list and the list of all live in different slots; Put, Get, List,
// All and Delete work across them, on Redis Cluster too (Put was one MULTI,
// refused there with CROSSSLOT), and each changes the version.
func TestEndpointsArePutListedAndDeleted(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	s := redisstore.New(rdb, 1000)
	ctx := t.Context()
	v0, err := s.Version(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a := endpoint.Endpoint{ID: "epA", Owner: "acme", URL: "https://example.com/a"}
	b := endpoint.Endpoint{ID: "epB", Owner: "other", URL: "https://example.com/b"}
	for _, e := range []endpoint.Endpoint{a, b} {
		if err := s.Put(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	if got, _, err := s.Get(ctx, "epA"); err != nil || got.URL != a.URL {
		t.Fatalf("Get(epA) = %+v, %v", got, err)
	}
	if got, err := s.List(ctx, "acme"); err != nil || len(got) != 1 || got[0].ID != "epA" {
		t.Fatalf("List(acme) = %+v, %v; want epA alone", got, err)
	}
	if got, err := s.All(ctx); err != nil || len(got) != 2 {
		t.Fatalf("All = %+v, %v; want 2", got, err)
	}
	if err := s.Delete(ctx, a); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Get(ctx, "epA"); !errors.Is(err, endpoint.ErrNotFound) {
		t.Fatalf("Get after Delete: %v, want ErrNotFound", err)
	}
	if got, err := s.All(ctx); err != nil || len(got) != 1 || got[0].ID != "epB" {
		t.Fatalf("All after Delete = %+v, %v; want epB alone", got, err)
	}
	if v, _ := s.Version(ctx); v != v0+3 {
		t.Errorf("version %d after two puts and a delete from %d, want %d", v, v0, v0+3)
	}
}

// TestClearUpToKeepsWhatCameAfterTheCut: a replay drops the queued events it
// refills (clicks at or below its CLICKS cut, alerts at or below its FRAUD
// cut, a click queued without its sequence) and the in-flight mark, and
// keeps what live intake queued after the cut, which nothing else would
// bring back.
func TestClearUpToKeepsWhatCameAfterTheCut(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	s := redisstore.New(rdb, 10_000)
	put(t, s, "ep")
	ctx := t.Context()
	alert := func(seq uint64, id string) redisstore.Event {
		e := ev(seq, id)
		e.Type = endpoint.TypeFraudAlert
		return e
	}
	var evs []redisstore.Event
	// 2,500 clicks (more than one chunk of the scan), 1..2500, and alerts
	// with FRAUD sequences 3 and 8, and a click without a sequence.
	for i := range 2500 {
		evs = append(evs, ev(uint64(i+1), fmt.Sprintf("c%d", i+1)))
	}
	evs = append(evs, alert(3, "a3"), alert(8, "a8"), redisstore.Event{ID: "test", Type: "click", Time: time.Now(), Data: []byte(`{}`)})
	if _, _, err := s.Enqueue(ctx, redisstore.DedupNone, 0, map[string][]redisstore.Event{"ep": evs}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetInflight(ctx, "ep", senderLease(t, s, "ep"), "0-1", "0-2"); err != nil {
		t.Fatal(err)
	}
	replay := redisstore.Replay{ID: "r1", State: redisstore.ReplayRunning}
	if err := s.SetReplay(ctx, "ep", replay, true, redisstore.ReplayLease{Holder: "a", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	dropped, err := s.ClearUpTo(ctx, "ep", redisstore.ReplayHold{ID: "r1", Holder: "a"}, 2490, 3)
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Read(ctx, "ep", "0", 100, 1<<20, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"c2491", "c2492", "c2493", "c2494", "c2495", "c2496", "c2497", "c2498", "c2499", "c2500", "a8"}
	if diff := cmp.Diff(want, ids(got)); diff != "" {
		t.Errorf("queue after the clear (-want +got):\n%s", diff)
	}
	if dropped != 2490+1+1 {
		t.Errorf("dropped %d, want %d", dropped, 2490+2)
	}
	if got[0].Seq != 2491 || got[len(got)-1].Seq != 8 {
		t.Errorf("sequences read back: first %d, last %d; want 2491 and 8", got[0].Seq, got[len(got)-1].Seq)
	}
	if _, _, ok, err := s.Inflight(ctx, "ep"); err != nil || ok {
		t.Errorf("in-flight mark after the clear: ok=%v err=%v, want none", ok, err)
	}
}

// bodyKeys returns endpoint id's delivery body keys, sorted.
func bodyKeys(t *testing.T, rdb redis.UniversalClient, id string) []string {
	t.Helper()
	keys := testenv.Keys(t, rdb, "snip:wh:{"+id+"}:body:*")
	slices.Sort(keys)
	return keys
}

// TestOnlyKeptDeliveriesKeepTheirBodies: only a delivery still in the
// endpoint's list can be redelivered, so a body lives as long as its record:
// after more deliveries than KeepDeliveries, the body keys are exactly those
// of the kept records (they were all kept for BodyTTL, Redis memory growing
// with the delivery rate), and each kept body still reads back.
func TestOnlyKeptDeliveriesKeepTheirBodies(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	s := redisstore.New(rdb, 1000)
	ctx := t.Context()
	if err := s.Put(ctx, endpoint.Endpoint{ID: "ep", Owner: "acme", URL: "https://example.com/a"}); err != nil {
		t.Fatal(err)
	}
	n := int(s.KeepDeliveries)*2 + 50
	for i := range n {
		d := redisstore.Delivery{ID: fmt.Sprintf("d%04d", i), WebhookID: fmt.Sprintf("e%d", i/3), Attempt: i%3 + 1, Status: "failed"}
		if err := s.AddDelivery(ctx, "ep", d, []byte("body of "+d.ID)); err != nil {
			t.Fatal(err)
		}
	}
	ds, err := s.Deliveries(ctx, "ep")
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(ds)) != s.KeepDeliveries || ds[0].ID != fmt.Sprintf("d%04d", n-1) {
		t.Fatalf("%d records, newest %+v; want %d, newest d%04d", len(ds), ds[0], s.KeepDeliveries, n-1)
	}
	var want []string
	for _, d := range ds {
		want = append(want, "snip:wh:{ep}:body:"+d.ID)
	}
	slices.Sort(want)
	if diff := cmp.Diff(want, bodyKeys(t, rdb, "ep")); diff != "" {
		t.Errorf("body keys after %d deliveries (-kept records +stored):\n%s", n, diff)
	}
	for _, d := range []redisstore.Delivery{ds[0], ds[len(ds)-1]} {
		b, err := s.Body(ctx, "ep", d.ID)
		if err != nil || string(b) != "body of "+d.ID {
			t.Errorf("Body(%s) = %q, %v; want the body it was sent with", d.ID, b, err)
		}
		if ttl := rdb.PTTL(ctx, "snip:wh:{ep}:body:"+d.ID).Val(); ttl <= 0 || ttl > s.BodyTTL {
			t.Errorf("body of %s expires in %s, want within %s", d.ID, ttl, s.BodyTTL)
		}
	}
	evicted := fmt.Sprintf("d%04d", n-int(s.KeepDeliveries)-1)
	if _, err := s.Body(ctx, "ep", evicted); !errors.Is(err, endpoint.ErrNotFound) {
		t.Errorf("Body(%s), an evicted record: %v, want ErrNotFound", evicted, err)
	}
}

// TestDeleteLeavesNoDeliveryBodies: deleting an endpoint removes its
// delivery records and their bodies (found from the records) and its
// sender's lease, not only its configuration and queue, and what its
// sender writes after the delete (a delivery record, delivered, a failure,
// its lease's renewal), or a scan that takes its lease, stores nothing;
// another endpoint's are untouched.
func TestDeleteLeavesNoDeliveryBodies(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	s := redisstore.New(rdb, 1000)
	s.KeepDeliveries = 5
	ctx := t.Context()
	a := endpoint.Endpoint{ID: "epA", Owner: "acme", URL: "https://example.com/a"}
	b := endpoint.Endpoint{ID: "epB", Owner: "acme", URL: "https://example.com/b"}
	for _, e := range []endpoint.Endpoint{a, b} {
		if err := s.Put(ctx, e); err != nil {
			t.Fatal(err)
		}
		for i := range 8 {
			d := redisstore.Delivery{ID: fmt.Sprintf("%s-d%d", e.ID, i), Status: "delivered"}
			if err := s.AddDelivery(ctx, e.ID, d, []byte("body")); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, _, err := s.Enqueue(ctx, redisstore.DedupSeq, 0, map[string][]redisstore.Event{"epA": {ev(1, "a")}}); err != nil {
		t.Fatal(err)
	}
	// Its sender holds the lease and has a batch in flight when the
	// endpoint is deleted.
	token := senderLease(t, s, "epA")
	if err := s.SetInflight(ctx, "epA", token, "0-1", "0-1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, a); err != nil {
		t.Fatal(err)
	}
	// The sender, mid-attempt, records its delivery after the delete, and
	// its manager renews the lease; a scan that listed the endpoint before
	// the delete takes its lease for a new sender. None writes anything.
	late := redisstore.Delivery{ID: "epA-late", Status: "delivered"}
	if err := s.AddDelivery(ctx, "epA", late, []byte("body")); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Delivered(ctx, "epA", token, []string{"0-1"}); err != nil || n != 0 {
		t.Fatalf("delivered after the delete: removed %d, %v; want 0, nil", n, err)
	}
	if _, err := s.RecordFailure(ctx, "epA", token, time.Now(), time.Time{}, "late"); !errors.Is(err, endpoint.ErrNotFound) {
		t.Errorf("a failure recorded after the delete: %v, want ErrNotFound", err)
	}
	if held, err := s.Leases(ctx, []string{"epA"}, map[string]string{"epA": token}, "a", time.Hour); err != nil || len(held) != 0 {
		t.Errorf("renewal of the deleted endpoint's lease: held %v, %v; want none", held, err)
	}
	if held, err := s.Leases(ctx, []string{"epA"}, nil, "b", time.Hour); err != nil || len(held) != 0 {
		t.Errorf("the deleted endpoint's lease taken: held %v, %v; want none", held, err)
	}
	if left := testenv.Keys(t, rdb, "snip:wh:{epA}:*"); len(left) != 0 {
		t.Errorf("keys of the deleted endpoint left: %q", left)
	}
	if n := len(bodyKeys(t, rdb, "epB")); n != 5 {
		t.Errorf("the other endpoint has %d bodies, want its 5", n)
	}
	if _, err := s.Body(ctx, "epB", "epB-d7"); err != nil {
		t.Errorf("the other endpoint's newest body: %v", err)
	}
}

// TestNothingIsQueuedForADeletedEndpoint: whatever still writes for an
// endpoint after its owner deleted it (an intake batch routed with the
// endpoints it loaded before the delete, a replay still copying, a test
// event, its sender marking a batch in flight, a replay writing its state)
// stores nothing: the queue, the partition marks, the in-flight mark and
// the replay state would outlive the endpoint, with no TTL, and nothing
// would ever delete them.
func TestNothingIsQueuedForADeletedEndpoint(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	s := redisstore.New(rdb, 1000)
	ctx := t.Context()
	put(t, s, "epA", "epB")
	if err := s.Delete(ctx, endpoint.Endpoint{ID: "epA", Owner: "acme"}); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []redisstore.Dedup{redisstore.DedupSeq, redisstore.DedupID, redisstore.DedupNone} {
		added, _, err := s.Enqueue(ctx, mode, 0, map[string][]redisstore.Event{"epA": {ev(1, "a")}, "epB": {ev(1, "b")}})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(map[string]int64{"epB": 1}, added); diff != "" {
			t.Errorf("mode %d: added (-want +got):\n%s", mode, diff)
		}
	}
	if err := s.SetInflight(ctx, "epA", "a/0", "0-1", "0-1"); err != nil {
		t.Fatal(err)
	}
	if err := s.SetReplay(ctx, "epA", redisstore.Replay{ID: "r1", State: redisstore.ReplayFailed}, true, redisstore.ReplayLease{}); !errors.Is(err, endpoint.ErrNotFound) {
		t.Errorf("replay state of the deleted endpoint: %v, want not found", err)
	}
	if left := testenv.Keys(t, rdb, "snip:wh:{epA}:*"); len(left) != 0 {
		t.Errorf("keys written for the deleted endpoint: %q", left)
	}
	if n, _, _ := s.Backlog(ctx, "epB"); n != 3 {
		t.Errorf("the other endpoint's backlog is %d, want its 3 events", n)
	}
}

// TestOnlyTheLatestReplayWritesItsState: an owner who asks for a replay
// again while the first still runs sees the second's state, not the first
// ending "done" or "failed" over it; the first learns it was superseded.
func TestOnlyTheLatestReplayWritesItsState(t *testing.T) {
	testenv.Parallel(t)
	s := redisstore.New(servers.RedisClient(t), 1000)
	ctx := t.Context()
	put(t, s, "ep")
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a := redisstore.ReplayLease{Holder: "a", TTL: time.Minute}
	first := redisstore.Replay{ID: "r1", State: redisstore.ReplayQueued, From: at, RequestedAt: at, UpdatedAt: at}
	if err := s.SetReplay(ctx, "ep", first, true, a); err != nil {
		t.Fatal(err)
	}
	first.State = redisstore.ReplayRunning
	if err := s.SetReplay(ctx, "ep", first, false, a); err != nil {
		t.Fatalf("the latest replay's own write: %v", err)
	}
	second := redisstore.Replay{ID: "r2", State: redisstore.ReplayQueued, From: at, RequestedAt: at.Add(time.Second), UpdatedAt: at.Add(time.Second)}
	if err := s.SetReplay(ctx, "ep", second, true, redisstore.ReplayLease{Holder: "b", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	first.State = redisstore.ReplayDone
	if err := s.SetReplay(ctx, "ep", first, false, redisstore.ReplayLease{}); !errors.Is(err, redisstore.ErrReplaySuperseded) {
		t.Errorf("the first replay's write after the second was asked for: %v, want superseded", err)
	}
	_, st, err := s.Get(ctx, "ep")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(second, st.Replay); diff != "" {
		t.Errorf("stored replay (-want +got):\n%s", diff)
	}
}

// TestAReplayWhoseLeaseLapsedReadsInterrupted: a replay's instance that
// crashed left it "running" for ever, in every reader's view. Its lease,
// written with its state, lapses unless renewed, and then the replay reads
// as interrupted, with a reason for the owner; nothing brings it back to
// running (neither its renewal nor its own write). A replay whose holder
// renews it stays as it is; one that ended drops its lease and reads as
// it ended.
func TestAReplayWhoseLeaseLapsedReadsInterrupted(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	s := redisstore.New(rdb, 1000)
	ctx := t.Context()
	put(t, s, "ep")
	replay := func() redisstore.Replay {
		t.Helper()
		_, st, err := s.Get(ctx, "ep")
		if err != nil {
			t.Fatal(err)
		}
		return st.Replay
	}
	at := time.Now().UTC()
	crashed := redisstore.Replay{ID: "r1", State: redisstore.ReplayRunning, From: at, RequestedAt: at, UpdatedAt: at}
	if err := s.SetReplay(ctx, "ep", crashed, true, redisstore.ReplayLease{Holder: "a", TTL: 100 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	var got redisstore.Replay
	if !testenv.Poll(10*time.Second, func() bool { got = replay(); return got.State != redisstore.ReplayRunning }) ||
		got.State != redisstore.ReplayInterrupted || got.Error != redisstore.ReplayInterruptedReason {
		t.Fatalf("replay of an instance that stopped renewing: %+v; want interrupted with the reason", got)
	}
	if held, err := s.RenewReplays(ctx, map[string]string{"ep": "r1"}, "a", time.Minute); err != nil || held["ep"] {
		t.Errorf("renewing a lapsed lease: %v, %v; want not held", held, err)
	}
	if err := s.SetReplay(ctx, "ep", crashed, false, redisstore.ReplayLease{Holder: "a", TTL: time.Minute}); !errors.Is(err, redisstore.ErrReplayLeaseLapsed) {
		t.Errorf("the lapsed replay's own running write: %v, want lease lapsed", err)
	}
	if got := replay(); got.State != redisstore.ReplayInterrupted {
		t.Errorf("replay after its lapsed holder tried to renew and write: %+v, want still interrupted", got)
	}

	// Asked again: the new request is taken, and its holder's renewals keep it.
	again := redisstore.Replay{ID: "r2", State: redisstore.ReplayQueued, From: at, RequestedAt: at, UpdatedAt: at}
	if err := s.SetReplay(ctx, "ep", again, true, redisstore.ReplayLease{Holder: "b", TTL: 100 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		replay, holder string
		want           bool
	}{{"r1", "a", false}, {"r2", "a", false}, {"r2", "b", true}} {
		held, err := s.RenewReplays(ctx, map[string]string{"ep": tc.replay}, tc.holder, time.Hour)
		if err != nil || held["ep"] != tc.want {
			t.Errorf("renew replay %s as %s: %v, %v; want held %v", tc.replay, tc.holder, held, err, tc.want)
		}
	}
	if left := rdb.PTTL(ctx, "snip:wh:{ep}:replay_lease").Val(); left <= time.Minute {
		t.Errorf("the renewed replay's lease has %s left, want about an hour", left)
	}
	if diff := cmp.Diff(again, replay()); diff != "" {
		t.Errorf("renewed replay (-want +got):\n%s", diff)
	}
	again.State, again.Events = redisstore.ReplayDone, 3
	if err := s.SetReplay(ctx, "ep", again, false, redisstore.ReplayLease{}); err != nil {
		t.Fatal(err)
	}
	if n := rdb.Exists(ctx, "snip:wh:{ep}:replay_lease").Val(); n != 0 {
		t.Error("the lease of a replay that ended is left")
	}
	if diff := cmp.Diff(again, replay()); diff != "" {
		t.Errorf("ended replay (-want +got):\n%s", diff)
	}
}

// TestAReplayQueuesOnlyWhileItIsTheLatestAndHoldsItsLease: a replay kept
// queueing its copies after a newer replay was asked for (whose clear had
// run, so they survived it and were sent twice, once from each replay) or
// after its lease lapsed (it read interrupted). The script that queues a
// replay's batch refuses it, queueing nothing, once the replay is no
// longer the endpoint's latest or its holder no longer holds its lease.
// A replay of an endpoint deleted meanwhile is told so (it went on copying
// the rest of the stream for nothing) and queues nothing.
func TestAReplayQueuesOnlyWhileItIsTheLatestAndHoldsItsLease(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	s := redisstore.New(rdb, 1000)
	ctx := t.Context()
	put(t, s, "ep", "epGone")
	at := time.Now().UTC()
	r1 := redisstore.Replay{ID: "r1", State: redisstore.ReplayRunning, From: at, RequestedAt: at, UpdatedAt: at}
	r2 := redisstore.Replay{ID: "r2", State: redisstore.ReplayRunning, From: at, RequestedAt: at, UpdatedAt: at}
	steps := []struct {
		name    string
		before  func() error
		id      string
		hold    redisstore.ReplayHold
		event   string
		wantErr error
	}{
		{name: "the_latest_replay_holding_its_lease_queues", id: "ep",
			before: func() error {
				return s.SetReplay(ctx, "ep", r1, true, redisstore.ReplayLease{Holder: "a", TTL: time.Minute})
			},
			hold: redisstore.ReplayHold{ID: "r1", Holder: "a"}, event: "r1-a"},
		{name: "another_holder_is_refused", id: "ep",
			hold: redisstore.ReplayHold{ID: "r1", Holder: "b"}, event: "r1-b", wantErr: redisstore.ErrReplayLeaseLapsed},
		{name: "a_superseded_replay_is_refused", id: "ep",
			before: func() error {
				return s.SetReplay(ctx, "ep", r2, true, redisstore.ReplayLease{Holder: "b", TTL: time.Minute})
			},
			hold: redisstore.ReplayHold{ID: "r1", Holder: "a"}, event: "r1-late", wantErr: redisstore.ErrReplaySuperseded},
		{name: "the_newer_replay_queues", id: "ep",
			hold: redisstore.ReplayHold{ID: "r2", Holder: "b"}, event: "r2-b"},
		{name: "a_replay_whose_lease_lapsed_is_refused", id: "ep",
			before: func() error { return rdb.Del(ctx, "snip:wh:{ep}:replay_lease").Err() },
			hold:   redisstore.ReplayHold{ID: "r2", Holder: "b"}, event: "r2-lapsed", wantErr: redisstore.ErrReplayLeaseLapsed},
		{name: "a_deleted_endpoint_gets_nothing", id: "epGone",
			before: func() error {
				if err := s.SetReplay(ctx, "epGone", r1, true, redisstore.ReplayLease{Holder: "a", TTL: time.Minute}); err != nil {
					return err
				}
				return s.Delete(ctx, endpoint.Endpoint{ID: "epGone", Owner: "acme"})
			},
			hold: redisstore.ReplayHold{ID: "r1", Holder: "a"}, event: "gone", wantErr: endpoint.ErrNotFound},
	}
	// The steps build on each other, in order.
	for _, st := range steps {
		if st.before != nil {
			if err := st.before(); err != nil {
				t.Fatalf("%s: %v", st.name, err)
			}
		}
		_, _, err := s.EnqueueReplay(ctx, st.id, st.hold, []redisstore.Event{ev(1, st.event)})
		if !errors.Is(err, st.wantErr) || (err != nil) != (st.wantErr != nil) {
			t.Errorf("%s: %v, want %v", st.name, err, st.wantErr)
		}
	}
	evs, err := s.Read(ctx, "ep", "0", 100, 1<<20, 0)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"r1-a", "r2-b"}, ids(evs)); diff != "" {
		t.Errorf("queued event IDs (-want +got):\n%s", diff)
	}
	if left := testenv.Keys(t, rdb, "snip:wh:{epGone}:*"); len(left) != 0 {
		t.Errorf("keys written for the deleted endpoint: %q", left)
	}
}

// TestLiveIntakeQueuesNothingAtOrBelowTheStoredCut: the intake skips
// events at or below the endpoint's cut (a replay's, a create's, a
// resume's) as it last loaded the endpoint, which may be before a replay
// cut: its batch, routed then, reached the queue after the replay's clear
// and sat beside the replay's copies of the same events, so the receiver
// got each twice. The queueing script skips, for live intake (DedupSeq
// clicks, DedupID alerts), events at or below the cut stored with the
// endpoint when it runs; test events and a replay's copies are not cut.
func TestLiveIntakeQueuesNothingAtOrBelowTheStoredCut(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	s := redisstore.New(rdb, 1000)
	alert := func(seq uint64, id string) redisstore.Event {
		e := ev(seq, id)
		e.Type = endpoint.TypeFraudAlert
		return e
	}
	tests := []struct {
		name string
		mode redisstore.Dedup
		evs  []redisstore.Event
		want []string
	}{
		{"clicks_at_or_below_the_clicks_cut_are_skipped", redisstore.DedupSeq,
			[]redisstore.Event{ev(9, "c9"), ev(10, "c10"), ev(11, "c11")}, []string{"c11"}},
		{"alerts_at_or_below_the_alerts_cut_are_skipped", redisstore.DedupID,
			[]redisstore.Event{alert(4, "a4"), alert(5, "a5"), alert(6, "a6")}, []string{"a6"}},
		{"alerts_are_held_to_the_alerts_cut_not_the_clicks", redisstore.DedupID,
			[]redisstore.Event{alert(7, "a7")}, []string{"a7"}},
		{"test_events_are_not_cut", redisstore.DedupNone,
			[]redisstore.Event{{ID: "t", Type: endpoint.TypeTest, Time: time.Unix(1, 0).UTC(), Data: []byte(`{}`)}}, []string{"t"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			testenv.Parallel(t)
			ctx := t.Context()
			id := "ep_" + tc.name
			if err := s.Put(ctx, endpoint.Endpoint{ID: id, Owner: "acme", URL: "https://example.com/" + id,
				ReplayClicksUpto: 10, ReplayAlertsUpto: 5}); err != nil {
				t.Fatal(err)
			}
			added, _, err := s.Enqueue(ctx, tc.mode, 0, map[string][]redisstore.Event{id: tc.evs})
			if err != nil {
				t.Fatal(err)
			}
			got, err := s.Read(ctx, id, "0", 100, 1<<20, 0)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, ids(got)); diff != "" {
				t.Errorf("queue (-want +got):\n%s", diff)
			}
			if added[id] != int64(len(tc.want)) {
				t.Errorf("added %d, want %d", added[id], len(tc.want))
			}
		})
	}
}
