package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/dashboard/dashboardtest"
	"github.com/snipdev/snip/pkg/deadletter"
	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/owners"
	"github.com/snipdev/snip/pkg/service/servicetest"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/console/internal/consoletest"
	"github.com/snipdev/snip/services/console/internal/sse"
)

var servers *testenv.Servers

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, &servers, testenv.WithRedis(), testenv.WithClickHouse()))
}

const testToken = "console-test-token-0123456789"

// system is a console running in the test against its own NATS, Redis
// database and ClickHouse database.
type system struct {
	url  string
	js   jetstream.JetStream
	rdb  *redis.Client
	ch   driver.Conn
	stop func() error
}

// start runs the console with cfg's defaults as in production, on loopback,
// with the test's servers and whatever edit changes.
func start(t *testing.T, edit func(*Config)) *system {
	t.Helper()
	_, js := consoletest.NATS(t)
	return startOn(t, js, log(t), edit)
}

// log is the console's logger in tests: silent unless -v.
func log(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("test", t.Name())
	}
	return slog.New(slog.DiscardHandler)
}

// startOn runs the console against the NATS server js is connected to.
func startOn(t *testing.T, js jetstream.JetStream, log *slog.Logger, edit func(*Config)) *system {
	t.Helper()
	natsURL := js.Conn().ConnectedUrl()
	rdb, db := servers.Redis.NewDB(t)
	conn, chdb := servers.ClickHouse.NewDB(t)
	dashboardtest.ApplySchema(t, conn)
	cfg, err := loadConfig([]string{
		"NATS_URL=" + natsURL, "REDIS_URL=" + servers.Redis.URL(db), "HTTP_ADDR=127.0.0.1:0",
		"CLICKHOUSE_ADDR=" + servers.ClickHouse.Addr, "CLICKHOUSE_DATABASE=" + chdb, "SHUTDOWN_TIMEOUT=5s",
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(&cfg)
	}
	s := &system{js: js, rdb: rdb, ch: conn}
	r := servicetest.Start(t, func(ctx context.Context, ready func(string)) error {
		cfg.Ready = ready
		return run(ctx, log, cfg)
	})
	s.url, s.stop = r.URL(), r.Stop
	return s
}

func withToken(c *Config) { c.Token = testToken }

// do sends a request with optional JSON body and headers and returns the
// status and body.
func do(t *testing.T, client *http.Client, method, url string, body any, header map[string]string) (int, []byte) {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = strings.NewReader(string(b))
	}
	req, err := http.NewRequestWithContext(t.Context(), method, url, r)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	if client == nil {
		client = noRedirects()
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func noRedirects() *http.Client {
	return &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

var bearer = map[string]string{"Authorization": "Bearer " + testToken}

func getJSON(t *testing.T, s *system, path string, into any) {
	t.Helper()
	code, b := do(t, nil, http.MethodGet, s.url+path, nil, bearer)
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, code, b)
	}
	if err := json.Unmarshal(b, into); err != nil {
		t.Fatalf("GET %s: %v in %s", path, err, b)
	}
}

// metric reads one sample from /metrics ("name" or "name{labels}").
func metric(t *testing.T, s *system, name string) float64 {
	t.Helper()
	_, b := do(t, nil, http.MethodGet, s.url+"/metrics", nil, nil)
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}

func TestPageHasEveryPanelAndLoadsNothingFromElsewhere(t *testing.T) {
	t.Parallel()
	// Six wrong tokens below: more than the default per-client allowance.
	s := start(t, func(c *Config) { withToken(c); c.AuthFailureBurst = 20 })
	code, b := do(t, nil, http.MethodGet, s.url+"/", nil, bearer)
	if code != http.StatusOK {
		t.Fatalf("GET /: %d", code)
	}
	page := string(b)
	for _, id := range []string{"panel-readers", "panel-consumers", "panel-outbox", "panel-webhooks", "panel-live", "panel-alerts", "panel-dlq", "panel-warehouse", "replay-dialog"} {
		if !strings.Contains(page, `id="`+id+`"`) {
			t.Errorf("the page has no #%s", id)
		}
	}
	if strings.Contains(page, "http://") || strings.Contains(page, "https://") {
		t.Errorf("the page refers to another site")
	}
	for _, path := range []string{"/static/console.js", "/static/console.css"} {
		if code, b := do(t, nil, http.MethodGet, s.url+path, nil, nil); code != http.StatusOK || len(b) < 100 {
			t.Errorf("GET %s: %d, %d bytes", path, code, len(b))
		}
	}
	req, _ := http.NewRequest(http.MethodGet, s.url+"/", nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "script-src 'self'") {
		t.Errorf("Content-Security-Policy = %q", csp)
	}
	// Without the token: the page sends to the login form, the API says 401.
	if code, _ := do(t, nil, http.MethodGet, s.url+"/", nil, nil); code != http.StatusSeeOther {
		t.Errorf("GET / without the token: %d, want 303 to /login", code)
	}
	for _, path := range []string{"/api/readers", "/api/dlq", "/api/alerts", "/api/outbox", "/api/warehouse", "/api/live"} {
		if code, _ := do(t, nil, http.MethodGet, s.url+path, nil, nil); code != http.StatusUnauthorized {
			t.Errorf("GET %s without the token: %d, want 401", path, code)
		}
		if code, _ := do(t, nil, http.MethodGet, s.url+path, nil, map[string]string{"Authorization": "Bearer wrong-token-0123456789"}); code != http.StatusUnauthorized {
			t.Errorf("GET %s with a wrong token: %d, want 401", path, code)
		}
	}
}

// seed puts something in every panel: a group that is down with lag, dead
// letters, a fraud alert, warehouse rows, an outbox backlog.
func seed(t *testing.T, s *system) (parked []uint64) {
	t.Helper()
	ctx := t.Context()
	consoletest.DownGroup(t, s.js, "down-reader")
	clicks := consoletest.Clicks("acme", "abc", 6)
	seqs := consoletest.Publish(t, s.js, clicks...)
	for i, c := range clicks[:3] {
		data, _ := json.Marshal(c)
		ack, err := deadletter.Publish(ctx, s.js, deadletter.Parcel{
			Source: "down-reader", Reason: "malformed", Stream: events.ClicksStream,
			Subject: events.PartitionedClickSubject(consoletest.Partitions, c.Owner, c.Code), Seq: seqs[i],
			Attempts: 1, Error: "test: <b>not</b> a click", Consumer: "down-reader", Data: data,
		})
		if err != nil {
			t.Fatal(err)
		}
		parked = append(parked, ack.Sequence)
	}
	if _, err := deadletter.Publish(ctx, s.js, deadletter.Parcel{
		Source: "preview", Reason: "timeout", Stream: events.PreviewJobsStream, Subject: events.PreviewJobSubject,
		Seq: 1, Attempts: 5, Error: "deadline exceeded", Consumer: topology.PreviewConsumer, Data: []byte(`{"v":1,"id":"job-1"}`),
	}); err != nil {
		t.Fatal(err)
	}
	consoletest.PublishAlert(t, s.js, consoletest.Alert("acme", "abc", "link_flood", 0))

	now := time.Now().UTC()
	dashboardtest.Insert(t, s.ch, []events.Click{
		dashboardtest.Click("acme", "abc", now, false), dashboardtest.Click("acme", "abc", now, true),
		dashboardtest.Click("globex", "xyz", now, false),
	})

	s.rdb.Set(ctx, "snip:outbox:shards", 1, 0)
	s.rdb.XAdd(ctx, &redis.XAddArgs{Stream: "snip:{s0}:outbox:clicks", ID: strconv.FormatInt(now.Add(-2*time.Minute).UnixMilli(), 10) + "-0",
		Values: []any{"id", "x", "subject", "clicks.acme.abc", "data", "{}"}})
	return parked
}

func TestPanelsShowTheSeededSystem(t *testing.T) {
	t.Parallel()
	s := start(t, withToken)
	parked := seed(t, s)

	type readers struct {
		Groups []struct {
			Group     string  `json:"group"`
			Pending   uint64  `json:"pending"`
			OldestAge float64 `json:"oldest_unread_age_s"`
			Unowned   int     `json:"unowned"`
			Note      string  `json:"replay_note"`
		} `json:"groups"`
		Consumers []struct {
			Consumer string `json:"consumer"`
		} `json:"consumers"`
		Warn float64 `json:"warn_after_s"`
	}
	// The server counts the group's pending clicks after it acks their
	// publishes: read the panel until it shows the 6 seeded ones, then
	// check that read.
	var readersPanel readers
	testenv.WaitFor(t, 30*time.Second, "the readers panel to show down-reader's 6 clicks pending", func() bool {
		var p readers
		getJSON(t, s, "/api/readers", &p)
		readersPanel = p
		return len(p.Groups) == 1 && p.Groups[0].Pending == 6
	})
	if len(readersPanel.Groups) != 1 || readersPanel.Groups[0].Group != "down-reader" || readersPanel.Groups[0].Pending != 6 ||
		readersPanel.Groups[0].OldestAge <= 0 || readersPanel.Groups[0].Unowned == 0 || readersPanel.Warn != 60 {
		t.Errorf("readers panel: %+v", readersPanel)
	}
	if len(readersPanel.Consumers) == 0 || readersPanel.Consumers[0].Consumer != topology.PreviewConsumer {
		t.Errorf("other consumers: %+v, want the preview workers' consumer", readersPanel.Consumers)
	}

	var dlqPanel struct {
		Total  uint64 `json:"total"`
		Groups []struct {
			Source, Reason string
			Count          uint64
			Newest         struct{ Seq uint64 }
		} `json:"groups"`
	}
	getJSON(t, s, "/api/dlq", &dlqPanel)
	if dlqPanel.Total != 4 || len(dlqPanel.Groups) != 2 || dlqPanel.Groups[0].Source != "down-reader" ||
		dlqPanel.Groups[0].Count != 3 || dlqPanel.Groups[0].Newest.Seq != parked[2] {
		t.Errorf("dlq panel: %+v", dlqPanel)
	}
	var letters struct {
		Letters []struct{ Seq uint64 } `json:"letters"`
	}
	getJSON(t, s, "/api/dlq/letters?source=down-reader&reason=malformed", &letters)
	if len(letters.Letters) != 3 || letters.Letters[0].Seq != parked[0] {
		t.Errorf("letters of down-reader/malformed: %+v, want the 3 parked, oldest first", letters)
	}
	var letter struct {
		Error     string              `json:"error"`
		Payload   string              `json:"payload"`
		Headers   map[string][]string `json:"headers"`
		RedriveTo string              `json:"redrive_to"`
	}
	getJSON(t, s, "/api/dlq/letters/"+strconv.FormatUint(parked[0], 10), &letter)
	if letter.Error != "test: <b>not</b> a click" || !strings.Contains(letter.Payload, `"owner": "acme"`) ||
		letter.Headers[events.HeaderDeadReason][0] != "malformed" || letter.RedriveTo != "clicks.acme.abc" {
		t.Errorf("letter: %+v", letter)
	}
	// The JSON escapes markup; the page puts it in the DOM as text.
	_, raw := do(t, nil, http.MethodGet, s.url+"/api/dlq/letters/"+strconv.FormatUint(parked[0], 10), nil, bearer)
	if strings.Contains(string(raw), "<b>") {
		t.Errorf("letter JSON carries raw markup: %s", raw)
	}
	if code, _ := do(t, nil, http.MethodGet, s.url+"/api/dlq/letters/999999", nil, bearer); code != http.StatusNotFound {
		t.Errorf("a letter that is not there: %d, want 404", code)
	}
	if code, _ := do(t, nil, http.MethodGet, s.url+"/api/dlq/letters?source=a.b", nil, bearer); code != http.StatusBadRequest {
		t.Errorf("a source that is not a token: %d, want 400", code)
	}

	var alertsPanel struct {
		Alerts []struct{ Rule, Owner, Code string }
		Seen   int
	}
	testenv.WaitFor(t, 30*time.Second, "the alert read", func() bool {
		getJSON(t, s, "/api/alerts", &alertsPanel)
		return alertsPanel.Seen == 1
	})
	if a := alertsPanel.Alerts[0]; a.Rule != "link_flood" || a.Owner != "acme" || a.Code != "abc" {
		t.Errorf("alert: %+v", a)
	}

	var wh struct {
		Available bool
		TopLinks  []struct {
			Owner, Code string
			Clicks      uint64
			BotClicks   uint64 `json:"bot_clicks"`
		} `json:"top_links"`
		Hours []struct{ Clicks uint64 }
	}
	getJSON(t, s, "/api/warehouse", &wh)
	if !wh.Available || len(wh.TopLinks) != 2 || wh.TopLinks[0].Code != "abc" || wh.TopLinks[0].Clicks != 2 || wh.TopLinks[0].BotClicks != 1 ||
		len(wh.Hours) != 1 || wh.Hours[0].Clicks != 3 {
		t.Errorf("warehouse panel: %+v", wh)
	}

	var outbox struct {
		Available bool
		Outbox    struct {
			Lanes []struct {
				Lane    string
				Entries int64
				Level   string
			}
		}
	}
	getJSON(t, s, "/api/outbox", &outbox)
	if !outbox.Available || outbox.Outbox.Lanes[0].Entries != 1 || outbox.Outbox.Lanes[0].Level != "warn" {
		t.Errorf("outbox panel: %+v", outbox)
	}
}

// Without ClickHouse the panel says so and everything else works.
func TestWithoutClickHouseThePanelSaysSo(t *testing.T) {
	t.Parallel()
	// Port 1: nothing listens there, and no test's server can take it.
	s := start(t, func(c *Config) { withToken(c); c.ClickHouseAddrs = []string{"127.0.0.1:1"} })
	var wh struct {
		Available bool
		Error     string
	}
	getJSON(t, s, "/api/warehouse", &wh)
	if wh.Available || !strings.Contains(wh.Error, "ClickHouse not reachable") {
		t.Errorf("warehouse panel without ClickHouse: %+v", wh)
	}
	var r struct{ Groups []any }
	getJSON(t, s, "/api/readers", &r)
}

// An action's body is one JSON object: one followed by anything (a second
// object, stray text) is refused with 400, and the action is not taken.
func TestActionBodyWithDataAfterTheObjectIsRefused(t *testing.T) {
	t.Parallel()
	s := start(t, withToken)
	seed(t, s)
	for _, body := range []string{
		`{"from_seq": 1, "confirm": "down-reader"} {"from_seq": 2}`,
		`{"from_seq": 1, "confirm": "down-reader"}x`,
	} {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, s.url+"/api/readers/down-reader/replay", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", bearer["Authorization"])
		resp, err := noRedirects().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "after the JSON object") {
			t.Errorf("replay with %q: %d %s, want 400 naming the data after the JSON object", body, resp.StatusCode, b)
		}
	}
	var st struct{ ID string }
	getJSON(t, s, "/api/readers/down-reader/replay", &st)
	if st.ID != "" {
		t.Errorf("a refused replay was requested: %+v", st)
	}
}

