package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/snipdev/snip/loadtest/internal/jsread"
	"github.com/snipdev/snip/loadtest/internal/oracle"
	"github.com/snipdev/snip/loadtest/internal/series"
	"github.com/snipdev/snip/loadtest/internal/truth"
	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

var servers *testenv.Servers

func TestMain(m *testing.M) {
	if os.Getenv(signalChild) != "" {
		mainThatHangs() // a child of TestSecondSignalEndsAStopThatHangs
	}
	dir, err := os.MkdirTemp("", "loadtest-bin-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: a folder for the service binaries: %v\n", err)
		os.Exit(1)
	}
	binDir = dir
	code := testenv.Main(m, &servers, testenv.WithClickHouse())
	os.RemoveAll(dir)
	os.Exit(code)
}

// testKey is the run owner's API key (one the services' owner bootstrap takes).
const testKey = "snip_test_key_0123456789abcdef"

// tally is a stand-in click counter: a real consumer group on CLICKS (pkg/
// reader) that counts each event ID once, served through the stats API's
// shape. lose, if set, makes it skip counting the events it returns true
// for: a reader that loses clicks.
type tally struct {
	mu     sync.Mutex
	seen   map[string]bool
	totals map[string][2]int64
	// dims counts by code, then "country:NAME" or "referrer:NAME".
	dims map[string]map[string][2]int64
	// hours and days count by code, then the hour or UTC day of the
	// click's own time (from the Unix epoch); visitors are by code and
	// day, of the clicks not labelled bots (its uniques, exact).
	hours, days map[string]map[int64][2]int64
	visitors    map[string]map[int64]map[string]bool
	lose        func(events.Click) bool
	// misfile, if set, makes it count the events it returns true for
	// under the country "ZZ": right totals, a wrong dimension.
	misfile func(events.Click) bool
	// earlier, if set, makes it count the events it returns true for an
	// hour before their time: right totals, a wrong hour.
	earlier func(events.Click) bool
	// counted is where each event was counted (by ID), for a verdict to
	// move it; verdicts holds the labels of verdicts about events not
	// counted yet.
	counted  map[string]*tallied
	verdicts map[string]bool
}

// tallied is where the tally counted one event: its link, dimensions, hour
// and day, and its label (0 human, 1 bot).
type tallied struct {
	code      string
	dims      []string
	hour, day int64
	label     int
}

// newTally returns an empty tally.
func newTally(o systemOptions) *tally {
	return &tally{seen: map[string]bool{}, totals: map[string][2]int64{}, dims: map[string]map[string][2]int64{},
		hours: map[string]map[int64][2]int64{}, days: map[string]map[int64][2]int64{}, visitors: map[string]map[int64]map[string]bool{},
		lose: o.lose, misfile: o.misfile, earlier: o.earlier, counted: map[string]*tallied{}, verdicts: map[string]bool{}}
}

// countAt adds one click of label to m[code][k].
func countAt(m map[string]map[int64][2]int64, code string, k int64, label int) {
	if m[code] == nil {
		m[code] = map[int64][2]int64{}
	}
	n := m[code][k]
	n[label]++
	m[code][k] = n
}

// tallyDims are the counter's names for a click's country and referrer.
func tallyDims(c events.Click) []string {
	country := "unknown"
	if len(c.Country) == 2 {
		country = strings.ToUpper(c.Country)
	}
	referrer := "(direct)"
	if c.Referrer != "" {
		referrer = "(unknown)"
		if u, err := url.Parse(c.Referrer); err == nil && u.Hostname() != "" {
			referrer = strings.TrimPrefix(strings.ToLower(u.Hostname()), "www.")
		}
	}
	return []string{"country:" + country, "referrer:" + referrer}
}

func (t *tally) handle(_ context.Context, _ int, batch []reader.Event) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, e := range batch {
		c := e.Click
		if t.seen[c.ID] || (t.lose != nil && t.lose(c)) {
			continue
		}
		t.seen[c.ID] = true
		label := 0
		if c.Bot {
			label = 1
		}
		if bot, ok := t.verdicts[c.ID]; ok {
			label = labelOf(bot)
		}
		tot := t.totals[c.Code]
		tot[label]++
		t.totals[c.Code] = tot
		if t.dims[c.Code] == nil {
			t.dims[c.Code] = map[string][2]int64{}
		}
		dims := tallyDims(c)
		if t.misfile != nil && t.misfile(c) {
			dims[0] = "country:ZZ"
		}
		for _, d := range dims {
			n := t.dims[c.Code][d]
			n[label]++
			t.dims[c.Code][d] = n
		}
		at := c.Time.UTC()
		if t.earlier != nil && t.earlier(c) {
			at = at.Add(-time.Hour)
		}
		day := at.Unix() / 86400
		countAt(t.hours, c.Code, at.Unix()/3600, label)
		countAt(t.days, c.Code, day, label)
		t.counted[c.ID] = &tallied{code: strings.Clone(c.Code), dims: dims, hour: at.Unix() / 3600, day: day, label: label}
		if !c.Bot && c.Visitor != "" {
			if t.visitors[c.Code] == nil {
				t.visitors[c.Code] = map[int64]map[string]bool{}
			}
			if t.visitors[c.Code][day] == nil {
				t.visitors[c.Code][day] = map[string]bool{}
			}
			t.visitors[c.Code][day][c.Visitor] = true
		}
	}
	return nil
}

func labelOf(bot bool) int {
	if bot {
		return 1
	}
	return 0
}

