package outbox

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// CommitterConfig tunes the group commit.
type CommitterConfig struct {
	// MaxBatch is the most clicks written in one Redis round trip.
	MaxBatch int
	// Workers is how many batches may be in flight at once. One is the
	// classic group commit; two overlap one batch's round trip with the next
	// batch's collection.
	Workers int
	// MaxEntries is the most entries one shard's clicks lane may hold; at
	// that depth Append returns ErrFull without writing. The depth is
	// measured (XLEN in the commit's pipeline) on every commit once the
	// estimate reaches half of it, and at least every second below that.
	MaxEntries int64
	// Linger is how long a worker waits for more clicks, after the first of
	// a batch, before it writes them (Postgres's commit_delay, Kafka's
	// linger.ms), so that the clicks of a busy moment share fewer Redis
	// round trips. It waits only when that first click came less than
	// Linger after the click before it: while clicks arrive that densely
	// the wait fills the batch; a lone click is written at once, as with
	// 0, which never waits. A redirect waits at most Linger longer.
	Linger time.Duration
	// Timeout bounds one batch's Redis round trip.
	Timeout time.Duration
	// Cooldown is how long Append fails fast with ErrUnavailable after a
	// batch failed for a connection error, instead of queueing requests
	// behind a dead Redis. The first Append after it probes again.
	Cooldown time.Duration
	// WaitReplicas, when above 0, makes each batch wait for that many
	// replicas of each Redis master it wrote to (WAIT on the connection of
	// the master's XADDs, in the same pipeline) for at most WaitTimeout. A
	// click whose master's replicas fell short is stored, but its Wait
	// returns ErrNotReplicated with the stored time, so the caller can record
	// it elsewhere too. 0: no WAIT (replication stays asynchronous).
	WaitReplicas int
	WaitTimeout  time.Duration
	// Written, if set, is told the stream ID of every click Redis stored,
	// so shutdown can wait for this instance's clicks to be relayed.
	Written *Written
}

// Committer writes clicks into the clicks lane in group commits: concurrent
// requests' clicks are collected by a few workers and written many per Redis
// round trip (a pipeline of XADDs), and each request waits for its own
// click's result. A request sends its 302 only after Append returned nil, so
// every click a browser was told about is in Redis.
//
// The pipeline is not a transaction: each XADD succeeds or fails on its own,
// and each request gets its own XADD's result.
//
// With CommitterConfig.WaitReplicas a batch is sent as one pipeline per
// Redis master it touches (on Redis Cluster the shards' hash tags spread
// them over the masters), each ending with WAIT, because WAIT counts the
// replicas that have every write of its own connection.
type Committer struct {
	rdb    redis.UniversalClient
	layout Layout
	cfg    CommitterConfig
	m      *Metrics

	reqs      chan *pending
	depth     []atomic.Int64 // per shard, clicks lane: an estimate, measured (XLEN, the monitor) and counted up by every batch
	measured  []atomic.Int64 // per shard: unix nanos of the last measured depth
	alwaysLen bool           // XLEN every shard on every commit (benchmarks compare)
	downUntil atomic.Int64   // unix nanos until which Append fails fast
	lastAt    atomic.Int64   // unix nanos of the latest Submit (Linger)
	pool      sync.Pool
	stop      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
}

type pending struct {
	shard    int
	id       rawArg
	subject  rawArg
	data     rawArg
	until    rawArg   // the entry's validity (Unix ms), as decimal text
	dense    bool     // submitted less than Linger after the click before it
	untilBuf [20]byte // backs until
	args     []any    // the XADD command, rebuilt in place for every use
	stored   int64    // Unix ms of the stream ID Redis assigned
	short    error    // its master's WAIT fell short (WaitReplicas)
	err      error
	done     chan struct{}
}

// rawArg hands a byte slice to go-redis without boxing the slice header
// into an interface per command (an allocation): a pointer to a pooled
// rawArg is boxed for free, and go-redis writes it via MarshalBinary.
type rawArg struct{ b []byte }

// MarshalBinary returns the bytes as they are.
func (r *rawArg) MarshalBinary() ([]byte, error) { return r.b, nil }

