package endpoint_test

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/snipdev/snip/services/webhooks/internal/endpoint"
)

func TestNewValidates(t *testing.T) {
	t.Parallel()
	rules := endpoint.Rules{HTTPHosts: []string{"receiver.local"}, DefaultBatchMax: 100, DefaultBatchWait: time.Second}
	tests := []struct {
		name string
		req  endpoint.Request
		ok   bool
	}{
		{"https", endpoint.Request{URL: "https://hooks.example.com/snip", Types: []string{"click"}}, true},
		{"both_types_and_links", endpoint.Request{URL: "https://h.example/x", Types: []string{"click", "fraud_alert"}, Links: []string{"abc"}}, true},
		{"http_allow_listed_host", endpoint.Request{URL: "http://receiver.local:9999/x", Types: []string{"click"}}, true},
		{"http_elsewhere", endpoint.Request{URL: "http://hooks.example.com/x", Types: []string{"click"}}, false},
		{"no_types", endpoint.Request{URL: "https://h.example/x"}, false},
		{"unknown_type", endpoint.Request{URL: "https://h.example/x", Types: []string{"purchase"}}, false},
		{"bad_link_code", endpoint.Request{URL: "https://h.example/x", Types: []string{"click"}, Links: []string{"a b"}}, false},
		{"credentials", endpoint.Request{URL: "https://u:p@h.example/x", Types: []string{"click"}}, false},
		{"fragment", endpoint.Request{URL: "https://h.example/x#y", Types: []string{"click"}}, false},
		{"no_host", endpoint.Request{URL: "https:///x", Types: []string{"click"}}, false},
		{"scheme", endpoint.Request{URL: "gopher://h.example/x", Types: []string{"click"}}, false},
		{"batch_max_zero_uses_default", endpoint.Request{URL: "https://h.example/x", Types: []string{"click"}, BatchMax: 0}, true},
		{"batch_max_too_big", endpoint.Request{URL: "https://h.example/x", Types: []string{"click"}, BatchMax: 1001}, false},
		{"batch_wait_too_long", endpoint.Request{URL: "https://h.example/x", Types: []string{"click"}, BatchWaitMS: 61_000}, false},
		{"url_too_long", endpoint.Request{URL: "https://h.example/" + strings.Repeat("x", 2100), Types: []string{"click"}}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e, err := endpoint.New("acme", tc.req, rules, time.Now())
			if tc.ok != (err == nil) {
				t.Fatalf("New(%+v) = %v, want ok=%v", tc.req, err, tc.ok)
			}
			if err != nil && !errors.Is(err, endpoint.ErrInvalid) {
				t.Errorf("error %v does not wrap ErrInvalid", err)
			}
			if err == nil && (!strings.HasPrefix(e.Secret, "whsec_") || e.BatchMax < 1 || e.ID == "") {
				t.Errorf("endpoint %+v: want an ID, a whsec_ secret and a batch size", e)
			}
		})
	}
}

// TestSignVerifiesWithTheStandardWebhooksLibrary: each secret of a rotation
// verifies the header on its own.
func TestSignVerifiesWithTheStandardWebhooksLibrary(t *testing.T) {
	t.Parallel()
	e := endpoint.Endpoint{Secret: endpoint.NewSecret()}
	old := e.Secret
	now := time.Now()
	e.Rotate(now, time.Hour)
	if got := e.Secrets(now); len(got) != 2 {
		t.Fatalf("secrets during the overlap: %d, want 2", len(got))
	}
	if got := e.Secrets(now.Add(2 * time.Hour)); len(got) != 1 || got[0] != e.Secret {
		t.Fatalf("secrets after the overlap: %v, want only the new one", got)
	}
	body := []byte(`{"events":[{"id":"x","type":"test","timestamp":"2026-01-01T00:00:00Z","data":{}}]}`)
	sig, err := endpoint.Sign(e.Secrets(now), "msg_1", now, body)
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{}
	h.Set("webhook-id", "msg_1")
	h.Set("webhook-timestamp", strconv.FormatInt(now.Unix(), 10))
	h.Set("webhook-signature", sig)
	for name, secret := range map[string]string{"old": old, "new": e.Secret} {
		wh, err := standardwebhooks.NewWebhook(secret)
		if err != nil {
			t.Fatal(err)
		}
		if err := wh.Verify(body, h); err != nil {
			t.Errorf("%s secret: %v", name, err)
		}
		if err := wh.Verify(append(body, ' '), h); err == nil {
			t.Errorf("%s secret verified an altered body", name)
		}
	}
	other, _ := standardwebhooks.NewWebhook(endpoint.NewSecret())
	if err := other.Verify(body, h); err == nil {
		t.Error("an unrelated secret verified the delivery")
	}
}

func TestWants(t *testing.T) {
	t.Parallel()
	e := endpoint.Endpoint{Types: []string{endpoint.TypeClick}, Links: []string{"a1"}}
	tests := []struct {
		name, typ, code string
		want            bool
	}{
		{"click_on_filtered_link", endpoint.TypeClick, "a1", true},
		{"click_on_other_link", endpoint.TypeClick, "b2", false},
		{"unsubscribed_type", endpoint.TypeFraudAlert, "a1", false},
		{"test_always", endpoint.TypeTest, "", true},
	}
	for _, tc := range tests {
		if got := e.Wants(tc.typ, tc.code); got != tc.want {
			t.Errorf("%s: Wants(%s, %s) = %v, want %v", tc.name, tc.typ, tc.code, got, tc.want)
		}
	}
	e.DisabledAt = time.Now()
	if e.Wants(endpoint.TypeClick, "a1") {
		t.Error("a disabled endpoint wants events")
	}
}
