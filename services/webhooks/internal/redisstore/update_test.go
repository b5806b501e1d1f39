package redisstore_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/webhooks/internal/endpoint"
	"github.com/snipdev/snip/services/webhooks/internal/redisstore"
)

// The changes the service makes to a stored endpoint, each an Edit.
var (
	disable = func(e *endpoint.Endpoint, _ redisstore.State) (redisstore.Write, error) {
		e.DisabledAt, e.DisabledReason = time.Unix(1000, 0).UTC(), "failing"
		return redisstore.WriteConfig, nil
	}
	rotate = func(e *endpoint.Endpoint, _ redisstore.State) (redisstore.Write, error) {
		e.OldSecret, e.Secret = e.Secret, "whsec_new"
		return redisstore.WriteConfig, nil
	}
	pause = func(e *endpoint.Endpoint, _ redisstore.State) (redisstore.Write, error) {
		e.Paused = true
		return redisstore.WriteConfig, nil
	}
	markReplay = func(e *endpoint.Endpoint, _ redisstore.State) (redisstore.Write, error) {
		e.ReplayClicksUpto = 42
		e.Generation++
		return redisstore.WriteConfig, nil
	}
	resume = func(e *endpoint.Endpoint, _ redisstore.State) (redisstore.Write, error) {
		e.Paused, e.DisabledAt, e.DisabledReason = false, time.Time{}, ""
		return redisstore.WriteConfigAndResetState, nil
	}
)

// TestInterleavedUpdatesKeepEachOthersChanges: two changes of one endpoint
// at once, the second made whole between the first's read and its write
// (the test runs it inside the first's edit), both stand: the first reads
// again and edits what the second wrote. Written back as it was read, the
// first would undo the second: a disable racing a rotation brought the old
// secret back, the one the owner had just been told to replace.
func TestInterleavedUpdatesKeepEachOthersChanges(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	s := redisstore.New(rdb, 1000)
	base := endpoint.Endpoint{Owner: "acme", URL: "https://example.com/hook", Secret: "whsec_old"}
	tests := []struct {
		name          string
		first, second redisstore.Edit
		want          func(e *endpoint.Endpoint)
	}{
		{"rotation_during_a_disable", disable, rotate, func(e *endpoint.Endpoint) {
			e.DisabledAt, e.DisabledReason = time.Unix(1000, 0).UTC(), "failing"
			e.OldSecret, e.Secret = "whsec_old", "whsec_new"
		}},
		{"disable_during_a_rotation", rotate, disable, func(e *endpoint.Endpoint) {
			e.DisabledAt, e.DisabledReason = time.Unix(1000, 0).UTC(), "failing"
			e.OldSecret, e.Secret = "whsec_old", "whsec_new"
		}},
		{"pause_during_a_replay", markReplay, pause, func(e *endpoint.Endpoint) {
			e.Paused, e.ReplayClicksUpto, e.Generation = true, 42, 1
		}},
		{"two_replays", markReplay, markReplay, func(e *endpoint.Endpoint) {
			e.ReplayClicksUpto, e.Generation = 42, 2
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			testenv.Parallel(t)
			ctx := t.Context()
			e := base
			e.ID = "ep_" + tc.name
			if err := s.Put(ctx, e); err != nil {
				t.Fatal(err)
			}
			runs := 0
			got, _, err := s.Update(ctx, e.ID, func(cur *endpoint.Endpoint, st redisstore.State) (redisstore.Write, error) {
				runs++
				if runs == 1 {
					if _, _, err := s.Update(ctx, e.ID, tc.second); err != nil {
						t.Fatalf("the second update: %v", err)
					}
				}
				return tc.first(cur, st)
			})
			if err != nil {
				t.Fatal(err)
			}
			want := e
			tc.want(&want)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("endpoint the first update answered (-want +got):\n%s", diff)
			}
			stored, _, err := s.Get(ctx, e.ID)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, stored); diff != "" {
				t.Errorf("endpoint stored (-want +got):\n%s", diff)
			}
			if runs != 2 {
				t.Errorf("the first edit ran %d times, want 2 (once more after the second's write)", runs)
			}
		})
	}
}