// NewCommitter returns a committer; Start starts its workers.
func NewCommitter(rdb redis.UniversalClient, layout Layout, cfg CommitterConfig, m *Metrics) *Committer {
	if cfg.MaxBatch < 1 {
		cfg.MaxBatch = 1
	}
	if cfg.Workers < 1 {
		cfg.Workers = 1
	}
	if cfg.WaitReplicas > 0 && cfg.WaitTimeout < time.Millisecond {
		cfg.WaitTimeout = time.Millisecond // WAIT n 0 would block until n replicas answer
	}
	c := &Committer{
		rdb: rdb, layout: layout, cfg: cfg, m: m,
		reqs:  make(chan *pending, cfg.MaxBatch*cfg.Workers),
		depth: make([]atomic.Int64, layout.Shards), measured: make([]atomic.Int64, layout.Shards),
		stop: make(chan struct{}),
	}
	c.pool.New = func() any { return &pending{done: make(chan struct{}, 1)} }
	return c
}

// Start starts the workers.
func (c *Committer) Start() {
	for range c.cfg.Workers {
		c.wg.Add(1)
		go c.work()
	}
}

// Close stops the workers after they have written every click queued so far.
// Call it after the HTTP server has stopped, so nothing appends any more.
func (c *Committer) Close() {
	c.closeOnce.Do(func() { close(c.stop) })
	c.wg.Wait()
}

// SetDepth records a sampled depth of a shard's clicks lane.
func (c *Committer) SetDepth(shard int, n int64) {
	c.depth[shard].Store(n)
	c.measured[shard].Store(time.Now().UnixNano())
}

// Append writes one click into shard's clicks lane without a validity and
// returns once Redis has it (nil), or why not: ErrFull (not attempted),
// ErrUnavailable (Redis failed; the entry may or may not be stored),
// ErrNotReplicated (stored on the master only; see WaitReplicas),
// ErrClosed, or ctx's error (the click may still be written). The slices are
// only read until Append returns.
func (c *Committer) Append(ctx context.Context, shard int, id, subject, data []byte) error {
	t, err := c.Submit(ctx, shard, id, subject, data, 0)
	if err != nil {
		return err
	}
	_, err = t.Wait(ctx)
	if t.Done() {
		t.Release()
	}
	return err
}

// Ticket is one click handed to the committer: Wait for its outcome, as
// often as needed, and Release it once Done.
type Ticket struct {
	c      *Committer
	p      *pending
	done   bool
	stored int64
	err    error
}

// Submit queues one click for shard's clicks lane with the entry field
// until (Unix ms; 0: none): the relay publishes the entry only if Redis
// stored it no later than that (Late). It fails fast with ErrFull (the lane
// is at its bound), ErrUnavailable (Redis failed moments ago), ErrClosed, or
// ctx's error when the queue stays full until ctx ends. The slices must stay
// unchanged until the ticket is Done: a worker may read them until then.
func (c *Committer) Submit(ctx context.Context, shard int, id, subject, data []byte, until int64) (Ticket, error) {
	return c.SubmitBy(ctx, time.Time{}, shard, id, subject, data, until)
}

// SubmitBy is Submit whose wait for room in a full queue also ends at
// deadline (zero: none), with context.DeadlineExceeded. With WaitBy it
// bounds a click's wait for the outbox without a context of its own: the
// redirect's hot path spared a timer context (its timer, done channel and
// entry in the request context's children) a click.
func (c *Committer) SubmitBy(ctx context.Context, deadline time.Time, shard int, id, subject, data []byte, until int64) (Ticket, error) {
	if c.depth[shard].Load() >= c.cfg.MaxEntries {
		c.m.Rejected.WithLabelValues("full").Inc()
		return Ticket{}, ErrFull
	}
	now := time.Now().UnixNano()
	if now < c.downUntil.Load() {
		c.m.Rejected.WithLabelValues("unavailable").Inc()
		return Ticket{}, fmt.Errorf("append click: redis failed recently: %w", ErrUnavailable)
	}
	p := c.pool.Get().(*pending)
	p.shard, p.id.b, p.subject.b, p.data.b, p.err, p.short, p.stored = shard, id, subject, data, nil, nil, 0
	p.dense = c.cfg.Linger > 0 && now-c.lastAt.Swap(now) < int64(c.cfg.Linger)
	p.until.b = nil
	if until > 0 {
		p.until.b = strconv.AppendInt(p.untilBuf[:0], until, 10)
	}
	select {
	case c.reqs <- p:
		return Ticket{c: c, p: p}, nil
	default:
	}
	var expired <-chan time.Time
	if !deadline.IsZero() {
		tm := getTimer(time.Until(deadline))
		defer putTimer(tm)
		expired = tm.C
	}
	select {
	case c.reqs <- p:
		return Ticket{c: c, p: p}, nil
	case <-c.stop:
		c.pool.Put(p)
		return Ticket{}, ErrClosed
	case <-ctx.Done():
		c.pool.Put(p)
		return Ticket{}, ctx.Err()
	case <-expired:
		c.pool.Put(p)
		return Ticket{}, context.DeadlineExceeded
	}
}

