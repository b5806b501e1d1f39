package redisstore

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/services/clickcounter/internal/benchmix"
	"github.com/snipdev/snip/services/clickcounter/internal/counter"
)

// mixWrite is a batch of n clicks of the benchmix mix (hot: one link) at
// now, over watermark 0.
func mixWrite(n int, hot bool, now time.Time) *counter.Write {
	mix := benchmix.New()
	if hot {
		mix = benchmix.NewHot()
	}
	w := &counter.Write{Partition: 0, Expect: counter.State{Read: 1, Write: 1}, Delta: counter.NewDelta(),
		DedupTTL: time.Minute, LastSeq: uint64(n), LastStored: now}
	for range n {
		c := mix.Click("acme", now)
		w.Delta.Add(&c, counter.LabelOf(c.Bot), 1)
		m, _ := counter.ParseID(c.ID)
		w.Marks = append(w.Marks, counter.Mark{ID: c.ID, IDMark: m})
		w.Counted++
	}
	return w
}

// opsFrom returns the ops part of an apply script's ARGV (see applyScript):
// what follows the fixed arguments and the ID and label groups.
func opsFrom(t *testing.T, argv []any) []any {
	t.Helper()
	nid, nlab := asInt(t, argv[6]), asInt(t, argv[7])
	return argv[12+3*nid+5*nlab:]
}

// asInt reads an integer argument, boxed as an int or an int64.
func asInt(t *testing.T, v any) int {
	t.Helper()
	switch n := v.(type) {
	case int:
		return n
	case int64:
		return int(n)
	}
	t.Fatalf("argument %v (%T) is not an integer", v, v)
	return 0
}

// parsedOps is what the ops of an apply script's ARGV ask for (see
// applyScript), by key name: the HINCRBYs of each hash, the visitors of
// each HyperLogLog and the expiry sent with each day and visitor key.
type parsedOps struct {
	incr     map[string]map[string]int64
	visitors map[string][]string
	expiry   map[string]int64
}

// parseOps reads the ops as the script does, failing on any that do not
// add up.
func parseOps(t *testing.T, keys []string, argv []any) parsedOps {
	t.Helper()
	ops := opsFrom(t, argv)
	out := parsedOps{incr: map[string]map[string]int64{}, visitors: map[string][]string{}, expiry: map[string]int64{}}
	i := 0
	next := func() any {
		t.Helper()
		if i >= len(ops) {
			t.Fatalf("ops end at %d, inside an op", i)
		}
		i++
		return ops[i-1]
	}
	fields := func(k string) {
		m := out.incr[k]
		if m == nil {
			m = map[string]int64{}
			out.incr[k] = m
		}
		for range asInt(t, next()) {
			f := next().(string)
			m[f] += int64(asInt(t, next()))
		}
	}
	for i < len(ops) {
		k := asInt(t, next())
		at := int64(asInt(t, next()))
		if nf := asInt(t, ops[i]); nf > 0 {
			fields(keys[k-2])
		} else {
			next()
		}
		dk := keys[k-1]
		out.expiry[dk] = at
		fields(dk)
		if nv := asInt(t, next()); nv > 0 {
			uk := keys[k]
			out.expiry[uk] = at
			for range nv {
				out.visitors[uk] = append(out.visitors[uk], next().(string))
			}
		}
	}
	return out
}