// applyVerdicts reads the counter's consumer on FRAUD_VERDICTS, as the
// counter does, and moves each labelled event it counted to its new label
// (totals, dimensions, hour and day; the uniques, of the visitors the
// redirect did not label bots, stay), until ctx ends.
func (t *tally) applyVerdicts(ctx context.Context, tb testing.TB, js jetstream.JetStream) {
	cons, err := js.Consumer(ctx, events.FraudVerdictsStream, topology.ClickCounterVerdictsConsumer)
	if err != nil {
		tb.Errorf("tally: verdicts consumer: %v", err)
		return
	}
	for ctx.Err() == nil {
		mb, err := cons.Fetch(100, jetstream.FetchMaxWait(200*time.Millisecond))
		if err != nil {
			continue
		}
		for m := range mb.Messages() {
			b, err := events.DecodeFraudVerdictBatch(m.Data())
			if err != nil {
				tb.Errorf("tally: verdict: %v", err)
				continue
			}
			t.mu.Lock()
			for _, l := range b.Labels {
				to := labelOf(l.Bot)
				e, ok := t.counted[l.ClickID]
				if !ok {
					t.verdicts[l.ClickID] = l.Bot
					continue
				}
				if e.label == to {
					continue
				}
				move := func(n [2]int64) [2]int64 { n[e.label]--; n[to]++; return n }
				t.totals[e.code] = move(t.totals[e.code])
				for _, d := range e.dims {
					t.dims[e.code][d] = move(t.dims[e.code][d])
				}
				t.hours[e.code][e.hour] = move(t.hours[e.code][e.hour])
				t.days[e.code][e.day] = move(t.days[e.code][e.day])
				e.label = to
			}
			t.mu.Unlock()
			if err := m.Ack(); err != nil && ctx.Err() == nil {
				tb.Errorf("tally: ack a verdict: %v", err)
			}
		}
	}
}

func (t *tally) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer "+testKey {
		http.Error(w, `{"error":"unauthorized"}`, http.StatusUnauthorized)
		return
	}
	code := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/api/links/"), "/stats")
	type dim struct {
		Name  string `json:"name"`
		Human int64  `json:"human"`
		Bot   int64  `json:"bot"`
	}
	type hour struct {
		Hour  time.Time `json:"hour"`
		Human int64     `json:"human"`
		Bot   int64     `json:"bot"`
	}
	type day struct {
		Day     string `json:"day"`
		Human   int64  `json:"human"`
		Bot     int64  `json:"bot"`
		Uniques int64  `json:"uniques"`
	}
	hours, err1 := strconv.Atoi(r.URL.Query().Get("hours"))
	days, err2 := strconv.Atoi(r.URL.Query().Get("days"))
	if err1 != nil || err2 != nil || hours < 1 || hours > 48 || days < 1 || days > 30 {
		http.Error(w, `{"error":"bad range"}`, http.StatusBadRequest)
		return
	}
	countries, referrers := []dim{}, []dim{}
	hourly, daily := []hour{}, []day{}
	now := time.Now().UTC()
	t.mu.Lock()
	for i := hours - 1; i >= 0; i-- {
		h := now.Truncate(time.Hour).Add(-time.Duration(i) * time.Hour)
		n := t.hours[code][h.Unix()/3600]
		hourly = append(hourly, hour{h, n[0], n[1]})
	}
	for i := days - 1; i >= 0; i-- {
		d := now.Truncate(24*time.Hour).AddDate(0, 0, -i)
		n := t.days[code][d.Unix()/86400]
		daily = append(daily, day{d.Format(time.DateOnly), n[0], n[1], int64(len(t.visitors[code][d.Unix()/86400]))})
	}
	tot, ok := t.totals[code]
	for d, n := range t.dims[code] {
		if name, ok := strings.CutPrefix(d, "country:"); ok {
			countries = append(countries, dim{name, n[0], n[1]})
		} else {
			referrers = append(referrers, dim{strings.TrimPrefix(d, "referrer:"), n[0], n[1]})
		}
	}
	t.mu.Unlock()
	if !ok {
		http.Error(w, `{"error":"link not found"}`, http.StatusNotFound)
		return
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"code": code, "totals": map[string]int64{"human": tot[0], "bot": tot[1]},
		"top_countries": countries, "top_referrers": referrers, "hourly": hourly, "daily": daily})
}

// loader is a stand-in warehouse loader: a consumer group that inserts each
// batch into a ClickHouse `clicks` table twice, the way a redelivery would,
// so the oracle must count distinct event IDs, not rows.
type loader struct {
	conn driver.Conn
	// stuck: fail every batch holding a load test's click.
	stuck bool
}

const clicksDDL = `CREATE TABLE clicks (event_id UUID, ts DateTime('UTC'), owner String, code String, bot UInt8)
ENGINE = ReplacingMergeTree PARTITION BY toDate(ts) ORDER BY (owner, code, ts, event_id)`

// createClicksUnmerged creates the stand-in's `clicks` table with its
// merges stopped, for a short run: ReplacingMergeTree would merge most
// copies away within seconds, and the oracle's distinct counts would meet
// only those a merge had not reached yet. Every insert is a part, so the
// part limits are raised past what a run of seconds makes (a long run
// keeps its merges).
func createClicksUnmerged(t *testing.T, conn driver.Conn) {
	t.Helper()
	if err := conn.Exec(t.Context(), clicksDDL+` SETTINGS parts_to_delay_insert = 100000, parts_to_throw_insert = 100000`); err != nil {
		t.Fatalf("create clicks: %v", err)
	}
	if err := conn.Exec(t.Context(), "SYSTEM STOP MERGES clicks"); err != nil {
		t.Fatalf("stop the merges of clicks: %v", err)
	}
}

func (l *loader) handle(ctx context.Context, _ int, batch []reader.Event) error {
	if l.stuck {
		for _, e := range batch {
			if strings.HasPrefix(e.Click.Code, stuckCode) {
				return errors.New("test: the warehouse is stuck")
			}
		}
	}
	for range 2 {
		b, err := l.conn.PrepareBatch(ctx, "INSERT INTO clicks (event_id, ts, owner, code, bot)")
		if err != nil {
			return err
		}
		for _, e := range batch {
			var bot uint8
			if e.Click.Bot {
				bot = 1
			}
			if err := b.Append(uuid.MustParse(e.Click.ID), e.Click.Time, e.Click.Owner, e.Click.Code, bot); err != nil {
				return err
			}
		}
		if err := b.Send(); err != nil {
			return err
		}
	}
	return nil
}

