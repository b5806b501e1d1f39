package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/dashboard"
	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/service/servicetest"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/warehouse/internal/chwriter"
	"github.com/snipdev/snip/services/warehouse/internal/loader"
	"github.com/snipdev/snip/services/warehouse/internal/warehousetest"
)

var servers *testenv.Servers

// childEnv makes the test binary run the service itself (main), so a test
// can kill -9 a real loader process.
const childEnv = "WAREHOUSE_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(testenv.Main(m, &servers, testenv.WithClickHouse()))
}

// --- helpers ---------------------------------------------------------------

// startNATS starts NATS with the topology applied.
func startNATS(t *testing.T) (*testenv.NATS, jetstream.JetStream) {
	t.Helper()
	n := testenv.StartNATS(t)
	js := n.JetStream(t)
	o := topology.Defaults()
	o.Partitions = warehousetest.Partitions
	if err := topology.Apply(t.Context(), js, o); err != nil {
		t.Fatal(err)
	}
	return n, js
}

// testConfig is the service's configuration for a test: quick to batch,
// quick to fail over, and quick to give up on a frozen server.
func testConfig(natsURL, chAddr, db string) Config {
	cfg, err := loadConfig([]string{
		"NATS_URL=" + natsURL,
		"CLICKHOUSE_ADDR=" + chAddr,
		"CLICKHOUSE_DATABASE=" + db,
		"CLICKHOUSE_DIAL_TIMEOUT=2s",
		"WAREHOUSE_BATCH_ROWS=1000",
		"WAREHOUSE_LINGER=100ms",
		"WAREHOUSE_INSERT_TIMEOUT=5s",
		"WAREHOUSE_MAX_RETRY_DELAY=1s",
		"WAREHOUSE_LEASE_TTL=1s",
		"SHUTDOWN_TIMEOUT=10s",
		"HTTP_ADDR=127.0.0.1:0",
	}, nil)
	if err != nil {
		panic(err)
	}
	return cfg
}

// instance is run() in a goroutine.
type instance struct {
	*servicetest.Running
	addr string
}

func startService(t *testing.T, cfg Config) *instance {
	t.Helper()
	log := slog.New(slog.NewJSONHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	r := servicetest.Start(t, func(ctx context.Context, ready func(string)) error {
		cfg.Ready = ready
		return run(ctx, log, cfg)
	})
	return &instance{Running: r, addr: r.Addr}
}

// stop stops the service as SIGTERM would and returns how run ended.
func (s *instance) stop(*testing.T) error { return s.Stop() }

// testWriter sends the service's logs to t.Log, shown only on failure.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// publish sends clicks to CLICKS with msgID(click) as Nats-Msg-Id.
func publish(t *testing.T, js jetstream.JetStream, clicks []events.Click, msgID func(events.Click) string) {
	t.Helper()
	for _, c := range clicks {
		b, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.PublishAsync(events.ClickSubject(c.Owner, c.Code), b, jetstream.WithMsgID(msgID(c))); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(60 * time.Second):
		t.Fatal("publish acks did not arrive")
	}
}

func eventID(c events.Click) string { return c.ID }

// counts is what the warehouse holds: distinct events, and rows the hourly
// view received (copies included).
func counts(t *testing.T, conn driver.Conn) (distinct, received uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := conn.QueryRow(ctx, "SELECT uniqExact(event_id) FROM clicks").Scan(&distinct); err != nil {
		t.Logf("count events: %v", err)
		return 0, 0
	}
	if err := conn.QueryRow(ctx, "SELECT countMerge(inserted_rows) FROM clicks_hourly").Scan(&received); err != nil {
		t.Logf("count received rows: %v", err)
		return 0, 0
	}
	return distinct, received
}

// waitLoaded waits until the warehouse holds want distinct events and its
// view received at least minReceived rows.
func waitLoaded(t *testing.T, conn driver.Conn, want, minReceived int, timeout time.Duration) {
	t.Helper()
	var d, r uint64
	testenv.WaitFor(t, timeout, fmt.Sprintf("%d distinct events, %d rows received", want, minReceived), func() bool {
		d, r = counts(t, conn)
		if d > uint64(want) {
			t.Fatalf("%d distinct events in ClickHouse, more than the %d sent", d, want)
		}
		return d == uint64(want) && r >= uint64(minReceived)
	})
}

// chConn opens a connection to db on a server of the test's own.
func chConn(t *testing.T, addr, db string) driver.Conn {
	t.Helper()
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{addr}, Auth: clickhouse.Auth{Database: db},
		DialTimeout: 5 * time.Second, ReadTimeout: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// metric sums the series of name in the service's /metrics.
func metric(t *testing.T, addr, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("get metrics: %v", err)
	}
	defer resp.Body.Close()
	return sumMetric(resp.Body, name)
}

// sumMetric sums the series of name in a Prometheus text exposition; for a
// histogram, name_count gives the number of observations.
func sumMetric(r io.Reader, name string) float64 {
	re := regexp.MustCompile(`^` + regexp.QuoteMeta(name) + `(\{[^}]*\})? (\S+)$`)
	var sum float64
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			v, _ := strconv.ParseFloat(m[2], 64)
			sum += v
		}
	}
	return sum
}

