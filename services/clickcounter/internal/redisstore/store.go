// Package redisstore keeps the click counter's counts in Redis: one Lua
// script per batch writes a batch's aggregated increments together with the
// partition's watermark and its recent-ID record, so a batch is counted
// entirely or not at all, and exactly once.
//
// Keys are listed in keys.go and in the service README, with their bounds.
// Every key of a partition carries the hash tag {p<N>}, so the store works on
// Redis Cluster (each partition's keys live in one slot).
package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/services/clickcounter/internal/counter"
)

// Store implements counter.Store on Redis.
type Store struct {
	rdb redis.UniversalClient

	// expiring remembers, per partition, the day and visitor keys that an
	// applied batch gave their expiry (key -> the unix time it expires at),
	// so later batches leave out their "x" op: one EXPIREAT fewer per link
	// and day when the hour field or the HyperLogLog is new, which in a
	// spread catch-up is most links of a batch. A key keeps an expiry once
	// set (HINCRBY and PFADD keep it) until it expires at that time or its
	// generation is dropped, and a dropped generation is never written
	// again; an entry is trusted only before its time. Data lost by Redis
	// (a failover, a restart losing the last second) would also lose the
	// watermark: the next write conflicts and reloads the state, and both
	// forget the partition's entries.
	mu       sync.Mutex
	expiring map[int]map[string]int64

	// The replica wait of Replicated (WaitForReplicas): off when waitN is 0.
	waitN       int
	waitTimeout time.Duration

	// applies holds the *args of applied batches, emptied, for the next
	// batch of any partition (at most maxApplies): a batch's keys and
	// arguments are thousands of entries, and go-redis copies them into
	// its command. Not a sync.Pool, which drops what it holds at every
	// garbage collection, every few batches in a catch-up.
	applies chan *args
}

// maxApplies bounds the batches' arguments a store keeps for the next
// batches: as many as partitions are written at once, up to 16.
const maxApplies = 16

// maxExpiring bounds the keys remembered per partition; beyond it the
// partition's entries are forgotten (the next batches set their expiries
// again). 20,000 is two keys for each of 10,000 links, a day.
const maxExpiring = 20_000

var _ counter.Store = (*Store)(nil)

// New returns a store on rdb.
func New(rdb redis.UniversalClient) *Store {
	return &Store{rdb: rdb, expiring: map[int]map[string]int64{}, applies: make(chan *args, maxApplies)}
}

// hasExpiry reports whether an applied batch gave key its expiry at, and
// that time is still ahead.
func (s *Store) hasExpiry(p int, key string, at int64, now int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	got, ok := s.expiring[p][key]
	return ok && got == at && now < at
}

// rememberExpiries records the keys an applied batch gave their expiry.
func (s *Store) rememberExpiries(p int, keys map[string]int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.expiring[p]
	if m == nil || len(m)+len(keys) > maxExpiring {
		m = make(map[string]int64, len(keys))
		s.expiring[p] = m
	}
	for k, at := range keys {
		m[k] = at
	}
}

// forgetExpiries drops what is remembered of partition p.
func (s *Store) forgetExpiries(p int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.expiring, p)
}

// State reads the partition's generations and the write generation's
// watermark. It forgets the expiries remembered for the partition: the
// counter reads the state when it takes a partition over and after a
// conflict, the moments where Redis may hold something else than this
// process last wrote.
func (s *Store) State(ctx context.Context, p int) (counter.State, error) {
	s.forgetExpiries(p)
	st, err := s.meta(ctx, s.rdb, p)
	if err != nil {
		return counter.State{}, err
	}
	v, err := s.rdb.HMGet(ctx, posKey(p, st.Write), "seq", "lost_from", "lost_until", "tok").Result()
	if err != nil {
		return counter.State{}, fmt.Errorf("read partition %d watermark: %w", p, err)
	}
	st.Token, _ = v[3].(string)
	for i, into := range []*uint64{&st.WM, &st.LostFrom, &st.LostUntil} {
		str, ok := v[i].(string)
		if !ok {
			continue
		}
		if *into, err = strconv.ParseUint(str, 10, 64); err != nil {
			return counter.State{}, fmt.Errorf("read partition %d watermark: %w", p, err)
		}
	}
	return st, nil
}

