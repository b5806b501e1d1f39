package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// demoWebhooksPath is the path of the demo's local webhook receiver; the
// demo replaces any endpoint of an earlier run that points at it.
const demoWebhooksPath = "/demo-webhooks"

// joinWebhooks starts a local receiver that verifies each delivery with the
// Standard Webhooks library and prints it, and registers it as the demo
// owner's endpoint for clicks and fraud alerts. It returns a function that
// stops the receiver (a no-op when the webhooks service is not running).
func (d *demo) joinWebhooks(ctx context.Context, started []string) func() {
	if !containsName(started, "webhooks") {
		return func() {}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		d.logf("%-11s receiver: %v", "webhooks", err)
		return func() {}
	}
	rcv := &demoReceiver{d: d}
	srv := &http.Server{Handler: rcv, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	stop := func() { _ = srv.Close() }

	// The service answers on its port from its start, and 503 to its API
	// until it has reached NATS and Redis: wait for /readyz first, as long
	// as the demo waits for the redirect's API.
	if err := waitUntil(ctx, 30*time.Second, func() error {
		if why := d.notReady(ctx, "webhooks"); why != "" {
			return errors.New(why)
		}
		return nil
	}); err != nil {
		d.logf("%-11s could not register the demo receiver: not ready: %v", "webhooks", err)
		return stop
	}
	api := "http://" + d.addr(7) + "/api/webhooks/endpoints"
	d.removeOldDemoEndpoints(ctx, api)
	url := "http://" + ln.Addr().String() + demoWebhooksPath
	body, _ := json.Marshal(map[string]any{"url": url, "event_types": []string{"click", "fraud_alert"}, "batch_max": 50, "batch_wait_ms": 5000})
	code, resp, err := httpPost(ctx, d.httpClient(), api, demoAPIKey, body)
	if err != nil || code != http.StatusCreated {
		d.logf("%-11s could not register the demo receiver: %d %s %v", "webhooks", code, resp, err)
		return stop
	}
	var ep struct {
		ID     string `json:"id"`
		Secret string `json:"secret"`
	}
	if err := json.Unmarshal(resp, &ep); err != nil {
		d.logf("%-11s endpoint answer: %v", "webhooks", err)
		return stop
	}
	wh, err := standardwebhooks.NewWebhook(ep.Secret)
	if err != nil {
		d.logf("%-11s secret: %v", "webhooks", err)
		return stop
	}
	rcv.wh.Store(wh)
	d.logf("%-11s endpoint %s -> %s (verified and printed here, every 5 s)", "webhooks", ep.ID, url)
	return stop
}

// removeOldDemoEndpoints deletes the demo receivers of earlier runs.
func (d *demo) removeOldDemoEndpoints(ctx context.Context, api string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, api, nil)
	if err != nil {
		return
	}
	req.Header.Set("Authorization", "Bearer "+demoAPIKey)
	client := d.httpClient()
	resp, err := client.Do(req)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	var list struct {
		Endpoints []struct {
			ID  string `json:"id"`
			URL string `json:"url"`
		} `json:"endpoints"`
	}
	if json.NewDecoder(resp.Body).Decode(&list) != nil {
		return
	}
	for _, e := range list.Endpoints {
		if strings.HasPrefix(e.URL, "http://127.0.0.1:") && strings.HasSuffix(e.URL, demoWebhooksPath) {
			del, err := http.NewRequestWithContext(ctx, http.MethodDelete, api+"/"+e.ID, nil)
			if err != nil {
				continue
			}
			del.Header.Set("Authorization", "Bearer "+demoAPIKey)
			if r, err := client.Do(del); err == nil {
				r.Body.Close()
			}
		}
	}
}

func containsName(names []string, n string) bool {
	for _, s := range names {
		if s == n {
			return true
		}
	}
	return false
}

// demoReceiver verifies and prints deliveries. The webhooks service
// delivers at least once: a batch whose answer it did not record (a
// timeout, a restart mid-POST, a redeliver) comes again with the same
// webhook-id and body. The receiver says so when it sees an ID again, as
// the lesson a real receiver must act on: deduplicate by webhook-id.
type demoReceiver struct {
	d *demo
	// wh verifies signatures once the endpoint is registered; the server
	// is already answering (503 before), so it is set while it may be read.
	wh atomic.Pointer[standardwebhooks.Webhook]

	// The last demoSeenIDs webhook-ids verified: ring[next] is the oldest
	// once the ring is full.
	mu   sync.Mutex
	seen map[string]struct{}
	ring []string
	next int
}

// demoSeenIDs is how many webhook-ids the demo's receiver remembers (a few
// hours of the demo's deliveries, one every 5 s at most per event type).
const demoSeenIDs = 4096

// again records id as received and reports whether it was received before.
func (r *demoReceiver) again(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.seen[id]; ok {
		return true
	}
	if r.seen == nil {
		r.seen, r.ring = make(map[string]struct{}, demoSeenIDs), make([]string, 0, demoSeenIDs)
	}
	if len(r.ring) < demoSeenIDs {
		r.ring = append(r.ring, id)
	} else {
		delete(r.seen, r.ring[r.next])
		r.ring[r.next] = id
		r.next = (r.next + 1) % demoSeenIDs
	}
	r.seen[id] = struct{}{}
	return false
}

func (r *demoReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(io.LimitReader(req.Body, 1<<20))
	wh := r.wh.Load()
	if err != nil || wh == nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	if err := wh.Verify(body, req.Header); err != nil {
		r.d.logf("webhook    %s REJECTED: %v", req.Header.Get("webhook-id"), err)
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	var b struct {
		Events []struct {
			ID   string `json:"id"`
			Type string `json:"type"`
			Data struct {
				Code string `json:"code"`
				Rule string `json:"rule"`
			} `json:"data"`
		} `json:"events"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	counts := map[string]int{}
	for _, e := range b.Events {
		k := e.Type + " " + e.Data.Code
		if e.Type == "fraud_alert" {
			k = "fraud_alert " + e.Data.Rule + " on " + e.Data.Code
		}
		counts[k]++
	}
	parts := make([]string, 0, len(counts))
	for k, n := range counts {
		parts = append(parts, fmt.Sprintf("%d %s", n, k))
	}
	id := req.Header.Get("webhook-id")
	if r.again(id) {
		r.d.logf("webhook    verified %s again: a REDELIVERY of a batch already received (%s); delivery is at least once, so a receiver deduplicates by webhook-id", short(id), strings.Join(parts, ", "))
	} else {
		r.d.logf("webhook    verified %s: %s", short(id), strings.Join(parts, ", "))
	}
	w.WriteHeader(http.StatusNoContent)
}

func short(id string) string {
	if len(id) > 40 {
		return id[:40] + "…"
	}
	return id
}