// The ops carry every count of a batch's delta once, grouped by key: each
// link's (label, country, referrer) fields, each day's hour fields, each
// day's visitors, and an expiry for each day and visitor key, which a
// batch after an applied one leaves at 0.
func TestApplyArgsCarryEveryCountOnce(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	w := mixWrite(2000, false, now)
	s := New(nil)
	a, _, expiries := s.applyArgs(w, now.Unix())
	got := parseOps(t, a.keys, a.argv)
	gk := genKeys(genPrefix(0, 1))
	wantKeys := 0
	for i := range w.Delta.Links {
		ld := &w.Delta.Links[i]
		want := map[string]int64{}
		for c, n := range w.Delta.Combos(ld) {
			if n.Human != 0 {
				want[comboField(counter.Human, c.Country, c.Referrer)] = n.Human
			}
			if n.Bot != 0 {
				want[comboField(counter.Bot, c.Country, c.Referrer)] = n.Bot
			}
		}
		if lk := gk.link(ld.Ref); !maps.Equal(got.incr[lk], want) {
			t.Errorf("%s: fields %v, want %v", lk, got.incr[lk], want)
		}
		wantKeys++
		for dd := range w.Delta.Days(ld) {
			want := map[string]int64{}
			for h, n := range dd.Hours {
				if n.Human != 0 {
					want[hourFieldArgs[0][h].(string)] = n.Human
				}
				if n.Bot != 0 {
					want[hourFieldArgs[1][h].(string)] = n.Bot
				}
			}
			at := dd.Day.End().Add(counter.DayKeep).Unix()
			dk := gk.day(ld.Ref, dd.Day.Key())
			if !maps.Equal(got.incr[dk], want) || got.expiry[dk] != at || expiries[dk] != at {
				t.Errorf("%s: fields %v expiring at %d, want %v at %d", dk, got.incr[dk], got.expiry[dk], want, at)
			}
			wantKeys++
			if dd.NumVisitors == 0 {
				continue
			}
			uk := gk.uv(ld.Ref, dd.Day.Key())
			vs := slices.Sorted(w.Delta.Visitors(dd))
			if gv := slices.Sorted(slices.Values(got.visitors[uk])); !slices.Equal(gv, vs) || got.expiry[uk] != at {
				t.Errorf("%s: visitors %v expiring at %d, want %v at %d", uk, gv, got.expiry[uk], vs, at)
			}
			wantKeys++
		}
	}
	if n := len(got.incr) + len(got.visitors); n != wantKeys {
		t.Errorf("the ops name %d keys, want %d", n, wantKeys)
	}
	// Once a batch giving them their expiry is applied, the next leaves it.
	s.rememberExpiries(0, expiries)
	a, _, _ = s.applyArgs(w, now.Unix())
	for k, at := range parseOps(t, a.keys, a.argv).expiry {
		if at != 0 {
			t.Errorf("%s: expiry %d again after an applied batch gave it, want 0", k, at)
		}
	}
}

// A link-day's visitors go to the script in one run after their count,
// however many (the script cuts them into PFADDs of maxUnpack), every
// visitor exactly once.
func TestApplyArgsCarryEveryVisitorOnce(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	const n = 2*maxUnpack + 500
	w := &counter.Write{Partition: 3, Expect: counter.State{Read: 1, Write: 1}, Delta: counter.NewDelta(),
		DedupTTL: time.Minute, LastSeq: n, LastStored: now}
	for i := range n {
		c := events.Click{V: events.ClickVersion, ID: events.NewID(), Time: now, Code: "hot", Owner: "acme",
			Visitor: fmt.Sprintf("v%d", i), Country: "DE"}
		w.Delta.Add(&c, counter.Human, 1)
		m, _ := counter.ParseID(c.ID)
		w.Marks = append(w.Marks, counter.Mark{ID: c.ID, IDMark: m})
		w.Counted++
	}
	a, _, _ := New(nil).applyArgs(w, now.Unix())
	got := parseOps(t, a.keys, a.argv)
	if len(got.visitors) != 1 {
		t.Fatalf("visitors of %d keys, want 1", len(got.visitors))
	}
	seen := map[string]int{}
	for _, vs := range got.visitors {
		for _, v := range vs {
			seen[v]++
		}
	}
	if len(seen) != n {
		t.Errorf("%d distinct visitors in the ops, want %d", len(seen), n)
	}
	for v, k := range seen {
		if k != 1 {
			t.Errorf("visitor %s in the ops %d times, want once", v, k)
		}
	}
}

// A batch's counts cost two arguments a field and five a link and day,
// not an op code and a key index more per field: 2,000 clicks of the
// spread mix (about 660 links) take under six keys and arguments a click
// in all, visitors, fingerprints and click IDs included, whether or not
// the day's keys need their expiry.
func TestApplyArgsAreUnderSixAClick(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	w := mixWrite(2000, false, now)
	s := New(nil)
	a, _, expiries := s.applyArgs(w, now.Unix())
	s.rememberExpiries(0, expiries)
	again, _, _ := s.applyArgs(w, now.Unix())
	// Measured, keys and arguments: 18,425 and 14,324 (9.2 and 7.2 a click)
	// with an op per field (the second batch without the EXPIREAT ops);
	// 11,623 (5.8) for both with the counts grouped by link and day.
	for _, c := range []struct {
		when string
		n    int
	}{{"first", len(a.argv) + len(a.keys)}, {"with the expiries given", len(again.argv) + len(again.keys)}} {
		if per := float64(c.n) / 2000; per >= 6.0 {
			t.Errorf("%s: %.2f keys and arguments a click (%d), want under 6", c.when, per, c.n)
		}
	}
}