// labeller is a stand-in fraud detection: for each batch, one verdict
// message on FRAUD_VERDICTS labelling bot the events label returns true
// for, published (and stored) before the batch is acknowledged.
func labeller(js jetstream.JetStream, label func(events.Click) bool) reader.Handler {
	return func(ctx context.Context, p int, batch []reader.Event) error {
		var labels []events.FraudVerdictLabel
		for _, e := range batch {
			if c := e.Click; label(c) {
				labels = append(labels, events.FraudVerdictLabel{ClickID: c.ID, ClickSeq: e.Seq, Code: c.Code, Owner: c.Owner,
					Rule: "link_flood", Bot: true, SourceBot: c.Bot, ClickTime: c.Time, Country: c.Country, Referrer: c.Referrer, Time: time.Now().UTC()})
			}
		}
		if len(labels) == 0 {
			return nil
		}
		for _, b := range events.SplitVerdicts(p, batch[0].Seq, batch[len(batch)-1].Seq, labels) {
			data, err := json.Marshal(b)
			if err != nil {
				return err
			}
			if _, err := js.Publish(ctx, events.FraudVerdictBatchSubject(p), data, jetstream.WithMsgID(b.ID)); err != nil {
				return err
			}
		}
		return nil
	}
}

// system is NATS with the topology, the two stand-in readers, and the
// environment and flags that point loadtest at them.
type testSystem struct {
	natsURL string
	js      jetstream.JetStream
	environ []string
	flags   []string
	tally   *tally
	// groups are the consumer groups of the stand-in readers, on
	// partitions CLICKS partitions.
	groups     []string
	partitions int
}

func startSystem(t *testing.T, lose func(events.Click) bool) *testSystem {
	t.Helper()
	return startSystemWith(t, systemOptions{lose: lose, loaderLinger: 20 * time.Millisecond})
}

// systemOptions change the stand-in readers.
type systemOptions struct {
	// lose makes the counter skip the events it returns true for.
	lose func(events.Click) bool
	// loaderLinger is the warehouse stand-in's linger: the real loader
	// batches for a second, so while any traffic flows its backlog
	// (delivered, not yet acknowledged) is rarely 0.
	loaderLinger time.Duration
	// loaderStuck makes the warehouse stand-in fail every batch holding a
	// click on stuckCode: it never acknowledges them.
	loaderStuck bool
	// misfile makes the counter count the events it returns true for
	// under another country.
	misfile func(events.Click) bool
	// earlier makes the counter count the events it returns true for in
	// the hour before their own.
	earlier func(events.Click) bool
	// label starts a stand-in fraud detection (a fraud-detection group on
	// CLICKS) that publishes a verdict on FRAUD_VERDICTS labelling bot each
	// event label returns true for, and the counter applies the verdicts.
	label func(events.Click) bool
}

const stuckCode = "lt-"

func startSystemWith(t *testing.T, o systemOptions) *testSystem {
	t.Helper()
	n := testenv.StartNATS(t)
	js := n.JetStream(t)
	opts := topology.Defaults()
	opts.Partitions = 4
	if err := topology.Apply(t.Context(), js, opts); err != nil {
		t.Fatalf("topology: %v", err)
	}
	conn, db := servers.ClickHouse.NewDB(t)
	createClicksUnmerged(t, conn)
	ta := newTally(o)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	handlers := map[string]reader.Handler{
		topology.GroupClickCounter:    ta.handle,
		topology.GroupWarehouseLoader: (&loader{conn: conn, stuck: o.loaderStuck}).handle,
	}
	if o.label != nil {
		handlers[topology.GroupFraudDetection] = labeller(js, o.label)
		wg.Go(func() { ta.applyVerdicts(ctx, t, n.JetStream(t)) })
	}
	for group, h := range handlers {
		linger := 20 * time.Millisecond
		if group == topology.GroupWarehouseLoader {
			linger = o.loaderLinger
		}
		wg.Go(func() {
			cfg := reader.Config{Group: group, Linger: linger, Start: reader.StartAtOldest()}
			if err := reader.Run(ctx, n.JetStream(t), cfg, h); err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("reader %s: %v", group, err)
			}
		})
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	srv := httptest.NewServer(ta)
	t.Cleanup(srv.Close)
	return &testSystem{
		natsURL:    n.URL,
		js:         js,
		groups:     slices.Collect(maps.Keys(handlers)),
		partitions: opts.Partitions,
		environ:    []string{"NATS_URL=" + n.URL, "SNIP_API_KEY=" + testKey},
		flags: []string{
			"--counter-url", srv.URL,
			"--clickhouse", "clickhouse://" + servers.ClickHouse.Addr + "/" + db,
			"--fraud", "off", "--require", "counter,warehouse", "--deadline", "90s",
		},
		tally: ta,
	}
}

func loadtest(t *testing.T, environ []string, args ...string) (string, error) {
	t.Helper()
	var out lockedBuffer
	err := run(t.Context(), args, environ, &out, &out, slog.New(slog.DiscardHandler))
	return out.String(), err
}

// lockedBuffer is a buffer the progress line and the results may share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// row returns the table row of a sink: expected, got, missing, extra, dup,
// verdict.
func row(t *testing.T, out, sink string) []string {
	t.Helper()
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(sink) + `\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(PASS|FAIL)`)
	m := re.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no row %q in:\n%s", sink, out)
	}
	return m[1:]
}

// eventsArgs is the run the end-to-end tests make: 600 clicks (300/s for
// 2 s) on 20 links, verified.
func eventsArgs(s *testSystem, dir string, extra ...string) []string {
	return eventsLoadArgs(s, dir, append([]string{"--verify"}, extra...)...)
}

// eventsLoadArgs is eventsArgs' run without the verification.
func eventsLoadArgs(s *testSystem, dir string, extra ...string) []string {
	args := []string{"events", "--rate", "300", "--duration", "2s", "--links", "20", "--viral", "0.3",
		"--burst-share", "0", "--bot-share", "0.1", "--probe-every", "30", "--out", dir}
	return append(append(args, s.flags...), extra...)
}

