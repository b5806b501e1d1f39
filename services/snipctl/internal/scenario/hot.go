package scenario

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
)

var hotPartition = Scenario{
	Name:   "hot-partition",
	Claim:  "one link much busier than the rest saturates its partition's member while the others idle; the group's throughput is capped by one member's rate, whatever the member count",
	Needs:  "nats",
	Lesson: 16 * time.Second,
	run:    runHotPartition,
}

const (
	hotPartitions = 6
	hotMemberCap  = 200.0 // events/s one member handles
	hotRate       = 600.0 // events/s of the hot link
	coldRate      = 20.0  // events/s of each of five other links
	hotPhase      = 8.0   // lesson seconds per phase
)

func runHotPartition(ctx context.Context, e *Env) error {
	js, err := e.NATS(ctx, hotPartitions)
	if err != nil {
		return err
	}
	hot := "hot"
	hp := events.Partition(hot, hotPartitions)
	// Five cold links, each in its own partition other than the hot one.
	var cold []string
	used := map[int]bool{hp: true}
	for i := 0; len(cold) < hotPartitions-1; i++ {
		c := fmt.Sprintf("cold%d", i)
		if p := events.Partition(c, hotPartitions); !used[p] {
			used[p] = true
			cold = append(cold, c)
		}
	}
	var mu sync.Mutex
	byPartition := make([]int, hotPartitions)
	busy := make([]time.Duration, hotPartitions) // time inside the handler, per partition
	sentTo := make([]int, hotPartitions)
	var lastChange atomic.Int64 // last partition move seen (Unix ns)
	settled := func(what string) error {
		return waitFor(ctx, 60*time.Second, what, func() (bool, error) {
			return time.Since(time.Unix(0, lastChange.Load())) > time.Second, nil
		})
	}
	var handled atomic.Int64
	startGroupMember := func(name string) (*member, error) {
		lim := e.limiter(hotMemberCap) // one member's capacity, shared by its partitions
		cfg := groupConfig("hot", name)
		cfg.OnAssign = func(context.Context, int, uint64) error { lastChange.Store(time.Now().UnixNano()); return nil }
		cfg.OnRevoke = func(int) { lastChange.Store(time.Now().UnixNano()) }
		return e.startMember(ctx, cfg, func(ctx context.Context, p int, batch []reader.Event) error {
			began := time.Now()
			defer func() {
				mu.Lock()
				busy[p] += time.Since(began)
				mu.Unlock()
			}()
			for len(batch) > 0 {
				n := min(len(batch), lim.Burst())
				if err := lim.WaitN(ctx, n); err != nil {
					return err
				}
				mu.Lock()
				byPartition[p] += n
				mu.Unlock()
				handled.Add(int64(n))
				batch = batch[n:]
			}
			return nil
		})
	}
	var members []*member
	defer func() {
		for _, m := range members {
			m.cancel()
		}
		for _, m := range members {
			<-m.done
		}
	}()
	for i := range hotPartitions {
		m, err := startGroupMember(fmt.Sprintf("m%d", i))
		if err != nil {
			return err
		}
		members = append(members, m)
	}
	if err := waitMembers(ctx, js, "hot", hotPartitions); err != nil {
		return err
	}

	pjs, err := e.Connect("producer")
	if err != nil {
		return err
	}
	keys := append([]string{hot}, cold...)
	// Warm up: one event per link, so every partition has a working owner
	// before the clock starts.
	for i, k := range keys {
		if _, err := publishClick(pjs, newClick(k, -1-i)); err != nil {
			return err
		}
	}
	if err := waitFor(ctx, 60*time.Second, "every partition's owner to handle an event", func() (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		for _, n := range byPartition {
			if n == 0 {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		return err
	}
	weights := []float64{hotRate}
	for range cold {
		weights = append(weights, coldRate)
	}
	total := hotRate + coldRate*float64(len(cold))
	// A deterministic mix: event i goes to the key whose cumulative share it
	// falls in.
	pick := func(i int) string {
		x := float64(i%int(total)) + 0.5
		for k, w := range weights {
			if x < w {
				return keys[k]
			}
			x -= w
		}
		return hot
	}
	smp := e.newSampler(500 * time.Millisecond)
	prev := make([]int, hotPartitions)
	stopSampling := smp.start(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		coldSum := 0
		for p := range hotPartitions {
			if p != hp {
				coldSum += byPartition[p] - prev[p]
			}
		}
		smp.add("hot partition handled/s", "events/s", e.LessonRate(float64(byPartition[hp]-prev[hp])/e.Real(500*time.Millisecond).Seconds()))
		smp.add("5 cold partitions handled/s", "events/s", e.LessonRate(float64(coldSum)/e.Real(500*time.Millisecond).Seconds()))
		copy(prev, byPartition)
	})
	defer stopSampling()
	// phase returns the group's throughput, the hot partition's rate, and
	// the share of the phase the hot and the cold partitions' handlers were
	// busy (handling or waiting for capacity).
	// phase returns the rate offered too: what the producer published over
	// the phase's lesson time.
	phase := func(name string) (tp, hotTP, hotBusy, coldBusy, offered float64, err error) {
		e.say("%s: hot link %g/s, five others %g/s each, member capacity %g/s", name, hotRate, coldRate, hotMemberCap)
		h0 := handled.Load()
		mu.Lock()
		hot0 := byPartition[hp]
		busy0 := slices.Clone(busy)
		mu.Unlock()
		start := time.Now()
		sent, err := emit(ctx, e.Rate(total), e.Real(time.Duration(hotPhase*float64(time.Second))), func(i int) error {
			k := pick(i)
			mu.Lock()
			sentTo[events.Partition(k, hotPartitions)]++
			mu.Unlock()
			_, err := publishClick(pjs, newClick(k, i))
			return err
		})
		wall := time.Since(start)
		secs := e.Lesson(wall)
		mu.Lock()
		hotN := byPartition[hp] - hot0
		for p := range hotPartitions {
			share := float64(busy[p]-busy0[p]) / float64(wall)
			if p == hp {
				hotBusy = share
			} else {
				coldBusy += share / float64(hotPartitions-1)
			}
		}
		mu.Unlock()
		return float64(handled.Load()-h0) / secs, float64(hotN) / secs, hotBusy, coldBusy, float64(sent) / secs, err
	}
	if err := settled("the assignment to settle"); err != nil {
		return err
	}
	tp6, hot6, hotBusy, coldBusy, offered6, err := phase("six members")
	if err != nil {
		return err
	}
	mu.Lock()
	hotBacklog := float64(sentTo[hp] + 1 - byPartition[hp]) // +1: the warm-up event
	coldBacklog := 0.0
	for p := range hotPartitions {
		if p != hp {
			coldBacklog += float64(sentTo[p] + 1 - byPartition[p])
		}
	}
	mu.Unlock()
	e.say("adding six more members")
	for i := hotPartitions; i < 2*hotPartitions; i++ {
		m, err := startGroupMember(fmt.Sprintf("m%d", i))
		if err != nil {
			return err
		}
		members = append(members, m)
	}
	if err := waitMembers(ctx, js, "hot", 2*hotPartitions); err != nil {
		return err
	}
	// Rendezvous hashing may hand a partition to a newcomer (the others
	// then own none): let the moves finish before measuring.
	if err := settled("the assignment to settle"); err != nil {
		return err
	}
	tp12, hot12, _, _, offered12, err := phase("twelve members")
	if err != nil {
		return err
	}
	stopSampling()
	smp.flush()
	capped := hotMemberCap + coldRate*float64(len(cold))
	e.within("offered load, 6 members", "events/s", total, offered6, 0.1, 0, "600 + 5 x 20, published on a 5 ms ticker over the phase")
	e.within("offered load, 12 members", "events/s", total, offered12, 0.1, 0, "the same")
	e.atMost("hot partition's rate, 6 members", "events/s", hotMemberCap*1.05, hot6, "one member's capacity is the ceiling: the hot link's events are all in one partition")
	e.atLeast("hot partition's backlog after 8 s", "events", (hotRate-hotMemberCap*1.05)*hotPhase*0.95, hotBacklog, "grows by at least 600 - 210 a second: the member is saturated")
	e.atMost("cold partitions' handlers busy, 6 members", "%", 25, 100*coldBusy, "their 20/s take a tenth of a 200/s capacity: idle most of the time")
	e.note("share of the time in the handler: hot partition %.0f%%, cold partitions %.0f%% on average; backlog after 8 s: hot %.0f, cold %.0f", 100*hotBusy, 100*coldBusy, hotBacklog, coldBacklog)
	e.atMost("hot partition's rate, 12 members", "events/s", hotMemberCap*1.15, hot12, "still one member's capacity: the extra six own no partition (+15%: a partition that moves starts on a fresh member with a full 50 ms burst)")
	e.info("group throughput, 12 members / 6 members", "x", 1, tp12/tp6, "more members than partitions add nothing; on a loaded machine the two phases get different shares of the CPU")
	e.atMost("group throughput, 12 members", "events/s", capped*1.15, tp12, "the hot member's capacity + the cold links' 100/s (+15%: a partition that moves starts on a fresh member with a full 50 ms burst)")
	e.note("measured: 6 members %.0f/s (hot %.0f/s), 12 members %.0f/s (hot %.0f/s), of %g/s offered; the ceiling is %g/s", tp6, hot6, tp12, hot12, total, capped)
	e.note("the hot partition's backlog grows by %g/s: spread the key (a finer partition key), not the members", hotRate-hotMemberCap)
	return nil
}