// A batch's arguments are built in slices and an index sized for them
// up front: a batch of 2,000 clicks of the spread mix (about 660 links)
// costs no more allocations than its keys, fields and boxed values
// themselves, not the copies of slices and maps growing to hundreds of
// entries.
func TestApplyArgsAreSizedUpFront(t *testing.T) {
	now := time.Now().UTC()
	w := mixWrite(2000, false, now)
	s := New(nil)
	a, _, _ := s.applyArgs(w, now.Unix())
	if len(a.argv) > cap(a.argv) || cap(a.argv) > 2*len(a.argv) {
		t.Errorf("%d arguments in a slice of %d, want it sized for them", len(a.argv), cap(a.argv))
	}
	if len(a.keys) > cap(a.keys) || cap(a.keys) > 2*len(a.keys)+2*len(w.Marks) {
		t.Errorf("%d keys in a slice of %d, want it sized for them", len(a.keys), cap(a.keys))
	}
	allocs := testing.AllocsPerRun(10, func() { s.applyArgs(w, now.Unix()) })
	// Measured: 8,842-8,853 allocations before the sizing, 8,110-8,121
	// after, 6,728 with the counts grouped by link and day, 5,374 with a
	// link's and its day's keys cut from one string, 4,158 with the link
	// fields cached (in the batch alone, here: the args are new).
	if allocs > 4600 {
		t.Errorf("%.0f allocations building a batch's arguments, want at most 4,600", allocs)
	}
}

// Apply builds each batch's arguments into the slices of an applied one
// (Store.applies): a batch like the last grows nothing, and allocates only
// the strings it makes (keys, fields, packed IDs) and its expiries.
func TestApplyArgsIntoReusedArgsAllocateOnlyStrings(t *testing.T) {
	now := time.Now().UTC()
	w := mixWrite(2000, false, now)
	s := New(nil)
	a := &args{idx: map[string]int{}}
	fill := func() {
		a.reset()
		s.applyArgsInto(a, w, now.Unix())
	}
	fill()
	fresh := testing.AllocsPerRun(10, func() { s.applyArgs(w, now.Unix()) })
	reused := testing.AllocsPerRun(10, fill)
	// Measured: 6,737 fresh, 6,732 reused (5,374 and 5,355 since a link's
	// and its day's keys are one string); what it saves are the batch's
	// largest (the arguments, the keys, their index, the order).
	if reused > fresh-4 {
		t.Errorf("%.0f allocations building a batch's arguments into reused ones, %.0f fresh: want at least 4 fewer", reused, fresh)
	}
	if len(a.keys) < 2 || len(a.argv) < 10 {
		t.Fatalf("%d keys, %d arguments: not built", len(a.keys), len(a.argv))
	}
}

// BenchmarkApplyArgs measures building one batch's script arguments (the
// Go side of Store.Apply before its one call), for 2,000 clicks.
//
//	go test -run '^$' -bench ApplyArgs -benchmem ./services/clickcounter/internal/redisstore
func BenchmarkApplyArgs(b *testing.B) {
	for _, mix := range []string{"spread", "hot"} {
		b.Run(mix, func(b *testing.B) {
			now := time.Now().UTC()
			w := mixWrite(2000, mix == "hot", now)
			s := New(nil)
			b.ReportAllocs()
			for b.Loop() {
				s.applyArgs(w, now.Unix())
			}
		})
		b.Run(mix+"/reused", func(b *testing.B) {
			now := time.Now().UTC()
			w := mixWrite(2000, mix == "hot", now)
			s := New(nil)
			a := &args{idx: map[string]int{}}
			b.ReportAllocs()
			for b.Loop() {
				a.reset()
				s.applyArgsInto(a, w, now.Unix())
			}
		})
	}
}
