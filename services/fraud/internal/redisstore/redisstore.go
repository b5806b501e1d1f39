// Package redisstore keeps what the fraud API serves, in Redis: per-link
// totals and flagged counts (the flagged share), and each owner's recent
// alerts. It is the Redis side of fraud.Store and of the API's reads.
//
// Keys (every key of a partition carries the hash tag {p<N>}, so one
// script can update them atomically, on Redis Cluster too):
//
//	fraud:{p<N>}:hwm                 last CLICKS sequence of partition N applied
//	fraud:{p<N>}:link:<code>         hash: owner, total, flagged, rule:<rule> (flagged by rule)
//	fraud:{p<N>}:alerts:<owner>      sorted set: alert ID, scored by its event time (ms)
//	fraud:{p<N>}:alertbody:<owner>   hash: alert ID -> alert JSON
//	fraud:{p<N>}:labels:<len>:<start> hash: label counter -> "count:last click (unix ns):mark",
//	                                 of the alert period of length len (a Go duration)
//	                                 starting at start (unix s); expires two periods
//	                                 after its last write
//
// Writes are idempotent twice over. The per-partition high-water mark makes
// a batch's counts apply once: the runtime hands a partition's events in
// order, so "applied up to sequence S" is all the memory needed, however
// often a batch is retried or redelivered or a partition changes hands
// (the verdict labels on FRAUD_VERDICTS carry the click ID for consumers that key
// by it). Alerts are added by ID (ZADD NX), so an alert raised again by a
// replay or a takeover is stored once. A mark that went back (Redis lost
// acknowledged writes) is told apart from one that did not: the caller
// says what it applied before (Batch.After), and the script refuses the
// batch when the mark is behind that. The label counters of a batch are
// written by the same script, so they are always exactly as of the mark
// (fraud.Partition.RestoreCounts relies on it).
package redisstore

import (
	"cmp"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/services/fraud/internal/fraud"
)

var _ fraud.Store = (*Store)(nil)

//go:embed apply.lua
var applyLua string

var applyScript = redis.NewScript(applyLua)

// countsScript reads the mark and label counter hashes of one partition
// together. KEYS: the mark, then the hashes; returns {mark, {field, value,
// ...} per hash}.
var countsScript = redis.NewScript(`
local out = {tonumber(redis.call('GET', KEYS[1]) or '0')}
for i = 2, #KEYS do out[i] = redis.call('HGETALL', KEYS[i]) end
return out
`)

// Store is the fraud service's Redis state.
type Store struct {
	rdb        redis.UniversalClient
	partitions int
	alertsCap  int

	// The replica wait (WaitForReplicas): off when waitN is 0.
	waitN       int
	waitTimeout time.Duration
	short       func(partition int, err error)
}

// New returns a store for a CLICKS stream of the given number of partitions
// that keeps at most alertsCap alerts per owner and partition.
func New(rdb redis.UniversalClient, partitions, alertsCap int) *Store {
	return &Store{rdb: rdb, partitions: partitions, alertsCap: alertsCap}
}

func tag(p int) string                     { return "fraud:{p" + strconv.Itoa(p) + "}:" }
func hwmKey(p int) string                  { return tag(p) + "hwm" }
func linkKey(p int, code string) string    { return tag(p) + "link:" + code }
func alertsKey(p int, owner string) string { return tag(p) + "alerts:" + owner }
func bodiesKey(p int, owner string) string { return tag(p) + "alertbody:" + owner }
func labelsKey(p int, period time.Duration, start time.Time) string {
	return tag(p) + "labels:" + period.String() + ":" + strconv.FormatInt(start.Unix(), 10)
}

// rulePrefix starts the flagged-by-rule fields of a link hash.
const rulePrefix = "rule:"

// Apply adds judgements of partition's events to the counts and alert lists,
// skipping any event at or before the partition's high-water mark, and
// stores the batch's label counters. If the mark is behind b.After, it
// writes nothing and returns a *fraud.StoreBehindError.
func (s *Store) Apply(ctx context.Context, partition int, b fraud.Batch) error {
	if err := s.apply(ctx, partition, b); err != nil {
		return err
	}
	s.replicated(ctx, partition)
	return nil
}

func (s *Store) apply(ctx context.Context, partition int, b fraud.Batch) error {
	js := b.Judgements
	for len(js) > 0 {
		keys, args, err := s.build(partition, js, b)
		if err != nil {
			return err
		}
		res, err := applyScript.Run(ctx, s.rdb, keys, args...).Int64Slice()
		if err != nil {
			return fmt.Errorf("apply partition %d sequences %d-%d: %w", partition, js[0].Seq, js[len(js)-1].Seq, err)
		}
		if res[0] == -2 {
			return &fraud.StoreBehindError{Mark: uint64(res[1]), After: b.After}
		}
		if res[0] != -1 {
			return nil // applied now (1) or before (0)
		}
		// Partly applied before (a batch cut differently by an earlier
		// owner): send what is after the mark.
		hwm := uint64(res[1])
		i, _ := slices.BinarySearchFunc(js, hwm+1, func(j fraud.Judgement, seq uint64) int { return cmp.Compare(j.Seq, seq) })
		js = js[i:]
	}
	return nil
}