func readyz(t *testing.T, addr string) int {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		t.Fatalf("get readyz: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// lag sums the group's pending and in-flight events, as the console sees it.
func lag(t *testing.T, js jetstream.JetStream) uint64 {
	t.Helper()
	pls, err := reader.Lag(t.Context(), js, topology.GroupWarehouseLoader)
	if err != nil {
		return 0
	}
	var n uint64
	for _, pl := range pls {
		n += pl.Pending + uint64(pl.AckPending)
	}
	return n
}

// snapshot is every dashboard answer about clicks' links.
type snapshot struct {
	Hours    map[string][]dashboard.HourClicks
	Visitors map[string]uint64
	Top      []dashboard.LinkClicks
	Events   uint64
}

func takeSnapshot(t *testing.T, conn driver.Conn, clicks []events.Click) snapshot {
	t.Helper()
	q := dashboard.New(conn)
	from, to := time.Now().Add(-100*time.Hour), time.Now().Add(time.Hour)
	s := snapshot{Hours: map[string][]dashboard.HourClicks{}, Visitors: map[string]uint64{}}
	for _, c := range clicks {
		key := c.Owner + "/" + c.Code
		if _, ok := s.Hours[key]; ok {
			continue
		}
		h, err := q.ClicksPerHour(t.Context(), c.Owner, c.Code, from, to)
		if err != nil {
			t.Fatal(err)
		}
		v, err := q.UniqueVisitors(t.Context(), c.Owner, c.Code, from, to)
		if err != nil {
			t.Fatal(err)
		}
		s.Hours[key], s.Visitors[key] = h, v
	}
	var err error
	if s.Top, err = q.TopLinks(t.Context(), "", dashboard.Last24h(time.Now()), 10); err != nil {
		t.Fatal(err)
	}
	tot, err := q.Totals(t.Context(), from, to)
	if err != nil {
		t.Fatal(err)
	}
	s.Events = tot.Events
	return s
}

// --- tests -----------------------------------------------------------------

// TestEveryClickOnceThroughReplayAndRepublish: N clicks in, N distinct
// events in ClickHouse with the dashboard answering as Go computes it; then a
// replay of the whole group (Rewind) and a republish of every click under
// other message IDs load every event twice more, and no answer changes.
func TestEveryClickOnceThroughReplayAndRepublish(t *testing.T) {
	t.Parallel()
	n, js := startNATS(t)
	conn, db := servers.ClickHouse.NewDB(t)
	clicks := warehousetest.Clicks(2000, time.Now().Add(-3*time.Hour), 5*time.Second)
	publish(t, js, clicks, eventID)
	s := startService(t, testConfig(n.URL, servers.ClickHouse.Addr, db))

	waitLoaded(t, conn, len(clicks), len(clicks), time.Minute)
	want := takeSnapshot(t, conn, clicks)
	sent := map[string][]dashboard.HourClicks{}
	for _, h := range warehousetest.Hours(clicks) { // sorted by owner, code, hour
		key := h.Owner + "/" + h.Code
		sent[key] = append(sent[key], dashboard.HourClicks{Hour: h.Hour, Clicks: h.Clicks, BotClicks: h.BotClicks, Visitors: h.Visitors})
	}
	if diff := cmp.Diff(sent, want.Hours); diff != "" {
		t.Errorf("clicks per link and hour (-sent +warehouse):\n%s", diff)
	}
	if want.Events != uint64(len(clicks)) {
		t.Errorf("totals: %d events, want %d", want.Events, len(clicks))
	}

	if _, err := reader.Rewind(t.Context(), js, topology.GroupWarehouseLoader, reader.FromSeq(1)); err != nil {
		t.Fatal(err)
	}
	waitLoaded(t, conn, len(clicks), 2*len(clicks), time.Minute)
	if diff := cmp.Diff(want, takeSnapshot(t, conn, clicks)); diff != "" {
		t.Errorf("dashboard after a replay (-before +after):\n%s", diff)
	}

	publish(t, js, clicks, func(c events.Click) string { return "again-" + c.ID })
	waitLoaded(t, conn, len(clicks), 3*len(clicks), time.Minute)
	if diff := cmp.Diff(want, takeSnapshot(t, conn, clicks)); diff != "" {
		t.Errorf("dashboard after a republish (-before +after):\n%s", diff)
	}
	// The writer counts rows after ClickHouse has taken the insert, so the
	// metric may come a moment after the rows are visible.
	testenv.WaitFor(t, 30*time.Second, fmt.Sprintf("snip_warehouse_rows_inserted_total >= %d", 3*len(clicks)), func() bool {
		return metric(t, s.addr, "snip_warehouse_rows_inserted_total") >= float64(3*len(clicks))
	})

	// The distroless healthcheck: the binary probes its own /healthz.
	for _, tc := range []struct {
		addr string
		ok   bool
	}{{s.addr, true}, {"127.0.0.1:1", false}} {
		cmd := exec.Command(os.Args[0], "healthcheck")
		cmd.Env = append(os.Environ(), childEnv+"=1", "HTTP_ADDR="+tc.addr)
		if err := cmd.Run(); (err == nil) != tc.ok {
			t.Errorf("healthcheck against %s: %v, want ok=%v", tc.addr, err, tc.ok)
		}
	}
}

// publisher publishes clicks in a loop until stopped, and remembers them.
type publisher struct {
	mu     sync.Mutex
	clicks []events.Click
	stop   chan struct{}
	done   chan struct{}
}

func startPublisher(t *testing.T, js jetstream.JetStream) *publisher {
	t.Helper()
	p := &publisher{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for i := 0; ; i++ {
			select {
			case <-p.stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			batch := warehousetest.Clicks(20, time.Now().Add(-time.Minute), time.Millisecond)
			for _, c := range batch {
				b, _ := json.Marshal(c)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := js.Publish(ctx, events.ClickSubject(c.Owner, c.Code), b, jetstream.WithMsgID(c.ID))
				cancel()
				if err != nil {
					t.Errorf("publish: %v", err)
					return
				}
				p.mu.Lock()
				p.clicks = append(p.clicks, c)
				p.mu.Unlock()
			}
		}
	}()
	t.Cleanup(p.halt)
	return p
}

func (p *publisher) halt() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
}

func (p *publisher) sent() []events.Click {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]events.Click(nil), p.clicks...)
}

