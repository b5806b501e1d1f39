package whrecv_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/snipdev/snip/loadtest/internal/oracle"
	"github.com/snipdev/snip/loadtest/internal/whrecv"
)

const (
	secret      = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	otherSecret = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"
	apiKey      = "snip_test_key"
)

// fakeAPI stands in for the webhooks API's endpoint routes (the load
// test's end-to-end test registers with the real one).
type fakeAPI struct {
	mu      sync.Mutex
	created map[string]any
	deleted bool
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer "+apiKey {
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/api/webhooks/endpoints":
		_ = json.NewDecoder(r.Body).Decode(&f.created)
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(map[string]any{"id": "ep_1", "owner": "demo", "secret": secret, "backlog": 0})
	case r.Method == http.MethodGet && r.URL.Path == "/api/webhooks/endpoints/ep_1":
		_ = json.NewEncoder(w).Encode(map[string]any{"id": "ep_1", "owner": "demo", "backlog": 7})
	case r.Method == http.MethodDelete && r.URL.Path == "/api/webhooks/endpoints/ep_1":
		f.deleted = true
		w.WriteHeader(http.StatusNoContent)
	default:
		w.WriteHeader(http.StatusNotFound)
	}
}

// post sends body to the receiver as the webhooks service does, signed
// with the Standard Webhooks library under secret ("" leaves the signature
// out), and returns the status.
func post(t *testing.T, url, secret, id string, body []byte) int {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	req.Header.Set("webhook-id", id)
	req.Header.Set("webhook-timestamp", strconv.FormatInt(now.Unix(), 10))
	if secret != "" {
		wh, err := standardwebhooks.NewWebhook(secret)
		if err != nil {
			t.Fatal(err)
		}
		sig, err := wh.Sign(id, now, body)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("webhook-signature", sig)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func body(ids ...string) []byte {
	type event struct {
		ID   string         `json:"id"`
		Type string         `json:"type"`
		Data map[string]any `json:"data"`
	}
	var b struct {
		Events []event `json:"events"`
	}
	for _, id := range ids {
		b.Events = append(b.Events, event{ID: id, Type: "click", Data: map[string]any{"id": id, "code": "lt-x-0"}})
	}
	out, _ := json.Marshal(b)
	return out
}

// The receiver records what verifies by event id (a repeat as a copy),
// refuses what does not, and counts both.
func TestReceiverVerifiesEveryDeliveryAndRecordsEventsByID(t *testing.T) {
	t.Parallel()
	api := &fakeAPI{}
	srv := httptest.NewServer(api)
	defer srv.Close()
	rcv, err := whrecv.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer rcv.Close()
	links := whrecv.Filter([]string{"lt-x-0", "lt-x-1", "lt-x-2", "lt-x-3"}, whrecv.MaxFilterLinks)
	if err := rcv.Register(t.Context(), srv.URL, apiKey, "demo", links, 200*time.Millisecond); err != nil {
		t.Fatalf("register: %v", err)
	}
	if diff := cmp.Diff([]any{"lt-x-0", "lt-x-2"}, api.created["links"]); diff != "" {
		t.Errorf("endpoint's links (-want +got):\n%s", diff)
	}
	if api.created["url"] != rcv.URL() || !rcv.Wants("lt-x-2") || rcv.Wants("lt-x-1") {
		t.Errorf("registered %v; wants lt-x-2 %v, lt-x-1 %v", api.created, rcv.Wants("lt-x-2"), rcv.Wants("lt-x-1"))
	}

	for _, tc := range []struct {
		name, secret string
		body         []byte
		want         int
	}{
		{"signed", secret, body("e1", "e2"), http.StatusNoContent},
		{"signed_again", secret, body("e1", "e2"), http.StatusNoContent},
		{"signed_with_another_secret", otherSecret, body("e3"), http.StatusUnauthorized},
		{"not_signed", "", body("e4"), http.StatusUnauthorized},
		{"signed_without_events", secret, []byte(`{"events":[]}`), http.StatusNoContent},
		{"signed_one_new", secret, body("e2", "e5"), http.StatusNoContent},
	} {
		if got := post(t, rcv.URL(), tc.secret, tc.name, tc.body); got != tc.want {
			t.Errorf("%s: status %d, want %d", tc.name, got, tc.want)
		}
	}
	want := oracle.WebhookDeliveries{
		Events: []oracle.WebhookEvent{
			{ID: "e1", Type: "click", Code: "lt-x-0", Copies: 2, First: 1},
			{ID: "e2", Type: "click", Code: "lt-x-0", Copies: 3, First: 2},
			{ID: "e5", Type: "click", Code: "lt-x-0", Copies: 1, First: 3},
		},
		Requests: 6, BadSignatures: 2, BadBodies: 1,
	}
	sortEvents := cmpopts.SortSlices(func(a, b oracle.WebhookEvent) bool { return a.ID < b.ID })
	if diff := cmp.Diff(want, rcv.Deliveries(), sortEvents); diff != "" {
		t.Errorf("deliveries (-want +got):\n%s", diff)
	}

	if n, err := rcv.Queued(t.Context()); err != nil || n != 7 {
		t.Errorf("queued: %d, %v; want the endpoint's backlog, 7", n, err)
	}
	if err := rcv.Unregister(t.Context()); err != nil || !api.deleted {
		t.Errorf("unregister: %v, deleted %v", err, api.deleted)
	}
}

// A key of another owner than the run's would register an endpoint for
// that owner's clicks: refused, and the endpoint deleted.
func TestRegisterRefusesAnotherOwnersKey(t *testing.T) {
	t.Parallel()
	api := &fakeAPI{}
	srv := httptest.NewServer(api)
	defer srv.Close()
	rcv, err := whrecv.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer rcv.Close()
	if err := rcv.Register(t.Context(), srv.URL, apiKey, "acme", []string{"lt-x-0"}, time.Second); err == nil {
		t.Fatal("registered with demo's key for acme's run")
	}
	if !api.deleted {
		t.Error("the endpoint registered with another owner's key was not deleted")
	}
}