// TestNoWriteBringsBackADeletedEndpoint: a change of an endpoint its owner
// deletes between the change's read and its write (a rotation, a resume,
// a replay's mark, the sender's disable), and whatever the sender records
// after the delete (a failure, a delivery), store nothing: the endpoint
// stays deleted and none of its keys come back. Written back as it was
// read, the change brought the endpoint back (its configuration, with no
// owner's list naming it, and its queue's marks).
func TestNoWriteBringsBackADeletedEndpoint(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	s := redisstore.New(rdb, 1000)
	ctx := t.Context()
	e := endpoint.Endpoint{ID: "ep_gone", Owner: "acme", URL: "https://example.com/hook", Secret: "whsec_old"}
	if err := s.Put(ctx, e); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Enqueue(ctx, redisstore.DedupSeq, 0, map[string][]redisstore.Event{e.ID: {ev(1, "a")}}); err != nil {
		t.Fatal(err)
	}
	queued, err := s.Read(ctx, e.ID, "0", 10, 1<<20, 0)
	if err != nil || len(queued) != 1 {
		t.Fatalf("read the queue: %d events, %v", len(queued), err)
	}
	token := senderLease(t, s, e.ID)
	if _, err := s.RecordFailure(ctx, e.ID, token, time.Now(), time.Time{}, "HTTP 500"); err != nil {
		t.Fatal(err)
	}
	// Its lease is given up (it expires otherwise): only what the
	// writes leave is looked for.
	if err := s.Release(ctx, e.ID, token); err != nil {
		t.Fatal(err)
	}
	for _, edit := range []redisstore.Edit{rotate, resume, markReplay, disable} {
		if _, _, err := s.Update(ctx, e.ID, func(cur *endpoint.Endpoint, st redisstore.State) (redisstore.Write, error) {
			if err := s.Delete(ctx, e); err != nil {
				t.Fatal(err)
			}
			return edit(cur, st)
		}); !errors.Is(err, endpoint.ErrNotFound) {
			t.Errorf("update of an endpoint deleted during it: %v, want ErrNotFound", err)
		}
		if left := testenv.Keys(t, rdb, "snip:wh:{ep_gone}:*"); len(left) != 0 {
			t.Fatalf("keys of the deleted endpoint after an update: %q", left)
		}
		if err := s.Put(ctx, e); err != nil { // for the next edit
			t.Fatal(err)
		}
	}
	if err := s.Delete(ctx, e); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RecordFailure(ctx, e.ID, token, time.Now(), time.Time{}, "HTTP 500"); !errors.Is(err, endpoint.ErrNotFound) {
		t.Errorf("failure recorded after the delete: %v, want ErrNotFound", err)
	}
	if _, err := s.Delivered(ctx, e.ID, token, []string{queued[0].Entry}); err != nil {
		t.Fatal(err)
	}
	if left := testenv.Keys(t, rdb, "snip:wh:{ep_gone}:*"); len(left) != 0 {
		t.Errorf("keys of the deleted endpoint after the sender's writes: %q", left)
	}
	if _, _, err := s.Get(ctx, e.ID); !errors.Is(err, endpoint.ErrNotFound) {
		t.Errorf("Get after the delete: %v, want ErrNotFound", err)
	}
}

