// Package whrecv is the load test's webhook receiver: an HTTP endpoint the
// load test registers through the webhooks API for the run's owner, which
// verifies every delivery's Standard Webhooks signature with the published
// library (not with code of this repository, so a signing mistake cannot
// hide behind a matching mistake here), records every event it is sent by
// event id, and answers 204. The oracle reads what it recorded
// (oracle.WebhookReader).
//
// It holds about 150 bytes per distinct event (its id, type, link and
// counts, in a map), up to MaxEvents; events past the bound are answered
// and counted, not recorded, and the oracle fails the run on them.
package whrecv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/snipdev/snip/loadtest/internal/oracle"
)

// MaxEvents is the most distinct events a receiver records.
const MaxEvents = 4_000_000

// MaxFilterLinks is the most links an endpoint's filter may list (the
// webhooks API's limit).
const MaxFilterLinks = 100

// maxBody bounds a request body: the webhooks service caps a batch at
// WEBHOOKS_MAX_BATCH_BYTES (256 KiB by default).
const maxBody = 8 << 20

// Path is where the receiver listens; the endpoint's URL ends with it.
const Path = "/loadtest-webhooks"

// Receiver is a running receiver. Start it, Register it, and Close it.
type Receiver struct {
	ln  net.Listener
	srv *http.Server

	// set by Register
	api, key, id string
	wants        map[string]bool

	mu     sync.Mutex
	wh     *standardwebhooks.Webhook
	events map[string]*got
	order  uint64
	d      oracle.WebhookDeliveries
}

type got struct {
	typ, code     string
	copies, first uint64
}

// Start listens on addr ("127.0.0.1:0" for any port) and serves.
func Start(addr string) (*Receiver, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("webhook receiver: listen: %w", err)
	}
	r := &Receiver{ln: ln, events: map[string]*got{}}
	r.srv = &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = r.srv.Serve(ln) }()
	return r, nil
}

// URL is the endpoint's URL.
func (r *Receiver) URL() string { return "http://" + r.ln.Addr().String() + Path }

// Close stops serving.
func (r *Receiver) Close() error { return r.srv.Close() }

// Endpoint is the registered endpoint's ID.
func (r *Receiver) Endpoint() string { return r.id }

// Wants reports whether the endpoint's filter wants clicks on code.
func (r *Receiver) Wants(code string) bool { return r.wants[code] }

// ServeHTTP verifies and records one delivery.
func (r *Receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(io.LimitReader(req.Body, maxBody))
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.d.Requests++
	if r.wh == nil || r.wh.Verify(body, req.Header) != nil {
		// Refused: the service tries again, and the row fails.
		r.d.BadSignatures++
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	var b struct {
		Events []struct {
			ID   string `json:"id"`
			Type string `json:"type"`
			Data struct {
				Code string `json:"code"`
			} `json:"data"`
		} `json:"events"`
	}
	if err := json.Unmarshal(body, &b); err != nil || len(b.Events) == 0 {
		r.d.BadBodies++
		w.WriteHeader(http.StatusNoContent) // signed by the service: answered, counted
		return
	}
	for _, e := range b.Events {
		if g, ok := r.events[e.ID]; ok {
			g.copies++
			continue
		}
		if len(r.events) >= MaxEvents {
			r.d.Unrecorded++
			continue
		}
		r.order++
		r.events[e.ID] = &got{typ: e.Type, code: e.Data.Code, copies: 1, first: r.order}
	}
	w.WriteHeader(http.StatusNoContent)
}

// Deliveries returns everything recorded so far.
func (r *Receiver) Deliveries() oracle.WebhookDeliveries {
	r.mu.Lock()
	defer r.mu.Unlock()
	d := r.d
	d.Events = make([]oracle.WebhookEvent, 0, len(r.events))
	for id, g := range r.events {
		d.Events = append(d.Events, oracle.WebhookEvent{ID: id, Type: g.typ, Code: g.code, Copies: g.copies, First: g.first})
	}
	return d
}

// endpointAnswer is the part of the webhooks API's answer the receiver
// needs.
type endpointAnswer struct {
	ID      string `json:"id"`
	Owner   string `json:"owner"`
	Secret  string `json:"secret"`
	Backlog uint64 `json:"backlog"`
}

// Register creates the receiver's endpoint through the webhooks API at api
// (its base URL) with key, an API key of owner: clicks only, on the links
// given, one request at most every batchWait. It fails if the key is not
// owner's: the endpoint would get another owner's clicks.
func (r *Receiver) Register(ctx context.Context, api, key, owner string, links []string, batchWait time.Duration) error {
	r.api, r.key = api, key
	body, _ := json.Marshal(map[string]any{"url": r.URL(), "event_types": []string{"click"}, "links": links,
		"batch_max": 1000, "batch_wait_ms": batchWait.Milliseconds()})
	var ep endpointAnswer
	if err := r.call(ctx, http.MethodPost, "/api/webhooks/endpoints", body, http.StatusCreated, &ep); err != nil {
		return fmt.Errorf("register webhook endpoint: %w", err)
	}
	r.id = ep.ID
	if ep.Owner != owner {
		_ = r.Unregister(ctx)
		return fmt.Errorf("register webhook endpoint: the API key is owner %q's, the run's clicks are %q's", ep.Owner, owner)
	}
	wh, err := standardwebhooks.NewWebhook(ep.Secret)
	if err != nil {
		_ = r.Unregister(ctx)
		return fmt.Errorf("register webhook endpoint: secret: %w", err)
	}
	r.wants = make(map[string]bool, len(links))
	for _, c := range links {
		r.wants[c] = true
	}
	r.mu.Lock()
	r.wh = wh
	r.mu.Unlock()
	return nil
}

// Unregister deletes the endpoint, its queue and its delivery records.
func (r *Receiver) Unregister(ctx context.Context) error {
	if r.id == "" {
		return nil
	}
	if err := r.call(ctx, http.MethodDelete, "/api/webhooks/endpoints/"+r.id, nil, http.StatusNoContent, nil); err != nil {
		return fmt.Errorf("delete webhook endpoint %s: %w", r.id, err)
	}
	return nil
}

// Queued returns the events the webhooks service holds in the endpoint's
// queue (its status's backlog).
func (r *Receiver) Queued(ctx context.Context) (uint64, error) {
	var ep endpointAnswer
	if err := r.call(ctx, http.MethodGet, "/api/webhooks/endpoints/"+r.id, nil, http.StatusOK, &ep); err != nil {
		return 0, err
	}
	return ep.Backlog, nil
}

// errStatus: the API answered another status than the call expects.
var errStatus = errors.New("unexpected status")

func (r *Receiver) call(ctx context.Context, method, path string, body []byte, want int, into any) error {
	req, err := http.NewRequestWithContext(ctx, method, r.api+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+r.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != want {
		return fmt.Errorf("%s %s: %w %d: %s", method, path, errStatus, resp.StatusCode, bytes.TrimSpace(b))
	}
	if into != nil {
		if err := json.Unmarshal(b, into); err != nil {
			return fmt.Errorf("%s %s: answer: %w", method, path, err)
		}
	}
	return nil
}

// Filter is the links of a run the endpoint asks for: the even-numbered
// ones, at most max (the webhooks API's limit on a filter). The others are
// links whose clicks it must not get.
func Filter(codes []string, max int) []string {
	var out []string
	for i := 0; i < len(codes) && len(out) < max; i += 2 {
		out = append(out, codes[i])
	}
	return slices.Clip(out)
}

var _ oracle.WebhookReader = (*Receiver)(nil)