// An action's body over the console's limit is a 413 "body_too_large" in
// the shared envelope, as the redirect's link API answers, whether its
// Content-Length says so or it is found while reading a chunked body.
func TestActionBodyOverTheLimitIsTooLarge(t *testing.T) {
	t.Parallel()
	s := start(t, withToken)
	big := `{"from_seq": 1, "confirm": "down-reader", "pad": "` + strings.Repeat("x", 20<<10) + `"}`
	for _, chunked := range []bool{false, true} {
		var body io.Reader = strings.NewReader(big)
		if chunked {
			body = io.MultiReader(body) // no length known: sent chunked
		}
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, s.url+"/api/readers/down-reader/replay", body)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", bearer["Authorization"])
		resp, err := noRedirects().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var got struct {
			Error struct{ Code, Message string }
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		_ = json.Unmarshal(b, &got)
		if resp.StatusCode != http.StatusRequestEntityTooLarge || got.Error.Code != "body_too_large" ||
			!strings.Contains(got.Error.Message, "16384 bytes") {
			t.Errorf("chunked %v: %d %s, want 413 body_too_large naming the limit", chunked, resp.StatusCode, b)
		}
	}
}

func TestReplayAndRedriveNeedTheTokenAndTheSameOrigin(t *testing.T) {
	t.Parallel()
	s := start(t, withToken)
	parked := seed(t, s)
	replay := map[string]any{"from_seq": 1, "confirm": "down-reader"}
	path := s.url + "/api/readers/down-reader/replay"
	letterPath := func(i int) string {
		return s.url + "/api/dlq/letters/" + strconv.FormatUint(parked[i], 10) + "/redrive"
	}

	// No token, a wrong one: refused, nothing requested.
	wrong := map[string]string{"Authorization": "Bearer wrong-token-0123456789"}
	for name, h := range map[string]map[string]string{"without the token": nil, "with a wrong token": wrong} {
		if code, _ := do(t, nil, http.MethodPost, path, replay, h); code != http.StatusUnauthorized {
			t.Errorf("replay %s: %d, want 401", name, code)
		}
		if code, _ := do(t, nil, http.MethodPost, letterPath(0), nil, h); code != http.StatusUnauthorized {
			t.Errorf("redrive %s: %d, want 401", name, code)
		}
	}
	var st struct{ ID string }
	getJSON(t, s, "/api/readers/down-reader/replay", &st)
	if st.ID != "" {
		t.Fatalf("a refused replay was requested: %+v", st)
	}
	// Unconfirmed: refused.
	if code, b := do(t, nil, http.MethodPost, path, map[string]any{"from_seq": 1}, bearer); code != http.StatusBadRequest || !strings.Contains(string(b), "not_confirmed") {
		t.Errorf("unconfirmed replay: %d %s, want 400 not_confirmed", code, b)
	}
	if code, _ := do(t, nil, http.MethodPost, s.url+"/api/readers/nope/replay", map[string]any{"from_seq": 1, "confirm": "nope"}, bearer); code != http.StatusNotFound {
		t.Errorf("replay of a group that does not exist: %d, want 404", code)
	}
	// With the token (a script): accepted.
	code, b := do(t, nil, http.MethodPost, path, replay, bearer)
	if code != http.StatusAccepted {
		t.Fatalf("replay with the token: %d %s", code, b)
	}
	var accepted struct{ ID, Position string }
	_ = json.Unmarshal(b, &accepted)
	getJSON(t, s, "/api/readers/down-reader/replay", &st)
	if st.ID == "" || st.ID != accepted.ID {
		t.Errorf("replay status %+v, want request %s", st, accepted.ID)
	}

	// A browser: log in, then act with the cookie from the same origin.
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	form := url.Values{"token": {"wrong-token-0123456789"}}
	resp, err := browser.PostForm(s.url+"/login", form)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("login with a wrong token: %d, want 401", resp.StatusCode)
	}
	resp, err = browser.PostForm(s.url+"/login", url.Values{"token": {testToken}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	cookies := resp.Cookies()
	if resp.StatusCode != http.StatusSeeOther || len(cookies) != 1 || !cookies[0].HttpOnly || cookies[0].SameSite != http.SameSiteStrictMode ||
		strings.Contains(cookies[0].Value, testToken) {
		t.Fatalf("login: %d, cookies %+v; want 303 and one HttpOnly SameSite=Strict cookie without the token in it", resp.StatusCode, cookies)
	}
	sameOrigin := map[string]string{"Origin": s.url, "Sec-Fetch-Site": "same-origin"}
	crossSite := map[string]string{"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}

	if code, _ := do(t, browser, http.MethodPost, letterPath(0), nil, crossSite); code != http.StatusForbidden {
		t.Errorf("cross-origin redrive with the session cookie: %d, want 403", code)
	}
	if code, _ := do(t, browser, http.MethodPost, path, replay, map[string]string{"Origin": "http://evil.example"}); code != http.StatusForbidden {
		t.Errorf("cross-origin replay (Origin only) with the session cookie: %d, want 403", code)
	}
	if _, err := deadletter.Get(t.Context(), s.js, parked[0]); err != nil {
		t.Fatalf("a refused redrive touched the letter: %v", err)
	}
	code, b = do(t, browser, http.MethodPost, letterPath(0), nil, sameOrigin)
	if code != http.StatusOK {
		t.Fatalf("same-origin redrive with the session cookie: %d %s", code, b)
	}
	var redriven struct {
		Subject string
		Stream  string
		NewSeq  uint64 `json:"new_seq"`
	}
	_ = json.Unmarshal(b, &redriven)
	if redriven.Subject != "clicks.acme.abc" || redriven.Stream != events.ClicksStream {
		t.Errorf("redriven: %+v", redriven)
	}
	m, err := s.js.Conn().JetStream()
	if err != nil {
		t.Fatal(err)
	}
	if got, err := m.GetMsg(events.ClicksStream, redriven.NewSeq); err != nil || got.Header.Get(deadletter.HeaderRedriveOf) != strconv.FormatUint(parked[0], 10) {
		t.Errorf("the redriven click on CLICKS: %v, %v", got, err)
	}
	if code, _ := do(t, browser, http.MethodPost, letterPath(0), nil, sameOrigin); code != http.StatusNotFound {
		t.Errorf("redriving it again: %d, want 404 (gone)", code)
	}

	// Redrive the rest of the group, as a script.
	code, b = do(t, nil, http.MethodPost, s.url+"/api/dlq/redrive", map[string]string{"source": "down-reader", "reason": "malformed"}, bearer)
	var group struct{ Redriven int }
	_ = json.Unmarshal(b, &group)
	if code != http.StatusOK || group.Redriven != 2 {
		t.Errorf("group redrive: %d %s, want the 2 left", code, b)
	}
	if code, _ := do(t, nil, http.MethodPost, s.url+"/api/dlq/redrive", map[string]string{"source": "down-reader"}, bearer); code != http.StatusBadRequest {
		t.Errorf("group redrive without a reason: %d, want 400", code)
	}
	var dlqPanel struct{ Total uint64 }
	getJSON(t, s, "/api/dlq", &dlqPanel)
	if dlqPanel.Total != 1 {
		t.Errorf("dead letters left: %d, want the preview one", dlqPanel.Total)
	}
	if n := metric(t, s, `snip_console_actions_total{action="redrive",result="ok"}`); n != 1 {
		t.Errorf("redrive actions counted: %v", n)
	}
}

func TestWithoutATokenOnlyLoopbackIsServed(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		env     []string
		wantErr bool
	}{
		{"loopback_without_token", []string{"HTTP_ADDR=127.0.0.1:8085"}, false},
		{"localhost_without_token", []string{"HTTP_ADDR=localhost:8085"}, false},
		{"ipv6_loopback_without_token", []string{"HTTP_ADDR=[::1]:8085"}, false},
		{"every_interface_without_token", []string{"HTTP_ADDR=:8085"}, true},
		{"public_address_without_token", []string{"HTTP_ADDR=0.0.0.0:8085"}, true},
		{"every_interface_insecure", []string{"HTTP_ADDR=:8085", "CONSOLE_INSECURE=true"}, false},
		{"every_interface_with_token", []string{"HTTP_ADDR=:8085", "CONSOLE_TOKEN=" + testToken}, false},
		{"short_token", []string{"CONSOLE_TOKEN=short"}, true},
		{"spaces_token", []string{"CONSOLE_TOKEN=                    "}, true},
		{"token_with_a_space", []string{"CONSOLE_TOKEN=console test token 0123"}, true},
		{"few_distinct_characters", []string{"CONSOLE_TOKEN=abababababababababab"}, true},
		{"published_dev_token", []string{"HTTP_ADDR=:8085", "CONSOLE_TOKEN=console-dev-token"}, true},
		{"published_dev_token_allowed_for_a_demo", []string{"HTTP_ADDR=:8085", "CONSOLE_TOKEN=console-dev-token", "CONSOLE_ALLOW_DEV_TOKEN=true"}, false},
		{"no_failures_allowed", []string{"CONSOLE_TOKEN=" + testToken, "CONSOLE_AUTH_FAILURE_BURST=0"}, true},
		{"trusted_proxies", []string{"HTTP_ADDR=127.0.0.1:8085", "CONSOLE_TRUSTED_PROXIES=10.0.0.0/8, 192.0.2.1"}, false},
		{"bad_trusted_proxy", []string{"HTTP_ADDR=127.0.0.1:8085", "CONSOLE_TRUSTED_PROXIES=proxy.local"}, true},
		{"alarm_before_warn", []string{"HTTP_ADDR=127.0.0.1:8085", "CONSOLE_LAG_WARN=5m", "CONSOLE_LAG_ALARM=1m"}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := loadConfig(tc.env, nil)
			if (err != nil) != tc.wantErr {
				t.Errorf("loadConfig(%v) = %v, want error: %v", tc.env, err, tc.wantErr)
			}
		})
	}

	s := start(t, nil) // no token, on 127.0.0.1
	if code, _ := do(t, nil, http.MethodGet, s.url+"/api/readers", nil, nil); code != http.StatusOK {
		t.Errorf("loopback console without a token: %d, want 200", code)
	}
	// A page elsewhere pointing a DNS name at 127.0.0.1 (DNS rebinding).
	if code, _ := do(t, nil, http.MethodGet, s.url+"/api/readers", nil, map[string]string{"Host": "evil.example:8085"}); code != http.StatusForbidden {
		t.Errorf("Host evil.example on a loopback console: %d, want 403", code)
	}
	if code, _ := do(t, nil, http.MethodPost, s.url+"/api/dlq/redrive", map[string]string{"source": "a", "reason": "b"},
		map[string]string{"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}); code != http.StatusForbidden {
		t.Errorf("cross-site POST to a loopback console: %d, want 403", code)
	}
}

// liveClient opens /api/live.
func liveClient(t *testing.T, s *system) *sse.Reader {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, s.url+"/api/live", nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
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

func TestLiveClicksReachThePageAndASlowPageIsDropped(t *testing.T) {
	t.Parallel()
	s := start(t, func(c *Config) {
		withToken(c)
		c.LiveMaxRate = 1e6
		c.LiveBuffer = 16
		c.SSEWriteTimeout = 300 * time.Millisecond
	})
	r := liveClient(t, s)
	testenv.WaitFor(t, 30*time.Second, "the page watching", func() bool { return metric(t, s, "snip_console_live_browsers") == 1 })
	sent := consoletest.Publish(t, s.js, consoletest.Clicks("acme", "live", 5)...)
	var got []uint64
	for len(got) < 5 {
		e, err := r.Next()
		if err != nil {
			t.Fatal(err)
		}
		if e.Name != "click" {
			continue
		}
		var c struct {
			Seq  uint64
			Code string
		}
		_ = json.Unmarshal(e.Data, &c)
		if c.Code == "live" {
			got = append(got, c.Seq)
		}
	}
	if d := cmp.Diff(sent, got); d != "" {
		t.Errorf("live clicks (-published +received):\n%s", d)
	}

	// A page that stops reading: a connection with a small receive buffer
	// that never reads. Its queue fills (clicks dropped, counted), its
	// writes time out, and it is disconnected: nothing grows for it.
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	conn, err := d.DialContext(t.Context(), "tcp", strings.TrimPrefix(s.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /api/live HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n\r\n", strings.TrimPrefix(s.url, "http://"), testToken)
	testenv.WaitFor(t, 30*time.Second, "two pages watching", func() bool { return metric(t, s, "snip_console_live_browsers") == 2 })
	stopReading := make(chan struct{})
	go func() { // the first page keeps reading
		for {
			if _, err := r.Next(); err != nil {
				return
			}
			select {
			case <-stopReading:
				return
			default:
			}
		}
	}()
	defer close(stopReading)
	testenv.WaitFor(t, 120*time.Second, "the page that does not read disconnected", func() bool {
		consoletest.Publish(t, s.js, consoletest.Clicks("acme", "flood", 500)...)
		return metric(t, s, "snip_console_live_browsers") == 1
	})
	if n := metric(t, s, "snip_console_live_clicks_dropped_total"); n == 0 {
		t.Errorf("no clicks counted as dropped for the page that did not read")
	}
}

// ownerClient connects to the owners' stream.
func ownerClient(t *testing.T, s *system, key, query, lastEventID string) (*http.Response, *sse.Reader) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, s.url+"/api/clicks/stream"+query, nil)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if lastEventID != "" {
		req.Header.Set("Last-Event-ID", lastEventID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp, sse.NewReader(resp.Body)
}

func TestOwnersStreamTheirOwnClicksAndResume(t *testing.T) {
	t.Parallel()
	s := start(t, func(c *Config) { withToken(c); c.OwnerStreamsPerOwner = 1 })
	store := owners.NewStore(s.rdb)
	const acmeKey, globexKey = "snip_acme_test_key_0123456789", "snip_globex_test_key_012345678"
	if err := store.EnsureFromSpec(t.Context(), "acme:"+acmeKey+",globex:"+globexKey); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, key string }{{"no_key", ""}, {"unknown_key", "snip_unknown_key_0123456789"}, {"console_token", testToken}} {
		resp, _ := ownerClient(t, s, tc.key, "", "")
		if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("%s: %d, want 401 with WWW-Authenticate", tc.name, resp.StatusCode)
		}
	}
	if resp, _ := ownerClient(t, s, acmeKey, "?since_seq=x", ""); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("since_seq=x: %d, want 400", resp.StatusCode)
	}
	// Times a stream position cannot hold are refused, not wrapped around.
	for _, since := range []string{"9999-12-31T23:59:59Z", "0001-01-01T00:00:00Z"} {
		resp, _ := ownerClient(t, s, acmeKey, "?since="+since, "")
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "outside") {
			t.Errorf("since=%s: %d %s, want 400 saying it is out of range", since, resp.StatusCode, b)
		}
	}

	mixed := func(n int) (acme []uint64) {
		var clicks []events.Click
		for i := range n {
			clicks = append(clicks, consoletest.Click("acme", "a"+strconv.Itoa(i%2), i), consoletest.Click("globex", "g", i))
		}
		seqs := consoletest.Publish(t, s.js, clicks...)
		for i := 0; i < len(seqs); i += 2 {
			acme = append(acme, seqs[i])
		}
		return acme
	}
	want := mixed(10)
	resp, r := ownerClient(t, s, acmeKey, "?since_seq=0", "")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("acme's stream: %d", resp.StatusCode)
	}
	// The query cannot choose another owner: there is no such parameter,
	// and the stream is acme's whatever is asked.
	got := consoletest.OwnerClicks(t, r, "acme", 4)
	if again, _ := ownerClient(t, s, acmeKey, "", ""); again.StatusCode != http.StatusTooManyRequests {
		t.Errorf("acme's second stream with a limit of 1: %d, want 429", again.StatusCode)
	}
	resp.Body.Close() // disconnect mid-stream
	testenv.WaitFor(t, 30*time.Second, "the stream closed on the server", func() bool { return metric(t, s, "snip_console_owner_streams") == 0 })
	want = append(want, mixed(6)...)

	// The reconnect carries Last-Event-ID, as EventSource does, and the
	// same query as the first connection.
	resp, r = ownerClient(t, s, acmeKey, "?since_seq=0", strconv.FormatUint(got[len(got)-1], 10))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("acme's stream again: %d", resp.StatusCode)
	}
	got = append(got, consoletest.OwnerClicks(t, r, "acme", len(want)-len(got))...)
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("acme's clicks across the reconnect (-published +received):\n%s", d)
	}
	// globex sees its own 16 and none of acme's.
	_, g := ownerClient(t, s, globexKey, "?since_seq=0", "")
	consoletest.OwnerClicks(t, g, "globex", 16)
}