// TestClickHouseStoppedUnderTraffic: ClickHouse goes away while clicks keep
// coming. The loader stops (the group's lag grows, readiness fails), the
// stream holds the backlog, and when ClickHouse is back every click arrives
// and none is counted twice.
func TestClickHouseStoppedUnderTraffic(t *testing.T) {
	t.Parallel()
	n, js := startNATS(t)
	ch := testenv.StartClickHouse(t)
	cfg := testConfig(n.URL, ch.Addr, "snip")
	s := startService(t, cfg)
	conn := chConn(t, ch.Addr, "snip")
	pub := startPublisher(t, js)

	testenv.WaitFor(t, time.Minute, "clicks loaded", func() bool {
		d, _ := counts(t, conn)
		return d > 100
	})
	ch.Stop()
	testenv.WaitFor(t, time.Minute, "lag to build up while ClickHouse is down", func() bool {
		return lag(t, js) > 200
	})
	if code := readyz(t, s.addr); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz with ClickHouse down = %d, want 503", code)
	}
	testenv.WaitFor(t, time.Minute, "the runtime to report the oldest unprocessed event's age", func() bool {
		return metric(t, s.addr, "snip_reader_oldest_unprocessed_age_seconds") > 0
	})
	if err := ch.Start(); err != nil {
		t.Fatal(err)
	}
	pub.halt()
	sent := pub.sent()
	waitLoaded(t, conn, len(sent), len(sent), 2*time.Minute)
	testenv.WaitFor(t, time.Minute, "lag back to 0", func() bool { return lag(t, js) == 0 })
	tot, err := dashboard.New(conn).Totals(t.Context(), time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	if err != nil || tot.Events != uint64(len(sent)) {
		t.Errorf("totals = %+v, %v; want %d events", tot, err, len(sent))
	}
	if got := metric(t, s.addr, "snip_warehouse_insert_errors_total"); got == 0 {
		t.Error("no insert errors counted while ClickHouse was down")
	}
	testenv.WaitFor(t, 30*time.Second, "ready again", func() bool { return readyz(t, s.addr) == http.StatusOK })
}

// TestLoaderKilledMidInsert: a loader process is kill -9ed while its insert
// hangs on a frozen ClickHouse (so it holds events it has not acked, some
// maybe already written). A new member takes the partitions over, gets those
// events again, and the warehouse ends with every click exactly once in its
// answers.
func TestLoaderKilledMidInsert(t *testing.T) {
	t.Parallel()
	n, js := startNATS(t)
	ch := testenv.StartClickHouse(t)
	conn := chConn(t, ch.Addr, "snip")
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	childAddr := "127.0.0.1:" + strconv.Itoa(port)
	child := exec.Command(os.Args[0])
	child.Env = append(os.Environ(), childEnv+"=1",
		"NATS_URL="+n.URL, "CLICKHOUSE_ADDR="+ch.Addr, "CLICKHOUSE_DATABASE=snip", "CLICKHOUSE_DIAL_TIMEOUT=60s",
		"WAREHOUSE_LINGER=100ms", "WAREHOUSE_INSERT_TIMEOUT=60s", "WAREHOUSE_LEASE_TTL=1s",
		"WAREHOUSE_MEMBER=doomed", "HTTP_ADDR="+childAddr, "LOG_LEVEL=warn")
	child.Stdout, child.Stderr = testWriter{t}, testWriter{t}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })

	first := warehousetest.Clicks(1000, time.Now().Add(-time.Hour), time.Second)
	publish(t, js, first, eventID)
	waitLoaded(t, conn, len(first), len(first), time.Minute)

	ch.Pause()
	second := warehousetest.Clicks(1000, time.Now().Add(-time.Hour), time.Second)
	publish(t, js, second, eventID)
	testenv.WaitFor(t, time.Minute, "the child to hold rows in a hanging insert", func() bool {
		return metric(t, childAddr, "snip_warehouse_rows_waiting") > 0
	})
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	ch.Resume()

	startService(t, testConfig(n.URL, ch.Addr, "snip"))
	all := append(first, second...)
	waitLoaded(t, conn, len(all), len(all), 2*time.Minute)
	tot, err := dashboard.New(conn).Totals(t.Context(), time.Now().Add(-2*time.Hour), time.Now().Add(time.Hour))
	if err != nil || tot.Events != uint64(len(all)) {
		t.Errorf("totals = %+v, %v; want %d events", tot, err, len(all))
	}
}