// MarkLost records the stretch of events the store lost in the write
// generation's pos (see counter.Store).
func (s *Store) MarkLost(ctx context.Context, p int, write int64, from, until uint64) error {
	if err := s.rdb.HSet(ctx, posKey(p, write), "lost_from", from, "lost_until", until).Err(); err != nil {
		return fmt.Errorf("record partition %d's lost events %d to %d: %w", p, from, until, err)
	}
	return nil
}

func (s *Store) meta(ctx context.Context, c redis.Cmdable, p int) (counter.State, error) {
	v, err := c.HMGet(ctx, metaKey(p), "read", "write", "until", "replay").Result()
	if err != nil {
		return counter.State{}, fmt.Errorf("read partition %d meta: %w", p, err)
	}
	return parseMeta(v)
}

func parseMeta(v []any) (counter.State, error) {
	st := counter.State{Read: 1, Write: 1}
	var err error
	num := func(x any, into *int64) {
		if str, ok := x.(string); ok && err == nil {
			*into, err = strconv.ParseInt(str, 10, 64)
		}
	}
	num(v[0], &st.Read)
	num(v[1], &st.Write)
	var until int64
	num(v[2], &until)
	st.Until = uint64(until)
	if str, ok := v[3].(string); ok {
		st.Replay = str
	}
	if err != nil {
		return counter.State{}, fmt.Errorf("parse meta %v: %w", v, err)
	}
	return st, nil
}

// args builds a script's KEYS and ARGV, giving each distinct key one index.
type args struct {
	keys []string
	idx  map[string]int
	argv []any
	// order is the apply script's: its marks' order (applyArgsInto).
	order []int
	// fields caches the link fields of the batches built in these args
	// (comboField), kept across them: a batch names the same few hundred
	// (label, country, referrer) fields for link after link.
	fields map[fieldKey]string
}

// fieldKey is a link field's parts; its strings are the cached field's
// own, never a click's.
type fieldKey struct {
	l             counter.Label
	country, host string
}

// maxCachedFields bounds an args' field cache: beyond it, it starts over.
const maxCachedFields = 4096

// field returns comboField(l, country, host), from the cache if there.
func (a *args) field(l counter.Label, country, host string) string {
	if f, ok := a.fields[fieldKey{l, country, host}]; ok {
		return f
	}
	f := comboField(l, country, host)
	if a.fields == nil || len(a.fields) >= maxCachedFields {
		a.fields = make(map[fieldKey]string, 64)
	}
	// The key's strings are cut from f: the click's may share the memory of
	// the message it was read from, which the cache must not keep.
	a.fields[fieldKey{l, f[2 : 2+len(country)], f[3+len(country):]}] = f
	return f
}

func newArgs(keys ...string) *args {
	return newArgsSized(0, keys...)
}

// newArgsSized is newArgs with room for nkeys keys, so a batch's hundreds
// of them are not copied as the slice grows; the index is sized for the
// few keys that go through it (key: the apply script's ops add theirs
// without it).
func newArgsSized(nkeys int, keys ...string) *args {
	nkeys += len(keys)
	a := &args{idx: make(map[string]int, len(keys)), keys: make([]string, 0, nkeys)}
	for _, k := range keys {
		a.key(k)
	}
	return a
}

// opsSize counts the keys and arguments addOps gives d: per link its key;
// per day its key, the visitors' key if it has visitors, and a group of
// five arguments, two per field of the link (on its first day) and of the
// day (human and bot counted apart), and the visitors.
func opsSize(d *counter.Delta) (keys, argv int) {
	for i := range d.Links {
		ld := &d.Links[i]
		keys++
		for _, n := range d.Combos(ld) {
			argv += pairArgs(n)
		}
		for dd := range d.Days(ld) {
			keys++
			argv += 5
			for _, n := range dd.Hours {
				argv += pairArgs(n)
			}
			if dd.NumVisitors > 0 {
				keys++
				argv += dd.NumVisitors
			}
		}
	}
	return keys, argv
}

// pairArgs is how many arguments the fields of a pair's labels take.
func pairArgs(n counter.Pair) int {
	k := 0
	if n.Human != 0 {
		k += 2
	}
	if n.Bot != 0 {
		k += 2
	}
	return k
}

// key returns the 1-based KEYS index of k, adding it if new.
func (a *args) key(k string) int {
	if i, ok := a.idx[k]; ok {
		return i
	}
	a.keys = append(a.keys, k)
	a.idx[k] = len(a.keys)
	return len(a.keys)
}

