package redisstore

import (
	"fmt"
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
	return argv[10+3*nid+5*nlab:]
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

// A link-day's visitors go to the script as "p" ops of at most maxUnpack
// visitors each (Lua's unpack fails beyond about 8,000), every visitor in
// exactly one of them, each op's count saying how many follow it.
func TestApplyArgsCarryEveryVisitorInOpsOfAtMostMaxUnpack(t *testing.T) {
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
	ops := opsFrom(t, a.argv)
	seen := map[string]int{}
	var counts []int
	for i := 0; i < len(ops); {
		switch ops[i] {
		case "h", "r":
			i += 4
		case "x":
			i += 3
		case "p":
			c := asInt(t, ops[i+2])
			counts = append(counts, c)
			for _, v := range ops[i+3 : i+3+c] {
				seen[v.(string)]++
			}
			i += 3 + c
		default:
			t.Fatalf("op %d: %v is not an op", i, ops[i])
		}
	}
	if len(counts) != 3 || counts[0] != maxUnpack || counts[1] != maxUnpack || counts[2] != 500 {
		t.Errorf("visitor ops of %v, want %d, %d and 500", counts, maxUnpack, maxUnpack)
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
	// Measured: 8,842-8,853 allocations before the sizing, 8,110-8,121 after.
	if allocs > 8400 {
		t.Errorf("%.0f allocations building a batch's arguments, want at most 8,400", allocs)
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
	}
}