type linkDelta struct {
	owner   string
	total   int64
	flagged int64
	byRule  map[string]int64
}

// build encodes judgements, and the batch's label counters, as the script's
// keys and arguments (see apply.lua).
func (s *Store) build(p int, js []fraud.Judgement, b fraud.Batch) ([]string, []any, error) {
	links := map[string]*linkDelta{}
	var codes []string
	type alertRef struct {
		z, h int
		id   string
		ms   int64
		body []byte
	}
	var alerts []alertRef
	keys := []string{hwmKey(p)}
	ownerKeys := map[string][2]int{}
	for _, j := range js {
		if j.Copy {
			continue // the event was counted as itself: the mark moves past it, nothing else
		}
		d := links[j.Code]
		if d == nil {
			d = &linkDelta{owner: j.Owner, byRule: map[string]int64{}}
			links[j.Code] = d
			codes = append(codes, j.Code)
		}
		d.total++
		if j.SourceBot {
			d.flagged++
			d.byRule[fraud.RuleSourceBot]++
		}
		for _, l := range j.Labels {
			d.flagged++
			d.byRule[l.Rule]++
		}
	}
	for _, code := range codes {
		keys = append(keys, linkKey(p, code))
	}
	for _, j := range js {
		for _, a := range j.Alerts {
			ks, ok := ownerKeys[a.Owner]
			if !ok {
				keys = append(keys, alertsKey(p, a.Owner), bodiesKey(p, a.Owner))
				ks = [2]int{len(keys) - 1, len(keys)}
				ownerKeys[a.Owner] = ks
			}
			body, err := json.Marshal(a)
			if err != nil {
				return nil, nil, fmt.Errorf("encode alert %s: %w", a.ID, err)
			}
			alerts = append(alerts, alertRef{z: ks[0], h: ks[1], id: a.ID, ms: a.Time.UnixMilli(), body: body})
		}
	}
	args := []any{js[0].Seq, js[len(js)-1].Seq, s.alertsCap, b.After, len(codes)}
	for _, code := range codes {
		d := links[code]
		args = append(args, d.owner, 2+len(d.byRule), "total", d.total, "flagged", d.flagged)
		rules := make([]string, 0, len(d.byRule))
		for r := range d.byRule {
			rules = append(rules, r)
		}
		slices.Sort(rules)
		for _, r := range rules {
			args = append(args, rulePrefix+r, d.byRule[r])
		}
	}
	args = append(args, len(alerts))
	for _, a := range alerts {
		args = append(args, a.z, a.h, a.id, a.ms, a.body)
	}
	// The counters, a hash per alert period (in order of first appearance),
	// each value tagged with the mark it is as of.
	if len(b.Counts) > 0 && b.Period <= 0 {
		return nil, nil, fmt.Errorf("label counters without an alert period")
	}
	to := strconv.FormatUint(js[len(js)-1].Seq, 10)
	byPeriod := map[int64][]fraud.Count{}
	var periods []int64
	for _, c := range b.Counts {
		k := c.Period.Unix()
		if _, ok := byPeriod[k]; !ok {
			periods = append(periods, k)
		}
		byPeriod[k] = append(byPeriod[k], c)
	}
	args = append(args, (2 * b.Period).Milliseconds(), len(periods))
	for _, k := range periods {
		cs := byPeriod[k]
		keys = append(keys, labelsKey(p, b.Period, cs[0].Period))
		args = append(args, len(keys), len(cs))
		for _, c := range cs {
			args = append(args, c.Key, strconv.Itoa(c.N)+":"+strconv.FormatInt(c.LastAt.UnixNano(), 10)+":"+to)
		}
	}
	return keys, args, nil
}

// LabelCounts returns the label counters stored for partition in the alert
// periods of length period starting at starts, and the partition's mark,
// read at once: the counters are as of the mark.
func (s *Store) LabelCounts(ctx context.Context, partition int, period time.Duration, starts []time.Time) (uint64, []fraud.Count, error) {
	keys := []string{hwmKey(partition)}
	for _, st := range starts {
		keys = append(keys, labelsKey(partition, period, st))
	}
	res, err := countsScript.Run(ctx, s.rdb, keys).Slice()
	if err != nil {
		return 0, nil, fmt.Errorf("label counters of partition %d: %w", partition, err)
	}
	mark, ok := res[0].(int64)
	if !ok || mark < 0 || len(res) != len(keys) {
		return 0, nil, fmt.Errorf("label counters of partition %d: unexpected answer %v", partition, res)
	}
	var out []fraud.Count
	for i, st := range starts {
		kv, _ := res[i+1].([]any)
		for f := 0; f+1 < len(kv); f += 2 {
			key, _ := kv[f].(string)
			v, _ := kv[f+1].(string)
			c, err := parseCount(key, v)
			if err != nil {
				return 0, nil, fmt.Errorf("label counters of partition %d: %s: %w", partition, keys[i+1], err)
			}
			c.Period = st
			out = append(out, c)
		}
	}
	return uint64(mark), out, nil
}