// TestBackfillLoadsTheWindowThenLive seeds CLICKS with four days of clicks
// (by click time; JetStream stores them all now) and starts a loader for the
// first time with -since 72h: it loads exactly the clicks of the last 72
// hours, then every live click, even one whose click time is older.
func TestBackfillLoadsTheWindowThenLive(t *testing.T) {
	t.Parallel()
	n, js := startNATS(t)
	conn, db := servers.ClickHouse.NewDB(t)
	now := time.Now().UTC()
	var seed, want []events.Click
	for _, c := range warehousetest.Clicks(960, now.Add(-96*time.Hour), 6*time.Minute) {
		age := now.Sub(c.Time)
		if age > 71*time.Hour && age < 73*time.Hour {
			continue // keep clear of the cut: the test's now and the loader's differ
		}
		seed = append(seed, c)
		if age < 72*time.Hour {
			want = append(want, c)
		}
	}
	publish(t, js, seed, eventID)
	if len(want) == len(seed) || len(want) == 0 {
		t.Fatalf("seed of %d clicks has %d in the window; the test needs both kinds", len(seed), len(want))
	}

	cfg, err := loadConfig([]string{"NATS_URL=" + n.URL, "CLICKHOUSE_ADDR=" + servers.ClickHouse.Addr, "CLICKHOUSE_DATABASE=" + db,
		"WAREHOUSE_LINGER=100ms", "WAREHOUSE_LEASE_TTL=1s", "HTTP_ADDR=127.0.0.1:0"}, []string{"-since", "72h"})
	if err != nil {
		t.Fatal(err)
	}
	s := startService(t, cfg)
	testenv.WaitFor(t, time.Minute, "the backlog to be handled", func() bool {
		d, _ := counts(t, conn)
		return d >= uint64(len(want)) && lag(t, js) == 0
	})
	got := warehousetest.RowsPerEvent(t, conn)
	wantIDs := map[string]int{}
	for _, c := range want {
		wantIDs[c.ID] = 1
	}
	if diff := cmp.Diff(wantIDs, got); diff != "" {
		t.Errorf("events loaded from the backlog (-last 72h +loaded):\n%s", diff)
	}
	if got, want := metric(t, s.addr, "snip_warehouse_backfill_skipped_total"), float64(len(seed)-len(want)); got != want {
		t.Errorf("snip_warehouse_backfill_skipped_total = %v, want %v", got, want)
	}
	// The consumers started by stored time at the window (less the slack).
	c, err := js.Consumer(t.Context(), events.ClicksStream, topology.GroupConsumerName(topology.GroupWarehouseLoader, 0))
	if err != nil {
		t.Fatal(err)
	}
	if cc := c.CachedInfo().Config; cc.DeliverPolicy != jetstream.DeliverByStartTimePolicy || cc.OptStartTime == nil ||
		cc.OptStartTime.Before(now.Add(-72*time.Hour-backfillSlack-time.Minute)) || cc.OptStartTime.After(now.Add(-72*time.Hour-backfillSlack+time.Minute)) {
		t.Errorf("consumer starts %v at %v, want by start time at now-72h-%s", cc.DeliverPolicy, cc.OptStartTime, backfillSlack)
	}

	live := []events.Click{
		warehousetest.Click(1, "acme", "late", now.Add(-90*time.Hour)), // published late by an outbox
		warehousetest.Click(2, "acme", "fresh", now),
	}
	publish(t, js, live, eventID)
	waitLoaded(t, conn, len(want)+len(live), len(want)+len(live), time.Minute)
}

