package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/labstack/echo/v4"

	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/console/internal/consoletest"
	"github.com/snipdev/snip/services/console/internal/livefeed"
	"github.com/snipdev/snip/services/console/internal/sse"
)

// A page's live stream carries each click once, also when the console's
// shared consumer fails and is started again while the page watches (the
// new consumer goes on after the last click the pages were given, not
// CONSOLE_LIVE_RECENT back); a page that opens after the restart still
// gets the recent clicks first.
func TestLiveStreamSendsEachClickOnceAcrossAConsumerRestart(t *testing.T) {
	t.Parallel()
	_, js := consoletest.NATS(t)
	breakable := consoletest.NewBreakable(js)
	old := consoletest.Publish(t, js, consoletest.Clicks("acme", "old", 5)...)
	hub := livefeed.New(breakable, livefeed.Config{Recent: 3, MaxRate: 1e6})
	hubDone := make(chan struct{})
	go func() {
		defer close(hubDone)
		_ = hub.Run(t.Context()) // t.Context ends before the cleanups run
	}()
	t.Cleanup(func() { <-hubDone })

	e := echo.New()
	a := &api{d: Deps{Live: hub, LiveWriteTimeout: 10 * time.Second, Stop: make(chan struct{})}}
	e.GET("/api/live", a.live)
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	page := func() *sse.Reader {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		t.Cleanup(cancel)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/api/live", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /api/live: %d", resp.StatusCode)
		}
		return sse.NewReader(resp.Body)
	}
	// until reads a page's clicks up to the one with sequence last and
	// returns their sequences in the order received.
	until := func(r *sse.Reader, last uint64) []uint64 {
		t.Helper()
		var seqs []uint64
		for len(seqs) == 0 || seqs[len(seqs)-1] != last {
			e, err := r.Next()
			if err != nil {
				t.Fatalf("live stream: after sequences %v, waiting for %d: %v", seqs, last, err)
			}
			if e.Name != "click" {
				continue
			}
			var c livefeed.Click
			if err := json.Unmarshal(e.Data, &c); err != nil {
				t.Fatal(err)
			}
			seqs = append(seqs, c.Seq)
		}
		return seqs
	}

	p := page()
	got := until(p, old[4])
	live := consoletest.Publish(t, js, consoletest.Clicks("acme", "live", 5)...)
	got = append(got, until(p, live[4])...)

	// The consumer fails under the hub (as when its connection closes);
	// the hub starts another after its retry delay.
	breakable.Break()
	testenv.WaitFor(t, 30*time.Second, "the hub following CLICKS with a second consumer", func() bool {
		return breakable.Opened() == 2 && hub.Stats().Following
	})
	more := consoletest.Publish(t, js, consoletest.Clicks("acme", "more", 5)...)
	got = append(got, until(p, more[4])...)
	want := append(append(append([]uint64(nil), old[2:]...), live...), more...)
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("one page's clicks across the consumer's restart (-want +got):\n%s", d)
	}

	// A page opened now gets the three recent clicks, once each.
	if d := cmp.Diff(more[2:], until(page(), more[4])); d != "" {
		t.Errorf("a new page's clicks (-want +got):\n%s", d)
	}
}