// TestAFailingRunEndsWithADeliveryOrAResume: the failing run that
// disables an endpoint (its start, FailingSince) is the one stored, and it
// ends when a batch is delivered, when the owner resumes the endpoint, or
// when the receiver took a batch whose delivery was not stored: the next
// failure starts a new run, whatever the sender last read. A failing-since
// left from before a success (the reset after a delivery was a second
// write whose error was ignored), or written back by a sender that read it
// before a resume cleared it, disabled the endpoint at its next failure.
func TestAFailingRunEndsWithADeliveryOrAResume(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	s := redisstore.New(rdb, 1000)
	t0 := time.UnixMilli(1_000_000_000_000)
	t1, t2 := t0.Add(time.Hour), t0.Add(100*time.Hour)
	tests := []struct {
		name string
		// between runs after a failure at t0, before one at t2, by the
		// sender holding token.
		between func(t *testing.T, id, token string)
		// okAfter is the sender's last success, given with t2's failure.
		okAfter time.Time
		want    redisstore.State
	}{
		{"failures_continue_the_run", func(*testing.T, string, string) {}, time.Time{},
			redisstore.State{FailingSince: t0, LastError: "at t2", Attempts: 2}},
		{"a_delivery_ends_it", func(t *testing.T, id, token string) {
			queued, err := s.Read(t.Context(), id, "0", 10, 1<<20, 0)
			if err != nil || len(queued) != 1 {
				t.Fatalf("read the queue: %d events, %v", len(queued), err)
			}
			if _, err := s.Delivered(t.Context(), id, token, []string{queued[0].Entry}); err != nil {
				t.Fatal(err)
			}
		}, time.Time{}, redisstore.State{FailingSince: t2, LastError: "at t2", Attempts: 1}},
		{"a_resume_ends_it", func(t *testing.T, id, _ string) {
			if _, _, err := s.Update(t.Context(), id, resume); err != nil {
				t.Fatal(err)
			}
		}, time.Time{}, redisstore.State{FailingSince: t2, LastError: "at t2", Attempts: 1}},
		{"a_success_not_stored_ends_it", func(*testing.T, string, string) {}, t1,
			redisstore.State{FailingSince: t2, LastError: "at t2", Attempts: 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			testenv.Parallel(t)
			ctx := t.Context()
			id := "ep_" + tc.name
			put(t, s, id)
			if _, _, err := s.Enqueue(ctx, redisstore.DedupSeq, 0, map[string][]redisstore.Event{id: {ev(1, "a")}}); err != nil {
				t.Fatal(err)
			}
			token := senderLease(t, s, id)
			if _, err := s.RecordFailure(ctx, id, token, t0, time.Time{}, "at t0"); err != nil {
				t.Fatal(err)
			}
			tc.between(t, id, token)
			got, err := s.RecordFailure(ctx, id, token, t2, tc.okAfter, "at t2")
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("failing run recorded (-want +got):\n%s", diff)
			}
			if _, stored, err := s.Get(ctx, id); err != nil || !cmp.Equal(tc.want, stored) {
				t.Errorf("failing run stored: %+v, %v; want %+v", stored, err, tc.want)
			}
		})
	}
}