// TestHalfMadeBackfillKeepsItsCut: a first start with -since 72h that
// stops after creating only some partitions' consumers (here its NATS user
// may not create partitions 4 to 7's, so it waits there until stopped)
// leaves a group that exists. The next start, without the flag, creates the
// missing consumers with the first start's cut, recorded on the ones it
// made, and the loader skips the same backlog: exactly the clicks of the
// window are loaded, in every partition. Before the cut was recorded, the
// missing partitions started at the oldest event and nothing was skipped.
func TestHalfMadeBackfillKeepsItsCut(t *testing.T) {
	t.Parallel()
	const made = 4 // partitions whose consumer the first start may create
	var deny []string
	for p := made; p < warehousetest.Partitions; p++ {
		name := topology.GroupConsumerName(topology.GroupWarehouseLoader, p)
		deny = append(deny, "$JS.API.CONSUMER.CREATE.CLICKS."+name, "$JS.API.CONSUMER.CREATE.CLICKS."+name+".>",
			"$JS.API.CONSUMER.DURABLE.CREATE.CLICKS."+name)
	}
	opts := testenv.NATSOptions(server.RANDOM_PORT, filepath.Join(t.TempDir(), "jetstream"))
	opts.Users = []*server.User{
		{Username: "admin", Password: "admin"},
		{Username: "first", Password: "first", Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: deny},
		}},
	}
	srv, err := testenv.RunNATSServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	url := "nats://" + srv.Addr().String()
	nc, err := nats.Connect(url, nats.UserInfo("admin", "admin"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	o := topology.Defaults()
	o.Partitions = warehousetest.Partitions
	if err := topology.Apply(t.Context(), js, o); err != nil {
		t.Fatal(err)
	}
	conn, db := servers.ClickHouse.NewDB(t)

	now := time.Now().UTC()
	var seed, want []events.Click
	oldUnmade := 0 // clicks the cut must skip in the partitions made late
	for _, c := range warehousetest.Clicks(960, now.Add(-96*time.Hour), 6*time.Minute) {
		age := now.Sub(c.Time)
		if age > 71*time.Hour && age < 73*time.Hour {
			continue // keep clear of the cut: the test's now and the loader's differ
		}
		seed = append(seed, c)
		switch {
		case age < 72*time.Hour:
			want = append(want, c)
		case events.Partition(c.Code, warehousetest.Partitions) >= made:
			oldUnmade++
		}
	}
	publish(t, js, seed, eventID)
	if oldUnmade == 0 || len(want) == 0 {
		t.Fatalf("seed of %d clicks has %d in the window and %d older in partitions %d+; the test needs both", len(seed), len(want), oldUnmade, made)
	}
	env := func(user string) []string {
		return []string{"NATS_URL=" + url, "NATS_USER=" + user, "NATS_PASSWORD=" + user, "SNIP_APPLY_TOPOLOGY=false",
			"CLICKHOUSE_ADDR=" + servers.ClickHouse.Addr, "CLICKHOUSE_DATABASE=" + db,
			"WAREHOUSE_LINGER=100ms", "WAREHOUSE_LEASE_TTL=1s", "HTTP_ADDR=127.0.0.1:0"}
	}
	consumer := func(p int) *jetstream.ConsumerConfig {
		c, err := js.Consumer(t.Context(), events.ClicksStream, topology.GroupConsumerName(topology.GroupWarehouseLoader, p))
		if err != nil {
			return nil
		}
		return &c.CachedInfo().Config
	}

	cfg, err := loadConfig(env("first"), []string{"-since", "72h"})
	if err != nil {
		t.Fatal(err)
	}
	first := startService(t, cfg)
	testenv.WaitFor(t, time.Minute, "the first start to create partitions 0-3's consumers", func() bool {
		for p := range made {
			if consumer(p) == nil {
				return false
			}
		}
		return true
	})
	if err := first.stop(t); err != nil {
		t.Logf("first start stopped: %v", err)
	}
	if consumer(made) != nil {
		t.Fatalf("partition %d's consumer exists: the first start was meant to stop half-way", made)
	}

	cfg, err = loadConfig(env("admin"), nil)
	if err != nil {
		t.Fatal(err)
	}
	s := startService(t, cfg)
	testenv.WaitFor(t, time.Minute, "the backlog to be handled", func() bool {
		d, _ := counts(t, conn)
		return d >= uint64(len(want)) && consumer(warehousetest.Partitions-1) != nil && lag(t, js) == 0
	})
	got := warehousetest.RowsPerEvent(t, conn)
	wantIDs := map[string]int{}
	for _, c := range want {
		wantIDs[c.ID] = 1
	}
	if diff := cmp.Diff(wantIDs, got); diff != "" {
		t.Errorf("events loaded from the backlog (-last 72h +loaded):\n%s", diff)
	}
	if got, want := metric(t, s.addr, "snip_warehouse_backfill_skipped_total"), float64(len(seed)-len(want)); got != want {
		t.Errorf("snip_warehouse_backfill_skipped_total = %v, want %v", got, want)
	}
	// Every partition's consumer starts where the first start's did.
	startOf := func(p int) string {
		cc := consumer(p)
		switch {
		case cc == nil:
			return "no consumer"
		case cc.OptStartTime == nil:
			return cc.DeliverPolicy.String()
		}
		return cc.DeliverPolicy.String() + " " + cc.OptStartTime.UTC().Format(time.RFC3339Nano)
	}
	want0 := startOf(0)
	if !strings.HasPrefix(want0, jetstream.DeliverByStartTimePolicy.String()+" ") {
		t.Fatalf("partition 0's consumer starts at %q, want by start time", want0)
	}
	for p := 1; p < warehousetest.Partitions; p++ {
		if got := startOf(p); got != want0 {
			t.Errorf("partition %d's consumer starts at %q, want %q as partition 0's", p, got, want0)
		}
	}
}

// TestWaitsForClickHouseAndStopsWhenItFreezes: started with no ClickHouse,
// the loader is alive but not ready and holds nothing back from the stream;
// when ClickHouse comes it loads everything. Then ClickHouse freezes
// (SIGSTOP) in the middle of an insert, and shutdown still ends within its
// timeouts; the clicks it could not load are loaded by the next start.
func TestWaitsForClickHouseAndStopsWhenItFreezes(t *testing.T) {
	t.Parallel()
	n, js := startNATS(t)
	ch := testenv.StartClickHouse(t)
	ch.Stop()
	cfg := testConfig(n.URL, ch.Addr, "snip")
	s := startService(t, cfg)
	first := warehousetest.Clicks(300, time.Now().Add(-time.Hour), time.Second)
	publish(t, js, first, eventID)
	testenv.WaitFor(t, time.Minute, "the events to wait in the stream", func() bool { return lag(t, js) == uint64(len(first)) })
	if code := readyz(t, s.addr); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz without ClickHouse = %d, want 503", code)
	}
	if err := ch.Start(); err != nil {
		t.Fatal(err)
	}
	conn := chConn(t, ch.Addr, "snip")
	waitLoaded(t, conn, len(first), len(first), 2*time.Minute)
	testenv.WaitFor(t, 30*time.Second, "ready", func() bool { return readyz(t, s.addr) == http.StatusOK })

	ch.Pause()
	second := warehousetest.Clicks(100, time.Now().Add(-time.Hour), time.Second)
	publish(t, js, second, eventID)
	testenv.WaitFor(t, time.Minute, "rows held in a hanging insert", func() bool {
		return metric(t, s.addr, "snip_warehouse_rows_waiting") > 0
	})
	start := time.Now()
	if err := s.stop(t); err != nil {
		t.Errorf("run = %v, want nil after a shutdown", err)
	}
	// SHUTDOWN_TIMEOUT (10s) for the drain, then at most the insert's
	// deadline (5s) or the dial timeout (2s); a hang would be forever.
	took := time.Since(start)
	t.Logf("shutdown with a frozen ClickHouse took %s", took)
	if took > 45*time.Second {
		t.Errorf("shutdown with a frozen ClickHouse took %s", took)
	}
	ch.Resume()

	startService(t, testConfig(n.URL, ch.Addr, "snip"))
	all := append(first, second...)
	waitLoaded(t, conn, len(all), len(all), 2*time.Minute)
}

