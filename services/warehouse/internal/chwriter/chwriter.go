// Package chwriter is the loader's ClickHouse adapter: it opens the
// connection pool, applies the schema (creating the database if needed), and
// inserts rows as one batch per call (one per MaxDaysPerInsert days of
// clicks when they span more), through clickhouse-go's native protocol
// with an explicit column list (the only insert form that works on both
// ClickHouse 18.16 and current servers; see docs/decisions/0040).
//
// It also classifies what goes wrong (Classify), so the loader can tell a
// server that is down or slow (retry) from one whose tables no longer fit the
// rows (an operator must act) and from one bad row (park it).
package chwriter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/column"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/services/warehouse/internal/loader"
	"github.com/snipdev/snip/services/warehouse/internal/schema"
)

var _ loader.Inserter = (*Writer)(nil)

// Config says where ClickHouse is and how to talk to it.
type Config struct {
	// Addrs are host:port of the native protocol (port 9000), not HTTP.
	Addrs []string
	// Database holds the tables; it is created if missing.
	Database string
	User     string
	Password string
	// DialTimeout bounds connecting and the handshake (default 5s). A
	// context deadline does not interrupt a handshake with a hung server,
	// so this is what bounds it.
	DialTimeout time.Duration
	// ReadTimeout bounds each read from the server (default 60s, above the
	// slowest insert or DDL measured on 18.16).
	ReadTimeout time.Duration
	// MaxOpenConns caps the pool (default 4): one insert at a time, plus
	// readiness probes and queries.
	MaxOpenConns int
	// MaxDaysPerInsert caps how many days (partitions of clicks) one INSERT
	// statement touches (default DefaultMaxDaysPerInsert); Insert splits
	// rows spanning more into several statements. Current servers refuse an
	// insert block touching more than max_partitions_per_insert_block
	// partitions (100 by default).
	MaxDaysPerInsert int
}

// DefaultMaxDaysPerInsert is Config.MaxDaysPerInsert's default: below the
// default max_partitions_per_insert_block (100) of current servers.
const DefaultMaxDaysPerInsert = 90

func (c *Config) setDefaults() error {
	if c.DialTimeout == 0 {
		c.DialTimeout = 5 * time.Second
	}
	if c.ReadTimeout == 0 {
		c.ReadTimeout = 60 * time.Second
	}
	if c.MaxOpenConns == 0 {
		c.MaxOpenConns = 4
	}
	if c.MaxDaysPerInsert == 0 {
		c.MaxDaysPerInsert = DefaultMaxDaysPerInsert
	}
	if c.User == "" {
		c.User = "default"
	}
	switch {
	case len(c.Addrs) == 0:
		return errors.New("clickhouse: no address")
	case !schema.ValidDatabase(c.Database):
		return fmt.Errorf("clickhouse database %q: %w", c.Database, schema.ErrBadDatabaseName)
	case c.MaxDaysPerInsert < 1:
		return fmt.Errorf("clickhouse: max days per insert %d: want at least 1", c.MaxDaysPerInsert)
	}
	return nil
}

func (c Config) options(database string) *clickhouse.Options {
	return &clickhouse.Options{
		Protocol:         clickhouse.Native,
		Addr:             c.Addrs,
		Auth:             clickhouse.Auth{Database: database, Username: c.User, Password: c.Password},
		DialTimeout:      c.DialTimeout,
		ReadTimeout:      c.ReadTimeout,
		MaxOpenConns:     c.MaxOpenConns,
		MaxIdleConns:     c.MaxOpenConns,
		ConnMaxLifetime:  time.Hour,
		Compression:      &clickhouse.Compression{Method: clickhouse.CompressionLZ4},
		ClientInfo:       clickhouse.ClientInfo{Products: []struct{ Name, Version string }{{Name: "snip-warehouse", Version: "1"}}},
		ConnOpenStrategy: clickhouse.ConnOpenInOrder,
	}
}

// insertSQL names every column: 18.16 needs the list, and it keeps the
// insert correct if columns are added to the table later.
const insertSQL = `INSERT INTO clicks (event_id, ts, owner, code, target, ip_prefix, visitor, user_agent, referrer, country, request_id, bot, stream_partition, stream_seq, ingested_at)`

// columnTypes are the types the schema gives the columns of insertSQL, the
// ones Insert's Go values are made for. They only name what changed when a
// well-formed row is refused (see Insert); a table whose types differ but
// still accept the rows (a wider FixedString, LowCardinality(String)) is
// fine.
var columnTypes = map[string]string{
	"event_id": "UUID", "ts": "DateTime('UTC')", "owner": "String", "code": "String", "target": "String",
	"ip_prefix": "String", "visitor": "String", "user_agent": "String", "referrer": "String",
	"country": "FixedString(2)", "request_id": "String", "bot": "UInt8", "stream_partition": "UInt16",
	"stream_seq": "UInt64", "ingested_at": "DateTime('UTC')",
}

