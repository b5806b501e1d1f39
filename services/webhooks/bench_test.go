package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
)

// benchEvents is the number of clicks per measurement
// (WEBHOOKS_BENCH_EVENTS, default 5000).
func benchEvents() int {
	if n, err := strconv.Atoi(os.Getenv("WEBHOOKS_BENCH_EVENTS")); err == nil && n > 0 {
		return n
	}
	return 5000
}

// BenchmarkDeliveries measures deliveries per second to one local receiver
// that verifies every request: the endpoint is paused while n clicks are
// queued, then resumed, and the time to deliver them all is measured, with
// batches of 100 and with one event per POST, side by side.
func BenchmarkDeliveries(b *testing.B) {
	n := benchEvents()
	for _, batch := range []int{100, 1} {
		b.Run(fmt.Sprintf("batch_%d", batch), func(b *testing.B) {
			for range b.N {
				s := newSystem(b)
				svc := s.start(b, s.testConfig("bench"))
				rc := newReceiver(b, nil)
				ep := createEndpoint(b, svc.addr, rc.url(), map[string]any{"batch_max": batch, "batch_wait_ms": 100})
				rc.addSecret(ep.Secret)
				base := "/api/webhooks/endpoints/" + ep.ID
				api(b, svc.addr, acmeKey, http.MethodPost, base+"/pause", nil, nil)
				clicks := s.publishClicks(b, []string{"a1", "b2", "c3", "d4"}, n)
				testenv.WaitFor(b, 5*time.Minute, "the backlog queued", func() bool {
					return getEndpoint(b, svc.addr, ep.ID).Backlog == int64(n)
				})
				start := time.Now()
				api(b, svc.addr, acmeKey, http.MethodPost, base+"/resume", nil, nil)
				rc.waitAll(b, "every delivery", clicks, 10*time.Minute)
				el := time.Since(start)
				requests, bad := rc.counts()
				if bad != 0 {
					b.Fatalf("%d requests did not verify", bad)
				}
				b.ReportMetric(float64(n)/el.Seconds(), "events/s")
				b.ReportMetric(float64(requests)/el.Seconds(), "requests/s")
				b.Logf("batch %d: %d events in %s (%.0f events/s, %d requests)", batch, n, el, float64(n)/el.Seconds(), requests)
			}
		})
	}
}

// BenchmarkOtherReaderLag measures how long another consumer group (a
// no-op reader, standing in for the counter, fraud and warehouse) takes to
// read n clicks published at once: alone, and while the webhooks service
// delivers the same clicks to a healthy, a failing (500) and a hanging
// endpoint. The goal is no difference.
func BenchmarkOtherReaderLag(b *testing.B) {
	n := benchEvents()
	for _, withWebhooks := range []bool{false, true} {
		b.Run(fmt.Sprintf("webhooks_%v", withWebhooks), func(b *testing.B) {
			for range b.N {
				s := newSystem(b)
				svc := s.start(b, s.testConfig("bench"))
				var healthy, failing, hanging *receiver
				if withWebhooks {
					healthy = newReceiver(b, nil)
					failing = newReceiver(b, func(w http.ResponseWriter, _ *http.Request) bool {
						w.WriteHeader(http.StatusInternalServerError)
						return false
					})
					hanging = newReceiver(b, func(w http.ResponseWriter, r *http.Request) bool {
						<-r.Context().Done()
						return false
					})
					for _, rc := range []*receiver{healthy, failing, hanging} {
						rc.addSecret(createEndpoint(b, svc.addr, rc.url(), nil).Secret)
					}
				}
				var got atomic.Int64
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				go func() {
					done <- reader.Run(ctx, s.js, reader.Config{Group: "other", Member: "o1", Partitions: testPartitions,
						LeaseTTL: time.Second, Start: reader.StartAtNew()},
						func(_ context.Context, _ int, batch []reader.Event) error { got.Add(int64(len(batch))); return nil })
				}()
				testenv.WaitFor(b, 30*time.Second, "the other group's consumers", func() bool {
					for p := range testPartitions {
						if _, err := s.js.Consumer(b.Context(), events.ClicksStream, fmt.Sprintf("other-p%d", p)); err != nil {
							return false
						}
					}
					return true
				})
				start := time.Now()
				clicks := publishAsync(b, s, n)
				published := time.Since(start)
				testenv.WaitFor(b, 10*time.Minute, "the other reader caught up", func() bool { return got.Load() >= int64(n) })
				el := time.Since(start)
				cancel()
				<-done
				if withWebhooks {
					// The figure is one "while the webhooks service
					// delivers" only if it did: every click reached the
					// healthy endpoint, and the failing and hanging ones
					// were tried.
					healthy.waitAll(b, "every click at the healthy endpoint", clicks, 10*time.Minute)
					for name, rc := range map[string]*receiver{"failing": failing, "hanging": hanging} {
						if requests, _ := rc.counts(); requests == 0 {
							b.Fatalf("the %s endpoint was never tried", name)
						}
					}
				}
				b.ReportMetric(el.Seconds(), "s_to_read_all")
				b.ReportMetric((el - published).Seconds(), "s_after_last_publish")
				b.Logf("webhooks=%v: other reader read %d clicks %s after the first was published (publishing took %s)", withWebhooks, n, el, published)
			}
		})
	}
}

// publishAsync publishes n clicks of owner acme without waiting for each
// ack, and returns them.
func publishAsync(b *testing.B, s *system, n int) []events.Click {
	b.Helper()
	codes := []string{"a1", "b2", "c3", "d4"}
	clicks := make([]events.Click, 0, n)
	for i := range n {
		c := events.Click{V: events.ClickVersion, ID: events.NewID(), Time: time.Now().UTC(), Code: codes[i%len(codes)],
			Owner: "acme", Target: "https://example.com/", Visitor: "v" + strconv.Itoa(i%7)}
		data, err := json.Marshal(c)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := s.js.PublishAsync(events.ClickSubject(c.Owner, c.Code), data, jetstream.WithMsgID(c.ID)); err != nil {
			b.Fatal(err)
		}
		clicks = append(clicks, c)
	}
	select {
	case <-s.js.PublishAsyncComplete():
	case <-time.After(5 * time.Minute):
		b.Fatal("publish acks missing after 5m")
	}
	return clicks
}