// TestSlowInsertsGetNoRedelivery: ClickHouse freezes, so every handler
// waits for an insert that hangs until WAREHOUSE_INSERT_TIMEOUT (5 s here),
// longer than the group's AckWait (2 s here; 60 s or more in the service,
// where a catch-up can queue a handler behind a full insert per partition).
// The runtime marks the batches in progress while the handlers wait, so
// JetStream redelivers nothing; once ClickHouse is back every click is
// loaded, each delivered once.
func TestSlowInsertsGetNoRedelivery(t *testing.T) {
	t.Parallel()
	n, js := startNATS(t)
	ch := testenv.StartClickHouse(t)
	cfg := testConfig(n.URL, ch.Addr, "snip")
	log := slog.New(slog.NewJSONHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	reg := prometheus.NewRegistry()
	w, err := chwriter.Open(cfg.clickhouse(), log, reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	testenv.WaitFor(t, time.Minute, "the schema applied", func() bool { return w.EnsureSchema(t.Context()) == nil })
	// A backlog of one batch per partition, so each partition's fetcher
	// keeps pulling while its handler waits: a redelivery would reach it.
	clicks := warehousetest.Clicks(400, time.Now().Add(-time.Hour), time.Second)
	publish(t, js, clicks, eventID)

	ch.Pause()
	lcfg := cfg.loader()
	lcfg.Logger, lcfg.Metrics = log, reg
	l, err := loader.New(w, lcfg)
	if err != nil {
		t.Fatal(err)
	}
	// The service's reader configuration, with a short AckWait.
	rcfg := cfg.reader(reader.StartAtOldest(), log, reg)
	rcfg.AckWait, rcfg.MaxRetryDelay = 2*time.Second, 500*time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- reader.Run(ctx, js, rcfg, l.Handle) }()
	t.Cleanup(func() {
		ch.Resume()
		cancel()
		<-done
		l.Close()
	})

	// The first insert fails at its deadline: its handlers waited 5 s,
	// past the AckWait twice over.
	testenv.WaitFor(t, time.Minute, "an insert to fail at its deadline", func() bool {
		return warehousetest.Metric(t, reg, "snip_warehouse_insert_errors_total", "class", chwriter.ClassTimeout) >= 1
	})
	for p := range warehousetest.Partitions {
		c, err := js.Consumer(t.Context(), events.ClicksStream, topology.GroupConsumerName(topology.GroupWarehouseLoader, p))
		if err != nil {
			t.Fatal(err)
		}
		info, err := c.Info(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if info.NumRedelivered != 0 {
			t.Errorf("partition %d: %d events redelivered while their handler waited for ClickHouse, want 0", p, info.NumRedelivered)
		}
	}
	ch.Resume()
	conn := chConn(t, ch.Addr, "snip")
	waitLoaded(t, conn, len(clicks), len(clicks), 2*time.Minute)
	testenv.WaitFor(t, time.Minute, "lag back to 0", func() bool { return lag(t, js) == 0 })
	if got := warehousetest.Metric(t, reg, "snip_reader_redeliveries_total"); got != 0 {
		t.Errorf("snip_reader_redeliveries_total = %v, want 0", got)
	}
}

// TestShutdownInsertsAndAcksWhatItHolds: rows waiting for a long linger when
// the service is told to stop are inserted at once and their events acked,
// and so are the batches the runtime prefetched behind them, so the next
// start has nothing to do again.
//
// The loader holds a partition's batch until its insert, and the runtime
// hands that partition's next batch over only then, so what the member
// holds is the rows waiting plus up to one prefetched batch per partition.
// How a partition's events split into batches is the fetches' business (on
// a busy machine a 100 ms pull can end with only part of what is stored),
// so the gauge alone cannot say that everything is in hand: the test makes
// the split itself, one click per partition held for the linger, then one
// more per partition fetched behind it, and waits until the server has
// delivered every event.
func TestShutdownInsertsAndAcksWhatItHolds(t *testing.T) {
	t.Parallel()
	n, js := startNATS(t)
	conn, db := servers.ClickHouse.NewDB(t)
	cfg := testConfig(n.URL, servers.ClickHouse.Addr, db)
	cfg.Linger = time.Minute
	s := startService(t, cfg)
	first, second := clicksPerPartition(0), clicksPerPartition(warehousetest.Partitions)
	publish(t, js, first, eventID)
	// One event per partition is one batch per partition: all in the loader.
	testenv.WaitFor(t, time.Minute, "the first clicks waiting for the linger", func() bool {
		return metric(t, s.addr, "snip_warehouse_rows_waiting") == float64(len(first))
	})
	publish(t, js, second, eventID)
	total := len(first) + len(second)
	testenv.WaitFor(t, time.Minute, "every event delivered to the member, none acked", func() bool {
		if f := metric(t, s.addr, "snip_warehouse_flushes_total"); f != 0 {
			t.Fatalf("%v inserts before the stop: the minute-long linger passed while the test waited", f)
		}
		pls, err := reader.Lag(t.Context(), js, topology.GroupWarehouseLoader)
		if err != nil {
			return false
		}
		held := 0
		for _, pl := range pls {
			if pl.Pending != 0 {
				return false
			}
			held += pl.AckPending
		}
		return held == total
	})
	// The second clicks wait behind the first, prefetched, not in the loader.
	if got := metric(t, s.addr, "snip_warehouse_rows_waiting"); got != float64(len(first)) {
		t.Fatalf("snip_warehouse_rows_waiting = %v with a batch prefetched behind each lingering one, want %d", got, len(first))
	}
	start := time.Now()
	if err := s.stop(t); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("shutdown took %s; the minute-long linger must not delay it", took)
	}
	if d, _ := counts(t, conn); d != uint64(total) {
		t.Errorf("%d distinct events in ClickHouse after shutdown, want %d", d, total)
	}
	if l := lag(t, js); l != 0 {
		t.Errorf("lag after a graceful shutdown = %d, want 0 (every inserted event acked)", l)
	}
}

// clicksPerPartition returns one click for each partition, on links of
// their own; i numbers them (Click's mix), from i0.
func clicksPerPartition(i0 int) []events.Click {
	out := make([]events.Click, warehousetest.Partitions)
	found := 0
	for k := 0; found < len(out); k++ {
		code := fmt.Sprintf("p-l%d", k)
		p := events.Partition(code, warehousetest.Partitions)
		if out[p].ID != "" {
			continue
		}
		out[p] = warehousetest.Click(i0+p, "acme", code, time.Now().Add(-time.Minute))
		found++
	}
	return out
}

// TestInvalidClicksAreParkedAndTheRestLoaded: the clicks every reader
// parks (the one rule of validity, events.ReadClick) are parked on
// DEAD_LETTER under the loader's group with their reason, none becomes a row,
// and their partitions go on: a click dated 40 days before it was stored, one
// dated 1999, one whose payload code differs from its subject's (and hashes
// to another partition), and one whose subject owner differs from its
// payload owner.
func TestInvalidClicksAreParkedAndTheRestLoaded(t *testing.T) {
	t.Parallel()
	n, js := startNATS(t)
	conn, db := servers.ClickHouse.NewDB(t)
	clicks := warehousetest.Clicks(20, time.Now().Add(-time.Hour), time.Second)
	bad := clicks[7]
	bad.Time = time.Now().Add(-40 * 24 * time.Hour).UTC()
	clicks[7] = bad
	old := clicks[9]
	old.Time = time.Date(1999, 6, 1, 0, 0, 0, 0, time.UTC)
	clicks[9] = old
	publish(t, js, clicks, eventID)
	// Published on another link's subject, and on another owner's.
	mismatch := warehousetest.Click(100, clicks[0].Owner, clicks[0].Code+"-x", time.Now())
	for events.Partition(mismatch.Code, warehousetest.Partitions) == events.Partition(clicks[0].Code, warehousetest.Partitions) {
		mismatch.Code += "x"
	}
	owner := warehousetest.Click(101, clicks[1].Owner, clicks[1].Code, time.Now())
	for subject, c := range map[string]events.Click{
		events.ClickSubject(clicks[0].Owner, clicks[0].Code): mismatch,
		events.ClickSubject("mallory", owner.Code):           owner,
	} {
		b, _ := json.Marshal(c)
		if _, err := js.Publish(t.Context(), subject, b, jetstream.WithMsgID(c.ID)); err != nil {
			t.Fatal(err)
		}
	}
	s := startService(t, testConfig(n.URL, servers.ClickHouse.Addr, db))

	waitLoaded(t, conn, len(clicks)-2, len(clicks)-2, time.Minute)
	rows := warehousetest.RowsPerEvent(t, conn)
	for _, c := range []events.Click{bad, old, mismatch, owner} {
		if got := rows[c.ID]; got != 0 {
			t.Errorf("invalid click %s has %d rows", c.ID, got)
		}
	}
	want := map[string]string{
		bad.ID:      events.DeadLetterSubject(topology.GroupWarehouseLoader, loader.ReasonImplausibleTime),
		old.ID:      events.DeadLetterSubject(topology.GroupWarehouseLoader, events.ReasonImplausibleTime),
		mismatch.ID: events.DeadLetterSubject(topology.GroupWarehouseLoader, events.ReasonSubjectMismatch),
		owner.ID:    events.DeadLetterSubject(topology.GroupWarehouseLoader, events.ReasonSubjectMismatch),
	}
	testenv.WaitFor(t, 30*time.Second, "the 4 invalid clicks parked", func() bool {
		dlq, err := js.Stream(t.Context(), events.DeadLetterStream)
		if err != nil {
			return false
		}
		info, err := dlq.Info(t.Context())
		if err != nil || info.State.Msgs < 4 {
			return false
		}
		got := map[string]string{}
		for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
			if m, err := dlq.GetMsg(t.Context(), seq); err == nil {
				var c events.Click
				if json.Unmarshal(m.Data, &c) == nil {
					got[c.ID] = m.Subject
				}
			}
		}
		return fmt.Sprint(got) == fmt.Sprint(want)
	})
	// The reader counts a parked event after DEAD_LETTER has acked its copy,
	// so the metric may come a moment after the dead letters.
	testenv.WaitFor(t, 30*time.Second, "snip_reader_parked_total = 4", func() bool {
		return metric(t, s.addr, "snip_reader_parked_total") == 4
	})
}

