package counter_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/services/clickcounter/internal/counter"
)

// counted reads snip_clickcounter_counted_total from reg, both labels.
func counted(t *testing.T, reg *prometheus.Registry) counter.Pair {
	t.Helper()
	return counter.Pair{
		Human: int64(metric(t, reg, "snip_clickcounter_counted_total", map[string]string{"label": "human"})),
		Bot:   int64(metric(t, reg, "snip_clickcounter_counted_total", map[string]string{"label": "bot"})),
	}
}

// A write whose answer is lost (Redis ran the script, the counter got a
// timeout) counted its batch in Redis. The batch comes again; the counter
// reads the partition's state again, finds its own write's token beside
// the watermark, and counts the batch in counted_total once: the member
// that made the write, whether it retries at once or takes the partition
// back later with nobody having written since. Before, its clicks were in
// no member's counted_total (the retry found them below the watermark and
// skipped them as duplicates).
func TestAWriteWhoseAnswerWasLostIsCountedOnce(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"retried", "taken back after a hand-over"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			lossy := &answerLost{Store: e.store}
			reg := prometheus.NewRegistry()
			c := e.newCounter(t, reg, withStore(lossy))
			const p = 1
			code := codeIn(t, p, 50)
			now := time.Now().UTC()
			var s seqs
			bot := click("acme", code, now)
			bot.Bot = true
			b1 := s.events(p, click("acme", code, now), click("acme", code, now))
			b2 := s.events(p, click("acme", code, now), bot, click("acme", code, now))
			e.clicks.store(b1...)
			e.clicks.store(b2...)
			mustHandle(t, c, p, b1)

			lossy.armed.Store(true)
			if err := c.HandleBatch(t.Context(), p, b2); err == nil {
				t.Fatal("HandleBatch with its answer lost: nil error, want the timeout")
			}
			other := prometheus.NewRegistry()
			if how == "taken back after a hand-over" {
				c.OnRevoke(p)
				next := e.newCounter(t, other)
				if err := next.OnAssign(t.Context(), p, b2[0].Seq); err != nil {
					t.Fatal(err)
				}
				mustHandle(t, next, p, b2) // handed again, unacked
				next.OnRevoke(p)
				if err := c.OnAssign(t.Context(), p, b2[len(b2)-1].Seq+1); err != nil {
					t.Fatal(err)
				}
			} else {
				mustHandle(t, c, p, b2) // the runtime's retry
			}

			if got := stats(t, c, "acme", code).Totals; got != (counter.Pair{Human: 4, Bot: 1}) {
				t.Fatalf("totals %+v, want 4 human and 1 bot", got)
			}
			if got := counted(t, reg); got != (counter.Pair{Human: 4, Bot: 1}) {
				t.Errorf("counted_total %+v, want 4 human and 1 bot: the write whose answer was lost counted once", got)
			}
			if got := counted(t, other); got != (counter.Pair{}) {
				t.Errorf("the other member's counted_total %+v, want none: it counted nothing", got)
			}
			// Read again, the state counts nothing twice.
			mustHandle(t, c, p, b2)
			if err := c.OnAssign(t.Context(), p, b2[len(b2)-1].Seq+1); err != nil {
				t.Fatal(err)
			}
			if got := counted(t, reg); got != (counter.Pair{Human: 4, Bot: 1}) {
				t.Errorf("counted_total after the state was read again %+v, want still 4 human and 1 bot", got)
			}
		})
	}
}

// A member whose write's answer was lost cannot tell it landed once
// another member wrote after it: the token beside the watermark is that
// one's. It counts nothing then, rather than risk counting twice.
func TestAWriteWhoseAnswerWasLostIsNotCountedOnceAnotherWroteAfterIt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	lossy := &answerLost{Store: e.store}
	reg := prometheus.NewRegistry()
	c := e.newCounter(t, reg, withStore(lossy))
	const p = 2
	code := codeIn(t, p, 51)
	now := time.Now().UTC()
	var s seqs
	b1 := s.events(p, click("acme", code, now), click("acme", code, now))
	b2 := s.events(p, click("acme", code, now))
	lossy.armed.Store(true)
	if err := c.HandleBatch(t.Context(), p, b1); err == nil {
		t.Fatal("HandleBatch with its answer lost: nil error, want the timeout")
	}
	c.OnRevoke(p)
	other := prometheus.NewRegistry()
	next := e.newCounter(t, other)
	mustHandle(t, next, p, b1)
	mustHandle(t, next, p, b2)
	next.OnRevoke(p)
	if err := c.OnAssign(t.Context(), p, b2[0].Seq+1); err != nil {
		t.Fatal(err)
	}
	if got := stats(t, c, "acme", code).Totals; got != (counter.Pair{Human: 3}) {
		t.Fatalf("totals %+v, want 3 human", got)
	}
	if got, want := counted(t, reg).Human+counted(t, other).Human, int64(1); got != want {
		t.Errorf("counted_total over the members %d, want %d (b2's; b1's write unknown to its member)", got, want)
	}
}

// The write that ends a recount switches the reads; its answer lost, the
// member finds its own token when it reads the state again, and counts
// the recount finished (and its clicks counted) once.
func TestARecountWhoseSwitchWasNotAnsweredIsCountedFinished(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	lossy := &answerLost{Store: e.store}
	reg := prometheus.NewRegistry()
	c := e.newCounter(t, reg, withStore(lossy))
	const p = 3
	code := codeIn(t, p, 52)
	now := time.Now().UTC()
	var s seqs
	b := s.events(p, click("acme", code, now), click("acme", code, now))
	e.clicks.store(b...)
	mustHandle(t, e.c, p, b)
	e.first.Store(b[0].Seq)
	if err := c.OnRewind(t.Context(), p, reader.RewindInfo{ID: events.NewID(), From: b[0].Seq, Until: s.n, Requested: now, MovesBack: true}); err != nil {
		t.Fatal(err)
	}
	lossy.armed.Store(true)
	if err := c.HandleBatch(t.Context(), p, b); err == nil {
		t.Fatal("HandleBatch with its answer lost: nil error, want the timeout")
	}
	mustHandle(t, c, p, b) // handed again by the runtime
	if st := stats(t, c, "acme", code); st.Totals != (counter.Pair{Human: 2}) || st.AsOf.Generation != 2 {
		t.Fatalf("totals %+v as of %+v, want 2 human in generation 2", st.Totals, st.AsOf)
	}
	if n := metric(t, reg, "snip_clickcounter_recounts_total", map[string]string{"result": "finished"}); n != 1 {
		t.Errorf("recounts_total{result=finished} = %v, want 1", n)
	}
	if got := counted(t, reg); got != (counter.Pair{Human: 2}) {
		t.Errorf("counted_total %+v, want 2 human", got)
	}
}
