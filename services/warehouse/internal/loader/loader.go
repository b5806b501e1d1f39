package loader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/reader"
)

// Inserter writes rows to the warehouse, as one INSERT or, when they span
// more days than one may, a few (chwriter.Writer). It returns nil only
// when ClickHouse accepted every row. An error wrapping *RowError blames one
// row that is not well-formed (Row.Validate), which the loader parks before
// trying the others again; an error wrapping ErrPermanent means an operator
// must act (the tables do not fit the rows, a well-formed row refused
// included, or the loader may not write); any other error is transient. A
// failed insert may have been partly applied: the loader always retries the
// whole batch, and the schema absorbs the rows that arrive twice.
type Inserter interface {
	Insert(ctx context.Context, rows []Row) error
}

// Config tunes batching. Zero fields take the defaults.
type Config struct {
	// MaxRows: an insert starts as soon as this many rows wait (default
	// 10,000). A group that reached it takes no more rows, so an insert holds
	// at most MaxRows plus one partition batch.
	MaxRows int
	// Linger: an insert starts at most this long after the first of its rows
	// arrived (default 1s), so a trickle of clicks is loaded about once a
	// second rather than one tiny insert per partition batch. Batches from a
	// backlog do not linger (see the package doc).
	Linger time.Duration
	// InsertTimeout bounds one INSERT (default 30s). A hung server (SIGSTOP,
	// a network partition) fails the insert after it, and the batch is
	// retried later.
	InsertTimeout time.Duration
	// PermanentRetryDelay is how long the loader waits before trying again
	// after an insert failed with ErrPermanent (default 30s). Batches that arrive in
	// between fail at once with the same error, so the partitions wait with
	// backoff instead of hammering a server that needs an operator.
	PermanentRetryDelay time.Duration
	// Backfill, if set, skips the part of the backlog that is older than
	// wanted (see Backfill).
	Backfill *Backfill
	// Logger receives the loader's logs (default: discard).
	Logger *slog.Logger
	// Metrics, if set, receives the loader's collectors.
	Metrics prometheus.Registerer
}

// Backfill describes a group made to load only recent clicks: "load the
// last three days first". The cut is fixed when the group's first consumer
// is created, and every loader of the group applies the same one.
//
// The group's consumers start at the first event stored at Since (the
// runtime's StartAtTime, by JetStream's stored time). Some of the events
// stored after Since are older clicks: the outbox publishes late when NATS was
// down, and a seeded or replayed stream carries old click times. Backfill
// cuts those by the click's own time, but only in the backlog: an event that
// was already in the log when the group was created (stream sequence up to
// BacklogUntilSeq) and whose click happened before Since is skipped. Events
// published later are live and always loaded, however old their click.
type Backfill struct {
	// Since is the oldest click time loaded from the backlog.
	Since time.Time
	// BacklogUntilSeq is the last CLICKS sequence when the group was created.
	BacklogUntilSeq uint64
}

// Skips reports whether e is part of the backlog older than wanted.
func (b *Backfill) Skips(e reader.Event) bool {
	return b != nil && e.Seq <= b.BacklogUntilSeq && e.Click.Time.Before(b.Since)
}

// Defaults.
const (
	DefaultMaxRows             = 10_000
	DefaultLinger              = time.Second
	DefaultInsertTimeout       = 30 * time.Second
	DefaultPermanentRetryDelay = 30 * time.Second
)

func (c *Config) setDefaults() error {
	if c.MaxRows == 0 {
		c.MaxRows = DefaultMaxRows
	}
	if c.Linger == 0 {
		c.Linger = DefaultLinger
	}
	if c.InsertTimeout == 0 {
		c.InsertTimeout = DefaultInsertTimeout
	}
	if c.PermanentRetryDelay == 0 {
		c.PermanentRetryDelay = DefaultPermanentRetryDelay
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case c.MaxRows < 1 || c.MaxRows > 1_000_000:
		return fmt.Errorf("max rows %d: want 1..1000000: %w", c.MaxRows, ErrBadConfig)
	case c.Linger < 0 || c.Linger > time.Minute:
		return fmt.Errorf("linger %s: want 0..1m: %w", c.Linger, ErrBadConfig)
	case c.InsertTimeout < 0:
		return fmt.Errorf("insert timeout %s: want > 0: %w", c.InsertTimeout, ErrBadConfig)
	case c.PermanentRetryDelay < 0:
		return fmt.Errorf("permanent retry delay %s: want > 0: %w", c.PermanentRetryDelay, ErrBadConfig)
	}
	return nil
}

