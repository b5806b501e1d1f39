package httpload_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/snipdev/snip/loadtest/internal/httpload"
	"github.com/snipdev/snip/loadtest/internal/series"
	"github.com/snipdev/snip/loadtest/internal/truth"
	"github.com/snipdev/snip/loadtest/internal/workload"
)

const tag = workload.Tag(0xabcdef)

// seen is a request as the service received it.
type seen struct {
	Path, UA, Referrer, Country, XFF string
}

func TestEveryAnswerMapsToItsClick(t *testing.T) {
	t.Parallel()
	gen, err := workload.New(workload.Spec{Seed: 3, Links: 10, ZipfS: 1, BotShare: 0.2, BurstShare: 0.1, BurstSize: 5,
		Visitors: 100, ProbeEvery: 7, CountryShare: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	got := map[uint64]seen{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seq, ok := tag.ParseRequestID(r.Header.Get("X-Request-Id"))
		if !ok {
			t.Errorf("request without the run's request ID: %q", r.Header.Get("X-Request-Id"))
			return
		}
		mu.Lock()
		got[seq] = seen{r.URL.Path, r.UserAgent(), r.Referer(), r.Header.Get("X-Country"), r.Header.Get("X-Forwarded-For")}
		mu.Unlock()
		switch seq % 10 {
		case 3: // the service refuses: no click
			w.WriteHeader(http.StatusServiceUnavailable)
		case 5: // an answer that says nothing about the click
			w.WriteHeader(http.StatusInternalServerError)
		default:
			w.Header().Set("Location", "https://example.com/")
			w.WriteHeader(http.StatusFound)
		}
	}))
	defer srv.Close()

	m := series.NewMeter(time.Now(), 100)
	rec := truth.NewRecorder(100)
	n, err := httpload.Run(t.Context(), httpload.Config{
		Base: srv.URL, Rate: 100, Duration: time.Second, Timeout: time.Minute,
		ForwardedFor: true, Tag: tag, Gen: gen,
	}, rec, m)
	if err != nil {
		t.Fatal(err)
	}
	if n < 90 || n > 110 {
		t.Fatalf("%d requests at 100/s for 1s", n)
	}
	// Exactly the 503s are refused and exactly the 500s uncertain (so every
	// 302 is sent): a recorder left empty would pass a check of only what
	// it holds.
	var wantRefused, wantUncertain []uint64
	for seq := range n {
		switch seq % 10 {
		case 3:
			wantRefused = append(wantRefused, seq)
		case 5:
			wantUncertain = append(wantUncertain, seq)
		}
	}
	refused, uncertain, answers := rec.Finish(n)
	if diff := cmp.Diff(wantRefused, refused); diff != "" {
		t.Errorf("clicks recorded refused (-the 503s +recorded):\n%s", diff)
	}
	if diff := cmp.Diff(wantUncertain, uncertain); diff != "" {
		t.Errorf("clicks recorded uncertain (-the 500s +recorded):\n%s", diff)
	}
	if answers["302"] == 0 || answers["503"] == 0 || answers["500"] == 0 {
		t.Errorf("answers %v: want 302s, 503s and 500s", answers)
	}
	for seq := range n {
		v := gen.Visit(seq)
		want := seen{"/" + tag.LinkCode(v.Link), v.UserAgent, v.Referrer, v.Country, v.IP.String()}
		mu.Lock()
		g, ok := got[seq]
		mu.Unlock()
		if !ok {
			t.Errorf("click %d never reached the service", seq)
			continue
		}
		if diff := cmp.Diff(want, g); diff != "" {
			t.Errorf("click %d was sent dressed wrong (-visit +request):\n%s", seq, diff)
		}
	}
	if m.ProbesSent() == 0 {
		t.Error("no probe 302 was noted")
	}
}

func TestClassify(t *testing.T) {
	t.Parallel()
	unconfirmed := http.Header{"Snip-Click": {"unconfirmed"}}
	tests := []struct {
		code   uint16
		header http.Header
		err    string
		want   truth.Outcome
	}{
		{302, nil, "", truth.Sent},
		{404, nil, "404 Not Found", truth.Refused},
		{503, nil, "503 Service Unavailable", truth.Refused},
		{503, unconfirmed, "503 Service Unavailable", truth.Uncertain},
		{500, nil, "500 Internal Server Error", truth.Uncertain},
		{200, nil, "", truth.Uncertain},
		{0, nil, "Get \"http://x\": context deadline exceeded (Client.Timeout exceeded)", truth.Uncertain},
		{0, nil, "dial tcp: connection refused", truth.Uncertain},
	}
	for _, tc := range tests {
		if got, _ := httpload.Classify(tc.code, tc.header, tc.err); got != tc.want {
			t.Errorf("Classify(%d, %q) = %s, want %s", tc.code, tc.err, got, tc.want)
		}
	}
}

func TestCreateLinks(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	codes := map[string]string{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/links" || r.Header.Get("Authorization") != "Bearer k" || !strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		var body struct{ Target, Code string }
		_ = json.NewDecoder(r.Body).Decode(&body)
		mu.Lock()
		codes[body.Code] = body.Target
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(map[string]string{"code": body.Code, "owner": "acme", "target": body.Target})
	}))
	defer srv.Close()
	owner, err := httpload.CreateLinks(t.Context(), srv.URL, "k", "http://127.0.0.1:8089/articles/", tag, 50)
	if err != nil || owner != "acme" {
		t.Fatalf("CreateLinks = %q, %v", owner, err)
	}
	for i := range 50 {
		code := tag.LinkCode(i)
		if want := "http://127.0.0.1:8089/articles/" + code; codes[code] != want {
			t.Errorf("link %s: target %q, want %q", code, codes[code], want)
		}
	}
	if _, err := httpload.CreateLinks(t.Context(), srv.URL, "wrong key", "http://127.0.0.1:8089/articles", tag, 5); err == nil {
		t.Error("CreateLinks with a refused key succeeded")
	}
}

// The load offered is the schedule's: rate times its duration, from when
// it began. Answers that come after the schedule ended (a slow service,
// requests timing out) are waited for, but the seconds spent waiting offer
// nothing: counted at the rate, they showed as load offered and not sent,
// the sign of a generator that cannot keep up.
func TestOfferedIsTheScheduleNotTheWaitForTheLastAnswers(t *testing.T) {
	t.Parallel()
	gen, err := workload.New(workload.Spec{Seed: 3, Links: 10, ZipfS: 1, Visitors: 100})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(1500 * time.Millisecond) // a slow service: the answer comes when it comes
		w.Header().Set("Location", "https://example.com/")
		w.WriteHeader(http.StatusFound)
	}))
	defer srv.Close()
	m := series.NewMeter(time.Now(), 20)
	n, err := httpload.Run(t.Context(), httpload.Config{
		Base: srv.URL, Rate: 20, Duration: time.Second, Timeout: time.Minute, Tag: tag, Gen: gen,
	}, truth.NewRecorder(20), m)
	if err != nil {
		t.Fatal(err)
	}
	// One second closing the whole run: the schedule's second and the
	// 1.5 s or more of waiting for its last answers.
	s := m.Tick(time.Now(), series.PhaseLoad)
	if s.Offered < 19 || s.Offered > 21 || s.Sent != n {
		t.Errorf("offered %d, sent %d of %d requests: want the schedule's 20 (20/s for 1s) offered", s.Offered, s.Sent, n)
	}
}
