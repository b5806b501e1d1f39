package loader_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/warehouse/internal/chwriter"
	"github.com/snipdev/snip/services/warehouse/internal/loader"
	"github.com/snipdev/snip/services/warehouse/internal/warehousetest"
)

var servers *testenv.Servers

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &servers, testenv.WithClickHouse())) }

// env is a loader writing into a database of the test's own.
type env struct {
	l    *loader.Loader
	w    *chwriter.Writer
	conn driver.Conn // the test's view of the database
	reg  *prometheus.Registry
}

func newEnv(tb testing.TB, addr string, cfg loader.Config) *env {
	tb.Helper()
	conn, db := servers.ClickHouse.NewDB(tb)
	return newEnvOn(tb, addr, db, conn, cfg)
}

func newEnvOn(tb testing.TB, addr, db string, conn driver.Conn, cfg loader.Config) *env {
	tb.Helper()
	reg := prometheus.NewRegistry()
	w, err := chwriter.Open(chwriter.Config{Addrs: []string{addr}, Database: db, DialTimeout: 2 * time.Second},
		slog.New(slog.DiscardHandler), reg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = w.Close() })
	cfg.Metrics = reg
	l, err := loader.New(w, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(l.Close)
	return &env{l: l, w: w, conn: conn, reg: reg}
}

func ids(evs []reader.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.Click.ID
	}
	return out
}