// Loader is the warehouse loader's core: a reader.Handler (Handle) that
// collects the batches the runtime hands it for every partition this member
// owns into shared inserts, and returns for each batch only once the insert
// holding its rows succeeded, so the runtime acks nothing ClickHouse has not
// accepted.
//
// One goroutine (the flusher) runs the inserts, one at a time: ClickHouse
// wants few, large inserts, about one a second per table, and eight
// partitions' batches of a few hundred rows each would be the opposite.
type Loader struct {
	ins Inserter
	cfg Config
	log *slog.Logger
	m   metrics

	mu       sync.Mutex
	full     []*group // groups that reached MaxRows, oldest first
	open     *group   // rows waiting for the next insert, nil when none
	draining bool
	closed   bool

	wake chan struct{} // capacity 1: something changed that the flusher should look at
	stop chan struct{} // closed by Close
	done chan struct{} // closed when the flusher has exited
	once sync.Once

	// flusher-only state
	coolUntil time.Time // no insert attempts before this, after ErrPermanent
	coolErr   error
	failing   failLog
}

// New starts a loader that inserts through ins.
func New(ins Inserter, cfg Config) (*Loader, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	l := &Loader{
		ins:  ins,
		cfg:  cfg,
		log:  cfg.Logger,
		m:    newMetrics(cfg.Metrics),
		wake: make(chan struct{}, 1),
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
	go l.flushLoop()
	return l, nil
}

// group is the rows of one insert and the handler calls waiting on it.
type group struct {
	entries []*entry
	rows    int
	first   time.Time     // when the first row arrived
	behind  bool          // a batch in it comes from a backlog
	done    chan struct{} // closed when err and every entry's result are set
	err     error
}

// entry is one handler call's rows.
type entry struct {
	rows      []Row
	poisonAt  int // index in rows of a row the inserter refused, or -1
	poisonErr error
}

// Handle is the reader.Handler: it maps the batch to rows, hands them to the
// next insert and waits for it. It returns nil once every row is in
// ClickHouse; a reader.Poison for an event that cannot be a row (the rows
// before it are in ClickHouse, the ones after it are not and come again);
// or the insert's error, which makes the runtime retry the batch with
// backoff while the stream holds everything after it.
func (l *Loader) Handle(ctx context.Context, partition int, batch []reader.Event) error {
	rows := make([]Row, 0, len(batch))
	index := make([]int, 0, len(batch)) // batch index of each row
	badAt := -1
	var bad error
	var skipped []int // batch indices of the events the backfill cut skips
	for i, e := range batch {
		if l.cfg.Backfill.Skips(e) {
			skipped = append(skipped, i)
			continue
		}
		r, err := RowFromEvent(e)
		if err != nil {
			badAt, bad = i, err
			break
		}
		rows = append(rows, r)
		index = append(index, i)
	}
	if len(rows) > 0 {
		// A batch whose newest event was stored more than a linger ago
		// comes from a backlog (a catch-up, a backfill, a replay). Its
		// events have waited long enough, and its partition fetches nothing
		// while the handler waits, so its rows are inserted as soon as the
		// flusher is free (group commit): the rows that gather during one
		// insert make the next, and inserts grow by themselves when
		// ClickHouse is the bottleneck.
		behind := time.Since(batch[len(batch)-1].Stored) > l.cfg.Linger
		e, err := l.insert(ctx, rows, behind)
		if err != nil {
			// Nothing of the batch is done: it comes again, skipped
			// events included, and they count then.
			return fmt.Errorf("load partition %d: %w", partition, err)
		}
		if e.poisonAt >= 0 {
			at := index[e.poisonAt]
			l.countSkipped(skipped, at)
			l.m.parked.WithLabelValues(ReasonBadRow).Inc()
			return reader.Poison(at, ReasonBadRow, e.poisonErr)
		}
	}
	if badAt >= 0 {
		l.countSkipped(skipped, badAt)
		l.m.parked.WithLabelValues(ReasonImplausibleTime).Inc()
		return reader.Poison(badAt, ReasonImplausibleTime, bad)
	}
	l.countSkipped(skipped, len(batch))
	return nil
}

// countSkipped counts the skipped events (batch indices, ascending) before
// batch index end: the ones the handler's answer says are done. The events
// from end on are handed again (the rest of a batch after a parked event),
// as is a whole batch whose insert failed, so each skipped event is counted
// once, when it is done.
func (l *Loader) countSkipped(skipped []int, end int) {
	n, _ := slices.BinarySearch(skipped, end)
	if n > 0 {
		l.m.skipped.Add(float64(n))
	}
}

// insert adds rows to the open group and waits until it was inserted.
func (l *Loader) insert(ctx context.Context, rows []Row, behind bool) (*entry, error) {
	e := &entry{rows: rows, poisonAt: -1}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, ErrStopped
	}
	g := l.open
	if g == nil {
		g = &group{first: time.Now(), done: make(chan struct{})}
		l.open = g
	}
	g.entries = append(g.entries, e)
	g.rows += len(rows)
	l.m.waiting.Add(float64(len(rows)))
	// Wake the flusher for a new group (to start its linger timer), for a
	// full one and for one that turned out to be behind; a wake it does not
	// need costs one look.
	if len(g.entries) == 1 || g.rows >= l.cfg.MaxRows || (behind && !g.behind) {
		l.signal()
	}
	g.behind = g.behind || behind
	// A full group takes no more rows: the next batch starts a new one, so
	// an insert holds at most MaxRows plus one batch however slow the
	// flusher is.
	if g.rows >= l.cfg.MaxRows {
		l.full = append(l.full, g)
		l.open = nil
	}
	l.mu.Unlock()

	select {
	case <-g.done:
		if g.err != nil {
			return nil, g.err
		}
		return e, nil
	case <-ctx.Done():
		// The runtime gave up on this batch (forced stop); the rows may
		// still be inserted, which the schema absorbs when they come again.
		return nil, ctx.Err()
	}
}