// settledDeadline is the oracle's deadline in a test that verifies sinks
// already settled (verifySettled).
const settledDeadline = "2s"

// verifySettled runs eventsArgs' run without the verification, waits until
// the stand-in readers have acknowledged everything in CLICKS, and then
// verifies the run's saved truth (loadtest verify --truth), returning its
// output and error. Each stand-in acknowledges a batch only after it has
// counted or inserted it, so the sinks then hold all they ever will: the
// rows that pass need no time to converge, and a row that fails, which the
// oracle waits on until its deadline (a sink may yet converge), fails for
// good. The oracle's deadline, and the catch-up watch of the run's own, is
// then settledDeadline: the wait for a failing row, not the room passing
// rows need on a loaded machine.
func (s *testSystem) verifySettled(t *testing.T, dir string, extra ...string) (string, error) {
	t.Helper()
	out, err := loadtest(t, s.environ, eventsLoadArgs(s, dir, append([]string{"--deadline", settledDeadline}, extra...)...)...)
	if err != nil {
		t.Fatalf("loadtest events: %v\n%s", err, out)
	}
	s.waitSettled(t)
	return loadtest(t, s.environ, slices.Concat([]string{"verify", "--truth", filepath.Join(dir, "truth.json")}, s.flags, []string{"--deadline", settledDeadline})...)
}

// waitSettled waits until each stand-in reader's consumer of every CLICKS
// partition has nothing left to deliver and nothing delivered that is not
// acknowledged.
func (s *testSystem) waitSettled(t *testing.T) {
	t.Helper()
	testenv.WaitFor(t, time.Minute, "the stand-in readers to acknowledge everything in CLICKS", func() bool {
		for _, g := range s.groups {
			for p := range s.partitions {
				c, err := s.js.Consumer(t.Context(), events.ClicksStream, topology.GroupConsumerName(g, p))
				if err != nil {
					return false
				}
				info, err := c.Info(t.Context())
				if err != nil || info.NumPending != 0 || info.NumAckPending != 0 {
					return false
				}
			}
		}
		return true
	})
}

func TestEventsRunPassesTheOracle(t *testing.T) {
	t.Parallel()
	s := startSystem(t, nil)
	dir := t.TempDir()
	out, err := loadtest(t, s.environ, eventsArgs(s, dir)...)
	if err != nil {
		t.Fatalf("loadtest events: %v\n%s", err, out)
	}
	for _, sink := range []string{"clicks log (CLICKS)", "counter totals", "counter bot split", "counter countries", "counter referrers",
		"counter hourly", "counter daily", "counter uniques", "warehouse event IDs", "warehouse bot flags", "readers caught up"} {
		if r := row(t, out, sink); r[5] != "PASS" {
			t.Errorf("%s: %v, want PASS", sink, r)
		}
	}
	for _, sink := range []string{"counter countries", "counter referrers", "counter hourly", "counter daily"} {
		if r := row(t, out, sink); r[0] != "600" {
			t.Errorf("%s: %v, want every click of the run checked by dimension and in the series", sink, r)
		}
	}
	if r := row(t, out, "clicks log (CLICKS)"); r[0] != "600" || r[1] != "600" {
		t.Errorf("log row %v: want 600 expected and got (300/s for 2s)", r)
	}
	// The stand-in loader wrote every click twice (and a batch delivered
	// again, more): the oracle counted events, not rows.
	if m := regexp.MustCompile(`(?m)^warehouse event IDs +600 +600 .*PASS .* (\d+) rows for 600 distinct IDs`).FindStringSubmatch(out); m == nil {
		t.Errorf("want the warehouse row to pass 600 distinct IDs:\n%s", out)
	} else if rows, _ := strconv.Atoi(m[1]); rows < 1200 {
		t.Errorf("the warehouse row read %d rows, want every click's two copies (1200 or more): the oracle was not shown to count events, not rows\n%s", rows, out)
	}
	for _, f := range []string{"truth.json", "report.json", "report.html"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("report file: %v", err)
		}
	}
	if !strings.Contains(out, "click-to-counter") {
		t.Errorf("no click-to-counted latency for the counter in:\n%s", out)
	}

	// The saved truth verifies again later, with the same answer.
	out, err = loadtest(t, s.environ, append([]string{"verify", "--truth", filepath.Join(dir, "truth.json")}, s.flags...)...)
	if err != nil {
		t.Fatalf("loadtest verify: %v\n%s", err, out)
	}
	if r := row(t, out, "counter totals"); r[0] != "600" || r[5] != "PASS" {
		t.Errorf("verify --truth: counter row %v", r)
	}
}