// The owners' stream answers "unavailable" when Redis or NATS is away, and
// no more: its clients are owners' systems, or anyone who sends a key-shaped
// guess, not the console's operators, so the cause (a dependency's address
// and error) goes to the console's log only.
func TestOwnersStreamUnavailableKeepsTheCauseInside(t *testing.T) {
	t.Parallel()
	const key = "snip_acme_test_key_0123456789"
	tests := []struct {
		name string
		// start returns the console, writing its log to logs, and what its
		// answer must not mention (the log must).
		start func(t *testing.T, logs *syncBuffer) (*system, []string)
	}{
		{"redis_away", func(t *testing.T, logs *syncBuffer) (*system, []string) {
			// Port 1: nothing listens there, and no test can take it (a port
			// freed by a closed listener can be taken by another test's
			// server, and the console then reads a stranger's answers).
			const addr = "127.0.0.1:1"
			_, js := consoletest.NATS(t)
			s := startOn(t, js, slog.New(slog.NewJSONHandler(logs, nil)), func(c *Config) { c.Redis.URL = "redis://" + addr + "/0" })
			return s, []string{addr, "dial", "refused"}
		}},
		{"clicks_stream_missing", func(t *testing.T, logs *syncBuffer) (*system, []string) {
			js := testenv.StartNATS(t).JetStream(t) // no topology: CLICKS is not there
			s := startOn(t, js, slog.New(slog.NewJSONHandler(logs, nil)), nil)
			if err := owners.NewStore(s.rdb).Ensure(t.Context(), "acme", key); err != nil {
				t.Fatal(err)
			}
			return s, []string{"API error", "nats", "CLICKS"}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var logs syncBuffer
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("the console's log:\n%s", logs.String())
				}
			})
			s, inside := tc.start(t, &logs)
			resp, _ := ownerClient(t, s, key, "", "")
			b, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			var body struct {
				Error struct{ Code, Message string }
			}
			if err := json.Unmarshal(b, &body); err != nil {
				t.Fatalf("%d %s: %v", resp.StatusCode, b, err)
			}
			if resp.StatusCode != http.StatusServiceUnavailable || body.Error.Code != "unavailable" || body.Error.Message == "" {
				t.Errorf("answer %d %s, want 503 unavailable with a message", resp.StatusCode, b)
			}
			for _, w := range inside {
				if strings.Contains(body.Error.Message, w) {
					t.Errorf("the answer's message %q mentions %q, the dependency's error", body.Error.Message, w)
				}
			}
			// The operators still learn the cause: the refusal is logged with it.
			testenv.WaitFor(t, 10*time.Second, "the refusal logged with its cause", func() bool {
				for _, line := range strings.Split(logs.String(), "\n") {
					if strings.Contains(line, `"msg":"request refused"`) && strings.Contains(line, inside[0]) {
						return true
					}
				}
				return false
			})
		})
	}
}