// Wait returns the Unix ms of the stream ID Redis gave the entry, or why it
// was not written (ErrUnavailable: Redis failed, the entry may or may not be
// stored), or ctx's error when the outcome is not known by then; Wait may
// then be called again. With WaitReplicas, an entry stored on its master but
// not acknowledged by enough replicas in time returns its stored time and
// an error wrapping ErrNotReplicated.
func (t *Ticket) Wait(ctx context.Context) (int64, error) {
	return t.WaitBy(ctx, time.Time{})
}

// WaitBy is Wait that also gives up at deadline (zero: none), with
// context.DeadlineExceeded (the outcome not known by then; WaitBy or Wait
// may be called again).
func (t *Ticket) WaitBy(ctx context.Context, deadline time.Time) (int64, error) {
	if t.done {
		return t.stored, t.err
	}
	select {
	case <-t.p.done:
		t.done, t.stored, t.err = true, t.p.stored, t.p.err
		return t.stored, t.err
	default:
	}
	var expired <-chan time.Time // nil without a deadline: never ready
	if !deadline.IsZero() {
		tm := getTimer(time.Until(deadline))
		defer putTimer(tm)
		expired = tm.C
	}
	select {
	case <-t.p.done:
		t.done, t.stored, t.err = true, t.p.stored, t.p.err
		return t.stored, t.err
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-expired:
		return 0, context.DeadlineExceeded
	}
}

// timers are reused by SubmitBy and WaitBy. A stopped timer's channel holds
// no stale tick (Go 1.23's timers), so Reset makes it as good as new.
var timers sync.Pool

func getTimer(d time.Duration) *time.Timer {
	if tm, ok := timers.Get().(*time.Timer); ok {
		tm.Reset(d)
		return tm
	}
	return time.NewTimer(d)
}

func putTimer(tm *time.Timer) {
	tm.Stop()
	timers.Put(tm)
}

// Submitted reports whether the ticket came from a successful Submit.
func (t *Ticket) Submitted() bool { return t.p != nil }

// Done reports whether the outcome is known (the worker is done with the
// click's slices).
func (t *Ticket) Done() bool { return t.done }

// Release returns a Done ticket's resources for reuse; a ticket that is not
// Done is left to the garbage collector (its worker still holds it).
func (t *Ticket) Release() {
	if t.p != nil && t.done {
		t.p.id.b, t.p.subject.b, t.p.data.b, t.p.until.b = nil, nil, nil, nil
		t.c.pool.Put(t.p)
	}
	t.p = nil
}

func (c *Committer) work() {
	defer c.wg.Done()
	batch := make([]*pending, 0, c.cfg.MaxBatch)
	cmds := make([]*redis.StringCmd, 0, c.cfg.MaxBatch)
	shards := make(map[int]*redis.IntCmd)
	var linger *time.Timer
	if c.cfg.Linger > 0 {
		linger = time.NewTimer(time.Hour)
		linger.Stop()
	}
	for {
		var first *pending
		select {
		case first = <-c.reqs:
		case <-c.stop:
			// Drain what was queued before the stop.
			select {
			case first = <-c.reqs:
			default:
				return
			}
		}
		batch = c.gather(append(batch[:0], first), linger)
		cmds = cmds[:0]
		clear(shards)
		c.commit(batch, cmds, shards)
	}
}

// gather adds the queued clicks to batch, up to MaxBatch, and returns it.
// When batch's first click came densely (Linger), it waits up to Linger
// for more.
func (c *Committer) gather(batch []*pending, linger *time.Timer) []*pending {
	var timeout <-chan time.Time
	if linger != nil && batch[0].dense {
		linger.Reset(c.cfg.Linger)
		defer linger.Stop()
		timeout = linger.C
	}
	for len(batch) < c.cfg.MaxBatch {
		select {
		case p := <-c.reqs:
			batch = append(batch, p)
			continue
		default:
		}
		if timeout == nil {
			return batch
		}
		select {
		case p := <-c.reqs:
			batch = append(batch, p)
		case <-timeout:
			return batch
		case <-c.stop:
			return batch
		}
	}
	return batch
}

