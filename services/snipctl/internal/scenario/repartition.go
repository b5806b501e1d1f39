package scenario

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/deadletter"
	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/reader"
	"github.com/snipdev/snip/pkg/topology"
)

var repartition = Scenario{
	Name:   "repartition",
	Claim:  "changing the partition count moves most keys to another partition, and a key's old and new events can no longer be read in order (a reader that does not check partitions would read them out of order; Snip's readers park the old ones); Snip refuses the change",
	Needs:  "nats",
	Lesson: 4 * time.Second,
	run:    runRepartition,
}

const (
	repFrom      = 8
	repTo        = 12
	repKeys      = 120
	repPerKey    = 20    // events per key before and after the change
	repPartition = 500.0 // events/s one partition's worker handles
)

// repLease is the Snip reader's lease: production's default, not the other
// lessons' 1 s (as rush's). Its one member never leaves and nothing in the
// lesson waits on a lease; but a lease lapses when no heartbeat is stored
// for its TTL, and on a machine starved as CI starves it (a load of 11 to
// 15 on two cores, the race detector on) heartbeats went unanswered past
// 1 s: the member gave every partition up, took them again and was handed
// its batches again, over and over, and read too slowly to finish.
const repLease = 3 * time.Second

// repStall is how long the wait for every event to be read or parked goes
// on with none read or parked before it gives up. A correct run on a
// loaded machine pauses at most for a lapsed lease's recovery: the lease
// stored again, the pin's TTL (the lease), and an abandoned batch's
// redelivery after the ack wait (10 s); three ack waits is a run that has
// stopped, not a slow one.
const repStall = 30 * time.Second