// The instance's limit on streams answers 503 without the instance's stream
// count: that is the operators' figure (log, metrics), not a caller's.
func TestTooManyStreamsKeepsTheCountInside(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	_, js := consoletest.NATS(t)
	s := startOn(t, js, slog.New(slog.NewJSONHandler(&logs, nil)), func(c *Config) {
		c.OwnerStreamsPerOwner, c.OwnerStreamsMax = 1, 1
	})
	const acmeKey, globexKey = "snip_acme_test_key_0123456789", "snip_globex_test_key_012345678"
	if err := owners.NewStore(s.rdb).EnsureFromSpec(t.Context(), "acme:"+acmeKey+",globex:"+globexKey); err != nil {
		t.Fatal(err)
	}
	if resp, _ := ownerClient(t, s, acmeKey, "", ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("acme's stream: %d", resp.StatusCode)
	}
	resp, _ := ownerClient(t, s, globexKey, "", "")
	b, _ := io.ReadAll(resp.Body)
	var body struct {
		Error struct{ Code, Message string }
	}
	if err := json.Unmarshal(b, &body); err != nil {
		t.Fatalf("%d %s: %v", resp.StatusCode, b, err)
	}
	if resp.StatusCode != http.StatusServiceUnavailable || body.Error.Code != "too_many_streams" || body.Error.Message == "" {
		t.Errorf("globex's stream beyond the instance's limit: %d %s, want 503 too_many_streams with a message", resp.StatusCode, b)
	}
	if strings.ContainsAny(body.Error.Message, "0123456789") || strings.Contains(body.Error.Message, "streams open") {
		t.Errorf("the answer's message %q gives the instance's stream count", body.Error.Message)
	}
	testenv.WaitFor(t, 10*time.Second, "the refusal logged with the count", func() bool {
		for line := range strings.SplitSeq(logs.String(), "\n") {
			if strings.Contains(line, `"msg":"request refused"`) && strings.Contains(line, "1 streams open") {
				return true
			}
		}
		return false
	})
}

