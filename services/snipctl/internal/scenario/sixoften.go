package scenario

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/reader"
)

var sixOfTen = Scenario{
	Name:   "six-of-ten",
	Claim:  "partitions cap parallelism: 6 partitions, 10 members, exactly 6 work; a stopped member's partition moves and resumes where it was acked, in order",
	Needs:  "nats",
	Lesson: 10 * time.Second,
	run:    runSixOfTen,
}

const (
	sixPartitions = 6
	sixMembers    = 10
	sixRate       = 300.0 // clicks/s over 30 links
)

func runSixOfTen(ctx context.Context, e *Env) error {
	js, err := e.NATS(ctx, sixPartitions)
	if err != nil {
		return err
	}
	t := newTally()
	var mu sync.Mutex
	firstAfter := map[int]time.Time{} // partition -> first event handled by a new owner
	var stoppedAt time.Time
	moved := -1
	busyParts := map[int]bool{}
	lastSeen := map[string]time.Time{} // member -> when it last handled a batch
	lastBy := map[int]string{}         // partition -> member that last handled it
	var ownersChanged time.Time        // when lastBy last named a new member
	type handling struct {
		at time.Time
		by string
		n  int
	}
	batches := map[int][]handling{} // partition -> every batch handled
	var victim string
	members := map[string]*member{}
	// Each member's own metrics: its lease lapses are read from them.
	regs := map[string]*prometheus.Registry{}
	for i := range sixMembers {
		name := fmt.Sprintf("m%d", i)
		cfg := groupConfig("six", name)
		regs[name] = prometheus.NewRegistry()
		cfg.Metrics = regs[name]
		m, err := e.startMember(ctx, cfg, func(_ context.Context, p int, batch []reader.Event) error {
			for _, ev := range batch {
				t.add(name, ev.Click)
			}
			mu.Lock()
			busyParts[p] = true
			lastSeen[name] = time.Now()
			if lastBy[p] != name {
				ownersChanged = time.Now()
			}
			lastBy[p] = name
			batches[p] = append(batches[p], handling{at: time.Now(), by: name, n: len(batch)})
			if p == moved && !stoppedAt.IsZero() && firstAfter[p].IsZero() && name != victim {
				firstAfter[p] = time.Now()
			}
			mu.Unlock()
			return nil
		})
		if err != nil {
			return err
		}
		members[name] = m
	}
	defer func() {
		for _, m := range members {
			m.cancel()
		}
		for _, m := range members {
			<-m.done
		}
	}()
	// The members at work: those that handled a batch in the last second
	// (every partition gets traffic many times a second).
	active := func() map[string]bool {
		mu.Lock()
		defer mu.Unlock()
		a := map[string]bool{}
		for n, at := range lastSeen {
			if time.Since(at) < time.Second {
				a[n] = true
			}
		}
		return a
	}
	// settled waits up to d for one member at work per partition, each the
	// one that last handled a partition, with no partition changing hands
	// for a full second (the join's last moves can still be under way when
	// traffic starts: a member that handled a partition's first events may
	// hand it on a moment later). It returns the set the wait last saw: the
	// checks read that, not a second sample that a member's next batch, a
	// moment late, could leave short. On a timeout the checks report what
	// it was.
	settled := func(d time.Duration, what string) map[string]bool {
		var act map[string]bool
		_ = waitFor(ctx, d, what, func() (bool, error) {
			act = active()
			mu.Lock()
			defer mu.Unlock()
			owners := map[string]bool{}
			for _, n := range lastBy {
				owners[n] = true
			}
			if len(act) != sixPartitions || len(lastBy) != sixPartitions || len(owners) != sixPartitions {
				return false, nil
			}
			for n := range owners {
				if !act[n] {
					return false, nil
				}
			}
			return time.Since(ownersChanged) >= time.Second, nil
		})
		return act
	}
	// lapses counts the heartbeats the members stored only after their
	// lease may have lapsed (snip_reader_lease_lapses_total): each time, the
	// member gave every partition up and the group moved them. On a machine
	// too busy to store a heartbeat within the 1 s lease, the owners change
	// under the lesson, and the counts of members at work are of that churn,
	// not of the group at rest the lesson is about.
	lapses := func() (float64, error) { return leaseLapses(regs) }
	e.say("10 members join a group on %d partitions", sixPartitions)
	if err := waitMembers(ctx, js, "six", sixMembers); err != nil {
		return err
	}
	if err := waitSettled(ctx, js, "six", sixPartitions); err != nil {
		return err
	}

	lapsedBefore, err := lapses()
	if err != nil {
		return err
	}
	// tooBusy is the premise's row: no member's lease lapsed from the
	// traffic's start on.
	tooBusy := func(lapsed float64) {
		e.atMost("lease lapses from the traffic's start (premise)", "lapses", 0, lapsed,
			"a heartbeat is stored every 1/3 s, each within 1/3 s; on a machine too busy for that a member gives its partitions up and the group moves them")
		e.premise()
	}
	// lapsedOr ends the run inconclusive when a wait failed after leases
	// lapsed: the group was moving partitions the lesson does not move,
	// each move waiting for the lapsed owner's pin to go. Otherwise the
	// wait's failure is the run's error.
	lapsedOr := func(err error) error {
		lapsed, lerr := lapses()
		if lerr != nil {
			return errors.Join(err, lerr)
		}
		if n := lapsed - lapsedBefore; n > 0 && ctx.Err() == nil {
			e.note("%v, after %g lease lapses: the machine was too busy for the lesson", err, n)
			tooBusy(n)
			return nil
		}
		return err
	}
	// Traffic over 30 links for the whole run.
	pjs, err := e.Connect("producer")
	if err != nil {
		return err
	}
	links := codes(30)
	var sent atomic.Int64
	pctx, stopTraffic := context.WithCancel(ctx)
	trafficDone := make(chan error, 1)
	go func() {
		_, err := emit(pctx, e.Rate(sixRate), e.Real(time.Hour), func(i int) error {
			_, err := publishClick(pjs, newClick(links[i%len(links)], i/len(links)))
			sent.Add(1)
			return err
		})
		if pctx.Err() != nil {
			err = nil
		}
		trafficDone <- err
	}()
	defer stopTraffic()
	smp := e.newSampler(250 * time.Millisecond)
	stopSampling := smp.start(ctx, func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		for i := range sixMembers {
			n := fmt.Sprintf("m%d", i)
			smp.add(n+" handled", "clicks", float64(t.byMember[n]))
		}
	})
	defer stopSampling()
	// Let every partition see traffic, then count who worked.
	if err := waitFor(ctx, 60*time.Second, "every partition to handle traffic", func() (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		return len(busyParts) == sixPartitions, nil
	}); err != nil {
		return lapsedOr(err)
	}
	// Owners as the members report them (OnAssign/OnRevoke); the handover
	// of the last moves of the join can still be under way.
	act := settled(30*time.Second, "6 owners")
	t.mu.Lock()
	working := len(t.byMember)
	t.mu.Unlock()
	e.exact("members at work (handled a batch in the last second)", "members", sixPartitions, float64(len(act)), "bounded-load rendezvous hashing: at most ceil(6/10) = 1 partition each")
	e.needsPremise()
	e.exact("members that handled events", "members", sixPartitions, float64(working), "only an owner can pull a partition (pinned_client)")
	e.needsPremise()
	e.exact("idle members (standbys)", "members", sixMembers-sixPartitions, float64(sixMembers-len(act)), "10 - 6")
	e.needsPremise()

	// Stop an active member and time its partition's move.
	mu.Lock()
	for p, n := range lastBy {
		if moved == -1 || p < moved {
			moved, victim = p, n
		}
	}
	mu.Unlock()
	e.say("stopping %s, the owner of partition %d", victim, moved)
	// The member stopped is the partition's owner, not one that handed it
	// on during the join: the group's leases (the members bucket) name it
	// as the one holder of the partition. Read from the leases, not from
	// how much it handled in the moments before: a member waiting for the
	// CPU on a loaded machine can go most of a second without a batch.
	leases, err := reader.Members(ctx, js, "six")
	if err != nil {
		return err
	}
	holders, victimHolds := 0, 0
	for _, l := range leases {
		if slices.Contains(l.Owned, moved) {
			holders++
			if l.Member == victim {
				victimHolds = 1
			}
		}
	}
	mu.Lock()
	stoppedAt = time.Now()
	// Nobody else handled its partition in the lesson second before the stop.
	othersRecent := 0
	for _, h := range batches[moved] {
		if stoppedAt.Sub(h.at) <= e.Real(time.Second) && h.by != victim {
			othersRecent += h.n
		}
	}
	mu.Unlock()
	e.exact("members holding the stopped member's partition (leases)", "members", 1, float64(holders), "one owner at a time")
	e.needsPremise()
	e.exact("of them the stopped member", "members", 1, float64(victimHolds),
		"the member stopped is the partition's owner, not one that handed it on during the join")
	e.needsPremise()
	e.exact("its partition's clicks others handled in the second before the stop", "clicks", 0, float64(othersRecent), "one owner at a time")
	e.needsPremise()
	if err := members[victim].stop(); err != nil {
		return err
	}
	delete(members, victim)
	if err := waitFor(ctx, 60*time.Second, "partition to move and resume", func() (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		return !firstAfter[moved].IsZero(), nil
	}); err != nil {
		return lapsedOr(err)
	}
	mu.Lock()
	took := firstAfter[moved].Sub(stoppedAt)
	newOwner := lastBy[moved]
	mu.Unlock()
	e.note("partition %d moved from %s to %s; first event handled %s after the stop (real time: the lease is 1 s at every speed)", moved, victim, newOwner, took.Round(time.Millisecond))
	e.atMost("move: stop to first event on the new owner (real s)", "s", 10, took.Seconds(), "a graceful stop deletes the lease and unpins at once (about 0.1 s on an idle machine); the bound allows for a loaded one")
	e.needsPremise()
	// The new owner's first batch can come before the others' next ones:
	// wait for six owners at work again.
	act = settled(60*time.Second, "6 owners again")
	e.exact("active members after the stop", "members", sixPartitions, float64(len(act)), "a standby took the partition")
	e.needsPremise()

	// Let the new owner work, stop traffic, and drain.
	time.Sleep(e.Real(2 * time.Second))
	stopTraffic()
	if err := <-trafficDone; err != nil {
		return err
	}
	if err := waitPublished(ctx, pjs); err != nil {
		return lapsedOr(err)
	}
	if err := waitFor(ctx, 60*time.Second, "every click to be handled", func() (bool, error) {
		h, _, _ := t.counts()
		return int64(h) >= sent.Load(), nil
	}); err != nil {
		return lapsedOr(err)
	}
	stopSampling()
	smp.flush()
	h, dups, disorder := t.counts()
	e.exact("clicks handled (once each)", "clicks", float64(sent.Load()), float64(h), "nothing lost across the move")
	e.atMost("clicks handled twice", "clicks", 50, float64(dups), "0 on a graceful stop as a rule (the member acks what it handled, then unpins); delivery is at least once, so on a loaded machine a few events of a batch in hand can come again, and handlers are idempotent by event ID")
	e.needsPremise()
	e.exact("clicks out of order per link", "clicks", 0, float64(disorder), "one owner at a time per partition, in stream order")
	lapsed, err := lapses()
	if err != nil {
		return err
	}
	tooBusy(lapsed - lapsedBefore)
	return nil
}

// leaseLapses sums snip_reader_lease_lapses_total over the members'
// registries. A registry that cannot gather its metrics is the error, not
// a count of zero: the premise row would read a machine that kept every
// lease.
func leaseLapses(regs map[string]*prometheus.Registry) (float64, error) {
	var n float64
	for name, reg := range regs {
		mfs, err := reg.Gather()
		if err != nil {
			return 0, fmt.Errorf("lease lapses of %s: %w", name, err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "snip_reader_lease_lapses_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n, nil
}