func runRepartition(ctx context.Context, e *Env) error {
	js, err := e.NATS(ctx, repFrom)
	if err != nil {
		return err
	}
	links := codes(repKeys)

	// The arithmetic: a key moves when hash mod 8 differs from hash mod 12.
	moved, toNew := 0, 0
	for _, c := range links {
		a, b := events.Partition(c, repFrom), events.Partition(c, repTo)
		if a != b {
			moved++
		}
		if b >= repFrom {
			toNew++
		}
	}

	// Snip's way: topology.Apply refuses to change the count of an existing
	// CLICKS (every service applies the topology at start).
	o := topology.Defaults()
	o.Partitions = repTo
	o.Storage = jetstream.MemoryStorage
	refused := errors.Is(topology.Apply(ctx, js, o), topology.ErrPartitionsChanged)
	e.exact("Snip: topology.Apply with 12 partitions on an 8-partition CLICKS is refused", "bool", 1, b2f(refused), "ErrPartitionsChanged: a count change would break order per link")

	// The naive way: events before the change, the stream's transform
	// edited to 12 partitions, events after it.
	e.say("%d links x %d events in %d partitions, then the count goes to %d, then %d more each", repKeys, repPerKey, repFrom, repTo, repPerKey)
	pjs, err := e.Connect("producer")
	if err != nil {
		return err
	}
	publish := func(from int) error {
		for i := from; i < from+repPerKey; i++ {
			for _, c := range links {
				if _, err := publishClick(pjs, newClick(c, i)); err != nil {
					return err
				}
			}
		}
		return waitPublished(ctx, pjs)
	}
	if err := publish(0); err != nil {
		return err
	}
	s, err := js.Stream(ctx, events.ClicksStream)
	if err != nil {
		return fmt.Errorf("clicks stream: %w", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return fmt.Errorf("clicks stream info: %w", err)
	}
	cfg := info.Config
	cfg.SubjectTransform.Destination = events.ClicksTransformDest(repTo)
	cfg.Metadata["snip.partitions"] = strconv.Itoa(repTo)
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("change the partition count: %w", err)
	}
	if err := publish(repPerKey); err != nil {
		return err
	}

	// A reader that does not check partitions: twelve workers at the same
	// pace, one per partition, each handling its partition's events in
	// stored order, one event each in turn.
	naiveOut, err := readUnchecked(ctx, js, repTo)
	if err != nil {
		return err
	}

	// A Snip reader group (pkg/reader, so it applies the rule of validity)
	// on all 12 partitions, each partition's worker at 500/s. Its group is
	// named "naive" only because it reads after a change Snip would refuse.
	var mu sync.Mutex
	lims := map[int]interface{ Wait(context.Context) error }{}
	var order readOrder
	rcfg := groupConfig("naive", "naive-1")
	rcfg.Partitions = repTo
	rcfg.LeaseTTL = repLease
	reg := prometheus.NewRegistry()
	rcfg.Metrics = reg
	m, err := e.startMember(ctx, rcfg, func(ctx context.Context, p int, batch []reader.Event) error {
		mu.Lock()
		lim, ok := lims[p]
		if !ok {
			lim = e.limiter(repPartition)
			lims[p] = lim
		}
		mu.Unlock()
		for _, ev := range batch {
			if err := lim.Wait(ctx); err != nil {
				return err
			}
			mu.Lock()
			order.read(ev.Click)
			mu.Unlock()
		}
		return nil
	})
	if err != nil {
		return err
	}
	defer m.stop()

	// Snip's readers apply the rule of validity: an event stored in a
	// partition its code does not hash to under the stream's current count
	// is parked (wrong_partition) on DEAD_LETTER, never handled out of
	// order. So every event is either handled or parked.
	filter := deadletter.Filter("naive", events.ReasonWrongPartition)
	parked := func() (int, error) {
		ds, err := js.Stream(ctx, events.DeadLetterStream)
		if err != nil {
			return 0, fmt.Errorf("dead letters: %w", err)
		}
		info, err := ds.Info(ctx, jetstream.WithSubjectFilter(filter))
		if err != nil {
			return 0, fmt.Errorf("dead letters: %w", err)
		}
		n := 0
		for _, c := range info.State.Subjects {
			n += int(c)
		}
		return n, nil
	}
	// However long a loaded machine takes: the wait gives up only when
	// nothing more is read or parked for repStall.
	if err := waitProgress(ctx, repStall, "every event to be read or parked", func() (bool, int, error) {
		n, err := parked()
		if err != nil {
			return false, 0, err
		}
		mu.Lock()
		defer mu.Unlock()
		n += order.handled
		return n >= 2*repKeys*repPerKey, n, nil
	}); err != nil {
		return err
	}
	nParked, err := parked()
	if err != nil {
		return err
	}
	parkedLinks := map[string]bool{}
	if err := deadletter.Each(ctx, js, filter, func(l deadletter.Letter) error {
		if i := strings.LastIndexByte(l.OrigSubject, '.'); i >= 0 {
			parkedLinks[l.OrigSubject[i+1:]] = true
		}
		return nil
	}); err != nil {
		return err
	}
	mu.Lock()
	outOfOrder, handedAgain := len(order.disordered), order.again
	mu.Unlock()
	e.exact("links whose old events are now in the wrong partition (parked by every reader)", "links", float64(moved), float64(len(parkedLinks)), "hash mod 8 != hash mod 12: about 2/3 of all links")
	e.exact("events parked as wrong_partition", "events", float64(moved*repPerKey), float64(nParked), "every event of a moved link stored before the change")
	e.atLeast("links a reader that does not check partitions read out of order", "links", float64(toNew), float64(naiveOut),
		"every link moved to partitions 8..11: its new events are at the front of a partition with no backlog, its old ones behind a backlog of the old")
	e.exact("links Snip's readers read out of order", "links", 0, float64(outOfOrder), "the old events are parked, not read after the new ones")
	e.note("%d of %d links moved (%.0f%%), %d of them to partitions 8..11 that had no backlog; the reader that does not check partitions read %d moved links out of order: those %d, and %d whose new partition's backlog ran out before their old one's", moved, repKeys, 100*float64(moved)/repKeys, toNew, naiveOut, toNew, naiveOut-toNew)
	lapses, err := counterTotal(reg, "snip_reader_lease_lapses_total")
	if err != nil {
		return err
	}
	if handedAgain > 0 || lapses > 0 {
		e.note("%d events were handed to Snip's reader again (a batch after a lease lapse or a redelivery: at-least-once; its lease lapsed %.0f times, %s lease); each was judged at its first handing", handedAgain, lapses, repLease)
	}
	e.note("either way the count change breaks order per link: out of order for a reader that does not check partitions, dead letters for Snip's; hence Snip refuses it")
	e.note("to grow, Snip would create a new stream with more partitions, have every group drain the old one, then switch producers (see docs/lessons.md)")
	return nil
}