// An owner that opens and closes streams (each a JetStream consumer) faster
// than its allowance is refused with 429 and told when to come back, within
// its concurrent streams; closing a stream gives nothing back, and another
// owner is not limited by it.
func TestOwnerStreamOpensAreRateLimited(t *testing.T) {
	t.Parallel()
	s := start(t, func(c *Config) { c.OwnerStreamOpenBurst, c.OwnerStreamOpenInterval = 2, time.Hour })
	const acmeKey, globexKey = "snip_acme_test_key_0123456789", "snip_globex_test_key_012345678"
	if err := owners.NewStore(s.rdb).EnsureFromSpec(t.Context(), "acme:"+acmeKey+",globex:"+globexKey); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		resp, _ := ownerClient(t, s, acmeKey, "", "")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("acme's stream %d: %d", i+1, resp.StatusCode)
		}
		resp.Body.Close()
		testenv.WaitFor(t, 30*time.Second, "the stream closed on the server", func() bool { return metric(t, s, "snip_console_owner_streams") == 0 })
	}
	resp, _ := ownerClient(t, s, acmeKey, "", "")
	if resp.StatusCode == http.StatusOK {
		t.Fatalf("acme's third stream open within the hour opened: want 429")
	}
	b, _ := io.ReadAll(resp.Body)
	retry, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(string(b), `"too_many_stream_opens"`) {
		t.Errorf("acme's third stream open within the hour, none open: %d %s, want 429 too_many_stream_opens", resp.StatusCode, b)
	}
	if retry < 3000 || retry > 3600 {
		t.Errorf("Retry-After %q, want the wait for the next open (about an hour)", resp.Header.Get("Retry-After"))
	}
	if n := metric(t, s, `snip_console_owner_streams_refused_total{reason="open_rate"}`); n != 1 {
		t.Errorf(`snip_console_owner_streams_refused_total{reason="open_rate"} = %v, want 1`, n)
	}
	if g, _ := ownerClient(t, s, globexKey, "", ""); g.StatusCode != http.StatusOK {
		t.Errorf("globex's stream after acme was limited: %d, want 200", g.StatusCode)
	}
}