// errTableChanged marks a well-formed row the client refused: the table's
// columns no longer fit the rows. Classify calls it ClassSchema.
var errTableChanged = errors.New("a well-formed row was refused: the clicks table's columns no longer fit the rows")

// errViewMissing marks an insert refused because the materialized view that
// feeds clicks_hourly is gone. The server would take the rows into clicks
// without it, and they would never reach the rollup every dashboard reads,
// not even once the view is back; so the writer inserts nothing while it is
// missing. Classify calls it ClassMissing: the schema is applied again
// before the next insert.
var errViewMissing = errors.New("the materialized view " + schema.RollupView + " is missing")

// Writer inserts rows into the clicks table. Its methods are safe for
// concurrent use; the loader calls Insert from one goroutine.
type Writer struct {
	cfg  Config
	conn driver.Conn
	log  *slog.Logger
	m    metrics

	schemaMu sync.Mutex  // one schema application at a time
	schemaOK atomic.Bool // the schema was applied on this server

	// objectsSeen is when (UnixNano) Ready last found every table and the
	// view in place (or the schema applied); a probe within
	// objectsCheckEvery of it asks the server nothing more than a ping.
	objectsSeen atomic.Int64

	sent func(rows []loader.Row) // if set, called with the rows of each INSERT statement the server accepted (tests)
}

// Open creates the connection pool. It does not connect: ClickHouse may not
// be up yet, and the loader waits for it (EnsureSchema, Ready).
func Open(cfg Config, log *slog.Logger, reg prometheus.Registerer) (*Writer, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("open clickhouse: %w", err)
	}
	conn, err := clickhouse.Open(cfg.options(cfg.Database))
	if err != nil {
		return nil, fmt.Errorf("open clickhouse: %w", err)
	}
	return &Writer{cfg: cfg, conn: conn, log: log, m: newMetrics(reg)}, nil
}

// Conn is the connection pool, for queries (package dashboard).
func (w *Writer) Conn() driver.Conn { return w.conn }

// Close closes the pool.
func (w *Writer) Close() error { return w.conn.Close() }

// EnsureSchema creates the database and the schema's tables and views unless
// they exist. After the first success it does nothing until an insert finds
// a table, the view or the database missing (someone dropped it), and then
// applies the schema again before the next insert or at the next readiness
// probe (Ready), whichever comes first.
func (w *Writer) EnsureSchema(ctx context.Context) error {
	if w.schemaOK.Load() {
		return nil
	}
	w.schemaMu.Lock()
	defer w.schemaMu.Unlock()
	return w.ensureSchemaLocked(ctx)
}

// ensureSchemaLocked is EnsureSchema with schemaMu held.
func (w *Writer) ensureSchemaLocked(ctx context.Context) error {
	if w.schemaOK.Load() {
		return nil
	}
	// A connection whose default database does not exist fails every query,
	// so the database is created over one without a default database.
	admin, err := clickhouse.Open(w.cfg.options(""))
	if err != nil {
		return fmt.Errorf("ensure schema: %w", err)
	}
	defer admin.Close()
	if err := schema.EnsureDatabase(ctx, admin, w.cfg.Database); err != nil {
		return fmt.Errorf("ensure schema: %w", err)
	}
	if err := schema.Apply(ctx, w.conn); err != nil {
		return fmt.Errorf("ensure schema: %w", err)
	}
	w.schemaOK.Store(true)
	w.objectsSeen.Store(time.Now().UnixNano())
	w.log.Info("clickhouse schema applied", "database", w.cfg.Database)
	return nil
}

// objectsCheckEvery is how long Ready trusts its last look at the tables:
// probes come every few seconds, and a second keeps each to a ping and,
// at most once a second, one small query of system.tables.
const objectsCheckEvery = time.Second