// handleAll hands every partition's batch to the loader at once, as the
// runtime does for the partitions a member owns, and returns each call's
// result by partition.
func handleAll(ctx context.Context, l *loader.Loader, byPart map[int][]reader.Event) map[int]error {
	var mu sync.Mutex
	var wg sync.WaitGroup
	out := map[int]error{}
	for p, batch := range byPart {
		wg.Go(func() {
			err := l.Handle(ctx, p, batch)
			mu.Lock()
			out[p] = err
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

// mustHandleAll is handleAll for batches that must all succeed.
func mustHandleAll(t *testing.T, l *loader.Loader, byPart map[int][]reader.Event) {
	t.Helper()
	for p, err := range handleAll(t.Context(), l, byPart) {
		if err != nil {
			t.Errorf("partition %d: %v", p, err)
		}
	}
}

func TestPartitionBatchesShareOneInsert(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	evs := warehousetest.Events(warehousetest.Clicks(400, now.Add(-2*time.Hour), time.Second), now)
	byPart := warehousetest.ByPartition(evs)
	if len(byPart) < 4 {
		t.Fatalf("test data covers %d partitions; want several", len(byPart))
	}
	// The insert starts when the last batch arrives (MaxRows = all rows),
	// long before the linger would start it.
	e := newEnv(t, servers.ClickHouse.Addr, loader.Config{MaxRows: len(evs), Linger: time.Minute})
	mustHandleAll(t, e.l, byPart)
	if got := warehousetest.Metric(t, e.reg, "snip_warehouse_insert_rows"); got != 1 {
		t.Errorf("%d partition batches took %v inserts, want 1", len(byPart), got)
	}
	got := warehousetest.RowsPerEvent(t, e.conn)
	want := map[string]int{}
	for _, id := range ids(evs) {
		want[id] = 1
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rows per event (-want +got):\n%s", diff)
	}
}

func TestFullGroupTakesNoMoreRows(t *testing.T) {
	t.Parallel()
	e := newEnv(t, servers.ClickHouse.Addr, loader.Config{MaxRows: 100, Linger: time.Minute})
	now := time.Now().UTC()
	byPart := map[int][]reader.Event{}
	for p := range 8 {
		byPart[p] = warehousetest.Events(warehousetest.Clicks(60, now, time.Second), now)
	}
	mustHandleAll(t, e.l, byPart)
	// Each group closes at its second batch (120 rows): four inserts, none
	// of them holding everything.
	if got := warehousetest.Metric(t, e.reg, "snip_warehouse_flushes_total", "trigger", "size"); got != 4 {
		t.Errorf("size flushes = %v, want 4", got)
	}
	if got := len(warehousetest.RowsPerEvent(t, e.conn)); got != 480 {
		t.Errorf("distinct events = %d, want 480", got)
	}
}

func TestHandleReturnsOnlyWhenRowsAreInClickHouse(t *testing.T) {
	t.Parallel()
	e := newEnv(t, servers.ClickHouse.Addr, loader.Config{Linger: 50 * time.Millisecond})
	now := time.Now().UTC()
	for round := range 5 {
		evs := warehousetest.Events(warehousetest.Clicks(20, now, time.Second), now)
		if err := e.l.Handle(t.Context(), evs[0].Partition, evs); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		// No polling: the ack follows this return, so the rows must already
		// be readable.
		got := warehousetest.RowsPerEvent(t, e.conn)
		for _, id := range ids(evs) {
			if got[id] != 1 {
				t.Fatalf("round %d: event %s has %d rows right after Handle returned, want 1", round, id, got[id])
			}
		}
	}
	if got := warehousetest.Metric(t, e.reg, "snip_warehouse_insert_rows"); got != 5 {
		t.Errorf("inserts = %v, want 5 (one per round)", got)
	}
}

func TestDrainInsertsWithoutLingering(t *testing.T) {
	t.Parallel()
	e := newEnv(t, servers.ClickHouse.Addr, loader.Config{Linger: time.Minute})
	now := time.Now().UTC()
	evs := warehousetest.Events(warehousetest.Clicks(10, now, time.Second), now)
	done := make(chan error, 1)
	go func() { done <- e.l.Handle(t.Context(), 0, evs) }()
	testenv.WaitFor(t, 10*time.Second, "rows waiting", func() bool {
		return warehousetest.Metric(t, e.reg, "snip_warehouse_rows_waiting") == 10
	})
	e.l.Drain()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Handle still waiting 30s after Drain; the linger is a minute")
	}
	if got := warehousetest.Metric(t, e.reg, "snip_warehouse_flushes_total", "trigger", "drain"); got != 1 {
		t.Errorf("drain flushes = %v, want 1", got)
	}
}

func TestBacklogDoesNotLinger(t *testing.T) {
	t.Parallel()
	e := newEnv(t, servers.ClickHouse.Addr, loader.Config{Linger: time.Minute})
	now := time.Now().UTC()
	// Stored an hour ago: a catch-up. With live events this would wait a
	// minute for more rows.
	evs := warehousetest.Events(warehousetest.Clicks(50, now.Add(-2*time.Hour), time.Second), now.Add(-time.Hour))
	done := make(chan map[int]error, 1)
	go func() { done <- handleAll(t.Context(), e.l, warehousetest.ByPartition(evs)) }()
	select {
	case results := <-done:
		for p, err := range results {
			if err != nil {
				t.Errorf("partition %d: %v", p, err)
			}
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a backlog batch waited for the minute-long linger")
	}
	if got := warehousetest.Metric(t, e.reg, "snip_warehouse_flushes_total", "trigger", "linger"); got != 0 {
		t.Errorf("linger flushes = %v, want 0", got)
	}
	if got := len(warehousetest.RowsPerEvent(t, e.conn)); got != 50 {
		t.Errorf("distinct events = %d, want 50", got)
	}
}

func TestRedeliveriesChangeNoCount(t *testing.T) {
	t.Parallel()
	e := newEnv(t, servers.ClickHouse.Addr, loader.Config{Linger: 20 * time.Millisecond})
	now := time.Now().UTC()
	evs := warehousetest.Events(warehousetest.Clicks(300, now.Add(-3*time.Hour), 30*time.Second), now)
	load := func(evs []reader.Event) { mustHandleAll(t, e.l, warehousetest.ByPartition(evs)) }
	distinct := func() (events, rows uint64) {
		t.Helper()
		if err := e.conn.QueryRow(t.Context(), "SELECT uniqExact(event_id), count() FROM clicks").Scan(&events, &rows); err != nil {
			t.Fatal(err)
		}
		return events, rows
	}
	load(evs)
	// A redelivery (the same events, same stored time) and a republish
	// (other sequences, a later stored time).
	load(evs)
	again := warehousetest.Events(warehousetest.ClicksOf(evs), now.Add(time.Minute))
	for i := range again {
		again[i].Seq += 1000
	}
	load(again)
	events, rows := distinct()
	if events != 300 {
		t.Errorf("distinct events = %d, want 300", events)
	}
	if rows < 300 {
		t.Errorf("rows = %d, want at least 300", rows)
	}
}

func TestBadRowIsParkedAndTheRestInserted(t *testing.T) {
	t.Parallel()
	e := newEnv(t, servers.ClickHouse.Addr, loader.Config{Linger: 20 * time.Millisecond})
	now := time.Now().UTC()
	evs := warehousetest.Events(warehousetest.Clicks(200, now, time.Second), now)
	byPart := warehousetest.ByPartition(evs)
	bad := -1
	for p, b := range byPart {
		if len(b) >= 6 {
			bad = p
			break
		}
	}
	if bad < 0 {
		t.Fatal("no partition with 6 events")
	}
	byPart[bad][3].Click.Country = "DEU" // FixedString(2): the client refuses it
	results := handleAll(t.Context(), e.l, byPart)

	var pe *reader.PoisonError
	if err := results[bad]; !errors.As(err, &pe) || pe.Index != 3 || pe.Reason != loader.ReasonBadRow {
		t.Fatalf("partition %d with a bad row at 3: %v, want Poison(3, %q)", bad, err, loader.ReasonBadRow)
	}
	got := warehousetest.RowsPerEvent(t, e.conn)
	for p, b := range byPart {
		if p != bad && results[p] != nil {
			t.Errorf("partition %d: %v", p, results[p])
		}
		for i, ev := range b {
			want := 1
			if p == bad && i >= 3 { // parked, or handed out again by the runtime
				want = 0
			}
			if got[ev.Click.ID] != want {
				t.Errorf("partition %d event %d: %d rows, want %d", p, i, got[ev.Click.ID], want)
			}
		}
	}
	if got := warehousetest.Metric(t, e.reg, "snip_warehouse_rows_parked_total", "reason", loader.ReasonBadRow); got != 1 {
		t.Errorf("parked = %v, want 1", got)
	}
}

func TestImplausibleTimeIsParked(t *testing.T) {
	t.Parallel()
	e := newEnv(t, servers.ClickHouse.Addr, loader.Config{Linger: 20 * time.Millisecond})
	now := time.Now().UTC()
	evs := warehousetest.Events(warehousetest.Clicks(5, now, time.Second), now)
	evs[2].Click.Time = now.Add(-loader.MaxClockSkew - time.Hour)
	var pe *reader.PoisonError
	if err := e.l.Handle(t.Context(), 0, evs); !errors.As(err, &pe) || pe.Index != 2 || pe.Reason != loader.ReasonImplausibleTime {
		t.Fatalf("Handle = %v, want Poison(2, %q)", err, loader.ReasonImplausibleTime)
	}
	got := warehousetest.RowsPerEvent(t, e.conn)
	want := map[string]int{evs[0].Click.ID: 1, evs[1].Click.ID: 1}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rows per event (-want +got):\n%s", diff)
	}
}

func TestUnavailableClickHouseFailsTheBatchForRetry(t *testing.T) {
	t.Parallel()
	conn, db := servers.ClickHouse.NewDB(t)
	// Port 1: nothing listens there, and no test's server can take it.
	down := newEnvOn(t, "127.0.0.1:1", db, conn, loader.Config{Linger: 10 * time.Millisecond})
	now := time.Now().UTC()
	evs := warehousetest.Events(warehousetest.Clicks(10, now, time.Second), now)

	err := down.l.Handle(t.Context(), 0, evs)
	var pe *reader.PoisonError
	if err == nil || errors.As(err, &pe) || errors.Is(err, loader.ErrPermanent) {
		t.Fatalf("Handle with ClickHouse down = %v, want a transient error (the runtime retries the batch)", err)
	}
	if got := warehousetest.Metric(t, down.reg, "snip_warehouse_insert_errors_total", "class", chwriter.ClassUnavailable); got != 1 {
		t.Errorf("unavailable errors = %v, want 1", got)
	}
	// The runtime hands the same batch again; this time ClickHouse is there.
	up := newEnvOn(t, servers.ClickHouse.Addr, db, conn, loader.Config{Linger: 10 * time.Millisecond})
	if err := up.l.Handle(t.Context(), 0, evs); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if got := len(warehousetest.RowsPerEvent(t, conn)); got != 10 {
		t.Errorf("distinct events = %d, want 10", got)
	}
}

// TestCloseStartsNoInsert: ClickHouse freezes during a catch-up, so an
// insert hangs with full groups queued behind it; the runtime gives up on
// the handlers (its drain timeout passed) and the loader is closed. Close
// cancels the insert in flight and starts no other: the queued groups are
// not tried with a cancelled context, which would count inserts started and
// insert errors that never reached ClickHouse, and log an outage that is a
// shutdown.
func TestCloseStartsNoInsert(t *testing.T) {
	t.Parallel()
	ch := testenv.StartClickHouse(t)
	e := newEnvOn(t, ch.Addr, "snip", nil, loader.Config{MaxRows: 1, Linger: time.Minute, InsertTimeout: time.Minute})
	now := time.Now().UTC()
	evs := warehousetest.Events(warehousetest.Clicks(4, now, time.Second), now)
	if err := e.l.Handle(t.Context(), 0, evs[:1]); err != nil {
		t.Fatal(err)
	}
	ch.Pause()
	t.Cleanup(ch.Resume)

	// MaxRows 1: each batch is a full group of its own, the first inserted
	// (hanging), the others queued behind it.
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for i := 1; i < len(evs); i++ {
		wg.Go(func() {
			if err := e.l.Handle(ctx, i, evs[i:i+1]); err == nil {
				t.Errorf("batch %d loaded into a frozen ClickHouse", i)
			}
		})
	}
	testenv.WaitFor(t, time.Minute, "one insert hanging, two groups queued behind it", func() bool {
		return warehousetest.Metric(t, e.reg, "snip_warehouse_flushes_total") == 2 &&
			warehousetest.Metric(t, e.reg, "snip_warehouse_rows_waiting") == 3
	})
	cancel() // the runtime's drain timeout: the handlers give up
	wg.Wait()
	e.l.Close()

	if got := warehousetest.Metric(t, e.reg, "snip_warehouse_flushes_total"); got != 2 {
		t.Errorf("inserts started = %v, want 2 (the first batch's and the one Close cancelled; none after Close)", got)
	}
	if got := warehousetest.Metric(t, e.reg, "snip_warehouse_insert_errors_total"); got > 1 {
		t.Errorf("insert errors = %v, want at most 1 (the insert Close cancelled)", got)
	}
	if got := warehousetest.Metric(t, e.reg, "snip_warehouse_rows_waiting"); got != 0 {
		t.Errorf("rows waiting after Close = %v, want 0", got)
	}
}

// TestGroupsQueuedBehindAFailedInsertFailWithIt: ClickHouse freezes during
// a catch-up, with a full group per partition queued behind the insert in
// flight. When that insert times out, the groups behind it fail with it at
// once instead of each waiting out an insert timeout of its own against the
// frozen server: the handlers all return within about one insert timeout
// (a rebalance or a shutdown waits no longer), only one insert is tried,
// nothing is acked, and the batches handed again load once ClickHouse is back.
func TestGroupsQueuedBehindAFailedInsertFailWithIt(t *testing.T) {
	t.Parallel()
	const insertTimeout = 2 * time.Second
	ch := testenv.StartClickHouse(t)
	e := newEnvOn(t, ch.Addr, "snip", nil, loader.Config{MaxRows: 1, Linger: time.Minute, InsertTimeout: insertTimeout})
	now := time.Now().UTC()
	evs := warehousetest.Events(warehousetest.Clicks(5, now, time.Second), now)
	if err := e.l.Handle(t.Context(), 0, evs[:1]); err != nil {
		t.Fatal(err)
	}
	ch.Pause()
	t.Cleanup(ch.Resume)

	// MaxRows 1: each partition's batch is a full group of its own, the
	// first inserted (hanging), the others queued behind it.
	errs := make([]error, len(evs))
	var wg sync.WaitGroup
	for i := 1; i < len(evs); i++ {
		wg.Go(func() { errs[i] = e.l.Handle(t.Context(), i, evs[i:i+1]) })
	}
	testenv.WaitFor(t, time.Minute, "one insert hanging, three groups queued behind it", func() bool {
		return warehousetest.Metric(t, e.reg, "snip_warehouse_flushes_total") == 2 &&
			warehousetest.Metric(t, e.reg, "snip_warehouse_rows_waiting") == 4
	})
	queued := time.Now()
	wg.Wait()
	waited := time.Since(queued)

	for i := 1; i < len(evs); i++ {
		var pe *reader.PoisonError
		if errs[i] == nil || errors.As(errs[i], &pe) || errors.Is(errs[i], loader.ErrPermanent) {
			t.Errorf("partition %d with ClickHouse frozen: %v, want a transient error (the runtime retries the batch)", i, errs[i])
		}
	}
	if waited >= 2*insertTimeout {
		t.Errorf("the handlers returned %s after the groups were queued, want under %s: the queued groups each waited out an insert timeout",
			waited.Round(time.Millisecond), 2*insertTimeout)
	}
	if got := warehousetest.Metric(t, e.reg, "snip_warehouse_flushes_total"); got != 2 {
		t.Errorf("inserts started = %v, want 2 (the first batch's and the one that timed out; none for the groups behind it)", got)
	}
	if got := warehousetest.Metric(t, e.reg, "snip_warehouse_insert_errors_total", "class", chwriter.ClassTimeout); got != 1 {
		t.Errorf("timeout errors = %v, want 1", got)
	}
	if got := warehousetest.Metric(t, e.reg, "snip_warehouse_rows_waiting"); got != 0 {
		t.Errorf("rows waiting after every handler returned = %v, want 0", got)
	}

	// The runtime hands every batch again; ClickHouse is back.
	ch.Resume()
	byPart := map[int][]reader.Event{}
	for i := 1; i < len(evs); i++ {
		byPart[i] = evs[i : i+1]
	}
	testenv.WaitFor(t, time.Minute, "the batches to load once ClickHouse is back", func() bool {
		for p, err := range handleAll(t.Context(), e.l, byPart) {
			if err != nil {
				t.Logf("partition %d: %v", p, err)
				return false
			}
			delete(byPart, p)
		}
		return true
	})
	if got := len(warehousetest.RowsPerEvent(t, e.w.Conn())); got != len(evs) {
		t.Errorf("distinct events = %d, want %d", got, len(evs))
	}
}

// TestOperatorsFaultIsLoggedAtOnce: ClickHouse freezes (an insert times
// out: a warning, and the next ones of the outage are not logged for 30 s),
// then comes back with a table that no longer fits the rows. The error that
// asks an operator to act is logged at the first insert it refuses, not
// only once the outage's 30 s have passed.
func TestOperatorsFaultIsLoggedAtOnce(t *testing.T) {
	t.Parallel()
	ch := testenv.StartClickHouse(t)
	logs := &recordedLogs{}
	e := newEnvOn(t, ch.Addr, "snip", nil, loader.Config{Linger: 10 * time.Millisecond, InsertTimeout: time.Second,
		PermanentRetryDelay: time.Second, Logger: slog.New(logs)})
	now := time.Now().UTC()
	batch := func() []reader.Event { return warehousetest.Events(warehousetest.Clicks(5, now, time.Second), now) }
	if err := e.l.Handle(t.Context(), 0, batch()); err != nil {
		t.Fatal(err)
	}
	ch.Pause()
	err := e.l.Handle(t.Context(), 0, batch())
	ch.Resume()
	if err == nil || errors.Is(err, loader.ErrPermanent) {
		t.Fatalf("Handle with ClickHouse frozen = %v, want a transient error", err)
	}
	if got := logs.count(slog.LevelWarn); got != 1 {
		t.Fatalf("%d warnings for the frozen ClickHouse, want 1", got)
	}
	if err := e.w.Conn().Exec(t.Context(), "ALTER TABLE clicks DROP COLUMN referrer"); err != nil {
		t.Fatal(err)
	}
	if err := e.l.Handle(t.Context(), 0, batch()); !errors.Is(err, loader.ErrPermanent) {
		t.Fatalf("Handle after a column was dropped = %v, want ErrPermanent", err)
	}
	if got := logs.count(slog.LevelError); got != 1 {
		t.Errorf("%d errors logged for the insert the table refused, want 1 at once", got)
	}
}

// recordedLogs is a slog.Handler that keeps the level of every record.
type recordedLogs struct {
	mu     sync.Mutex
	levels []slog.Level
}

func (h *recordedLogs) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordedLogs) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *recordedLogs) WithGroup(string) slog.Handler            { return h }
func (h *recordedLogs) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.levels = append(h.levels, r.Level)
	return nil
}