// The real webhooks service delivers the run's clicks to the run's own
// receiver, registered for the even-numbered links: every click on them
// delivered (by event id), none on the others, every signature valid, each
// link's clicks in CLICKS' order, the group and the endpoint's queue caught
// up; the endpoint is deleted at the end.
// With --fraud off the counter is still judged by the final labels: it
// applies every verdict fraud detection publishes, whether the run checks
// fraud or not. The oracle read the verdicts only with fraud checked, so it
// expected the source labels and failed a counter that had applied them
// (the bot split, and the dimensions and series by label).
func TestFraudOffJudgesTheCounterByTheVerdicts(t *testing.T) {
	t.Parallel()
	// About a quarter of the human clicks (UUIDv7's last digit random).
	label := func(c events.Click) bool { return !c.Bot && strings.ContainsRune("048c", rune(c.ID[len(c.ID)-1])) }
	s := startSystemWith(t, systemOptions{loaderLinger: 20 * time.Millisecond, label: label})
	out, err := loadtest(t, s.environ, eventsArgs(s, t.TempDir())...)
	if err != nil {
		t.Fatalf("loadtest events: %v\n%s", err, out)
	}
	for _, sink := range []string{"counter totals", "counter bot split", "counter countries", "counter referrers",
		"counter hourly", "counter daily", "counter uniques", "warehouse bot flags", "readers caught up"} {
		if r := row(t, out, sink); r[5] != "PASS" {
			t.Errorf("%s: %v, want PASS", sink, r)
		}
	}
	// Relabelled: more bots counted than the 10 % the redirect labelled.
	if r := row(t, out, "counter bot split"); r[0] == "" || mustAtoi(t, r[0]) < 100 {
		t.Errorf("counter bot split %v: want the verdicts' bots counted too (over 100 of 600)", r)
	}
	for _, sink := range []string{"fraud verdicts (bursts)", "fraud alerts (bursts)"} {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(sink) + `\s.*SKIPPED\s+off \(--fraud off\)`).MatchString(out) {
			t.Errorf("want %s SKIPPED, off:\n%s", sink, out)
		}
	}
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestEventsRunPassesTheOracleWithTheWebhooksService(t *testing.T) {
	t.Parallel()
	s := startSystem(t, nil)
	r := testenv.StartRedis(t)
	wh := startService(t, "webhooks", buildService(t, "webhooks"), "NATS_URL="+s.natsURL, "REDIS_URL="+r.URL(0),
		"SNIP_PARTITIONS=4", "SNIP_BOOTSTRAP_OWNERS=demo:"+testKey,
		"WEBHOOKS_HTTP_HOSTS=127.0.0.1", "WEBHOOKS_ALLOW_CIDRS=127.0.0.1/32")
	// A fixed seed: with a random one, about one run in 200 sends no click
	// to one of the 11 wanted links in its 600 (a CI run met it). Seed 56
	// sends each of them 8 or more.
	out, err := loadtest(t, s.environ, eventsArgs(s, t.TempDir(), "--seed", "56", "--webhooks", wh.url, "--require", "counter,warehouse,webhooks")...)
	if err != nil {
		t.Fatalf("loadtest events with the webhooks service: %v\n%s", err, out)
	}
	for _, sink := range []string{"clicks log (CLICKS)", "counter totals", "warehouse event IDs",
		"webhooks clicks", "webhooks signatures", "webhooks order per link", "readers caught up"} {
		if r := row(t, out, sink); r[5] != "PASS" {
			t.Errorf("%s: %v, want PASS\n%s", sink, r, out)
		}
	}
	// The filter matters: some of the 600 clicks are wanted, not all.
	if r := row(t, out, "webhooks clicks"); r[0] == "0" || r[0] == "600" || r[0] != r[1] {
		t.Errorf("webhooks clicks %v: want some but not all of the 600 clicks expected, and got", r)
	}
	if r := row(t, out, "webhooks order per link"); r[0] != "11" {
		t.Errorf("webhooks order per link %v: want the 11 even-numbered links of 21 (20 and the probe's) delivered to", r)
	}
	t.Logf("\n%s", out)
	// The owner's list, read as the owner: a refused or unknown request
	// lists nothing too, so the answer must be the list.
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, wh.url+"/api/webhooks/endpoints", nil)
	req.Header.Set("Authorization", "Bearer "+testKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	var body map[string]json.RawMessage
	if err == nil {
		err = json.Unmarshal(b, &body)
	}
	if err != nil || resp.StatusCode != http.StatusOK || body["endpoints"] == nil {
		t.Fatalf("list the owner's endpoints: %s %s (%v); want 200 and a list", resp.Status, b, err)
	}
	var list []json.RawMessage
	if err := json.Unmarshal(body["endpoints"], &list); err != nil || len(list) != 0 {
		t.Errorf("endpoints left after the run: %d (%s, %v), want none", len(list), body["endpoints"], err)
	}
}

// trickle publishes clicks on another link of the run's owner, as `make
// demo` does, until the test ends: the readers are never idle. It returns
// the count of clicks stored so far, for the test to check that they flowed.
func trickle(t *testing.T, natsURL string, every time.Duration) *trickled {
	t.Helper()
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	tr := &trickled{}
	go func() {
		defer close(done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			c := events.Click{V: events.ClickVersion, ID: uuid.Must(uuid.NewV7()).String(), Time: time.Now().UTC(),
				Code: "nats-jetstream", Owner: "demo", Target: "http://127.0.0.1:8089/articles/nats-jetstream",
				IPPrefix: "203.0.113.0/24", Visitor: "v1", UserAgent: "Mozilla/5.0", RequestID: "bg"}
			data, _ := json.Marshal(&c)
			msg := nats.NewMsg(events.ClickSubject(c.Owner, c.Code))
			msg.Data = data
			msg.Header.Set(events.HeaderMsgID, c.ID)
			pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := js.PublishMsg(pctx, msg)
			pcancel()
			tr.note(err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done; nc.Close() })
	return tr
}

// trickled counts the trickle's stored clicks and keeps its last publish
// error.
type trickled struct {
	mu      sync.Mutex
	stored  int
	lastErr error
}

func (tr *trickled) note(err error) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if err != nil {
		tr.lastErr = err
		return
	}
	tr.stored++
}

// during runs fn and fails t unless at least `least` of the trickle's clicks
// were stored meanwhile: a trickle whose publishes fail leaves the readers
// idle, and a test of a run next to other traffic would pass without any.
func (tr *trickled) during(t *testing.T, least int, fn func()) {
	t.Helper()
	tr.mu.Lock()
	before := tr.stored
	tr.mu.Unlock()
	fn()
	tr.mu.Lock()
	n, err := tr.stored-before, tr.lastErr
	tr.mu.Unlock()
	if n < least {
		t.Errorf("the other traffic stored %d clicks during the run, want at least %d (last publish error: %v)", n, least, err)
	}
}

