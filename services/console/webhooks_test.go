package main

import (
	"encoding/json"
	"fmt"
	"html"
	"net/http"
	"regexp"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/console/internal/webhookstate"
)

// TestWebhooksPanelShowsADisabledEndpoint: an endpoint the webhooks service
// disabled shows on the console with its reason and backlog.
func TestWebhooksPanelShowsADisabledEndpoint(t *testing.T) {
	t.Parallel()
	s := start(t, withToken)
	ctx := t.Context()
	s.rdb.SAdd(ctx, "snip:wh:endpoints", "ep_1")
	s.rdb.HSet(ctx, "snip:wh:{ep_1}:ep",
		"cfg", `{"id":"ep_1","owner":"acme","url":"https://hooks.acme.example/x","disabled_at":"2026-12-01T00:00:00Z","disabled_reason":"failing since 2026-11-28T00:00:00Z: HTTP 500"}`,
		"failing_since", time.Now().Add(-72*time.Hour).UnixMilli(), "last_error", "HTTP 500")
	for _, age := range []time.Duration{2 * time.Hour, time.Hour} { // its backlog: two events waiting
		s.rdb.XAdd(ctx, &redis.XAddArgs{Stream: "snip:wh:{ep_1}:q", Values: []any{"id", "e", "t", "click", "ts", time.Now().Add(-age).UnixNano(), "d", "{}"}})
	}
	var got struct {
		Available bool                  `json:"available"`
		Webhooks  webhookstate.Snapshot `json:"webhooks"`
	}
	testenv.WaitFor(t, 10*time.Second, "the endpoint on /api/webhooks", func() bool {
		code, b := do(t, nil, http.MethodGet, s.url+"/api/webhooks", nil, bearer)
		return code == http.StatusOK && json.Unmarshal(b, &got) == nil && got.Webhooks.Total == 1
	})
	e := got.Webhooks.Endpoints[0]
	if !got.Available || got.Webhooks.Disabled != 1 || e.Status != "disabled" || e.Owner != "acme" || e.Host != "hooks.acme.example" || e.LastError != "HTTP 500" ||
		e.DisabledReason != "failing since 2026-11-28T00:00:00Z: HTTP 500" || e.Backlog != 2 || got.Webhooks.Backlog != 2 || e.OldestAgeS < 7200 {
		t.Errorf("webhooks panel %+v", got)
	}
	if code, _ := do(t, nil, http.MethodGet, s.url+"/api/webhooks", nil, nil); code != http.StatusUnauthorized {
		t.Errorf("GET /api/webhooks without the console token: %d, want 401", code)
	}

	// The page arrives with the panel's figures, as with the others, so its
	// first paint shows the endpoint rather than "Reading the endpoints…".
	initialJSON := regexp.MustCompile(`id="initial"[^>]*data-json="([^"]*)"`)
	var page string
	if !testenv.Poll(10*time.Second, func() bool {
		code, b := do(t, nil, http.MethodGet, s.url+"/", nil, bearer)
		m := initialJSON.FindSubmatch(b)
		if code != http.StatusOK || m == nil {
			page = fmt.Sprintf("GET /: %d", code)
			return false
		}
		page = html.UnescapeString(string(m[1]))
		var initial struct {
			Webhooks *struct {
				Available bool                  `json:"available"`
				Webhooks  webhookstate.Snapshot `json:"webhooks"`
			} `json:"webhooks"`
		}
		return json.Unmarshal([]byte(page), &initial) == nil && initial.Webhooks != nil &&
			initial.Webhooks.Available && initial.Webhooks.Webhooks.Total == 1
	}) {
		t.Errorf("the page never arrived with the webhooks panel's figures; its first figures: %s", page)
	}
}