func (h *recordedLogs) count(level slog.Level) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, l := range h.levels {
		if l == level {
			n++
		}
	}
	return n
}

func TestPermanentErrorIsRetriedSlowly(t *testing.T) {
	t.Parallel()
	e := newEnv(t, servers.ClickHouse.Addr, loader.Config{Linger: 10 * time.Millisecond, PermanentRetryDelay: time.Second})
	now := time.Now().UTC()
	batch := func() []reader.Event {
		return warehousetest.Events(warehousetest.Clicks(5, now, time.Second), now)
	}
	if err := e.l.Handle(t.Context(), 0, batch()); err != nil {
		t.Fatal(err)
	}
	if err := e.conn.Exec(t.Context(), "ALTER TABLE clicks DROP COLUMN referrer"); err != nil {
		t.Fatal(err)
	}
	evs := batch()
	if err := e.l.Handle(t.Context(), 0, evs); !errors.Is(err, loader.ErrPermanent) {
		t.Fatalf("Handle after a column was dropped = %v, want ErrPermanent", err)
	}
	// Within the retry delay nothing is tried: the error comes at once and
	// ClickHouse sees no second failing insert.
	if err := e.l.Handle(t.Context(), 0, evs); !errors.Is(err, loader.ErrPermanent) {
		t.Fatalf("second Handle = %v, want ErrPermanent", err)
	}
	if got := warehousetest.Metric(t, e.reg, "snip_warehouse_insert_errors_total", "class", chwriter.ClassSchema); got != 1 {
		t.Errorf("schema errors = %v, want 1 (one attempt per retry delay)", got)
	}
	if got := warehousetest.Metric(t, e.reg, "snip_warehouse_flushes_total"); got != 2 {
		t.Errorf("flushes = %v, want 2 (the first batch's insert and the failing one; none while waiting out the delay)", got)
	}
	if err := e.conn.Exec(t.Context(), "ALTER TABLE clicks ADD COLUMN referrer String AFTER user_agent"); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the batch to load once the column is back", func() bool {
		return e.l.Handle(t.Context(), 0, evs) == nil
	})
	if got := warehousetest.RowsPerEvent(t, e.conn); got[evs[4].Click.ID] != 1 {
		t.Errorf("event %s: %d rows, want 1", evs[4].Click.ID, got[evs[4].Click.ID])
	}
}