// Next to `make demo` other clicks keep flowing and the warehouse batches
// for a second, so some backlog is almost never 0: the run is caught up when
// every reader has acknowledged the run's own last events, and the summary
// says so.
func TestCaughtUpWhileOtherTrafficFlows(t *testing.T) {
	t.Parallel()
	s := startSystemWith(t, systemOptions{loaderLinger: time.Second})
	other := trickle(t, s.natsURL, 20*time.Millisecond)
	var out string
	var err error
	// 50/s for the 2 s of load and the verification: 20 is far below.
	other.during(t, 20, func() { out, err = loadtest(t, s.environ, eventsArgs(s, t.TempDir(), "--deadline", "60s")...) })
	if err != nil {
		t.Fatalf("loadtest events with other traffic flowing: %v\n%s", err, out)
	}
	if r := row(t, out, "readers caught up"); r[5] != "PASS" {
		t.Errorf("readers caught up: %v, want PASS\n%s", r, out)
	}
	if !regexp.MustCompile(`catch-up time +[0-9.]+m?s \(end of load to every event of the run processed`).MatchString(out) {
		t.Errorf("the summary gives no catch-up time for the run:\n%s", out)
	}
}

// A reader that never processes the run's clicks (while others flow and it
// acknowledges those): the readers row fails, naming it, and the summary
// gives no catch-up time. (The row's regexp below requires the warehouse's
// partitions among those behind.)
func TestSummaryGivesNoCatchUpTimeWhenAReaderIsBehind(t *testing.T) {
	t.Parallel()
	s := startSystemWith(t, systemOptions{loaderLinger: 20 * time.Millisecond, loaderStuck: true})
	other := trickle(t, s.natsURL, 50*time.Millisecond)
	var out string
	var err error
	// 20/s for the 2 s of load and the 8 s deadline: 20 is far below.
	other.during(t, 20, func() { out, err = loadtest(t, s.environ, eventsArgs(s, t.TempDir(), "--deadline", "8s")...) })
	if !errors.Is(err, errVerifyFailed) {
		t.Fatalf("loadtest events with a stuck warehouse: err %v, want %v\n%s", err, errVerifyFailed, out)
	}
	// At least the warehouse is missing; on a busy machine the click
	// counter may also not have caught up within the deadline.
	if r := row(t, out, "readers caught up"); r[2] == "0" || r[5] != "FAIL" {
		t.Errorf("readers caught up: %v, want the warehouse missing and FAIL\n%s", r, out)
	}
	if !regexp.MustCompile(`readers caught up .*FAIL +\d+ partitions? behind the run's last event: (.*, )?warehouse-loader p\d acked \d+ of \d+`).MatchString(out) {
		t.Errorf("the readers row does not name the warehouse's partitions behind:\n%s", out)
	}
	if !strings.Contains(out, "catch-up time        not reached") || strings.Contains(out, "processed by every reader)") {
		t.Errorf("the summary claims a catch-up next to a failed readers row:\n%s", out)
	}
}

// The summary's catch-up time is dropped only when the readers row found a
// reader behind: a skipped row (no reader deployed) judged none.
func TestReadersPassedIsFalseOnlyOnAFailedRow(t *testing.T) {
	t.Parallel()
	for status, want := range map[oracle.Status]bool{oracle.Pass: true, oracle.Skipped: true, oracle.Fail: false} {
		rows := []oracle.Result{{Sink: oracle.SinkLog, Status: oracle.Pass}, {Sink: oracle.SinkReaders, Status: status}}
		if got := readersPassed(rows); got != want {
			t.Errorf("readers row %s: readersPassed = %v, want %v", status, got, want)
		}
	}
}

func TestOracleFailsWhenAnEventIsDropped(t *testing.T) {
	t.Parallel()
	s := startSystem(t, nil)
	dir := t.TempDir()
	// Every 50th event is recorded as sent but never published.
	out, err := s.verifySettled(t, dir, "--inject-loss", "50")
	if !errors.Is(err, errVerifyFailed) {
		t.Fatalf("loadtest verify of a run with lost events: err %v, want %v\n%s", err, errVerifyFailed, out)
	}
	if r := row(t, out, "clicks log (CLICKS)"); r[2] != "12" || r[5] != "FAIL" {
		t.Errorf("log row %v: want 12 missing (600/50) and FAIL", r)
	}
	tr, err := truth.Load(filepath.Join(dir, "truth.json"))
	if err != nil {
		t.Fatalf("load the run's truth: %v", err)
	}
	if n := tr.SentCount(); n != 600 {
		t.Errorf("truth: %d sent, want 600: the lost events counted as sent", n)
	}
}

func TestOracleFailsWhenAReaderLosesAnEvent(t *testing.T) {
	t.Parallel()
	var once sync.Once
	s := startSystem(t, func(c events.Click) bool {
		lost := false
		once.Do(func() { lost = true })
		return lost
	})
	out, err := s.verifySettled(t, t.TempDir())
	if !errors.Is(err, errVerifyFailed) {
		t.Fatalf("loadtest verify with a lossy counter: err %v, want %v\n%s", err, errVerifyFailed, out)
	}
	if r := row(t, out, "counter totals"); r[2] != "1" || r[5] != "FAIL" {
		t.Errorf("counter row %v: want 1 missing and FAIL", r)
	}
	for _, sink := range []string{"clicks log (CLICKS)", "warehouse event IDs"} {
		if r := row(t, out, sink); r[5] != "PASS" {
			t.Errorf("%s: %v, want PASS (only the counter lost a click)", sink, r)
		}
	}
}

// firstRunClick returns a selector that is true for the first click of the
// run it is asked about (a code starting "lt-"), and false ever after, and
// a func that returns that click (false before there is one).
func firstRunClick() (func(events.Click) bool, func() (events.Click, bool)) {
	var (
		once   sync.Once
		mu     sync.Mutex
		picked *events.Click
	)
	selector := func(c events.Click) bool {
		wrong := false
		if strings.HasPrefix(c.Code, "lt-") {
			once.Do(func() {
				wrong = true
				mu.Lock()
				picked = &c
				mu.Unlock()
			})
		}
		return wrong
	}
	return selector, func() (events.Click, bool) {
		mu.Lock()
		defer mu.Unlock()
		if picked == nil {
			return events.Click{}, false
		}
		return *picked, true
	}
}

