package counter

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/events"
)

// Clicks is what the counter needs to know about the CLICKS stream itself.
type Clicks interface {
	// FirstSeq returns the sequence of the oldest event CLICKS retains in a
	// partition, or 0 when the partition is empty.
	FirstSeq(ctx context.Context, partition int) (uint64, error)
	// NextSeq returns the sequence of the partition's first event stored
	// at or after from, or 0 when there is none.
	NextSeq(ctx context.Context, partition int, from uint64) (uint64, error)
}

// Hooks inject faults for tests; production leaves them nil.
type Hooks struct {
	// AfterWrite runs after a batch is written to the store (or the
	// watermark moved past parked events, OnPassed) and before the handler
	// (or OnPassed) returns, that is before the runtime acks it. A test
	// makes it block or fail to play a member that dies between the two.
	AfterWrite func(ctx context.Context, partition int, lastSeq uint64) error
	// Weight, if set, is how many times a click is counted: a test sets it
	// to 2 to play a buggy release, then recounts with it unset.
	Weight func(c *events.Click) int64
}

// Options configure a Counter.
type Options struct {
	Store  Store
	Clicks Clicks
	// Partitions is the number of CLICKS partitions.
	Partitions int
	// DedupWindow is how long an event ID stays in the recent-ID record
	// after it was counted, or less in a catch-up: until the partition's
	// position (the stored time of the events counted) is that far past
	// it. A copy of the event stored under another sequence within that
	// time is not counted again.
	DedupWindow time.Duration
	// ClicksMaxAge is CLICKS retention: how long a click can be recounted,
	// and so how long its verdict label is kept.
	ClicksMaxAge time.Duration
	Logger       *slog.Logger
	Metrics      prometheus.Registerer
	Hooks        Hooks
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Counter counts clicks. Its methods are safe for concurrent use; the reader
// runtime calls HandleBatch for different partitions concurrently, never for
// the same one.
type Counter struct {
	store  Store
	clicks Clicks
	n      int
	window time.Duration
	maxAge time.Duration
	log    *slog.Logger
	hooks  Hooks
	now    func() time.Time
	m      *metrics

	mu    sync.Mutex
	parts map[int]*State
	// unchecked are the partitions whose state was read from the store
	// since the counter last checked CLICKS for events the store has not
	// counted below the next batch (see catchUp).
	unchecked map[int]bool
	// recounted are the partitions whose state, read again after a
	// conflict, has a newer write generation than the one cached: a recount
	// another member started. What that generation has not counted before
	// the batch is the recount's to count, not events the store lost (see
	// catchUp).
	recounted map[int]bool
	// replays are, per partition that asked for its events again (see
	// catchUp), the events the store had lost. Unlike the cached state they
	// outlive the partition's revocation (forget): a member that loses the
	// partition during the catch-up and takes it back resumes from the
	// store's watermark, somewhere among those events, where nothing tells
	// a lost event from a new one but this. The store keeps the stretch
	// too (Store.MarkLost), so a member that takes the partition over from
	// another joins it to its own when it loads the partition's state.
	replays map[int]replay
	// vstate caches the generations of every partition for the verdict
	// path, which runs on every member whatever partitions it owns.
	vstate map[int]State
	// starts are, per partition, the recount start asked for and not yet
	// answered (see startRecount).
	starts map[int]pendingStart
	// unanswered are, per partition, the last write whose answer was lost
	// and which no state read has settled since (see settle).
	unanswered map[int]unanswered

	janitor chan int

	// batches holds the scratch of batches' writes, emptied, for the next
	// batch of any partition: at most one per partition. Not a sync.Pool,
	// which drops what it holds at every garbage collection: a catch-up
	// collects every few batches, and a scratch made anew grows its maps
	// again.
	batches chan *batchScratch
}

// New returns a Counter.
func New(o Options) (*Counter, error) {
	switch {
	case o.Store == nil || o.Clicks == nil:
		return nil, fmt.Errorf("new counter: store and clicks are required")
	case o.Partitions < 1:
		return nil, fmt.Errorf("new counter: partitions %d: want >= 1", o.Partitions)
	case o.DedupWindow <= 0:
		return nil, fmt.Errorf("new counter: dedup window %s: want > 0", o.DedupWindow)
	case o.ClicksMaxAge <= 0:
		return nil, fmt.Errorf("new counter: clicks max age %s: want > 0", o.ClicksMaxAge)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	m, err := newMetrics(o.Metrics)
	if err != nil {
		return nil, fmt.Errorf("new counter: %w", err)
	}
	return &Counter{
		store: o.Store, clicks: o.Clicks, n: o.Partitions, window: o.DedupWindow, maxAge: o.ClicksMaxAge,
		log: o.Logger, hooks: o.Hooks, now: o.Now, m: m,
		parts:      map[int]*State{},
		unchecked:  map[int]bool{},
		recounted:  map[int]bool{},
		replays:    map[int]replay{},
		vstate:     map[int]State{},
		starts:     map[int]pendingStart{},
		unanswered: map[int]unanswered{},
		janitor:    make(chan int, 4*o.Partitions),
		batches:    make(chan *batchScratch, o.Partitions),
	}, nil
}

// Partitions is the number of CLICKS partitions the counter was built for.
func (c *Counter) Partitions() int { return c.n }

// cached returns the partition's cached state, loading it on first use.
func (c *Counter) cached(ctx context.Context, p int) (*State, error) {
	c.mu.Lock()
	s := c.parts[p]
	c.mu.Unlock()
	if s != nil {
		return s, nil
	}
	return c.reload(ctx, p)
}

// reload reads the partition's state from the store into the cache.
func (c *Counter) reload(ctx context.Context, p int) (*State, error) {
	st, _, err := c.load(ctx, p)
	return st, err
}

// load is reload, which also settles the partition's write whose answer
// was lost, if any (settle); ours reports that that write switched a
// recount.
func (c *Counter) load(ctx context.Context, p int) (s *State, ours bool, err error) {
	st, err := c.store.State(ctx, p)
	if err != nil {
		return nil, false, fmt.Errorf("load partition %d state: %w", p, err)
	}
	c.mu.Lock()
	c.parts[p] = &st
	c.unchecked[p] = true
	if st.LostUntil != 0 {
		// Recorded by whichever member asked for the catch-up: this one,
		// or another that held the partition before.
		c.joinReplay(p, replay{st.LostFrom, st.LostUntil})
	}
	c.trimReplay(p, st.WM)
	c.mu.Unlock()
	c.m.observeState(p, st)
	return &st, c.settle(p, st), nil
}

func (c *Counter) forget(p int) {
	c.mu.Lock()
	delete(c.parts, p)
	delete(c.unchecked, p)
	delete(c.recounted, p)
	// c.replays[p] stays: see replays. So does c.unanswered[p]: taking
	// the partition back, the member reads its state and settles it.
	c.mu.Unlock()
	// The partition's owner reports its generations from now on; a value
	// kept here would go stale (a recount that never seems to end).
	ps := strconv.Itoa(p)
	c.m.generation.DeleteLabelValues(ps, "read")
	c.m.generation.DeleteLabelValues(ps, "write")
}

// takeUnchecked reports whether the partition's state came from the store
// since it was last checked, and marks it checked; and whether that state
// is of a recount another member started meanwhile (recounted).
func (c *Counter) takeUnchecked(p int) (unchecked, recounted bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	u, r := c.unchecked[p], c.recounted[p]
	delete(c.unchecked, p)
	delete(c.recounted, p)
	return u, r
}

// replay is a partition's stretch of events the store lost: from the
// first the counter asked for again to the batch that asked, excluded.
type replay struct{ from, until uint64 }

// has reports whether seq is one of the events the store lost.
func (r replay) has(seq uint64) bool { return seq >= r.from && seq < r.until }

// setReplay records that partition p asked for its events again from
// from, before the batch at until. A stretch recorded before that reaches
// past from is joined to it: the events of it the store has not counted
// are still events it lost (the store lost writes again during the
// catch-up); one that ends before from is over, and replaced.
func (c *Counter) setReplay(p int, from, until uint64) replay {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.joinReplay(p, replay{from, until})
	return c.replays[p]
}

// joinReplay is setReplay with c.mu held. A stretch that ends before the
// recorded one is over (the recorded one came later), and changes nothing.
func (c *Counter) joinReplay(p int, r replay) {
	old, ok := c.replays[p]
	switch {
	case ok && old.until > r.from && r.until > old.from:
		r = replay{min(old.from, r.from), max(old.until, r.until)}
	case ok && r.until <= old.from:
		return
	}
	c.replays[p] = r
}

// trimReplay drops from partition p's record of a replay the events at or
// below the store's watermark wm, just read: they are counted (by this
// member, or by another that held the partition meanwhile), and a recount
// that hands them again later is not handing them because the store lost
// them. The caller holds c.mu.
func (c *Counter) trimReplay(p int, wm uint64) {
	r, ok := c.replays[p]
	if !ok {
		return
	}
	if r.from = max(r.from, wm+1); r.from >= r.until {
		delete(c.replays, p)
		return
	}
	c.replays[p] = r
}

// replayDone drops partition p's record of a replay: the events it asked
// for again have all come.
func (c *Counter) replayDone(p int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.replays, p)
}

// replayOf returns partition p's record of a replay (until 0: none).
func (c *Counter) replayOf(p int) replay {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.replays[p]
}

func (c *Counter) markUnchecked(p int) {
	c.mu.Lock()
	c.unchecked[p] = true
	c.mu.Unlock()
}

// markRecounted records that partition p's state was read again into a
// recount another member started (see recounted).
func (c *Counter) markRecounted(p int) {
	c.mu.Lock()
	c.recounted[p] = true
	c.mu.Unlock()
}

// metrics are the counter's Prometheus collectors.
type metrics struct {
	counted      *prometheus.CounterVec
	duplicates   *prometheus.CounterVec
	retries      *prometheus.CounterVec
	corrections  *prometheus.CounterVec
	recounts     *prometheus.CounterVec
	missed       *prometheus.CounterVec
	replicaShort *prometheus.CounterVec
	linkEvents   *prometheus.CounterVec
	writeTime    prometheus.Histogram
	generation   *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		counted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "snip_clickcounter_counted_total",
			Help: "Click events counted, by the label they were counted with, by the writes of this member that Redis applied (one whose answer was lost once the member finds its token beside the watermark: see the README).",
		}, []string{"label"}),
		duplicates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "snip_clickcounter_duplicates_total",
			Help: "Click events skipped as already counted: kind=watermark (redelivery, replay overlap) or event_id (the same event stored twice).",
		}, []string{"kind"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "snip_clickcounter_write_retries_total",
			Help: "Writes redone: reason=conflict (the partition's state changed under a click batch), recheck (duplicates or verdict labels found by the write), verdict_conflict (a partition's generations changed under a verdict batch).",
		}, []string{"reason"}),
		corrections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "snip_clickcounter_corrections_total",
			Help: "Fraud verdicts handled: result=relabelled (applied), unchanged, stale (older than one applied), expired (click past retention), not_counted (click stored in another partition than its code hashes to: never counted).",
		}, []string{"result"}),
		recounts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "snip_clickcounter_recounts_total",
			Help: "Recounts per partition: result=started, finished (switched to the new generation), partial_ignored (a replay that did not start at the oldest event), nothing_retained (a replay of a partition CLICKS retains nothing of, whose counts were kept), not_replayed (a replay the runtime did not move the partition back for, whose counts were kept), restarted (a start the store lost, found by the member counting it and made again), lost (a start the store lost that could not be made again: CLICKS retains nothing of the partition).",
		}, []string{"result"}),
		missed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "snip_clickcounter_missed_events_total",
			Help: "Events handed again from CLICKS because the store's watermark was behind the batch being counted (Redis lost its last writes, e.g. a failover to a replica that had not received them): result=read.",
		}, []string{"result"}),
		replicaShort: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "snip_clickcounter_replica_wait_short_total",
			Help: "Feed batches (feed: verdicts, links) whose writes the Redis replicas did not confirm within CLICKCOUNTER_WAIT_REPLICAS_TIMEOUT before the ack, and recount starts (feed=recount) not confirmed before the consumer moves back: acked or moved all the same, on the master alone until its replicas catch up.",
		}, []string{"feed"}),
		linkEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "snip_clickcounter_link_events_total",
			Help: "LINKS events handled: result=applied or stale.",
		}, []string{"result"}),
		writeTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "snip_clickcounter_batch_write_seconds",
			Help:    "Time to write one batch to Redis (one script call, retries included).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		generation: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "snip_clickcounter_generation",
			Help: "Count generation per partition this member owns: role=read (served by the stats API) and role=write (being counted into; higher than read during a recount).",
		}, []string{"partition", "role"}),
	}
	// Exported at 0 from the start, so that the first loss is an increase
	// an alert sees (a series that appears already at N has none).
	m.missed.WithLabelValues("read")
	if reg != nil {
		for _, col := range []prometheus.Collector{m.counted, m.duplicates, m.retries, m.corrections, m.recounts, m.missed, m.replicaShort, m.linkEvents, m.writeTime, m.generation} {
			if err := reg.Register(col); err != nil {
				return nil, fmt.Errorf("register metrics: %w", err)
			}
		}
	}
	return m, nil
}

func (m *metrics) observeState(p int, s State) {
	ps := strconv.Itoa(p)
	m.generation.WithLabelValues(ps, "read").Set(float64(s.Read))
	m.generation.WithLabelValues(ps, "write").Set(float64(s.Write))
}