// TestChangedColumnTypeParksNothing: an operator changed a column's type
// (ALTER TABLE clicks MODIFY COLUMN request_id UUID) so the client refuses
// every row. No partition's batch is poisoned (the runtime would park each
// event in turn, draining the stream into the dead letters): every handler
// gets ErrPermanent, the schema error is counted, and once the type is
// changed back the same batches load.
func TestChangedColumnTypeParksNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, servers.ClickHouse.Addr, loader.Config{Linger: 10 * time.Millisecond, PermanentRetryDelay: time.Second})
	if err := e.w.EnsureSchema(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := e.conn.Exec(t.Context(), "ALTER TABLE clicks MODIFY COLUMN request_id UUID"); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	evs := warehousetest.Events(warehousetest.Clicks(40, now, time.Second), now)
	byPart := warehousetest.ByPartition(evs)
	for p, err := range handleAll(t.Context(), e.l, byPart) {
		var pe *reader.PoisonError
		if errors.As(err, &pe) || !errors.Is(err, loader.ErrPermanent) {
			t.Errorf("partition %d with request_id a UUID column: %v, want ErrPermanent and no event poisoned", p, err)
		}
	}
	if got := warehousetest.Metric(t, e.reg, "snip_warehouse_rows_parked_total"); got != 0 {
		t.Errorf("parked = %v, want 0", got)
	}
	if got := warehousetest.Metric(t, e.reg, "snip_warehouse_insert_errors_total", "class", chwriter.ClassSchema); got < 1 {
		t.Errorf("schema errors = %v, want at least 1", got)
	}
	if got := warehousetest.Metric(t, e.reg, "snip_warehouse_insert_errors_total", "class", chwriter.ClassBadRow); got != 0 {
		t.Errorf("bad_row errors = %v, want 0", got)
	}
	if err := e.conn.Exec(t.Context(), "ALTER TABLE clicks MODIFY COLUMN request_id String"); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the batches to load once the type is changed back", func() bool {
		for p, err := range handleAll(t.Context(), e.l, byPart) {
			if err != nil {
				return false
			}
			delete(byPart, p)
		}
		return true
	})
	if got := len(warehousetest.RowsPerEvent(t, e.conn)); got != len(evs) {
		t.Errorf("distinct events = %d, want %d", got, len(evs))
	}
}