// A counter that counts one click under another country than it was sent
// with has every total right: only the counts by country show it.
func TestOracleFailsWhenTheCounterCountsAClickUnderTheWrongCountry(t *testing.T) {
	t.Parallel()
	misfile, _ := firstRunClick()
	s := startSystemWith(t, systemOptions{loaderLinger: 20 * time.Millisecond, misfile: misfile})
	out, err := s.verifySettled(t, t.TempDir())
	if !errors.Is(err, errVerifyFailed) {
		t.Fatalf("loadtest verify with a counter that misfiles a click: err %v, want %v\n%s", err, errVerifyFailed, out)
	}
	if r := row(t, out, "counter countries"); r[2] != "1" || r[3] != "1" || r[5] != "FAIL" {
		t.Errorf("countries row %v: want 1 missing, 1 extra and FAIL", r)
	}
	for _, sink := range []string{"clicks log (CLICKS)", "counter totals", "counter bot split", "counter referrers", "warehouse event IDs"} {
		if r := row(t, out, sink); r[5] != "PASS" {
			t.Errorf("%s: %v, want PASS (only a country is wrong)", sink, r)
		}
	}
}

// A counter that counts one click in the hour before its own has every
// total and dimension right: its hourly series shows it, 1 missing and 1
// extra (the oracle asks for the hour before the run too). What else shows
// follows from the click's own time, which the test reads back from the
// stand-in, so a run at any hour is judged exactly:
//   - in any hour but 00 UTC the hour before is on the same day: the daily
//     series and the uniques pass;
//   - in the 00 hour (a run just after midnight UTC) the click moves to the
//     day before: the daily series fails, 1 missing and 1 extra. The
//     uniques fail, 1 extra, when the click is a human's and the link has
//     no other human click that day (0 visitors are allowed no error);
//     otherwise they pass: a bot's visitor is not counted, and next to
//     other human clicks (a run begun before midnight) one visitor more is
//     within the tolerance, and one fewer on the click's own day always is.
//
// Every other row passes.
func TestOracleFailsWhenTheCounterCountsAClickInTheWrongHour(t *testing.T) {
	t.Parallel()
	earlier, picked := firstRunClick()
	s := startSystemWith(t, systemOptions{loaderLinger: 20 * time.Millisecond, earlier: earlier})
	out, err := s.verifySettled(t, t.TempDir())
	if !errors.Is(err, errVerifyFailed) {
		t.Fatalf("loadtest verify with a counter that counts a click in the wrong hour: err %v, want %v\n%s", err, errVerifyFailed, out)
	}
	c, ok := picked()
	if !ok {
		t.Fatalf("the counter stand-in moved no click of the run\n%s", out)
	}
	at := c.Time.UTC()
	dayBefore := at.Add(-time.Hour).Unix() / 86400
	crossesDay := dayBefore != at.Unix()/86400
	s.tally.mu.Lock()
	humansDayBefore := s.tally.days[c.Code][dayBefore][0] // the moved click included, if a human's
	s.tally.mu.Unlock()
	moved := "FAIL: 1 missing, 1 extra"
	want := map[string]string{"counter hourly": moved, "counter daily": "PASS", "counter uniques": "PASS"}
	if crossesDay {
		want["counter daily"] = moved
		if !c.Bot && humansDayBefore == 1 {
			want["counter uniques"] = "FAIL: 0 missing, 1 extra"
		}
	}
	t.Logf("moved a click at %s (bot %v) of %s to the hour before; want counter daily %s, counter uniques %s",
		at.Format(time.RFC3339Nano), c.Bot, c.Code, want["counter daily"], want["counter uniques"])
	for _, sink := range []string{"clicks log (CLICKS)", "counter totals", "counter bot split", "counter countries", "counter referrers",
		"warehouse event IDs", "warehouse bot flags", "readers caught up"} {
		want[sink] = "PASS"
	}
	got := map[string]string{}
	for sink := range want {
		r := row(t, out, sink)
		got[sink] = r[5]
		if r[2] != "0" || r[3] != "0" {
			got[sink] = fmt.Sprintf("%s: %s missing, %s extra", r[5], r[2], r[3])
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rows for a click at %s (bot %v) counted an hour early, %d human clicks of %s counted on %s, the day it moved to (-want +got):\n%s\n%s",
			at.Format(time.RFC3339Nano), c.Bot, humansDayBefore, c.Code, time.Unix(dayBefore*86400, 0).UTC().Format(time.DateOnly), diff, out)
	}
}

func TestBare302AnswersWithARedirect(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(bare302(&Env{Log: slog.New(slog.DiscardHandler)}).Handler())
	defer srv.Close()
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/abc", nil)
	req.Header.Set("X-Request-Id", "lt-x-1")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") == "" || resp.Header.Get("X-Request-Id") != "lt-x-1" {
		t.Errorf("bare302 answered %s, Location %q, X-Request-Id %q", resp.Status, resp.Header.Get("Location"), resp.Header.Get("X-Request-Id"))
	}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
	}{
		{name: "unknown_command", args: []string{"stampede"}},
		{name: "unknown_flag", args: []string{"events", "--velocity", "9"}},
		{name: "verify_without_truth", args: []string{"verify"}},
		{name: "bad_require", args: []string{"verify", "--truth", "x.json", "--require", "everything"}},
		{name: "bad_spec", args: []string{"events", "--bot-share", "2"}},
		{name: "ramp_backwards", args: []string{"ramp", "--from", "10", "--to", "5"}},
		{name: "chaos_without_faults", args: []string{"chaos"}},
		{name: "chaos_bad_fault", args: []string{"chaos", "--fault", "drop:redis:12"}},
		// Values the oracle and the drivers used to replace with their
		// defaults without a word: --set-limit 0 compared 2,000,000 IDs,
		// --deadline 0 waited 2 minutes, --window 0 opened 4,096.
		{name: "zero_rate", args: []string{"events", "--rate", "0"}},
		{name: "zero_duration", args: []string{"http", "--duration", "0s"}},
		{name: "zero_deadline", args: []string{"verify", "--truth", "x.json", "--deadline", "0s"}},
		{name: "negative_deadline", args: []string{"events", "--deadline", "-1m"}},
		{name: "zero_set_limit", args: []string{"events", "--set-limit", "0"}},
		{name: "zero_burst_threshold", args: []string{"chaos", "--fault", "kill:x:1", "--burst-threshold", "0"}},
		{name: "zero_window", args: []string{"events", "--window", "0"}},
		{name: "zero_timeout", args: []string{"http", "--timeout", "0s"}},
		{name: "chaos_zero_timeout", args: []string{"chaos", "--fault", "kill:x:1", "--timeout", "0s"}},
		{name: "negative_max_conns", args: []string{"http", "--max-conns", "-1"}},
		{name: "unknown_country_header", args: []string{"http", "--country-header", "X-Land"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out, err := loadtest(t, []string{"NATS_URL=nats://127.0.0.1:1"}, tc.args...)
			if !errors.Is(err, errUsage) {
				t.Errorf("loadtest %v: err %v, want a usage error\n%s", tc.args, err, out)
			}
		})
	}
}

