package redisstore_test

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

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
	if err := s.SetState(ctx, e.ID, redisstore.State{FailingSince: time.Now(), LastError: "HTTP 500", Attempts: 1}); err != nil {
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
	if err := s.SetState(ctx, e.ID, redisstore.State{FailingSince: time.Now(), LastError: "HTTP 500", Attempts: 2}); err != nil {
		t.Fatal(err)
	}
	if err := s.Delivered(ctx, e.ID, []string{queued[0].Entry}); err != nil {
		t.Fatal(err)
	}
	if left := testenv.Keys(t, rdb, "snip:wh:{ep_gone}:*"); len(left) != 0 {
		t.Errorf("keys of the deleted endpoint after the sender's writes: %q", left)
	}
	if _, _, err := s.Get(ctx, e.ID); !errors.Is(err, endpoint.ErrNotFound) {
		t.Errorf("Get after the delete: %v, want ErrNotFound", err)
	}
}
