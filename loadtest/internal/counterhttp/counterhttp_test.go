package counterhttp_test

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/loadtest/internal/counterhttp"
	"github.com/snipdev/snip/loadtest/internal/oracle"
	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
)

var servers *testenv.Servers

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &servers, testenv.WithRedis())) }

var _ oracle.CounterReader = (*counterhttp.Client)(nil)

const (
	acmeKey  = "snip_counterhttp_acme_0123456789abcdef"
	otherKey = "snip_counterhttp_other_0123456789abcdef"
)

// startCounter builds the click counter from the workspace and runs it as
// a process against an embedded NATS and a database of the shared Redis,
// with the owners acme and other; it returns the stats API's base URL and
// a JetStream client of its NATS. The counter is stopped (SIGTERM) when
// the test ends.
func startCounter(t *testing.T) (string, jetstream.JetStream) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "clickcounter")
	build := exec.Command("go", "build", "-C", filepath.Join("..", "..", "..", "services", "clickcounter"), "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the click counter: %v\n%s", err, out)
	}
	n := testenv.StartNATS(t)
	_, db := servers.Redis.NewDB(t)
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(t.TempDir(), "clickcounter.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "NATS_URL="+n.URL, "REDIS_URL="+servers.Redis.URL(db),
		"HTTP_ADDR=127.0.0.1:"+strconv.Itoa(port), "LOG_LEVEL=warn", "SNIP_PARTITIONS=4",
		"SNIP_BOOTSTRAP_OWNERS=acme:"+acmeKey+",other:"+otherKey)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the click counter: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("click counter's log:\n%s", b)
		}
	})
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	testenv.WaitFor(t, 60*time.Second, "the click counter to answer /readyz", func() bool {
		select {
		case <-done:
			b, _ := os.ReadFile(logPath)
			t.Fatalf("the click counter exited during start:\n%s", b)
		default:
		}
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return base, n.JetStream(t)
}

// publish sends clicks into CLICKS as the redirect would.
func publish(t *testing.T, js jetstream.JetStream, clicks []events.Click) {
	t.Helper()
	for _, c := range clicks {
		data, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		msg := nats.NewMsg(events.ClickSubject(c.Owner, c.Code))
		msg.Data = data
		msg.Header.Set(events.HeaderMsgID, c.ID)
		if _, err := js.PublishMsg(t.Context(), msg); err != nil {
			t.Fatalf("publish: %v", err)
		}
	}
}

func click(owner, code string, at time.Time, visitor, country, referrer string, bot bool) events.Click {
	return events.Click{V: events.ClickVersion, ID: events.NewID(), Time: at, Code: code, Owner: owner,
		Target: "https://example.test/" + code, Visitor: visitor, Country: country, Referrer: referrer, Bot: bot,
		UserAgent: "Mozilla/5.0"}
}

// TestStatsOfARealCounter reads what the click counter counted through its
// stats API, as the oracle does: totals, countries and referrers under
// the counter's names, the hourly and daily series of the span asked for
// with the day's uniques, and a link the owner cannot see as no clicks.
func TestStatsOfARealCounter(t *testing.T) {
	t.Parallel()
	base, js := startCounter(t)
	at := time.Now().UTC()
	publish(t, js, []events.Click{
		click("acme", "c-one", at, "v1", "DE", "https://www.news.example/a", false),
		click("acme", "c-one", at, "v1", "DE", "", false),
		click("acme", "c-one", at, "v2", "FR", "https://news.example/b", false),
		click("acme", "c-one", at, "b1", "", "not a url", true),
		click("other", "c-theirs", at, "v3", "DE", "", false),
	})
	acme := counterhttp.New(base+"/", acmeKey) // the trailing slash is the client's to trim
	other := counterhttp.New(base, otherKey)
	testenv.WaitFor(t, 30*time.Second, "the counter to count the 5 clicks", func() bool {
		h, b, err := acme.Totals(t.Context(), "c-one")
		h2, b2, err2 := other.Totals(t.Context(), "c-theirs")
		return err == nil && err2 == nil && h+b == 4 && h2+b2 == 1
	})
	if h, b, err := acme.Totals(t.Context(), "c-one"); err != nil || h != 3 || b != 1 {
		t.Errorf("Totals = %d human, %d bot, %v; want 3, 1", h, b, err)
	}

	span := oracle.Span{Hours: 3, Days: 2}
	before := time.Now().UTC()
	got, err := acme.Stats(t.Context(), "c-one", span)
	after := time.Now().UTC()
	if err != nil {
		t.Fatal(err)
	}
	// The series end with the hour and day of the query (read between
	// before and after), span long, one entry per hour or day.
	if len(got.Hourly) != span.Hours || len(got.Daily) != span.Days {
		t.Fatalf("series of %d hours and %d days, want %d and %d", len(got.Hourly), len(got.Daily), span.Hours, span.Days)
	}
	if last := got.Hourly[len(got.Hourly)-1].Hour; last.Before(before.Truncate(time.Hour)) || last.After(after.Truncate(time.Hour)) {
		t.Errorf("hourly series ends at %s, want the hour of the query", last)
	}
	want := oracle.LinkStats{
		Totals:    oracle.Pair{Human: 3, Bot: 1},
		Countries: map[string]oracle.Pair{"DE": {Human: 2}, "FR": {Human: 1}, "unknown": {Bot: 1}},
		Referrers: map[string]oracle.Pair{"news.example": {Human: 2}, "(direct)": {Human: 1}, "(unknown)": {Bot: 1}},
	}
	for i, h := range got.Hourly {
		if i > 0 && !h.Hour.Equal(got.Hourly[i-1].Hour.Add(time.Hour)) {
			t.Errorf("hour %s follows %s", h.Hour, got.Hourly[i-1].Hour)
		}
		c := oracle.HourCount{Hour: h.Hour}
		if h.Hour.Equal(at.Truncate(time.Hour)) {
			c.Pair = oracle.Pair{Human: 3, Bot: 1}
		}
		want.Hourly = append(want.Hourly, c)
	}
	for _, d := range got.Daily {
		c := oracle.DayCount{Day: d.Day}
		if d.Day.Equal(at.Truncate(24 * time.Hour)) {
			c.Pair, c.Uniques = oracle.Pair{Human: 3, Bot: 1}, 2
		}
		want.Daily = append(want.Daily, c)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("stats of c-one (-want +got):\n%s", diff)
	}

	// What the owner cannot see reads as no clicks; what the counter
	// refuses is an error that says why.
	tests := []struct {
		name    string
		key     string
		code    string
		span    oracle.Span
		wantErr string
	}{
		{name: "a_link_never_clicked_is_zero", key: acmeKey, code: "c-none", span: span},
		{name: "another_owners_link_is_zero", key: acmeKey, code: "c-theirs", span: span},
		{name: "an_unknown_key_is_an_error", key: "snip_counterhttp_nobody_0123456789", code: "c-one", span: span, wantErr: "401"},
		{name: "a_span_the_api_refuses_is_an_error", key: acmeKey, code: "c-one", span: oracle.Span{Hours: 49, Days: 1}, wantErr: "400"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := counterhttp.New(base, tc.key).Stats(t.Context(), tc.code, tc.span)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), tc.code) {
					t.Errorf("Stats = %+v, %v; want an error naming %s and saying %s", got, err, tc.code, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(oracle.LinkStats{}, got); diff != "" {
				t.Errorf("stats (-want +got):\n%s", diff)
			}
		})
	}
	// The other owner sees its own link.
	if h, b, err := other.Totals(t.Context(), "c-theirs"); err != nil || h != 1 || b != 0 {
		t.Errorf("other's Totals of c-theirs = %d, %d, %v; want 1, 0", h, b, err)
	}
}