func (a *args) add(v ...any) { a.argv = append(a.argv, v...) }

// maxUnpack bounds the values the apply script spreads into one Redis
// command (Lua's unpack fails beyond about 8,000, and a script that fails
// halfway keeps what it wrote): it cuts visitor lists and label lookups
// into commands of this many (the 1,000 in applyScript).
const maxUnpack = 1000

// Apply writes one batch (see applyScript).
func (s *Store) Apply(ctx context.Context, w *counter.Write) (counter.ApplyResult, error) {
	p := w.Partition
	var a *args
	select {
	case a = <-s.applies:
	default:
		a = &args{idx: map[string]int{}}
	}
	defer func() {
		select {
		case s.applies <- a:
		default: // maxApplies kept already
		}
	}()
	order, expiries := s.applyArgsInto(a, w, time.Now().Unix())
	defer a.reset()
	res, err := applyScript.Run(ctx, s.rdb, a.keys, a.argv...).Slice()
	return s.applyResult(p, order, expiries, res, err)
}

// reset empties a for another batch, keeping its slices and index.
func (a *args) reset() {
	clear(a.keys)
	a.keys = a.keys[:0]
	clear(a.idx)
	clear(a.argv)
	a.argv = a.argv[:0]
	a.order = a.order[:0]
}

// applyArgs builds the apply script's keys and arguments for w, and
// returns them, the marks' order in them and the expiries their ops give
// (see addOps).
func (s *Store) applyArgs(w *counter.Write, now int64) (a *args, order []int, expiries map[string]int64) {
	a = &args{idx: map[string]int{}}
	order, expiries = s.applyArgsInto(a, w, now)
	return a, order, expiries
}

// applyArgsInto is applyArgs into a, empty, which it grows to the batch's
// size.
func (s *Store) applyArgsInto(a *args, w *counter.Write, now int64) (order []int, expiries map[string]int64) {
	p, g := w.Partition, w.Expect.Write
	opsKeys, opsArgv := opsSize(w.Delta)
	// Besides the ops' keys, one per recent-ID bucket and label day: a
	// few (a batch's IDs span its events' time of publishing).
	a.keys = slices.Grow(a.keys, opsKeys+16+3)
	a.key(metaKey(p))
	a.key(posKey(p, g))
	a.key(idIndexKey(p, g))

	// Marks sorted by ID time, so each dedup bucket and each label day is one
	// contiguous run; the script reports positions in this order.
	a.order = slices.Grow(a.order[:0], len(w.Marks))[:len(w.Marks)]
	order = a.order
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(i, j int) bool { return w.Marks[order[i]].Bucket < w.Marks[order[j]].Bucket })

	var idGroups, labelGroups []any
	nID, nLabel := 0, 0
	for start := 0; start < len(order); {
		b := w.Marks[order[start]].Bucket
		end := start
		blob := make([]byte, 0, 8*8)
		for end < len(order) && w.Marks[order[end]].Bucket == b {
			fp := w.Marks[order[end]].Fingerprint
			blob = append(blob, fp[:]...)
			end++
		}
		idGroups = append(idGroups, a.key(idKey(p, g, b)), start, string(blob))
		nID++
		start = end
	}
	for start := 0; start < len(order); {
		d := w.Marks[order[start]].LabelDay()
		end := start
		var ids strings.Builder
		ids.Grow(36 * (len(order) - start))
		assumed := make([]byte, 0, len(order)-start)
		for end < len(order) && w.Marks[order[end]].LabelDay() == d {
			m := w.Marks[order[end]]
			ids.WriteString(m.ID) // canonical, 36 bytes (counter.ParseID)
			if m.Assumed != 0 {
				assumed = append(assumed, byte(m.Assumed))
			} else {
				assumed = append(assumed, '-')
			}
			end++
		}
		labelGroups = append(labelGroups, a.key(labelKey(p, d)), start, end-start, ids.String(), string(assumed))
		nLabel++
		start = end
	}

	a.argv = slices.Grow(a.argv, 12+len(idGroups)+len(labelGroups)+opsArgv)
	a.add(g, w.Expect.WM, w.LastSeq, w.LastStored.UnixMilli(), w.Counted, w.DedupTTL.Milliseconds(),
		nID, nLabel, counter.MaxCombosPerLink, counter.OtherReferrer, w.FirstSeq, w.Token)
	a.add(idGroups...)
	a.add(labelGroups...)
	expiries = s.addOps(a, p, g, w.Delta, now)
	return order, expiries
}

