package main

import (
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/webhooks/internal/delivery"
	"github.com/snipdev/snip/services/webhooks/internal/redisstore"
)

// TestSlowFailingAndHangingEndpointsDoNotDelayAHealthyOne: three endpoints
// of one owner get the same clicks. The healthy one gets each within 3 s of
// its publication (a few hundred milliseconds here) while the second
// answers 500 and the third hangs until the 5 s attempt timeout: a healthy
// endpoint that waited for a hanging attempt would be late; after the
// second recovers it has every event, each verified by the Standard
// Webhooks library and unaltered; the hanging one's attempts time out and
// are retried.
func TestSlowFailingAndHangingEndpointsDoNotDelayAHealthyOne(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	cfg := s.testConfig("m1")
	cfg.Timeout = 5 * time.Second // longer than the healthy endpoint's bound
	svc := s.start(t, cfg)

	healthy := newReceiver(t, nil)
	var recovered atomic.Bool
	failing := newReceiver(t, func(w http.ResponseWriter, _ *http.Request) bool {
		if recovered.Load() {
			return true
		}
		w.WriteHeader(http.StatusInternalServerError)
		return false
	})
	hanging := newReceiver(t, func(w http.ResponseWriter, r *http.Request) bool {
		<-r.Context().Done() // until the sender gives up
		return false
	})
	for _, rc := range []*receiver{healthy, failing, hanging} {
		ep := createEndpoint(t, svc.addr, rc.url(), nil)
		rc.addSecret(ep.Secret)
	}

	// 150 clicks over about 1.5 s; the healthy endpoint's latency is
	// measured from each click's publication to its receipt.
	var clicks []events.Click
	for range 15 {
		clicks = append(clicks, s.publishClicks(t, []string{"a1", "b2", "c3"}, 10)...)
		time.Sleep(100 * time.Millisecond) // pacing the load, not waiting for a result
	}
	healthy.waitAll(t, "every click at the healthy endpoint", clicks, 30*time.Second)
	published := map[string]time.Time{}
	for _, c := range clicks {
		published[c.ID] = c.Time
	}
	var worst time.Duration
	for _, r := range healthy.got() {
		for _, e := range r.events {
			worst = max(worst, r.at.Sub(published[e.ID]))
		}
	}
	t.Logf("healthy endpoint: worst publish-to-receipt latency %s", worst)
	if worst > 3*time.Second {
		t.Errorf("healthy endpoint's worst latency %s while others fail, want < 3s (batch wait 50ms, hanging attempts 5s)", worst)
	}
	if n, _ := failing.counts(); n < 2 {
		t.Errorf("failing endpoint got %d requests before recovery, want retries", n)
	}

	recovered.Store(true)
	failing.waitAll(t, "every click at the recovered endpoint", clicks, 60*time.Second)
	for name, rc := range map[string]*receiver{"healthy": healthy, "failing": failing} {
		if _, bad := rc.counts(); bad != 0 {
			t.Errorf("%s endpoint: %d requests did not verify", name, bad)
		}
		checkUnaltered(t, rc, clicks)
	}

	// The hanging endpoint: attempts recorded as timed out, then retried.
	var eps struct {
		Endpoints []struct {
			ID  string `json:"id"`
			URL string `json:"url"`
		} `json:"endpoints"`
	}
	api(t, svc.addr, acmeKey, http.MethodGet, "/api/webhooks/endpoints", nil, &eps)
	var hangID string
	for _, e := range eps.Endpoints {
		if e.URL == hanging.url() {
			hangID = e.ID
		}
	}
	testenv.WaitFor(t, 30*time.Second, "timed-out attempts retried at the hanging endpoint", func() bool {
		var ds struct {
			Deliveries []redisstore.Delivery `json:"deliveries"`
		}
		api(t, svc.addr, acmeKey, http.MethodGet, "/api/webhooks/endpoints/"+hangID+"/deliveries", nil, &ds)
		timeouts, maxAttempt := 0, 0
		for _, d := range ds.Deliveries {
			if strings.Contains(d.Error, "timed out") || strings.Contains(d.Error, "Timeout") {
				timeouts++
			}
			maxAttempt = max(maxAttempt, d.Attempt)
		}
		return timeouts >= 2 && maxAttempt >= 2
	})
}

// TestSecretRotationMidStream: every delivery verifies with the old or the
// new secret while clicks flow through a rotation, and deliveries made
// during the overlap carry both signatures.
func TestSecretRotationMidStream(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	svc := s.start(t, s.testConfig("m1"))
	rc := newReceiver(t, nil)
	ep := createEndpoint(t, svc.addr, rc.url(), nil)
	rc.addSecret(ep.Secret)

	before := s.publishClicks(t, []string{"a1", "b2"}, 40)
	rc.waitAll(t, "clicks before the rotation", before, 30*time.Second)
	var rotated created
	if code := api(t, svc.addr, acmeKey, http.MethodPost, "/api/webhooks/endpoints/"+ep.ID+"/rotate-secret", nil, &rotated); code != http.StatusOK {
		t.Fatalf("rotate: status %d", code)
	}
	if rotated.Secret == ep.Secret || !strings.HasPrefix(rotated.Secret, "whsec_") {
		t.Fatalf("rotated secret %q, want a new whsec_ secret", rotated.Secret)
	}
	rc.addSecret(rotated.Secret)
	after := s.publishClicks(t, []string{"a1", "b2"}, 40)
	rc.waitAll(t, "clicks after the rotation", after, 30*time.Second)
	if _, bad := rc.counts(); bad != 0 {
		t.Fatalf("%d deliveries verified with neither secret", bad)
	}

	// During the overlap both secrets sign: each alone verifies every
	// delivery made after the rotation.
	for _, secret := range []string{ep.Secret, rotated.Secret} {
		wh, err := standardwebhooks.NewWebhook(secret)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rc.got() {
			if !slices.ContainsFunc(r.events, func(e delivery.BodyEvent) bool { return containsID(after, e.ID) }) {
				continue
			}
			if err := wh.Verify(r.body, r.header); err != nil {
				t.Errorf("delivery %s after the rotation does not verify with one of the secrets: %v", r.webhookID, err)
			}
		}
	}
}

func containsID(clicks []events.Click, id string) bool {
	return slices.ContainsFunc(clicks, func(c events.Click) bool { return c.ID == id })
}