func TestStartFor(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)
	made := now.Add(-time.Hour) // when a first start recorded its cut
	cut := &loader.Backfill{Since: made.Add(-72 * time.Hour), BacklogUntilSeq: 1000}
	tests := []struct {
		name      string
		g         group
		since     time.Duration
		wantStart reader.Start
		wantBF    *loader.Backfill
	}{
		{"existing_group_resumes", group{partitions: 8, consumers: 8, lastSeq: 4242}, 72 * time.Hour, reader.StartAtOldest(), nil},
		{"new_group_loads_everything", group{partitions: 8, lastSeq: 4242}, 0, reader.StartAtOldest(), nil},
		{"new_group_since_72h", group{partitions: 8, lastSeq: 4242}, 72 * time.Hour,
			reader.StartAtTime(now.Add(-72*time.Hour - backfillSlack)),
			&loader.Backfill{Since: now.Add(-72 * time.Hour), BacklogUntilSeq: 4242}},
		{"half_made_group_keeps_its_cut", group{partitions: 8, consumers: 3, cut: cut, lastSeq: 4242}, 72 * time.Hour,
			reader.StartAtTime(cut.Since.Add(-backfillSlack)), cut},
		{"half_made_group_keeps_its_cut_without_the_flag", group{partitions: 8, consumers: 3, cut: cut, lastSeq: 4242}, 0,
			reader.StartAtTime(cut.Since.Add(-backfillSlack)), cut},
		{"existing_group_keeps_its_cut", group{partitions: 8, consumers: 8, cut: cut, lastSeq: 4242}, 24 * time.Hour,
			reader.StartAtTime(cut.Since.Add(-backfillSlack)), cut},
		{"half_made_group_without_a_cut_gets_none", group{partitions: 8, consumers: 3, lastSeq: 4242}, 72 * time.Hour,
			reader.StartAtOldest(), nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			start, bf := startFor(tc.g, tc.since, now)
			if diff := cmp.Diff(tc.wantStart, start, cmp.AllowUnexported(reader.Start{})); diff != "" {
				t.Errorf("start (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantBF, bf); diff != "" {
				t.Errorf("backfill (-want +got):\n%s", diff)
			}
		})
	}
}