func TestBackfillSkipsOnlyOldBacklog(t *testing.T) {
	t.Parallel()
	created := time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)
	b := &loader.Backfill{Since: created.Add(-72 * time.Hour), BacklogUntilSeq: 1000}
	tests := []struct {
		name  string
		click time.Time
		seq   uint64
		skip  bool
	}{
		{"backlog_older_than_window", created.Add(-80 * time.Hour), 999, true},
		{"last_of_backlog_older_than_window", created.Add(-80 * time.Hour), 1000, true},
		{"backlog_inside_window", created.Add(-70 * time.Hour), 10, false},
		{"backlog_at_the_edge", created.Add(-72 * time.Hour), 10, false},
		{"live_with_an_old_click", created.Add(-100 * time.Hour), 1001, false},
		{"live", created.Add(time.Minute), 5000, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := reader.Event{Seq: tc.seq}
			e.Click.Time = tc.click
			if got := b.Skips(e); got != tc.skip {
				t.Errorf("Skips = %v, want %v", got, tc.skip)
			}
		})
	}
	var none *loader.Backfill
	if none.Skips(reader.Event{}) {
		t.Error("a nil Backfill skips")
	}
}

// TestSkippedEventsAreCountedOnce: an event the backfill cut skips is
// counted once its batch is done, not each time the runtime hands the batch
// again (after a failed insert, or the rest of a batch after a parked event).
func TestSkippedEventsAreCountedOnce(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	e := newEnv(t, servers.ClickHouse.Addr, loader.Config{Linger: 10 * time.Millisecond, PermanentRetryDelay: 100 * time.Millisecond,
		Backfill: &loader.Backfill{Since: now.Add(-72 * time.Hour), BacklogUntilSeq: 1000}})
	if err := e.w.EnsureSchema(t.Context()); err != nil {
		t.Fatal(err)
	}
	// Backlog events of one link, every other one's click older than the
	// window (skipped), the others inside it.
	batch := func(firstSeq uint64) []reader.Event {
		clicks := make([]events.Click, 10)
		for i := range clicks {
			at := now.Add(-time.Hour)
			if i%2 == 0 {
				at = now.Add(-80 * time.Hour)
			}
			clicks[i] = warehousetest.Click(i, "acme", "a-l1", at)
		}
		evs := warehousetest.Events(clicks, now)
		for i := range evs {
			evs[i].Seq += firstSeq - 1
		}
		return evs
	}
	skipped := func() float64 {
		t.Helper()
		return warehousetest.Metric(t, e.reg, "snip_warehouse_backfill_skipped_total")
	}

	// Inserts fail: nothing of the batch is done, however often it comes.
	evs := batch(1)
	p := evs[0].Partition
	if err := e.conn.Exec(t.Context(), "ALTER TABLE clicks DROP COLUMN referrer"); err != nil {
		t.Fatal(err)
	}
	for try := range 3 {
		if err := e.l.Handle(t.Context(), p, evs); !errors.Is(err, loader.ErrPermanent) {
			t.Fatalf("try %d with a column dropped: %v, want ErrPermanent", try, err)
		}
	}
	if got := skipped(); got != 0 {
		t.Errorf("skipped after three failed tries = %v, want 0 (nothing of the batch is done)", got)
	}
	if err := e.conn.Exec(t.Context(), "ALTER TABLE clicks ADD COLUMN referrer String AFTER user_agent"); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the batch to load once the column is back", func() bool {
		return e.l.Handle(t.Context(), p, evs) == nil
	})
	if got := skipped(); got != 5 {
		t.Errorf("skipped once the batch loaded = %v, want 5", got)
	}

	// A row parked at index 5: the skipped events before it (0, 2, 4) are
	// done; the runtime hands those after it again, and they count then.
	evs = batch(11)
	evs[5].Click.Country = "DEU" // FixedString(2): the client refuses it
	var pe *reader.PoisonError
	if err := e.l.Handle(t.Context(), p, evs); !errors.As(err, &pe) || pe.Index != 5 {
		t.Fatalf("Handle with a bad row at 5 = %v, want Poison(5)", err)
	}
	if err := e.l.Handle(t.Context(), p, evs[6:]); err != nil {
		t.Fatalf("the rest of the batch: %v", err)
	}
	if got := skipped(); got != 10 {
		t.Errorf("skipped after both batches = %v, want 10", got)
	}
}

func TestConfigIsValidated(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  loader.Config
	}{
		{"negative_rows", loader.Config{MaxRows: -1}},
		{"huge_rows", loader.Config{MaxRows: 10_000_000}},
		{"negative_linger", loader.Config{Linger: -time.Second}},
		{"long_linger", loader.Config{Linger: time.Hour}},
		{"negative_timeout", loader.Config{InsertTimeout: -time.Second}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if _, err := loader.New(nil, tc.cfg); !errors.Is(err, loader.ErrBadConfig) {
				t.Errorf("New(%+v) = %v, want ErrBadConfig", tc.cfg, err)
			}
		})
	}
}