// applyResult reads the apply script's answer.
func (s *Store) applyResult(p int, order []int, expiries map[string]int64, res []any, err error) (counter.ApplyResult, error) {
	if err != nil {
		return counter.ApplyResult{}, fmt.Errorf("apply batch: %w", err)
	}
	switch res[0] {
	case "ok":
		s.rememberExpiries(p, expiries)
		return counter.ApplyResult{Status: counter.Applied}, nil
	case "switched":
		s.rememberExpiries(p, expiries)
		return counter.ApplyResult{Status: counter.Applied, Switched: true}, nil
	case "conflict":
		s.forgetExpiries(p)
		return counter.ApplyResult{Status: counter.Conflict}, nil
	case "recheck":
		out := counter.ApplyResult{Status: counter.Recheck, Labels: map[int]counter.Label{}}
		for _, v := range res[1].([]any) {
			out.Duplicates = append(out.Duplicates, order[int(v.(int64))])
		}
		labs := res[2].([]any)
		for i := 0; i+1 < len(labs); i += 2 {
			var l counter.Label
			if str := labs[i+1].(string); str != "" {
				l = counter.Label(str[0])
			}
			out.Labels[order[int(labs[i].(int64))]] = l
		}
		return out, nil
	}
	return counter.ApplyResult{}, fmt.Errorf("apply batch: unexpected reply %v", res)
}

// addOps encodes a delta as the apply script's ops (see applyScript), one
// group per link and day, and returns the keys given an expiry, with it: a
// day whose keys an applied batch has already given that expiry gets 0
// instead (see Store.expiring). Each group's keys are added to KEYS in a
// row (the link's, on its first day, then the day's and the visitors'),
// so the group names them by one index.
func (s *Store) addOps(a *args, p int, g int64, d *counter.Delta, now int64) map[string]int64 {
	// A batch names hundreds of keys and fields: the arguments are built
	// with as few allocations as they take (boxed once where they repeat),
	// and each count is written in its place once known. The ops' keys
	// are each the batch's only use of them: they go to KEYS without the
	// index that dedups the others.
	expiries := map[string]int64{}
	gk := genKeys(genPrefix(p, g))
	var lastDay counter.Day
	var lastDayKey string
	var at int64
	var atArg any // at, boxed once a day
	for i := range d.Links {
		ld := &d.Links[i]
		first := true
		for dd := range d.Days(ld) {
			day := dd.Day
			if lastDayKey == "" || day != lastDay {
				lastDay, lastDayKey = day, day.Key()
				at = day.End().Add(counter.DayKeep).Unix()
				atArg = at
			}
			lkey, dkey, ukey := gk.linkDay(ld.Ref, lastDayKey, first, dd.NumVisitors > 0)
			if first {
				a.keys = append(a.keys, lkey)
			}
			a.keys = append(a.keys, dkey)
			if ukey != "" {
				a.keys = append(a.keys, ukey)
			}
			exp := boxedInts[0]
			if !s.hasExpiry(p, dkey, at, now) || ukey != "" && !s.hasExpiry(p, ukey, at, now) {
				exp = atArg
				expiries[dkey] = at
				if ukey != "" {
					expiries[ukey] = at
				}
			}
			dk := len(a.keys)
			if ukey != "" {
				dk--
			}
			a.add(boxInt(dk), exp, nil)
			nf := len(a.argv) - 1
			if first {
				for c, n := range d.Combos(ld) {
					if n.Human != 0 {
						a.add(a.field(counter.Human, c.Country, c.Referrer), boxInt64(n.Human))
					}
					if n.Bot != 0 {
						a.add(a.field(counter.Bot, c.Country, c.Referrer), boxInt64(n.Bot))
					}
				}
				first = false
			}
			a.argv[nf] = boxInt((len(a.argv) - nf - 1) / 2)
			a.add(nil)
			nh := len(a.argv) - 1
			for h, n := range dd.Hours { // the day's total is the sum of its hours
				if n.Human != 0 {
					a.add(hourFieldArgs[0][h], boxInt64(n.Human))
				}
				if n.Bot != 0 {
					a.add(hourFieldArgs[1][h], boxInt64(n.Bot))
				}
			}
			a.argv[nh] = boxInt((len(a.argv) - nh - 1) / 2)
			a.add(boxInt(dd.NumVisitors))
			for v := range d.Visitors(dd) {
				a.argv = append(a.argv, v)
			}
		}
	}
	return expiries
}