func (l *Loader) signal() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// Drain makes the loader insert waiting rows at once instead of lingering:
// the service calls it when it stops taking work, so the batches in hand are
// inserted and acked without delay. Safe to call more than once.
func (l *Loader) Drain() {
	l.mu.Lock()
	l.draining = true
	l.mu.Unlock()
	l.signal()
}

// Close stops the loader: an insert in flight is cancelled and every handler
// still waiting returns ErrStopped (its batch is not acked and will be handed
// out again). Call it after the runtime has returned, so that nothing waits.
// It returns when the flusher has exited.
func (l *Loader) Close() {
	l.once.Do(func() {
		l.mu.Lock()
		l.closed = true
		l.mu.Unlock()
		close(l.stop)
	})
	<-l.done
}

// flushLoop runs the inserts until Close.
func (l *Loader) flushLoop() {
	defer close(l.done)
	base, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-l.stop:
			cancel()
		case <-base.Done():
		}
	}()
	for {
		g, trigger := l.next()
		if g == nil {
			return
		}
		began := time.Now()
		l.flush(base, g, trigger)
		l.log.Debug("insert", "trigger", trigger, "rows", g.rows, "batches", len(g.entries),
			"waited", began.Sub(g.first).Round(time.Millisecond).String(), "took", time.Since(began).Round(time.Millisecond).String(), "err", g.err)
		l.m.waiting.Sub(float64(g.rows))
		if g.err != nil {
			l.failQueued(g.err)
		}
	}
}

// failQueued fails every group waiting behind an insert that failed with
// err, without trying them: the full groups queued behind it and the open
// one. Their handlers return the error and the runtime hands their batches
// again after its backoff, as it does the failed group's, so the loader
// backs off as a whole. Tried in turn, each would wait out its own
// InsertTimeout against a frozen server: a catch-up with a full group per
// partition queued would hold a rebalance or a shutdown for partitions x
// InsertTimeout. Nothing of them was inserted and nothing is acked; the
// batches handed again meet in the next group, which is tried. A loader
// being closed leaves them to next, which fails them with ErrStopped.
func (l *Loader) failQueued(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	n := 0
	for _, g := range append(l.full, l.open) {
		if g != nil {
			l.m.waiting.Sub(float64(g.rows))
			g.err = fmt.Errorf("not tried: an insert queued ahead of it failed: %w", err)
			close(g.done)
			n++
		}
	}
	l.full, l.open = nil, nil
	if n > 0 {
		l.log.Debug("failed the groups queued behind a failed insert", "groups", n)
	}
}