// Ready reports whether an insert would land now: the server answers and
// every table and the view of the schema exist. The schema applied once is
// not enough: someone may have dropped a table or the database since, and
// without traffic no insert finds out (a pooled ping still succeeds while
// a table is gone), so Ready looks them up in system.tables, at most once
// every objectsCheckEvery. A schema not applied (before the start-up's wait
// got it applied, or since an insert, the ping or this look-up found a
// table, the view or the database missing) is applied here, within ctx, so
// readiness does not wait for the next insert, which a loader without
// traffic may not make for hours. While another call applies it (the
// start-up's wait, an insert), Ready says so at once instead of waiting
// for it.
func (w *Writer) Ready(ctx context.Context) error {
	if err := w.conn.Ping(ctx); err != nil {
		// A connection's handshake names its database, so the ping
		// fails (81) while the database is missing.
		if !missingSchema(err) {
			return fmt.Errorf("ping clickhouse: %w", err)
		}
		w.schemaOK.Store(false)
	}
	if w.schemaOK.Load() {
		if err := w.checkObjects(ctx); err != nil {
			return err
		}
	}
	if w.schemaOK.Load() {
		return nil
	}
	if !w.schemaMu.TryLock() {
		return errors.New("clickhouse schema being applied")
	}
	defer w.schemaMu.Unlock()
	if err := w.ensureSchemaLocked(ctx); err != nil {
		return fmt.Errorf("clickhouse schema not applied: %w", err)
	}
	return nil
}

// checkObjects looks up the schema's tables and view unless Ready found
// them within objectsCheckEvery, and forgets the schema if one is missing
// (Ready then applies it again).
func (w *Writer) checkObjects(ctx context.Context) error {
	if time.Since(time.Unix(0, w.objectsSeen.Load())) < objectsCheckEvery {
		return nil
	}
	args := []any{w.cfg.Database}
	for _, o := range schema.Objects {
		args = append(args, o)
	}
	in := strings.TrimSuffix(strings.Repeat("?, ", len(schema.Objects)), ", ")
	var n uint64
	if err := w.conn.QueryRow(ctx, "SELECT count() FROM system.tables WHERE database = ? AND name IN ("+in+")",
		args...).Scan(&n); err != nil {
		if missingSchema(err) {
			w.schemaOK.Store(false)
			return nil
		}
		return fmt.Errorf("look up the clickhouse tables: %w", err)
	}
	if n < uint64(len(schema.Objects)) {
		w.log.Warn("clickhouse tables missing; applying the schema again", "database", w.cfg.Database,
			"found", n, "want", len(schema.Objects))
		w.schemaOK.Store(false)
		return nil
	}
	w.objectsSeen.Store(time.Now().UnixNano())
	return nil
}

// Insert writes rows as one INSERT statement, or as several when they span
// more than MaxDaysPerInsert days (applying the schema first if it has not
// been). Each statement takes whole days, so no partition of clicks is split
// between two. A statement that fails leaves the ones before it applied: the
// loader retries the whole batch, and the schema absorbs the rows that come
// twice (same sorting key, same partition). It returns a *loader.RowError
// (Index into rows) when the client refuses a row that is not well-formed,
// an error wrapping loader.ErrPermanent for the classes an operator must fix
// (a well-formed row refused among them), and otherwise the cause wrapped
// with its class ("unavailable: ...").
func (w *Writer) Insert(ctx context.Context, rows []loader.Row) error {
	if err := w.EnsureSchema(ctx); err != nil {
		return w.fail(err)
	}
	if err := w.checkView(ctx); err != nil {
		return w.fail(err)
	}
	parts := splitByDays(rows, w.cfg.MaxDaysPerInsert)
	if parts == nil {
		if err := w.send(ctx, rows); err != nil {
			return err
		}
	}
	for _, index := range parts {
		part := make([]loader.Row, len(index))
		for k, i := range index {
			part[k] = rows[i]
		}
		if err := w.send(ctx, part); err != nil {
			if re, ok := errors.AsType[*loader.RowError](err); ok {
				re.Index = index[re.Index]
			}
			return err
		}
	}
	w.m.lastSuccess.SetToCurrentTime()
	return nil
}