// hourFieldArgs are the day hash's field names, boxed once as script
// arguments: hourFieldArgs[0][7] = "h07" (Human), [1][7] = "b07" (Bot).
var hourFieldArgs = func() (out [2][24]any) {
	for i, l := range []counter.Label{counter.Human, counter.Bot} {
		for h := range 24 {
			out[i][h] = string(rune(l)) + twoDigits(h)
		}
	}
	return out
}()

// boxedInts are the small integers a batch's arguments repeat (key indexes,
// counts), boxed once: converting an int above 255 to any allocates.
var boxedInts = func() []any {
	out := make([]any, 4096)
	for i := range out {
		out[i] = int64(i)
	}
	return out
}()

func boxInt(i int) any { return boxInt64(int64(i)) }

func boxInt64(i int64) any {
	if i >= 0 && i < int64(len(boxedInts)) {
		return boxedInts[i]
	}
	return i
}

func twoDigits(n int) string {
	if n < 10 {
		return "0" + strconv.Itoa(n)
	}
	return strconv.Itoa(n)
}

// StartGeneration begins a recount (see startScript).
func (s *Store) StartGeneration(ctx context.Context, p int, replayID, token string, from, until uint64) (counter.State, bool, error) {
	res, err := startScript.Run(ctx, s.rdb, []string{metaKey(p)}, replayID, until, from, token).Slice()
	if err != nil {
		return counter.State{}, false, fmt.Errorf("start generation: %w", err)
	}
	st := counter.State{Read: res[1].(int64), Write: res[2].(int64), Until: uint64(res[3].(int64)), Replay: replayID}
	seq, err := s.rdb.HGet(ctx, posKey(p, st.Write), "seq").Uint64()
	if err != nil && !errors.Is(err, redis.Nil) {
		return counter.State{}, false, fmt.Errorf("start generation: %w", err)
	}
	st.WM = seq
	return st, res[0] == "started", nil
}