func (c *Committer) commit(batch []*pending, cmds []*redis.StringCmd, shards map[int]*redis.IntCmd) {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.Timeout)
	defer cancel()
	start := time.Now()
	var err error
	if c.cfg.WaitReplicas > 0 {
		cmds, err = c.execWaiting(ctx, batch, cmds, shards)
	} else {
		pipe := c.rdb.Pipeline()
		cmds = c.queue(ctx, pipe, batch, cmds, shards)
		_, err = pipe.Exec(ctx)
	}
	c.m.CommitDuration.Observe(time.Since(start).Seconds())
	c.m.BatchSize.Observe(float64(len(batch)))
	if err != nil {
		c.downUntil.Store(time.Now().Add(c.cfg.Cooldown).UnixNano())
	} else {
		c.downUntil.Store(0)
	}
	now := time.Now().UnixNano()
	for s, cmd := range shards {
		if cmd.Err() == nil {
			c.depth[s].Store(cmd.Val())
			c.measured[s].Store(now)
		}
	}
	c.counted(batch, cmds, shards)
	for i, p := range batch {
		if e := cmds[i].Err(); e != nil {
			c.m.Rejected.WithLabelValues("unavailable").Inc()
			p.err = fmt.Errorf("append click: %w: %w", ErrUnavailable, e)
		} else {
			p.stored = streamIDMillis(cmds[i].Val())
			c.cfg.Written.Note(p.shard, LaneClicks, cmds[i].Val())
			if p.short != nil {
				p.err = fmt.Errorf("append click: %w", p.short)
			}
		}
		p.done <- struct{}{}
	}
}

// queue adds the XADDs of batch (and an XLEN of each shard written) to
// pipe, appending one command per click to cmds, and returns cmds.
func (c *Committer) queue(ctx context.Context, pipe redis.Pipeliner, batch []*pending, cmds []*redis.StringCmd, shards map[int]*redis.IntCmd) []*redis.StringCmd {
	for _, p := range batch {
		cmds = append(cmds, c.xadd(ctx, pipe, p))
	}
	now := time.Now().UnixNano()
	for _, p := range batch {
		c.queueLen(ctx, pipe, p.shard, shards, now)
	}
	return cmds
}

// queueLen adds to pipe the XLEN of shard, once per commit (lens holds those
// queued), when needsLen says the depth must be measured: the depth of each
// shard written comes in the same round trip.
func (c *Committer) queueLen(ctx context.Context, pipe redis.Pipeliner, shard int, lens map[int]*redis.IntCmd, now int64) {
	if _, ok := lens[shard]; !ok && c.needsLen(shard, now) {
		lens[shard] = pipe.XLen(ctx, c.layout.OutboxKey(shard, LaneClicks))
	}
}

// needsLen reports whether a commit must measure shard's depth (XLEN): when
// the estimate (the last measured depth, plus what this committer wrote
// since) has reached half the bound, or when it is older than lenEvery. Far
// below the bound the XLEN changes nothing Submit decides, and costs Redis a
// command per shard per batch; the monitor's sample (SetDepth) and lenEvery
// bring in what other instances wrote.
func (c *Committer) needsLen(shard int, now int64) bool {
	return c.alwaysLen || c.depth[shard].Load() >= c.cfg.MaxEntries/2 ||
		now-c.measured[shard].Load() > int64(lenEvery)
}

// lenEvery bounds the age of a shard's depth estimate: the fullness check
// sees other instances' writes at least this often, even without a monitor.
const lenEvery = time.Second

// counted adds n clicks written to shard's estimate, unless an XLEN of the
// same commit measured it.
func (c *Committer) counted(batch []*pending, cmds []*redis.StringCmd, shards map[int]*redis.IntCmd) {
	for i, p := range batch {
		if _, measured := shards[p.shard]; !measured && cmds[i].Err() == nil {
			c.depth[p.shard].Add(1)
		}
	}
}