// TestOnlyTheLatestReplayHoldingItsLeaseCutsAndClears: a replay superseded
// after its running write (a newer request through another instance)
// still cut and cleared: its cut, read from the streams before the newer
// replay's, could land after it and lower it, and its clear deleted what
// the newer replay had copied since, which then ended done without those
// events. A replay's cut and each chunk of its clear are written only
// while it is the endpoint's latest and its holder holds its lease;
// otherwise nothing changes. The endpoint's other changes (Update) are
// not bound to a replay.
func TestOnlyTheLatestReplayHoldingItsLeaseCutsAndClears(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	s := redisstore.New(rdb, 1000)
	ctx := t.Context()
	put(t, s, "ep")
	old := redisstore.ReplayHold{ID: "r1", Holder: "a"}
	latest := redisstore.ReplayHold{ID: "r2", Holder: "b"}
	for _, h := range []redisstore.ReplayHold{old, latest} {
		if err := s.SetReplay(ctx, "ep", redisstore.Replay{ID: h.ID, State: redisstore.ReplayRunning}, true,
			redisstore.ReplayLease{Holder: h.Holder, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	// The latest replay's copies.
	if _, _, err := s.EnqueueReplay(ctx, "ep", latest, []redisstore.Event{ev(1, "a"), ev(2, "b"), ev(3, "c")}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetInflight(ctx, "ep", senderLease(t, s, "ep"), "0-1", "0-2"); err != nil {
		t.Fatal(err)
	}
	lower := func(e *endpoint.Endpoint, _ redisstore.State) (redisstore.Write, error) {
		e.ReplayClicksUpto = 7
		e.Generation++
		return redisstore.WriteConfig, nil
	}
	steps := []struct {
		name    string
		before  func() error
		write   func() error
		wantErr error
	}{
		{name: "the_latest_replay_cuts", write: func() error {
			_, _, err := s.UpdateAsReplay(ctx, "ep", latest, markReplay)
			return err
		}},
		{name: "the_superseded_replay_does_not_cut", wantErr: redisstore.ErrReplaySuperseded, write: func() error {
			_, _, err := s.UpdateAsReplay(ctx, "ep", old, lower)
			return err
		}},
		{name: "the_superseded_replay_does_not_clear", wantErr: redisstore.ErrReplaySuperseded, write: func() error {
			_, err := s.ClearUpTo(ctx, "ep", old, 100, 100)
			return err
		}},
		{name: "another_change_is_not_bound_to_a_replay", write: func() error {
			_, _, err := s.Update(ctx, "ep", pause)
			return err
		}},
		{name: "a_replay_whose_lease_lapsed_does_not_cut", wantErr: redisstore.ErrReplayLeaseLapsed,
			before: func() error { return rdb.Del(ctx, "snip:wh:{ep}:replay_lease").Err() },
			write: func() error {
				_, _, err := s.UpdateAsReplay(ctx, "ep", latest, lower)
				return err
			}},
		{name: "a_replay_whose_lease_lapsed_does_not_clear", wantErr: redisstore.ErrReplayLeaseLapsed, write: func() error {
			_, err := s.ClearUpTo(ctx, "ep", latest, 100, 100)
			return err
		}},
	}
	// The steps build on each other, in order.
	for _, st := range steps {
		if st.before != nil {
			if err := st.before(); err != nil {
				t.Fatalf("%s: %v", st.name, err)
			}
		}
		if err := st.write(); !errors.Is(err, st.wantErr) || (err != nil) != (st.wantErr != nil) {
			t.Errorf("%s: %v, want %v", st.name, err, st.wantErr)
		}
	}
	e, _, err := s.Get(ctx, "ep")
	if err != nil {
		t.Fatal(err)
	}
	if e.ReplayClicksUpto != 42 || e.Generation != 1 || !e.Paused {
		t.Errorf("endpoint: cut %d, generation %d, paused %v; want the latest replay's cut (42, generation 1) and the pause",
			e.ReplayClicksUpto, e.Generation, e.Paused)
	}
	evs, err := s.Read(ctx, "ep", "0", 100, 1<<20, 0)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"a", "b", "c"}, ids(evs)); diff != "" {
		t.Errorf("the latest replay's copies after the others' clears (-want +got):\n%s", diff)
	}
	if _, _, ok, err := s.Inflight(ctx, "ep"); err != nil || !ok {
		t.Errorf("in-flight mark after the others' clears: ok=%v err=%v, want it kept", ok, err)
	}
}

// TestASenderWritesOnlyWhileItHoldsItsLease: a sender whose endpoint's
// lease passed to another sender (another instance's after it lapsed, or
// this instance's next one after it stopped) writes nothing of the
// endpoint's delivery state, however late its write reaches Redis: not
// its batch in flight over the new holder's (a crash would send the new
// holder's batch cut differently, under another webhook-id), not a
// delivery that deletes the new holder's mark and ends its failing run,
// not a failure counted again in that run, not a disable. Each write is
// refused with ErrLeaseLost and the state stays as the new holder left it;
// the new holder's own writes are made.
func TestASenderWritesOnlyWhileItHoldsItsLease(t *testing.T) {
	testenv.Parallel(t)
	rdb := servers.RedisClient(t)
	s := redisstore.New(rdb, 1000)
	for _, next := range []string{"b", "a"} {
		t.Run("the_next_sender_is_"+next+"s", func(t *testing.T) {
			testenv.Parallel(t)
			ctx := t.Context()
			id := "ep_next_" + next
			put(t, s, id)
			if _, _, err := s.Enqueue(ctx, redisstore.DedupSeq, 0, map[string][]redisstore.Event{id: {ev(1, "e1"), ev(2, "e2"), ev(3, "e3")}}); err != nil {
				t.Fatal(err)
			}
			queued, err := s.Read(ctx, id, "0", 10, 1<<20, 0)
			if err != nil || len(queued) != 3 {
				t.Fatalf("read the queue: %d events, %v", len(queued), err)
			}
			old := senderLease(t, s, id)
			if err := s.SetInflight(ctx, id, old, queued[0].Entry, queued[0].Entry); err != nil {
				t.Fatal(err)
			}
			if next == "b" {
				// a's lease lapses; b takes it.
				if err := rdb.Del(ctx, "snip:wh:{"+id+"}:lease").Err(); err != nil {
					t.Fatal(err)
				}
			} // else a's sender stopped; a's next scan takes the lease again.
			held, err := s.Leases(ctx, []string{id}, nil, next, time.Hour)
			if err != nil || held[id] == "" || held[id] == old {
				t.Fatalf("the next sender's lease: %v, %v; want a token other than %q", held, err, old)
			}
			token := held[id]
			// The new holder sends the batch in flight, fails, and marks
			// its next batch after delivering it.
			failedAt := time.UnixMilli(1_000_000_000_000)
			if _, err := s.RecordFailure(ctx, id, token, failedAt, time.Time{}, "new holder's failure"); err != nil {
				t.Fatal(err)
			}
			if err := s.SetInflight(ctx, id, token, queued[1].Entry, queued[2].Entry); err != nil {
				t.Fatal(err)
			}
			want := snapshot(t, s, rdb, id)

			late := failedAt.Add(-time.Minute) // before the lease passed
			writes := []struct {
				name  string
				write func() error
			}{
				{"in_flight", func() error { return s.SetInflight(ctx, id, old, queued[0].Entry, queued[0].Entry) }},
				{"delivered", func() error { _, err := s.Delivered(ctx, id, old, []string{queued[0].Entry}); return err }},
				{"failure", func() error {
					_, err := s.RecordFailure(ctx, id, old, late, time.Time{}, "old sender's failure")
					return err
				}},
				{"disable", func() error {
					_, _, err := s.UpdateAsSender(ctx, id, old, disable)
					return err
				}},
			}
			for _, w := range writes {
				if err := w.write(); !errors.Is(err, redisstore.ErrLeaseLost) {
					t.Errorf("the old sender's %s: %v, want ErrLeaseLost", w.name, err)
				}
				if diff := cmp.Diff(want, snapshot(t, s, rdb, id)); diff != "" {
					t.Errorf("state after the old sender's %s (-as the new holder left it +got):\n%s", w.name, diff)
				}
			}

			// The holder's own writes are made.
			if _, _, err := s.UpdateAsSender(ctx, id, token, disable); err != nil {
				t.Errorf("the holder's disable: %v", err)
			}
			if _, err := s.Delivered(ctx, id, token, []string{queued[1].Entry, queued[2].Entry}); err != nil {
				t.Fatal(err)
			}
			got := snapshot(t, s, rdb, id)
			if got.Inflight != "" || !slices.Equal(got.Queue, []string{"e1"}) || got.Attempts != 0 || !got.Disabled {
				t.Errorf("after the holder's disable and delivery: %+v; want no mark, e1 queued, no failing run, disabled", got)
			}
		})
	}
}

// senderState is what a sender's writes change of an endpoint.
type senderState struct {
	Inflight     string
	Queue        []string
	FailingSince time.Time
	LastError    string
	Attempts     int
	Disabled     bool
	Rev          string
}

func snapshot(t *testing.T, s *redisstore.Store, rdb redis.UniversalClient, id string) senderState {
	t.Helper()
	ctx := t.Context()
	e, st, err := s.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	q, err := s.Read(ctx, id, "0", 100, 1<<20, 0)
	if err != nil {
		t.Fatal(err)
	}
	mark, err := rdb.Get(ctx, "snip:wh:{"+id+"}:inflight").Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	return senderState{Inflight: mark, Queue: ids(q), FailingSince: st.FailingSince, LastError: st.LastError, Attempts: st.Attempts,
		Disabled: !e.DisabledAt.IsZero(), Rev: rdb.HGet(ctx, "snip:wh:{"+id+"}:ep", "rev").Val()}
}