// snip_console_owner_stream_clicks_total counts the clicks an owner's
// stream sent, not those it queued for a client that then stopped reading:
// a stream cut off for not reading had up to its whole queue counted as sent.
func TestOwnerStreamCountsOnlyTheClicksItSent(t *testing.T) {
	t.Parallel()
	s := start(t, func(c *Config) { withToken(c); c.SSEWriteTimeout = 300 * time.Millisecond })
	const key = "snip_acme_test_key_0123456789"
	if err := owners.NewStore(s.rdb).Ensure(t.Context(), "acme", key); err != nil {
		t.Fatal(err)
	}
	// A client with a small receive buffer that does not read until the
	// console has given up on it.
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	host := strings.TrimPrefix(s.url, "http://")
	conn, err := d.DialContext(t.Context(), "tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req, _ := http.NewRequest(http.MethodGet, s.url+"/api/clicks/stream", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	if err := req.Write(conn); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the stream open", func() bool { return metric(t, s, "snip_console_owner_streams") == 1 })
	testenv.WaitFor(t, 120*time.Second, "the stream that is not read cut off", func() bool {
		consoletest.Publish(t, s.js, consoletest.Clicks("acme", "flood", 500)...)
		return metric(t, s, "snip_console_owner_streams") == 0
	})
	counted := metric(t, s, "snip_console_owner_stream_clicks_total")

	// Now read what reached the client.
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := sse.NewReader(resp.Body)
	received := 0
	for {
		e, err := r.Next()
		if err != nil {
			break // the stream's end, or cut off mid-event
		}
		if e.Name == "click" {
			received++
		}
	}
	t.Logf("counted %v sent, the client received %d", counted, received)
	if counted == 0 || counted > float64(received) {
		t.Errorf("snip_console_owner_stream_clicks_total = %v, the client received %d: want at least one, and no click counted that was not sent", counted, received)
	}
}

// Shutdown ends the event streams instead of waiting for them, and returns.
func TestShutdownEndsOpenStreams(t *testing.T) {
	t.Parallel()
	// With a shutdown timeout this long, waiting for the streams would show.
	s := start(t, func(c *Config) { withToken(c); c.ShutdownTimeout = time.Minute })
	if err := owners.NewStore(s.rdb).Ensure(t.Context(), "acme", "snip_acme_test_key_0123456789"); err != nil {
		t.Fatal(err)
	}
	live := liveClient(t, s)
	_, owner := ownerClient(t, s, "snip_acme_test_key_0123456789", "", "")
	testenv.WaitFor(t, 30*time.Second, "both streams open", func() bool {
		return metric(t, s, "snip_console_live_browsers") == 1 && metric(t, s, "snip_console_owner_streams") == 1
	})
	began := time.Now()
	if err := s.stop(); err != nil {
		t.Fatalf("run returned %v", err)
	}
	if took := time.Since(began); took > 30*time.Second {
		t.Errorf("shutdown took %s with streams open (the HTTP shutdown timeout is 1 min): the streams were waited for", took)
	}
	for _, r := range []*sse.Reader{live, owner} {
		for {
			if _, err := r.Next(); err != nil {
				break // the stream ended
			}
		}
	}
}

// CONSOLE_LIVE_RECENT=0 would not mean "no recent clicks" (the live feed
// takes 0 for its default, 50): it is refused, as a negative is.
func TestLiveRecentMustBeOneOrMore(t *testing.T) {
	t.Parallel()
	for v, wantErr := range map[string]bool{"-1": true, "0": true, "1": false, "50": false} {
		_, err := loadConfig([]string{"HTTP_ADDR=127.0.0.1:8085", "CONSOLE_LIVE_RECENT=" + v}, nil)
		if (err != nil) != wantErr {
			t.Errorf("CONSOLE_LIVE_RECENT=%s: err = %v, want error: %v", v, err, wantErr)
		}
	}
}

// The click counter keeps all-time totals and recounts only a replay from
// the oldest event CLICKS retains (decision 0021): a replay from later
// changes nothing. The console requested it all the same (202), while the
// operator believed the counts were being rebuilt. It now refuses it, as
// snipctl does, with a 409 that says why and what to do (from_seq 1, or
// force), and requests nothing; forced, it is requested with that reason as
// a warning. A recount, and any position for another group, is requested
// as before.
func TestAClickCounterReplayThatRecountsNothingIsRefused(t *testing.T) {
	t.Parallel()
	s := start(t, withToken)
	for _, group := range []string{topology.GroupClickCounter, "down-reader"} {
		consoletest.DownGroup(t, s.js, group)
	}
	seqs := consoletest.Publish(t, s.js, consoletest.Clicks("acme", "abc", 6)...)
	latest := func(group string) string {
		var st struct{ ID string }
		getJSON(t, s, "/api/readers/"+group+"/replay", &st)
		return st.ID
	}
	type answer struct {
		ID, Position string
		Warnings     []string
		Error        struct{ Code, Message string }
	}
	replay := func(group string, body map[string]any) (int, answer) {
		t.Helper()
		body["confirm"] = group
		code, b := do(t, nil, http.MethodPost, s.url+"/api/readers/"+group+"/replay", body, bearer)
		var a answer
		if err := json.Unmarshal(b, &a); err != nil {
			t.Fatalf("replay %s %v: %d %s: %v", group, body, code, b, err)
		}
		return code, a
	}
	later := strconv.FormatUint(seqs[2], 10)
	// Sequential: the cases share the group's latest replay.
	for _, body := range []map[string]any{
		{"from_seq": seqs[2]},
		{"since": "1ms"},
		{"from_seq": seqs[2], "force": false},
	} {
		code, a := replay(topology.GroupClickCounter, body)
		if code != http.StatusConflict || a.Error.Code != "not_a_recount" ||
			!strings.Contains(a.Error.Message, "starts after the oldest event CLICKS retains (sequence "+strconv.FormatUint(seqs[0], 10)) ||
			!strings.Contains(a.Error.Message, `"from_seq": 1`) || !strings.Contains(a.Error.Message, `"force": true`) {
			t.Errorf("click-counter replay %v: %d %+v; want 409 not_a_recount naming CLICKS' oldest event, from_seq 1 and force", body, code, a)
		}
		if id := latest(topology.GroupClickCounter); id != "" {
			t.Fatalf("after click-counter replay %v: replay %s requested; want none", body, id)
		}
	}

	code, a := replay(topology.GroupClickCounter, map[string]any{"from_seq": seqs[2], "force": true})
	if code != http.StatusAccepted || a.Position != "from sequence "+later ||
		len(a.Warnings) != 1 || !strings.Contains(a.Warnings[0], "from sequence "+later+" starts after the oldest event CLICKS retains") {
		t.Errorf("forced click-counter replay: %d %+v; want 202 with a warning that it recounts nothing", code, a)
	}
	if id := latest(topology.GroupClickCounter); id == "" || id != a.ID {
		t.Errorf("forced click-counter replay: latest replay %q, want %q", id, a.ID)
	}
	for _, body := range []map[string]any{{"from_seq": seqs[0]}, {"since": "1h"}} {
		code, a := replay(topology.GroupClickCounter, body)
		if code != http.StatusAccepted || hasWarning(a.Warnings, "starts after the oldest event CLICKS retains") || latest(topology.GroupClickCounter) != a.ID {
			t.Errorf("click-counter recount %v: %d %+v; want 202, requested, without a warning", body, code, a)
		}
	}
	// Another group replays from anywhere, without a warning.
	if code, a := replay("down-reader", map[string]any{"from_seq": seqs[2]}); code != http.StatusAccepted || len(a.Warnings) != 0 || latest("down-reader") != a.ID {
		t.Errorf("down-reader replay from sequence %s: %d %+v; want 202, requested, without a warning", later, code, a)
	}
}