// xadd queues p's XADD on pipe.
func (c *Committer) xadd(ctx context.Context, pipe redis.Pipeliner, p *pending) *redis.StringCmd {
	// XADD key * id <id> subject <subject> data <data>, as outbox.Add
	// writes it, built without per-click allocations.
	p.args = append(p.args[:0], "xadd", c.layout.boxedKey(p.shard, LaneClicks), "*",
		fieldID, &p.id, fieldSubject, &p.subject, fieldData, &p.data)
	if p.until.b != nil {
		p.args = append(p.args, fieldUntil, &p.until)
	}
	cmd := redis.NewStringCmd(ctx, p.args...)
	_ = pipe.Process(ctx, cmd)
	return cmd
}

// masterBatch is the part of a batch one Redis master stores.
type masterBatch struct {
	node *redis.Client // nil: c.rdb itself (one server)
	idx  []int         // positions in the batch
	wait *redis.IntCmd
}

// execWaiting writes batch with one pipeline per master, each ending with
// WAIT, and fills cmds (one per click, in batch order). A click whose
// master's WAIT counted fewer than WaitReplicas replicas keeps its stream ID
// but gets ErrNotReplicated. It returns an error when a master failed
// (connection, timeout), for the cooldown.
func (c *Committer) execWaiting(ctx context.Context, batch []*pending, cmds []*redis.StringCmd, shards map[int]*redis.IntCmd) ([]*redis.StringCmd, error) {
	cmds = cmds[:len(batch)]
	clear(cmds)
	cc, cluster := c.rdb.(*redis.ClusterClient)
	var groups []*masterBatch
	if !cluster {
		g := &masterBatch{idx: make([]int, len(batch))}
		for i := range batch {
			g.idx[i] = i
		}
		groups = append(groups, g)
	} else {
		byNode := map[*redis.Client]*masterBatch{}
		byShard := map[int]*masterBatch{}
		for i, p := range batch {
			g, ok := byShard[p.shard]
			if !ok {
				node, err := cc.MasterForKey(ctx, c.layout.OutboxKey(p.shard, LaneClicks))
				if err != nil {
					cmd := redis.NewStringCmd(ctx)
					cmd.SetErr(fmt.Errorf("master of shard %d: %w", p.shard, err))
					cmds[i] = cmd
					continue
				}
				if g = byNode[node]; g == nil {
					g = &masterBatch{node: node}
					byNode[node] = g
					groups = append(groups, g)
				}
				byShard[p.shard] = g
			}
			g.idx = append(g.idx, i)
		}
	}
	errs := make([]error, len(groups))
	now := time.Now().UnixNano()
	var wg sync.WaitGroup
	var smu sync.Mutex
	for gi, g := range groups {
		var pipe redis.Pipeliner
		if g.node != nil {
			pipe = g.node.Pipeline()
		} else {
			pipe = c.rdb.Pipeline()
		}
		local := map[int]*redis.IntCmd{}
		for _, i := range g.idx {
			cmds[i] = c.xadd(ctx, pipe, batch[i])
		}
		for _, i := range g.idx {
			c.queueLen(ctx, pipe, batch[i].shard, local, now)
		}
		g.wait = redis.NewIntCmd(ctx, "wait", c.cfg.WaitReplicas, c.cfg.WaitTimeout.Milliseconds())
		_ = pipe.Process(ctx, g.wait)
		wg.Go(func() {
			_, errs[gi] = pipe.Exec(ctx)
			smu.Lock()
			maps.Copy(shards, local)
			smu.Unlock()
		})
	}
	wg.Wait()
	var failed error
	for gi, g := range groups {
		if errs[gi] != nil && failed == nil {
			failed = errs[gi]
		}
		if errs[gi] != nil && cluster {
			// A MOVED or a dead master: read the slot map again now rather
			// than after the client's reload interval.
			cc.ReloadState(ctx)
		}
		n, werr := g.wait.Val(), g.wait.Err()
		if werr == nil && n >= int64(c.cfg.WaitReplicas) {
			continue
		}
		short := fmt.Errorf("%w: WAIT %d answered %d", ErrNotReplicated, c.cfg.WaitReplicas, n)
		if werr != nil {
			short = fmt.Errorf("%w: WAIT %d: %w", ErrNotReplicated, c.cfg.WaitReplicas, werr)
		}
		for _, i := range g.idx {
			batch[i].short = short
		}
	}
	if failed == nil {
		for _, cmd := range cmds {
			if cmd.Err() != nil {
				failed = cmd.Err()
				break
			}
		}
	}
	return cmds, failed
}
