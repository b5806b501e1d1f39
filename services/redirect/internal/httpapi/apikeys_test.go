package httpapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/owners"
	"github.com/snipdev/snip/pkg/webserver"
	"github.com/snipdev/snip/services/redirect/internal/httpapi"
)

// authThen is the real owner store whose Authenticate, once the key has
// passed, runs then: it forces what happens when another request or an
// operator acts between a request's authentication and its work.
type authThen struct {
	*owners.Store
	then func(ctx context.Context)
}

func (a authThen) Authenticate(ctx context.Context, key string) (owners.Owner, error) {
	o, err := a.Store.Authenticate(ctx, key)
	if err == nil && a.then != nil {
		a.then(ctx)
	}
	return o, err
}

// A rotation whose key is revoked after it authenticated, by an operator's
// revoke or by another rotation with the same key, is refused and leaves no
// key behind: a request in flight never leaves with a working key once its
// own key is revoked. (Without the check it got 201 and a key that worked
// after the revoke had returned.)
func TestRotateWithAKeyRevokedInFlightGivesNoKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		revoke func(ctx context.Context, s *owners.Store) error
	}{
		{"operator_revokes_every_key", func(ctx context.Context, s *owners.Store) error {
			_, err := s.Revoke(ctx, "acme")
			return err
		}},
		{"another_request_rotates_first", func(ctx context.Context, s *owners.Store) error {
			_, err := s.Rotate(ctx, "acme")
			return err
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rdb, _ := servers.Redis.NewDB(t)
			store := owners.NewStore(rdb)
			key, err := store.Create(t.Context(), "acme", "Acme")
			if err != nil {
				t.Fatal(err)
			}
			var revokeErr error
			web := webserver.New(slog.New(slog.DiscardHandler), prometheus.NewRegistry())
			api := &httpapi.API{Log: slog.New(slog.DiscardHandler), Keys: store,
				Owners: authThen{Store: store, then: func(ctx context.Context) { revokeErr = tc.revoke(ctx, store) }}}
			api.Register(web.Echo, prometheus.NewRegistry())

			req := httptest.NewRequest("POST", "/api/key/rotate", nil)
			req.Header.Set("Authorization", "Bearer "+key)
			w := httptest.NewRecorder()
			web.Echo.ServeHTTP(w, req)
			if revokeErr != nil {
				t.Fatal(revokeErr)
			}
			if w.Code != http.StatusUnauthorized {
				t.Errorf("rotate with a key revoked in flight: %d %s, want 401", w.Code, w.Body)
			}
			// Whatever the response said, no key of acme but one the
			// revoking side was given may work: the set holds the keys.
			hashes, err := rdb.SMembers(t.Context(), "snip:owner:acme:keys").Result()
			if err != nil {
				t.Fatal(err)
			}
			want := 0
			if tc.name == "another_request_rotates_first" {
				want = 1
			}
			if len(hashes) != want {
				t.Errorf("acme has %d keys after the in-flight rotation, want %d", len(hashes), want)
			}
			for _, h := range hashes {
				if id, err := rdb.Get(t.Context(), "snip:apikey:"+h).Result(); err != nil || id != "acme" {
					t.Errorf("key %s…: %q %v", h[:8], id, err)
				}
			}
			if _, err := store.Authenticate(t.Context(), key); !errors.Is(err, owners.ErrUnauthorized) {
				t.Errorf("the revoked key: %v, want ErrUnauthorized", err)
			}
		})
	}
}

// rotateFailing is a KeyRotator whose rotation returns key and err: the
// store's answer when it revoked the caller's key and then failed (key
// set), or failed before (key empty).
type rotateFailing struct {
	key string
	err error
}

func (r rotateFailing) RotateFrom(context.Context, string, string) (string, error) {
	return r.key, r.err
}

// A rotation that revoked the caller's key and then failed to revoke the
// owner's other keys still answers 201 with the new key, the caller's only
// one now, and says the others may still work; one that failed before
// giving a key is a 503 with no key.
func TestRotateThatCouldNotRevokeTheOtherKeysStillGivesTheNewKey(t *testing.T) {
	t.Parallel()
	rdb, _ := servers.Redis.NewDB(t)
	store := owners.NewStore(rdb)
	key, err := store.Create(t.Context(), "acme", "Acme")
	if err != nil {
		t.Fatal(err)
	}
	const fresh = "snip_the_new_key_0123456789"
	tests := []struct {
		name     string
		rotator  rotateFailing
		wantCode int
		wantKey  string
	}{
		{"the_others_not_revoked", rotateFailing{fresh, errors.New("revoke the old keys: WRONGTYPE")}, http.StatusCreated, fresh},
		{"nothing_rotated", rotateFailing{"", errors.New("store the new key: connection refused")}, http.StatusServiceUnavailable, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			web := webserver.New(slog.New(slog.DiscardHandler), prometheus.NewRegistry())
			api := &httpapi.API{Log: slog.New(slog.DiscardHandler), Keys: tc.rotator, Owners: store}
			api.Register(web.Echo, prometheus.NewRegistry())
			req := httptest.NewRequest("POST", "/api/key/rotate", nil)
			req.Header.Set("Authorization", "Bearer "+key)
			w := httptest.NewRecorder()
			web.Echo.ServeHTTP(w, req)
			var body struct {
				Owner  string `json:"owner"`
				APIKey string `json:"api_key"`
				Note   string `json:"note"`
			}
			_ = json.Unmarshal(w.Body.Bytes(), &body)
			if w.Code != tc.wantCode || body.APIKey != tc.wantKey {
				t.Fatalf("rotate: %d %s; want %d with key %q", w.Code, w.Body, tc.wantCode, tc.wantKey)
			}
			if tc.wantKey != "" && (body.Owner != "acme" || !strings.Contains(body.Note, "other keys of this owner may still work")) {
				t.Errorf("rotate answered %+v; want acme's new key and a note that other keys may still work", body)
			}
		})
	}
}