// hasWarning reports whether one of warnings says what.
func hasWarning(warnings []string, what string) bool {
	for _, w := range warnings {
		if strings.Contains(w, what) {
			return true
		}
	}
	return false
}

// A replay from a position CLICKS holds nothing after (a sequence after its
// last event, a time after its last click, an empty CLICKS) moves nothing
// back; the console requested it all the same (202), and the page then
// showed every partition moved back. It is now refused with a 409
// nothing_to_replay naming CLICKS' last event, and requests nothing; a
// from_seq of 0 is refused as such, not as a missing position. A replay
// from before CLICKS' oldest event (its retention discarded what was
// before) says where it really starts, and one asked while the group's
// previous replay is under way says that it replaces it: the answer's
// warnings, as snipctl replay prints them.
func TestAReplayThatReplaysNothingIsRefusedAndOneThatReplaysOtherwiseSaysSo(t *testing.T) {
	t.Parallel()
	s := start(t, withToken)
	const group = "loader"
	consoletest.DownGroup(t, s.js, group)
	seqs := consoletest.Publish(t, s.js, consoletest.Clicks("acme", "abc", 10)...)
	last := seqs[len(seqs)-1]
	clicks, err := s.js.Stream(t.Context(), events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	// As the age limit does: the first five are gone.
	if err := clicks.Purge(t.Context(), jetstream.WithPurgeSequence(seqs[5])); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		ID       string
		Warnings []string
		Error    struct{ Code, Message string }
	}
	replay := func(body map[string]any) (int, answer) {
		t.Helper()
		body["confirm"] = group
		code, b := do(t, nil, http.MethodPost, s.url+"/api/readers/"+group+"/replay", body, bearer)
		var a answer
		if err := json.Unmarshal(b, &a); err != nil {
			t.Fatalf("replay %v: %d %s: %v", body, code, b, err)
		}
		return code, a
	}
	latest := func() string {
		var st struct{ ID string }
		getJSON(t, s, "/api/readers/"+group+"/replay", &st)
		return st.ID
	}
	refusals := []struct {
		body map[string]any
		code int
		says string
	}{
		{map[string]any{"from_seq": last + 1}, http.StatusConflict, fmt.Sprintf("from sequence %d is after CLICKS' last event (sequence %d): nothing to replay", last+1, last)},
		// A moment ago: after the last click, stored before it.
		{map[string]any{"since": "1ns"}, http.StatusConflict, fmt.Sprintf("is after CLICKS' last event (sequence %d, stored ", last)},
		{map[string]any{"from_seq": 0}, http.StatusBadRequest, "from_seq 0: CLICKS sequences start at 1"},
		{map[string]any{"from_seq": -1}, http.StatusBadRequest, "from_seq -1: CLICKS sequences are whole numbers and start at 1"},
		{map[string]any{"from_seq": 1.5}, http.StatusBadRequest, "from_seq 1.5: CLICKS sequences are whole numbers and start at 1"},
		{map[string]any{"from_seq": "5"}, http.StatusBadRequest, "from_seq (a string): CLICKS sequences are whole numbers and start at 1"},
		{map[string]any{"since": "0s"}, http.StatusBadRequest, "is not a positive duration"},
	}
	check := func() {
		t.Helper()
		for _, tc := range refusals {
			code, a := replay(tc.body)
			want := map[int]string{http.StatusConflict: "nothing_to_replay", http.StatusBadRequest: "bad_request"}[tc.code]
			if code != tc.code || a.Error.Code != want || !strings.Contains(a.Error.Message, tc.says) {
				t.Errorf("replay %v: %d %+v; want %d %s saying %q", tc.body, code, a, tc.code, want, tc.says)
			}
		}
	}
	check()
	if id := latest(); id != "" {
		t.Fatalf("after the refused replays: replay %s requested; want none", id)
	}

	const gone = "CLICKS' oldest event now is sequence "
	code, first := replay(map[string]any{"from_seq": seqs[2]})
	if code != http.StatusAccepted || len(first.Warnings) != 1 ||
		!strings.Contains(first.Warnings[0], gone+strconv.FormatUint(seqs[5], 10)) ||
		!strings.Contains(first.Warnings[0], fmt.Sprintf("not at from sequence %d", seqs[2])) {
		t.Errorf("replay from sequence %d, discarded: %d %+v; want 202 warning only where it really starts", seqs[2], code, first)
	}
	// No member takes it: the next one replaces it.
	code, second := replay(map[string]any{"from_seq": seqs[7]})
	if code != http.StatusAccepted || len(second.Warnings) != 1 ||
		!strings.Contains(second.Warnings[0], "replay "+first.ID+" of group "+group) ||
		!strings.Contains(second.Warnings[0], "this replay replaces it") {
		t.Errorf("replay from sequence %d over replay %s under way: %d %+v; want 202 warning only that it replaces it", seqs[7], first.ID, code, second)
	}
	code, third := replay(map[string]any{"since": "2h"})
	if code != http.StatusAccepted || len(third.Warnings) != 2 || !hasWarning(third.Warnings, "replay "+second.ID+" of group "+group) ||
		!hasWarning(third.Warnings, "not at since 2h0m0s") || latest() != third.ID {
		t.Errorf("replay since 2h over replay %s under way, discarded: %d %+v; want 202 warning that it replaces it and where it starts", second.ID, code, third)
	}

	// An empty CLICKS refuses every position.
	if err := clicks.Purge(t.Context()); err != nil {
		t.Fatal(err)
	}
	refusals = append(refusals[2:], struct {
		body map[string]any
		code int
		says string
	}{map[string]any{"from_seq": 1}, http.StatusConflict, "CLICKS holds no events: nothing to replay"})
	check()
	if id := latest(); id != third.ID {
		t.Errorf("after the refused replays of an empty CLICKS: latest replay %s; want %s", id, third.ID)
	}
}

// A replay of a click counter that has no consumers on CLICKS is a group
// that is not there: 404 not_found, whatever the position and force. It
// was a 409 not_a_recount for a position the counter would not recount
// from, as though replaying from sequence 1 would do.
func TestAReplayOfAClickCounterThatIsNotThereIsNotFound(t *testing.T) {
	t.Parallel()
	s := start(t, withToken)
	seqs := consoletest.Publish(t, s.js, consoletest.Clicks("acme", "abc", 6)...)
	group := topology.GroupClickCounter
	for _, body := range []map[string]any{
		{"from_seq": seqs[2]},
		{"since": "1ms"},
		{"from_seq": seqs[2], "force": true},
		{"from_seq": 1},
	} {
		body["confirm"] = group
		code, b := do(t, nil, http.MethodPost, s.url+"/api/readers/"+group+"/replay", body, bearer)
		var a struct {
			Error struct{ Code, Message string }
		}
		if err := json.Unmarshal(b, &a); err != nil {
			t.Fatalf("replay %v: %d %s: %v", body, code, b, err)
		}
		if code != http.StatusNotFound || a.Error.Code != "not_found" {
			t.Errorf("replay of a click counter with no consumers %v: %d %s; want 404 not_found", body, code, b)
		}
	}
	var st struct{ ID string }
	getJSON(t, s, "/api/readers/"+group+"/replay", &st)
	if st.ID != "" {
		t.Errorf("replay %s requested for a group that is not there", st.ID)
	}
}