// send writes rows as one INSERT statement.
func (w *Writer) send(ctx context.Context, rows []loader.Row) error {
	start := time.Now()
	batch, err := w.conn.PrepareBatch(ctx, insertSQL)
	if err != nil {
		return w.fail(fmt.Errorf("prepare insert: %w", err))
	}
	for i := range rows {
		r := &rows[i]
		var bot uint8
		if r.Bot {
			bot = 1
		}
		// Exact Go types: the driver converts silently where it can
		// (an int into UInt64 wraps), so every value has the column's type.
		if err := batch.Append(r.EventID, r.Time, r.Owner, r.Code, r.Target, r.IPPrefix, r.Visitor,
			r.UserAgent, r.Referrer, r.Country, r.RequestID, bot, r.Partition, r.Seq, r.IngestedAt); err != nil {
			// The client checks values against the column types the server
			// sent for this insert, so a column whose type changed (an
			// operator's ALTER … MODIFY COLUMN) is refused here too, blamed
			// on the first row it meets, and every row after it would be
			// refused the same: parking it would drain the stream into the
			// dead letters. So the row decides. One that breaks Snip's rule
			// of validity is parked; the schema as created accepts every
			// row that keeps it, so one that keeps it was refused because
			// the table changed, which is the schema class (nothing parked,
			// retried slowly, an error logged). This does not compare the
			// types up front: a changed type the client still accepts
			// (LowCardinality, a wider FixedString) is no reason to stop.
			changed := typeChanges(batch.Columns())
			_ = batch.Abort()
			if r.Validate() != nil {
				w.m.errors.WithLabelValues(ClassBadRow).Inc()
				return &loader.RowError{Index: i, Err: err}
			}
			return w.fail(fmt.Errorf("append row %d: %w (%s): %w", i, errTableChanged, changed, err))
		}
	}
	if err := batch.Send(); err != nil {
		return w.fail(fmt.Errorf("send insert: %w", err))
	}
	// Per statement, not per Insert: the server took these rows even if
	// a later statement of the same Insert fails, and each statement is
	// one insert block (its parts) to the server. The duration is the
	// statement's alone: the schema and view checks before it are not an
	// insert's cost, and a split batch's statements each have their own.
	w.m.duration.Observe(time.Since(start).Seconds())
	w.m.batchRows.Observe(float64(len(rows)))
	w.m.rows.Add(float64(len(rows)))
	if w.sent != nil {
		w.sent(rows)
	}
	return nil
}

// splitByDays returns nil when rows span at most maxDays days (UTC dates of
// their click time: the partitions of clicks), and otherwise the indices in
// rows of each statement's rows: whole days, maxDays of them per statement
// (the last may hold fewer), oldest first, each row's order kept.
func splitByDays(rows []loader.Row, maxDays int) [][]int {
	dayOf := func(r *loader.Row) int64 { return r.Time.Unix() / 86400 } // toDate(ts) of a DateTime('UTC')
	days := make(map[int64]int)
	for i := range rows {
		days[dayOf(&rows[i])] = 0
	}
	if len(days) <= maxDays {
		return nil
	}
	sorted := slices.Sorted(maps.Keys(days))
	for rank, d := range sorted {
		days[d] = rank / maxDays
	}
	parts := make([][]int, (len(sorted)+maxDays-1)/maxDays)
	for i := range rows {
		p := days[dayOf(&rows[i])]
		parts[p] = append(parts[p], i)
	}
	return parts
}

// checkView returns an error wrapping errViewMissing unless the view that
// feeds clicks_hourly exists. A table dropped fails the insert on the
// server (code 60); the view dropped does not, so it is looked up before
// every insert (one small query, against the 20 to 70 ms an insert costs on
// 18.16).
func (w *Writer) checkView(ctx context.Context) error {
	var n uint64
	if err := w.conn.QueryRow(ctx, "SELECT count() FROM system.tables WHERE database = ? AND name = ?",
		w.cfg.Database, schema.RollupView).Scan(&n); err != nil {
		return fmt.Errorf("look up %s: %w", schema.RollupView, err)
	}
	if n == 0 {
		return fmt.Errorf("%w: clicks inserted now would never reach clicks_hourly", errViewMissing)
	}
	return nil
}

// fail counts err by class, forgets the schema if a table, the view or the
// database is gone, and wraps err with its class.
func (w *Writer) fail(err error) error {
	class := Classify(err)
	w.m.errors.WithLabelValues(class).Inc()
	if missingSchema(err) {
		w.schemaOK.Store(false)
	}
	if class == ClassPartitions {
		err = fmt.Errorf("the server takes fewer partitions per insert than the %d days the loader puts in one: "+
			"raise max_partitions_per_insert_block for the loader's user (0 is no limit) or lower WAREHOUSE_MAX_DAYS_PER_INSERT: %w",
			w.cfg.MaxDaysPerInsert, err)
	}
	if permanent(class) {
		return fmt.Errorf("%s: %w: %w", class, loader.ErrPermanent, err)
	}
	return fmt.Errorf("%s: %w", class, err)
}

// typeChanges says which columns of a prepared insert have another type than
// the schema gives them, as the server described them for this insert.
func typeChanges(cols []column.Interface) string {
	var out []string
	for _, c := range cols {
		if want, ok := columnTypes[c.Name()]; ok && string(c.Type()) != want {
			out = append(out, fmt.Sprintf("%s is %s, the loader writes %s", c.Name(), c.Type(), want))
		}
	}
	if len(out) == 0 {
		return "every column has the schema's type"
	}
	return strings.Join(out, "; ")
}