// The cut recorded on a consumer reads back as it was, to the nanosecond; a
// consumer made without one has none; a record someone edited into nonsense
// is an error, not a silent "no cut".
func TestCutMetadataReadsBack(t *testing.T) {
	t.Parallel()
	bf := &loader.Backfill{Since: time.Date(2026, 3, 7, 11, 59, 58, 123456789, time.UTC), BacklogUntilSeq: 4242}
	tests := []struct {
		name    string
		md      map[string]string
		want    *loader.Backfill
		wantErr bool
	}{
		{"recorded_cut_reads_back", cutMetadata(bf), bf, false},
		{"no_cut_recorded", map[string]string{"snip.group": topology.GroupWarehouseLoader}, nil, false},
		{"no_metadata", nil, nil, false},
		{"bad_time_is_an_error", map[string]string{cutSinceKey: "yesterday", cutBacklogKey: "1"}, nil, true},
		{"bad_sequence_is_an_error", map[string]string{cutSinceKey: "2026-03-07T00:00:00Z", cutBacklogKey: "-1"}, nil, true},
		{"half_a_record_is_an_error", map[string]string{cutSinceKey: "2026-03-07T00:00:00Z"}, nil, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := cutOf(tc.md)
			if (err != nil) != tc.wantErr {
				t.Fatalf("cutOf(%v) error = %v, want error %v", tc.md, err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("cut (-want +got):\n%s", diff)
			}
		})
	}
	if cutMetadata(nil) != nil {
		t.Errorf("cutMetadata(nil) = %v, want nil", cutMetadata(nil))
	}
}

func TestLoadConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		environ []string
		args    []string
		check   func(Config) error
		wantErr bool
	}{
		{"defaults", nil, nil, func(c Config) error {
			if c.BatchRows != 10000 || c.Linger != time.Second || c.Since != 0 || c.ClickHouseDatabase != "snip" ||
				len(c.ClickHouseAddrs) != 1 || c.ClickHouseAddrs[0] != "127.0.0.1:9000" || c.HTTPAddr != ":8083" ||
				c.MaxDaysPerInsert != chwriter.DefaultMaxDaysPerInsert {
				return fmt.Errorf("defaults: %+v", c)
			}
			return nil
		}, false},
		{"since_from_env", []string{"WAREHOUSE_SINCE=72h"}, nil, func(c Config) error {
			if c.Since != 72*time.Hour {
				return fmt.Errorf("since %s", c.Since)
			}
			return nil
		}, false},
		{"flag_overrides_env", []string{"WAREHOUSE_SINCE=1h"}, []string{"-since", "72h"}, func(c Config) error {
			if c.Since != 72*time.Hour {
				return fmt.Errorf("since %s", c.Since)
			}
			return nil
		}, false},
		{"topology_not_applied", []string{"SNIP_APPLY_TOPOLOGY=false"}, nil, func(c Config) error {
			if c.ApplyTopology {
				return errors.New("ApplyTopology still true")
			}
			return nil
		}, false},
		{"several_clickhouse_addrs", []string{"CLICKHOUSE_ADDR=a:9000,b:9000"}, nil, func(c Config) error {
			if got := c.clickhouse().Addrs; !cmp.Equal(got, []string{"a:9000", "b:9000"}) {
				return fmt.Errorf("addrs %v", got)
			}
			return nil
		}, false},
		{"days_per_insert", []string{"WAREHOUSE_MAX_DAYS_PER_INSERT=30"}, nil, func(c Config) error {
			if got := c.clickhouse().MaxDaysPerInsert; got != 30 {
				return fmt.Errorf("days per insert %d", got)
			}
			return nil
		}, false},
		{"zero_days_per_insert", []string{"WAREHOUSE_MAX_DAYS_PER_INSERT=0"}, nil, nil, true},
		{"since_longer_than_retention", []string{"WAREHOUSE_SINCE=200h"}, nil, nil, true},
		{"negative_since", nil, []string{"-since", "-1h"}, nil, true},
		{"bad_duration", []string{"WAREHOUSE_LINGER=soon"}, nil, nil, true},
		{"bad_log_level", []string{"LOG_LEVEL=loud"}, nil, nil, true},
		{"unknown_flag", nil, []string{"-until", "1h"}, nil, true},
		{"database_not_an_identifier", []string{"CLICKHOUSE_DATABASE=snip-dev"}, nil, nil, true},
		{"zero_batch_rows", []string{"WAREHOUSE_BATCH_ROWS=0"}, nil, nil, true},
		{"zero_linger", []string{"WAREHOUSE_LINGER=0s"}, nil, nil, true},
		{"zero_insert_timeout", []string{"WAREHOUSE_INSERT_TIMEOUT=0s"}, nil, nil, true},
		{"stray_argument", nil, []string{"now"}, nil, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg, err := loadConfig(tc.environ, tc.args)
			if (err != nil) != tc.wantErr {
				t.Fatalf("loadConfig = %v, want error %v", err, tc.wantErr)
			}
			if tc.check != nil {
				if err := tc.check(cfg); err != nil {
					t.Error(err)
				}
			}
		})
	}
}