// readUnchecked reads every partition of CLICKS as a reader that skips the
// rule of validity would: partition p's events in stored order, the
// partitions side by side at the same pace (event k of every partition in
// turn k). It returns how many links it read out of order.
func readUnchecked(ctx context.Context, js jetstream.JetStream, partitions int) (int, error) {
	s, err := js.Stream(ctx, events.ClicksStream)
	if err != nil {
		return 0, fmt.Errorf("clicks stream: %w", err)
	}
	parts := make([][]events.Click, partitions)
	for p := range partitions {
		filter := events.PartitionFilter(p)
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(filter))
		if err != nil {
			return 0, fmt.Errorf("partition %d info: %w", p, err)
		}
		want := 0
		for _, n := range info.State.Subjects {
			want += int(n)
		}
		c, err := js.OrderedConsumer(ctx, events.ClicksStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
		if err != nil {
			return 0, fmt.Errorf("read partition %d: %w", p, err)
		}
		for len(parts[p]) < want {
			b, err := c.Fetch(min(want-len(parts[p]), 500), jetstream.FetchMaxWait(5*time.Second))
			if err != nil {
				return 0, fmt.Errorf("read partition %d: %w", p, err)
			}
			got := 0
			for m := range b.Messages() {
				got++
				var ck events.Click
				if err := json.Unmarshal(m.Data(), &ck); err != nil {
					return 0, fmt.Errorf("decode click: %w", err)
				}
				parts[p] = append(parts[p], ck)
			}
			if got == 0 {
				return 0, fmt.Errorf("read partition %d: stalled at %d of %d", p, len(parts[p]), want)
			}
		}
	}
	last := map[string]int{}
	disordered := map[string]bool{}
	for k := 0; ; k++ {
		more := false
		for p := range partitions {
			if k >= len(parts[p]) {
				continue
			}
			more = true
			c := parts[p][k]
			i := indexOf(c)
			if l, ok := last[c.Code]; ok && i < l {
				disordered[c.Code] = true
			}
			last[c.Code] = max(last[c.Code], i)
		}
		if !more {
			return len(disordered), nil
		}
	}
}

// readOrder is what the repartition lesson's Snip reader has read: the
// links it read out of order (an event of a link read after a later one of
// the same link). Each event is judged at its first handing only: a batch
// handed again (a lease that lapsed on a busy machine, an ack wait that ran
// out) repeats events already read, which is at-least-once delivery, not a
// read out of order, and must not count twice towards "every event read or
// parked".
type readOrder struct {
	last       map[string]int  // a link's highest event index read
	disordered map[string]bool // links read out of order
	seen       map[string]bool // click IDs read
	handled    int             // distinct events read
	again      int             // handings of an event already read
}

func (r *readOrder) read(c events.Click) {
	if r.seen == nil {
		r.last, r.disordered, r.seen = map[string]int{}, map[string]bool{}, map[string]bool{}
	}
	if r.seen[c.ID] {
		r.again++
		return
	}
	r.seen[c.ID] = true
	r.handled++
	i := indexOf(c)
	if l, ok := r.last[c.Code]; ok && i < l {
		r.disordered[c.Code] = true
	}
	r.last[c.Code] = max(r.last[c.Code], i)
}