// Generations lists the generations that have keys, by scanning the
// partition's keys (a background job, after a recount or an assignment).
func (s *Store) Generations(ctx context.Context, p int) ([]int64, error) {
	seen := map[int64]bool{}
	pre := partPrefix(p) + "g"
	err := s.scan(ctx, genPattern(p), func(keys []string) error {
		for _, k := range keys {
			rest := strings.TrimPrefix(k, pre)
			num, _, ok := strings.Cut(rest, ":")
			if !ok {
				continue
			}
			if g, err := strconv.ParseInt(num, 10, 64); err == nil {
				seen[g] = true
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list generations of partition %d: %w", p, err)
	}
	out := make([]int64, 0, len(seen))
	for g := range seen {
		out = append(out, g)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out, nil
}

// DropGeneration deletes one generation's keys (UNLINK, so Redis frees
// them in the background).
func (s *Store) DropGeneration(ctx context.Context, p int, g int64) error {
	err := s.scan(ctx, genPrefix(p, g)+"*", func(keys []string) error {
		return s.rdb.Unlink(ctx, keys...).Err()
	})
	if err != nil {
		return fmt.Errorf("drop generation %d of partition %d: %w", g, p, err)
	}
	return nil
}

// scan calls fn with batches of keys matching pattern, on every primary
// of a cluster.
func (s *Store) scan(ctx context.Context, pattern string, fn func([]string) error) error {
	one := func(ctx context.Context, c redis.Cmdable) error {
		var cursor uint64
		for {
			keys, next, err := c.Scan(ctx, cursor, pattern, 1000).Result()
			if err != nil {
				return err
			}
			if len(keys) > 0 {
				if err := fn(keys); err != nil {
					return err
				}
			}
			if next == 0 {
				return nil
			}
			cursor = next
		}
	}
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return one(ctx, c) })
	}
	return one(ctx, s.rdb)
}

// Correct applies each partition's verdicts in one script call (see
// correctScript), all partitions in one pipeline: on Redis Cluster each
// call goes to its partition's slot.
func (s *Store) Correct(ctx context.Context, batches []*counter.Corrections) []counter.CorrectionsResult {
	calls := make([]scriptCall, len(batches))
	for k, b := range batches {
		calls[k] = correctCall(b)
	}
	out := make([]counter.CorrectionsResult, len(batches))
	for k, cmd := range s.runAll(ctx, correctScript, calls) {
		out[k] = correctResult(batches[k], cmd)
	}
	return out
}

// correctCall builds one partition's correctScript call.
func correctCall(b *counter.Corrections) scriptCall {
	p := b.Partition
	gens := []int64{b.Expect.Read}
	if b.Expect.Write != b.Expect.Read {
		gens = append(gens, b.Expect.Write)
	}
	a := newArgs(metaKey(p))
	for _, g := range gens {
		a.key(posKey(p, g))
	}
	a.add(b.Expect.Read, b.Expect.Write, len(gens), counter.MaxCombosPerLink)
	for i := range b.Items {
		c := &b.Items[i]
		a.add(a.key(labelKey(p, c.LabelDay)), c.ClickID, c.FraudSeq, string(rune(c.To)), string(rune(c.Source)),
			c.ClickSeq, c.LabelExpiry.Unix(), "|"+c.Country+"|"+c.Referrer, "|"+c.Country+"|"+counter.OtherReferrer, twoDigits(c.Hour),
			string(c.Mark.Fingerprint[:]))
		for _, g := range gens {
			a.add(a.key(linkKey(p, g, c.Link)), a.key(dayKey(p, g, c.Link, c.Day)), a.key(idKey(p, g, c.Mark.Bucket)))
		}
	}
	return scriptCall{keys: a.keys, argv: a.argv}
}

func correctResult(b *counter.Corrections, cmd *redis.Cmd) counter.CorrectionsResult {
	res, err := cmd.Slice()
	if err != nil {
		return counter.CorrectionsResult{Err: fmt.Errorf("correct partition %d: %w", b.Partition, err)}
	}
	if res[0] == "conflict" {
		return counter.CorrectionsResult{Conflict: true}
	}
	var st string
	if len(res) == 2 {
		st, _ = res[1].(string)
	}
	if res[0] != "ok" || len(st) != len(b.Items) {
		return counter.CorrectionsResult{Err: fmt.Errorf("correct partition %d: unexpected reply %v", b.Partition, res)}
	}
	items := make([]counter.CorrectionResult, len(st))
	for j := range len(st) {
		switch st[j] {
		case 's':
			items[j].Status = counter.Stale
		case 'u':
			items[j].Status = counter.Unchanged
		default:
			items[j] = counter.CorrectionResult{Status: counter.Relabelled, Moved: int(st[j] - '0')}
		}
	}
	return counter.CorrectionsResult{Items: items}
}

// ApplyLinkEvents records LINKS events (see linkScript), in one pipeline.
func (s *Store) ApplyLinkEvents(ctx context.Context, es []counter.LinkEvent) ([]bool, error) {
	calls := make([]scriptCall, len(es))
	for i, e := range es {
		calls[i] = scriptCall{keys: []string{registryKey(e.E.Code)},
			argv: []any{e.Seq, string(e.E.Kind), e.E.Owner, e.E.Time.UTC().Format(time.RFC3339Nano)}}
	}
	applied := make([]bool, len(es))
	for i, cmd := range s.runAll(ctx, linkScript, calls) {
		n, err := cmd.Int()
		if err != nil {
			return nil, fmt.Errorf("record link event: %w", err)
		}
		applied[i] = n == 1
	}
	return applied, nil
}

// ForgetLinks gives deleted links' counts their expiry (see forgetScript),
// in one pipeline.
func (s *Store) ForgetLinks(ctx context.Context, links []counter.DeletedLink) error {
	now := time.Now().Unix()
	calls := make([]scriptCall, len(links))
	for i, l := range links {
		calls[i] = scriptCall{keys: []string{metaKey(l.Partition), deletedKey(l.Partition)},
			argv: []any{deletedMember(l.Ref), l.Until.Unix(), now}}
	}
	for i, cmd := range s.runAll(ctx, forgetScript, calls) {
		if err := cmd.Err(); err != nil {
			return fmt.Errorf("expire the counts of deleted link %q: %w", links[i].Ref.Code, err)
		}
	}
	return nil
}

// deletedMember is a deleted link in deletedKey: its hash's name in a
// generation, less the generation's prefix.
func deletedMember(r counter.LinkRef) string { return "l:" + r.Owner + ":" + r.Code }

// ExpireDeletedLinks gives the hashes of the partition's deleted links, in
// its read and write generations, the expiry recorded for them (an
// EXPIREAT on a hash that does not exist does nothing), a page of the
// deleted set per pipeline.
func (s *Store) ExpireDeletedLinks(ctx context.Context, p int) error {
	st, err := s.meta(ctx, s.rdb, p)
	if err != nil {
		return err
	}
	gens := []int64{st.Read}
	if st.Write != st.Read {
		gens = append(gens, st.Write)
	}
	const page = 1000
	from := strconv.FormatInt(time.Now().Unix()+1, 10)
	for off := int64(0); ; off += page {
		zs, err := s.rdb.ZRangeByScoreWithScores(ctx, deletedKey(p), &redis.ZRangeBy{Min: from, Max: "+inf", Offset: off, Count: page}).Result()
		if err != nil {
			return fmt.Errorf("list partition %d's deleted links: %w", p, err)
		}
		if len(zs) == 0 {
			return nil
		}
		_, err = s.rdb.Pipelined(ctx, func(pl redis.Pipeliner) error {
			for _, z := range zs {
				member, _ := z.Member.(string)
				for _, g := range gens {
					pl.ExpireAt(ctx, genPrefix(p, g)+member, time.Unix(int64(z.Score), 0))
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("expire partition %d's deleted links' counts: %w", p, err)
		}
		if len(zs) < page {
			return nil
		}
	}
}

// scriptCall is one call of a script: its keys and arguments.
type scriptCall struct {
	keys []string
	argv []any
}

// runAll runs the calls of one script in one pipeline (EVALSHA), then once
// more, with the script's source, those Redis answered NOSCRIPT (a new
// server, or its script cache was flushed): a call answered NOSCRIPT did
// not run. The commands answer the calls in order, each with its own error.
func (s *Store) runAll(ctx context.Context, script *redis.Script, calls []scriptCall) []*redis.Cmd {
	cmds := make([]*redis.Cmd, len(calls))
	pipe := func(idx []int, eval func(p redis.Pipeliner, c scriptCall) *redis.Cmd) {
		// The pipeline's error is the first command's; each command keeps its own.
		_, _ = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, i := range idx {
				cmds[i] = eval(p, calls[i])
			}
			return nil
		})
	}
	all := make([]int, len(calls))
	for i := range all {
		all[i] = i
	}
	pipe(all, func(p redis.Pipeliner, c scriptCall) *redis.Cmd { return script.EvalSha(ctx, p, c.keys, c.argv...) })
	var missing []int
	for i, cmd := range cmds {
		if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			missing = append(missing, i)
		}
	}
	if len(missing) > 0 {
		pipe(missing, func(p redis.Pipeliner, c scriptCall) *redis.Cmd { return script.Eval(ctx, p, c.keys, c.argv...) })
	}
	return cmds
}

// Link returns what LINKS said last about code.
func (s *Store) Link(ctx context.Context, code string) (counter.LinkInfo, bool, error) {
	m, err := s.rdb.HGetAll(ctx, registryKey(code)).Result()
	if err != nil {
		return counter.LinkInfo{}, false, fmt.Errorf("read link %q: %w", code, err)
	}
	if len(m) == 0 {
		return counter.LinkInfo{}, false, nil
	}
	seq, _ := strconv.ParseUint(m["seq"], 10, 64)
	return counter.LinkInfo{Owner: m["owner"], Deleted: m["state"] == string(events.LinkDeleted), Seq: seq}, true, nil
}

// readStatsAttempts bounds the retries of a stats read that raced with a
// generation switch (each retry follows a switch, which is rare).
const readStatsAttempts = 5

// ReadStats reads a link's counts from the read generation in one
// MULTI/EXEC, and retries if the generations changed between learning them
// and reading, so the snapshot is always of one generation, whole.
func (s *Store) ReadStats(ctx context.Context, p int, ref counter.LinkRef, days []counter.Day) (counter.Snapshot, error) {
	st, err := s.meta(ctx, s.rdb, p)
	if err != nil {
		return counter.Snapshot{}, err
	}
	for range readStatsAttempts {
		snap, again, err := s.readStats(ctx, p, ref, days, st)
		if err != nil {
			return counter.Snapshot{}, fmt.Errorf("read stats: %w", err)
		}
		if !again {
			return snap, nil
		}
		st = snap.State
	}
	return counter.Snapshot{}, fmt.Errorf("read stats: %w", counter.ErrContention)
}

func (s *Store) readStats(ctx context.Context, p int, ref counter.LinkRef, days []counter.Day, st counter.State) (counter.Snapshot, bool, error) {
	r := st.Read
	var (
		meta           *redis.SliceCmd
		readPos, wrPos *redis.MapStringStringCmd
		link           *redis.MapStringStringCmd
		dayCmds        = make([]*redis.MapStringStringCmd, len(days))
		uvCmds         = make([]*redis.IntCmd, len(days))
	)
	_, err := s.rdb.TxPipelined(ctx, func(tx redis.Pipeliner) error {
		meta = tx.HMGet(ctx, metaKey(p), "read", "write", "until", "replay")
		readPos = tx.HGetAll(ctx, posKey(p, r))
		wrPos = tx.HGetAll(ctx, posKey(p, st.Write))
		link = tx.HGetAll(ctx, linkKey(p, r, ref))
		for i, d := range days {
			dayCmds[i] = tx.HGetAll(ctx, dayKey(p, r, ref, d))
			uvCmds[i] = tx.PFCount(ctx, uvKey(p, r, ref, d))
		}
		return nil
	})
	if err != nil {
		return counter.Snapshot{}, false, err
	}
	now, err := parseMeta(meta.Val())
	if err != nil {
		return counter.Snapshot{}, false, err
	}
	if now.Read != st.Read || now.Write != st.Write {
		return counter.Snapshot{State: now}, true, nil
	}
	snap := counter.Snapshot{
		State:     now,
		Read:      parsePos(readPos.Val()),
		Write:     parsePos(wrPos.Val()),
		Countries: map[string]counter.Pair{},
		Referrers: map[string]counter.Pair{},
		Days:      make(map[counter.Day]counter.DayCounts, len(days)),
	}
	snap.State.WM = snap.Write.Seq
	lm := link.Val()
	snap.Exists = len(lm) > 0
	for f, v := range lm {
		n, _ := strconv.ParseInt(v, 10, 64)
		l, country, host, ok := parseComboField(f)
		if !ok {
			continue
		}
		snap.Total.Add(l, n)
		addPair(snap.Countries, country, l, n)
		addPair(snap.Referrers, host, l, n)
	}
	for i, d := range days {
		var dc counter.DayCounts
		for f, v := range dayCmds[i].Val() {
			n, _ := strconv.ParseInt(v, 10, 64)
			if h, err := strconv.Atoi(f[1:]); err == nil && len(f) == 3 && h >= 0 && h < 24 {
				dc.Hours[h].Add(counter.Label(f[0]), n)
				dc.Total.Add(counter.Label(f[0]), n)
			}
		}
		dc.Uniques = uvCmds[i].Val()
		snap.Days[d] = dc
	}
	return snap, false, nil
}

// comboField is a link hash field: "<h|b>|<country>|<referrer host>".
// Countries are ISO codes or "unknown" and hosts cannot contain '|'.
func comboField(l counter.Label, country, host string) string {
	return string(rune(l)) + "|" + country + "|" + host
}

func parseComboField(f string) (l counter.Label, country, host string, ok bool) {
	if len(f) < 4 || f[1] != '|' || (f[0] != byte(counter.Human) && f[0] != byte(counter.Bot)) {
		return 0, "", "", false
	}
	country, host, ok = strings.Cut(f[2:], "|")
	return counter.Label(f[0]), country, host, ok
}

func addPair(m map[string]counter.Pair, k string, l counter.Label, n int64) {
	pr := m[k]
	pr.Add(l, n)
	m[k] = pr
}

func parsePos(m map[string]string) counter.Position {
	var pos counter.Position
	pos.Seq, _ = strconv.ParseUint(m["seq"], 10, 64)
	pos.Events, _ = strconv.ParseInt(m["events"], 10, 64)
	if ms, err := strconv.ParseInt(m["stored"], 10, 64); err == nil && ms > 0 {
		pos.Stored = time.UnixMilli(ms).UTC()
	}
	return pos
}