// next waits until a group is due and takes it, returning it with what made
// it due: full groups first, oldest first, then the open one. It returns nil
// when the loader is closed, and then no group is due any more: the ones
// still waiting (full groups queued behind an insert that Close cancelled)
// fail with ErrStopped instead of being tried with a cancelled context.
func (l *Loader) next() (*group, string) {
	for {
		l.mu.Lock()
		if l.closed {
			l.stopWaiting()
			l.mu.Unlock()
			return nil, ""
		}
		if len(l.full) > 0 {
			g := l.full[0]
			l.full = l.full[1:]
			l.mu.Unlock()
			return g, "size"
		}
		g := l.open
		var wait time.Duration
		trigger := ""
		if g != nil {
			switch wait = l.cfg.Linger - time.Since(g.first); {
			case l.draining:
				trigger = "drain"
			case g.behind:
				trigger = "backlog"
			case wait <= 0:
				trigger = "linger"
			}
			if trigger != "" {
				l.open = nil
				l.mu.Unlock()
				return g, trigger
			}
		}
		l.mu.Unlock()

		var timer *time.Timer
		var fire <-chan time.Time
		if g != nil {
			timer = time.NewTimer(wait)
			fire = timer.C
		}
		select {
		case <-l.wake:
		case <-fire:
		case <-l.stop:
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

// stopWaiting fails every group not yet taken with ErrStopped. l.mu is held.
func (l *Loader) stopWaiting() {
	for _, g := range append(l.full, l.open) {
		if g != nil {
			l.m.waiting.Sub(float64(g.rows))
			g.err = ErrStopped
			close(g.done)
		}
	}
	l.full, l.open = nil, nil
}

// flush inserts one group, parking rows the inserter refuses, and tells
// every waiting handler how it went. A group due while the loader waits out
// PermanentRetryDelay fails without an insert, and counts as no flush.
func (l *Loader) flush(base context.Context, g *group, trigger string) {
	defer close(g.done)
	if now := time.Now(); now.Before(l.coolUntil) {
		g.err = fmt.Errorf("not inserting until %s: %w", l.coolUntil.Format(time.RFC3339), l.coolErr)
		return
	}
	l.m.flushes.WithLabelValues(trigger).Inc()

	rows := make([]Row, 0, g.rows)
	owner := make([]rowRef, 0, g.rows)
	for _, e := range g.entries {
		for i := range e.rows {
			rows = append(rows, e.rows[i])
			owner = append(owner, rowRef{e, i})
		}
	}
	for len(rows) > 0 {
		ctx, cancel := context.WithTimeout(base, l.cfg.InsertTimeout)
		err := l.ins.Insert(ctx, rows)
		cancel()
		var re *RowError
		switch {
		case err == nil:
			l.failing.recovered(l.log)
			return
		case errors.As(err, &re) && re.Index >= 0 && re.Index < len(rows):
			// One bad row: its handler parks it, and the rows of that
			// handler after it are handed out again later, so they leave
			// this insert too. Everyone else's rows go again at once.
			bad := owner[re.Index]
			bad.e.poisonAt, bad.e.poisonErr = bad.i, re.Err
			l.log.Warn("row refused; parking its event", "event_id", rows[re.Index].EventID, "err", re.Err)
			rows, owner = dropFrom(rows, owner, bad)
		default:
			if errors.Is(err, ErrPermanent) {
				l.coolUntil, l.coolErr = time.Now().Add(l.cfg.PermanentRetryDelay), err
			}
			g.err = fmt.Errorf("insert %d rows: %w", len(rows), err)
			l.failing.failed(l.log, g.err, errors.Is(err, ErrPermanent))
			return
		}
	}
}

// rowRef says which handler call a row came from and where in its rows.
type rowRef struct {
	e *entry
	i int
}

// dropFrom removes the rows of bad.e from index bad.i on.
func dropFrom(rows []Row, owner []rowRef, bad rowRef) ([]Row, []rowRef) {
	keepRows, keepOwner := rows[:0], owner[:0]
	for k := range rows {
		if owner[k].e == bad.e && owner[k].i >= bad.i {
			continue
		}
		keepRows = append(keepRows, rows[k])
		keepOwner = append(keepOwner, owner[k])
	}
	return keepRows, keepOwner
}

// failLog logs an outage once when it starts, every 30s while it lasts, and
// once when it ends, instead of once per attempt. A failure of the other
// kind than the one last logged (an operator's fault after a server that
// was away, or the reverse) is logged at once: the error that asks an
// operator to act must not wait out the warnings of a restart before it.
type failLog struct {
	since     time.Time
	lastLog   time.Time
	attempts  int
	permanent bool // the kind of the failure last logged
}

func (f *failLog) failed(log *slog.Logger, err error, permanent bool) {
	now := time.Now()
	f.attempts++
	switch {
	case f.since.IsZero():
		f.since = now
	case permanent == f.permanent && now.Sub(f.lastLog) < 30*time.Second:
		return
	}
	f.lastLog, f.permanent = now, permanent
	level := slog.LevelWarn
	msg := "insert failed; the partitions wait and retry"
	if permanent {
		level = slog.LevelError
		msg = "insert refused until an operator acts (schema, credentials or server settings); retrying slowly"
	}
	log.Log(context.Background(), level, msg, "err", err, "attempts", f.attempts, "failing_for", now.Sub(f.since).Round(time.Millisecond).String())
}

func (f *failLog) recovered(log *slog.Logger) {
	if f.since.IsZero() {
		return
	}
	log.Info("inserts recovered", "attempts", f.attempts, "failed_for", time.Since(f.since).Round(time.Millisecond).String())
	*f = failLog{}
}