func TestProgressLine(t *testing.T) {
	t.Parallel()
	got := progressLine(seriesSecond(), map[string]uint64{"warehouse-loader": 12, "click-counter": 0}, nil)
	want := "    3s load  offered   2000/s sent   1999/s ok   1990/s err    9  p50    1.20ms p99    8.40ms | click-counter 0 warehouse-loader 12"
	if got != want {
		t.Errorf("progress line\n got %q\nwant %q", got, want)
	}
	if got := progressLine(seriesSecond(), nil, fmt.Errorf("nats down")); !strings.HasSuffix(got, "| lag ?") {
		t.Errorf("progress line without lag: %q", got)
	}
}

// A tick the machine was too busy to deliver on time closes a "second"
// longer than one: its counts are rates over its span, not per second. On
// a starved 2-core machine `make loadtest` printed "offered 6000/s" for a
// schedule of 2000/s: three seconds' offer on a line four seconds long.
func TestProgressLineOfALateTickSaysRatesPerSecond(t *testing.T) {
	t.Parallel()
	start := time.Now()
	m := series.NewMeter(start, 2000)
	m.Offer(start, start.Add(30*time.Second))
	for range 3000 {
		m.Sent()
		m.Done(time.Millisecond, true)
	}
	m.Tick(start.Add(time.Second), series.PhaseLoad)
	for range 8000 {
		m.Sent()
		m.Done(time.Millisecond, true)
	}
	s := m.Tick(start.Add(5*time.Second), series.PhaseLoad)
	if s.Offered != 8000 || s.Sent != 8000 {
		t.Fatalf("the four seconds' tick: offered %d, sent %d; want the 8000 of four seconds at 2000/s", s.Offered, s.Sent)
	}
	line := progressLine(s, nil, nil)
	if want := "offered   2000/s sent   2000/s ok   2000/s"; !strings.Contains(line, want) {
		t.Errorf("a tick four seconds long:\n got %q\nwant it to contain %q", line, want)
	}
}

func seriesSecond() series.Second {
	return series.Second{At: 3, Phase: series.PhaseLoad, Offered: 2000, Sent: 1999, OK: 1990, Errors: 9, P50: 1.2, P99: 8.4}
}

// The backlog is read on a loop of its own and every read lands in the
// peak lags, however long the progress line's second is.
func TestLagLoopRecordsEachBacklogRead(t *testing.T) {
	t.Parallel()
	js := testenv.StartNATS(t).JetStream(t)
	if err := topology.Apply(t.Context(), js, topology.Defaults()); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := js.Publish(t.Context(), events.FraudVerdictBatchSubject(i), []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	sys := &system{readers: jsread.NewReaders(js)}
	m := series.NewMeter(time.Now(), 1)
	var last lastLag
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); lagLoop(ctx, sys, m, &last) }()
	verdicts := events.FraudVerdictsStream + "/" + topology.ClickCounterVerdictsConsumer
	// The server counts the consumer's pending verdicts after it acks
	// their publishes, so the first reads may see fewer than 3: wait for a
	// read of all 3, in the last backlog and in the peak.
	testenv.WaitFor(t, 30*time.Second, "a backlog read of "+verdicts+" at 3, in the last read and the peak", func() bool {
		lag, at, err := last.get()
		return !at.IsZero() && err == nil && lag[verdicts] == 3 &&
			m.Summarise(time.Second).PeakLag[verdicts] == 3
	})
	cancel()
	<-done
	lag, _, err := last.get()
	if err != nil || lag[verdicts] != 3 {
		t.Fatalf("last backlog %v, %v; want %s at 3", lag, err, verdicts)
	}
	if got := m.Summarise(time.Second).PeakLag[verdicts]; got != 3 {
		t.Fatalf("peak lag of %s = %d, want 3", verdicts, got)
	}
}

// A report directory that cannot be made is refused before the load, naming
// it: the run sends nothing, rather than a whole run's clicks whose report
// then has nowhere to go.
func TestAReportDirectoryItCannotWriteFailsBeforeTheLoad(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t)
	js := n.JetStream(t)
	if err := topology.Apply(t.Context(), js, topology.Defaults()); err != nil {
		t.Fatalf("topology: %v", err)
	}
	file := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(file, "reports") // under a file: it cannot be made, even by root
	out, err := loadtest(t, []string{"NATS_URL=" + n.URL, "SNIP_API_KEY=" + testKey},
		"events", "--rate", "200", "--duration", "2s", "--out", dir,
		"--counter-url", "off", "--clickhouse", "off", "--fraud", "off")
	if err == nil || !strings.Contains(err.Error(), "report directory "+dir) {
		t.Errorf("loadtest events --out %s: %v, want the report directory named\n%s", dir, err, out)
	}
	s, err := js.Stream(t.Context(), events.ClicksStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 0 {
		t.Errorf("CLICKS holds %d clicks: the load ran before the report directory was found unwritable", info.State.Msgs)
	}
}