// A replay of a group JetStream cannot move back (the webhooks group,
// created at new events) is refused with a 409 not_replayable that says so
// and names the endpoint replay, and requests nothing. Before, it was
// requested, and every partition of the group retried a refused move for
// ever, delivering nothing more. A group started at a time replays from
// its start at the earliest: the status says which partitions start there.
func TestAReplayOfAGroupThatCannotGoBackIsRefused(t *testing.T) {
	t.Parallel()
	s := start(t, withToken)
	create := func(group string, gc topology.GroupConsumer) {
		t.Helper()
		gc.AckWait, gc.PinnedTTL, gc.MaxAckPending = time.Minute, 5*time.Second, 100
		for p := range consoletest.Partitions {
			if _, err := s.js.CreateOrUpdateConsumer(t.Context(), events.ClicksStream, topology.GroupConsumerConfig(group, p, gc)); err != nil {
				t.Fatal(err)
			}
		}
	}
	consoletest.Publish(t, s.js, consoletest.Clicks("acme", "abc", 6)...)
	create(topology.GroupWebhooks, topology.GroupConsumer{DeliverPolicy: jetstream.DeliverNewPolicy})
	var a struct {
		ID    string
		Error struct{ Code, Message string }
	}
	code, b := do(t, nil, http.MethodPost, s.url+"/api/readers/"+topology.GroupWebhooks+"/replay",
		map[string]any{"since": "1h", "confirm": topology.GroupWebhooks}, bearer)
	if err := json.Unmarshal(b, &a); err != nil {
		t.Fatalf("replay webhooks: %d %s: %v", code, b, err)
	}
	if code != http.StatusConflict || a.Error.Code != "not_replayable" ||
		!strings.Contains(a.Error.Message, "JetStream cannot move its consumers back") ||
		!strings.Contains(a.Error.Message, "/api/webhooks/endpoints/<id>/replay") {
		t.Errorf("replay webhooks: %d %s; want 409 not_replayable naming the endpoint replay", code, b)
	}
	var st struct {
		ID    string
		Parts []struct {
			Partition    int
			AtGroupStart bool `json:"at_group_start"`
		} `json:"partition_status"`
	}
	getJSON(t, s, "/api/readers/"+topology.GroupWebhooks+"/replay", &st)
	if st.ID != "" {
		t.Errorf("replay webhooks refused, yet replay %s requested", st.ID)
	}

	started := time.Now()
	consoletest.Publish(t, s.js, append(consoletest.Clicks("acme", "abc", 3), consoletest.Clicks("acme", "xyz", 3)...)...)
	create("late", topology.GroupConsumer{DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &started})
	code, b = do(t, nil, http.MethodPost, s.url+"/api/readers/late/replay", map[string]any{"from_seq": 1, "confirm": "late"}, bearer)
	if code != http.StatusAccepted {
		t.Fatalf("replay late: %d %s", code, b)
	}
	getJSON(t, s, "/api/readers/late/replay", &st)
	atStart := 0
	for _, p := range st.Parts {
		atStart += btoi(p.AtGroupStart)
	}
	if st.ID == "" || atStart == 0 {
		t.Errorf("replay of a group started after sequence 1: %+v; want partitions at the group's start", st)
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestActionsAndLettersSayNATSIsAway: with NATS away (the console's
// /readyz says its connection is down), the routes an operator uses beyond
// the panels (a group's letters, one letter, a redrive, a group redrive, a
// replay and its progress) answer 503 "unavailable" within 2 s, with what
// could not be read or done and the NATS connection's state, as the panels
// do: not a 500 "internal error" that leaves the operator guessing, and
// not after their JetStream calls time out one after another (up to about
// 20 s; a group redrive answered 200 "incomplete" then).
func TestActionsAndLettersSayNATSIsAway(t *testing.T) {
	t.Parallel()
	n, js := consoletest.NATS(t)
	s := startOn(t, js, log(t), withToken)
	n.Stop()
	testenv.WaitFor(t, 10*time.Second, "the console's /readyz to say NATS is down", func() bool {
		code, b := do(t, nil, http.MethodGet, s.url+"/readyz", nil, nil)
		return code == http.StatusServiceUnavailable && strings.Contains(string(b), "nats")
	})
	const bound = 2 * time.Second
	tests := []struct {
		method, path string
		body         any
		what         string // the start of the message
	}{
		{http.MethodGet, "/api/dlq/letters?source=click-counter&reason=malformed", nil, "read dead letters"},
		{http.MethodGet, "/api/dlq/letters/1", nil, "read dead letter 1"},
		{http.MethodPost, "/api/dlq/letters/1/redrive", nil, "redrive dead letter 1"},
		{http.MethodPost, "/api/dlq/redrive", map[string]string{"source": "click-counter", "reason": "malformed"}, "redrive dead letters (source click-counter, reason malformed)"},
		{http.MethodPost, "/api/readers/click-counter/replay", map[string]any{"from_seq": 1, "confirm": "click-counter"}, "replay click-counter"},
		{http.MethodGet, "/api/readers/click-counter/replay", nil, "read the replay of click-counter"},
	}
	for _, tc := range tests {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			t.Parallel()
			began := time.Now()
			code, b := do(t, nil, tc.method, s.url+tc.path, tc.body, bearer)
			took := time.Since(began)
			var body struct {
				Error struct{ Code, Message string }
			}
			if err := json.Unmarshal(b, &body); err != nil {
				t.Fatalf("%d %s: %v", code, b, err)
			}
			if code != http.StatusServiceUnavailable || body.Error.Code != "unavailable" ||
				!strings.HasPrefix(body.Error.Message, tc.what+": unavailable: nats ") {
				t.Errorf("with NATS away: %d %s, want 503 unavailable saying %q, unavailable, and the NATS connection's state", code, b, tc.what)
			}
			if took > bound {
				t.Errorf("answered after %s, want within %s", took.Round(time.Millisecond), bound)
			}
		})
	}
}

// TestPanelsSayNATSIsAwayAtOnce: once the console's NATS connection is down
// (its /readyz says so), the panels that read JetStream (readers, dead
// letters) answer 503 "unavailable" at once, naming the connection's state
// and why it failed to connect, rather than after their JetStream calls
// time out one after another (up to the panels' 20 s limit).
func TestPanelsSayNATSIsAwayAtOnce(t *testing.T) {
	t.Parallel()
	n, js := consoletest.NATS(t)
	s := startOn(t, js, log(t), withToken)
	for _, path := range []string{"/api/readers", "/api/dlq"} {
		if code, b := do(t, nil, http.MethodGet, s.url+path, nil, bearer); code != http.StatusOK {
			t.Fatalf("%s with NATS up: %d %s", path, code, b)
		}
	}
	n.Stop()
	testenv.WaitFor(t, 10*time.Second, "the console's /readyz to say NATS is down", func() bool {
		code, b := do(t, nil, http.MethodGet, s.url+"/readyz", nil, nil)
		return code == http.StatusServiceUnavailable && strings.Contains(string(b), "nats")
	})
	const bound = 2 * time.Second
	for _, tc := range []struct{ path, what string }{
		{"/api/readers", "read the readers"},
		{"/api/dlq", "read dead letters"},
	} {
		t.Run(tc.path, func(t *testing.T) {
			t.Parallel()
			// A panel remembers its figures for a second: the first answer
			// may still be the one from before the outage.
			deadline := time.Now().Add(10 * time.Second)
			for {
				began := time.Now()
				code, b := do(t, nil, http.MethodGet, s.url+tc.path, nil, bearer)
				took := time.Since(began)
				if took > bound {
					t.Fatalf("with NATS away: answered %d after %s, want within %s", code, took.Round(time.Millisecond), bound)
				}
				if code == http.StatusOK && time.Now().Before(deadline) {
					continue
				}
				var body struct {
					Error struct{ Code, Message string }
				}
				if err := json.Unmarshal(b, &body); err != nil {
					t.Fatalf("%d %s: %v", code, b, err)
				}
				if code != http.StatusServiceUnavailable || body.Error.Code != "unavailable" ||
					!strings.HasPrefix(body.Error.Message, tc.what+": unavailable: nats ") {
					t.Errorf("with NATS away: %d %s, want 503 unavailable saying %q, unavailable, and the NATS connection's state", code, b, tc.what)
				}
				t.Logf("answered %d in %s: %s", code, took.Round(time.Millisecond), body.Error.Message)
				return
			}
		})
	}
}