// parseCount decodes a counter written by build: "count:last click:mark".
func parseCount(key, v string) (fraud.Count, error) {
	parts := strings.Split(v, ":")
	if len(parts) != 3 {
		return fraud.Count{}, fmt.Errorf("counter %s: malformed value %q", key, v)
	}
	n, err1 := strconv.Atoi(parts[0])
	at, err2 := strconv.ParseInt(parts[1], 10, 64)
	mark, err3 := strconv.ParseUint(parts[2], 10, 64)
	if err := errors.Join(err1, err2, err3); err != nil {
		return fraud.Count{}, fmt.Errorf("counter %s: malformed value %q: %w", key, v, err)
	}
	return fraud.Count{Key: key, N: n, LastAt: time.Unix(0, at), Mark: mark}, nil
}

// RecentAlerts returns the owner's newest alerts, newest first, at most limit.
func (s *Store) RecentAlerts(ctx context.Context, owner string, limit int) ([]events.FraudAlert, error) {
	type ref struct {
		id    string
		score float64
		p     int
	}
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.ZSliceCmd, s.partitions)
	for p := range s.partitions {
		cmds[p] = pipe.ZRevRangeWithScores(ctx, alertsKey(p, owner), 0, int64(limit-1))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("recent alerts of %s: %w", owner, err)
	}
	var refs []ref
	for p, c := range cmds {
		for _, z := range c.Val() {
			refs = append(refs, ref{id: z.Member.(string), score: z.Score, p: p})
		}
	}
	slices.SortFunc(refs, func(a, b ref) int {
		return cmp.Or(cmp.Compare(b.score, a.score), strings.Compare(a.id, b.id))
	})
	refs = refs[:min(len(refs), limit)]
	byPart := map[int][]string{}
	for _, r := range refs {
		byPart[r.p] = append(byPart[r.p], r.id)
	}
	pipe = s.rdb.Pipeline()
	bodies := map[int]*redis.SliceCmd{}
	for p, ids := range byPart {
		bodies[p] = pipe.HMGet(ctx, bodiesKey(p, owner), ids...)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("recent alerts of %s: %w", owner, err)
	}
	found := map[string]events.FraudAlert{}
	for p, c := range bodies {
		for i, v := range c.Val() {
			body, ok := v.(string)
			if !ok {
				continue // trimmed between the two reads
			}
			a, err := events.DecodeFraudAlert([]byte(body))
			if err != nil {
				return nil, fmt.Errorf("recent alerts of %s: alert %s: %w", owner, byPart[p][i], err)
			}
			found[a.ID] = a
		}
	}
	out := make([]events.FraudAlert, 0, len(refs))
	for _, r := range refs {
		if a, ok := found[r.id]; ok {
			out = append(out, a)
		}
	}
	return out, nil
}

// LinkStats returns the flagged share of a link, or ErrUnknownLink.
func (s *Store) LinkStats(ctx context.Context, code string) (fraud.LinkStats, error) {
	m, err := s.rdb.HGetAll(ctx, linkKey(events.Partition(code, s.partitions), code)).Result()
	if err != nil {
		return fraud.LinkStats{}, fmt.Errorf("link stats of %s: %w", code, err)
	}
	if len(m) == 0 {
		return fraud.LinkStats{}, fmt.Errorf("link %s: %w", code, fraud.ErrUnknownLink)
	}
	st := fraud.LinkStats{Code: code, Owner: m["owner"], ByRule: map[string]int64{}}
	for k, v := range m {
		n, err := strconv.ParseInt(v, 10, 64)
		switch {
		case k == "owner":
		case err != nil:
			return fraud.LinkStats{}, fmt.Errorf("link stats of %s: field %s: %w", code, k, err)
		case k == "total":
			st.Total = n
		case k == "flagged":
			st.Flagged = n
		case strings.HasPrefix(k, rulePrefix):
			st.ByRule[strings.TrimPrefix(k, rulePrefix)] = n
		}
	}
	if st.Total > 0 {
		st.Share = float64(st.Flagged) / float64(st.Total)
	}
	return st, nil
}

// HighWater returns the last sequence of partition applied (0: none).
func (s *Store) HighWater(ctx context.Context, partition int) (uint64, error) {
	v, err := s.rdb.Get(ctx, hwmKey(partition)).Uint64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("high-water mark of partition %d: %w", partition, err)
	}
	return v, nil
}
