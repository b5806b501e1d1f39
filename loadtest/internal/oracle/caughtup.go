package oracle

import (
	"fmt"
	"sort"
	"time"
)

// Targets are a run's last events: a reader has processed the run once its
// acknowledged position reached them, whatever else flows through the
// streams meanwhile (a demo's trickle, another run). A backlog of 0 says
// nothing about a run while other traffic keeps arriving, and a reader that
// batches (the warehouse inserts once a second) may never show 0 at all.
type Targets struct {
	// Clicks is, per CLICKS partition, the highest stream sequence of the
	// run's clicks.
	Clicks map[int]uint64
	// Fraud is the highest FRAUD_VERDICTS sequence of the verdicts about the run's
	// clicks; 0 when there are none.
	Fraud uint64
	// Readers are the readers that must be among the positions (the
	// consumer groups of the sinks being checked): one that is not is
	// behind, not absent from the judgement.
	Readers []string
}

// Behind is one reader's partition that has not processed the run yet.
type Behind struct {
	Reader    string
	Partition int // -1 on FRAUD_VERDICTS
	// AckFloor and Target: acknowledged up to AckFloor, the run's last
	// event is at Target.
	AckFloor, Target uint64
	// Backlog is the reader's backlog there, the run's and other traffic's.
	Backlog uint64
	// NoConsumer: the group has no consumer for the partition.
	NoConsumer bool
	// Queue: Reader is a webhook endpoint's queue, holding Backlog events
	// not yet delivered.
	Queue bool
}

// webhookQueue names a webhook endpoint's queue among the readers.
func webhookQueue(endpoint string) string { return "webhooks endpoint " + endpoint }

func (b Behind) String() string {
	where := fmt.Sprintf("%s p%d", b.Reader, b.Partition)
	if b.Partition < 0 {
		where = b.Reader
	}
	if b.NoConsumer {
		return where + " has no consumer"
	}
	if b.Queue {
		return fmt.Sprintf("%s has %d events queued", b.Reader, b.Backlog)
	}
	return fmt.Sprintf("%s acked %d of %d (backlog %d)", where, b.AckFloor, b.Target, b.Backlog)
}

// CaughtUp judges readers' positions against a run's targets. A reader has
// processed the run when, on every partition holding the run's clicks (and
// on FRAUD_VERDICTS, for the readers of verdicts), its acknowledged floor is at or
// past the run's last event there, or it has nothing left to process at all
// (a consumer whose filter leaves the run's events out has a floor that
// never reaches them, and a backlog of 0). It returns the readers deployed,
// sorted, and every partition still behind; a reader of t.Readers with no
// position at all is behind.
func CaughtUp(pos []Position, t Targets) (readers []string, behind []Behind) {
	type key struct {
		reader string
		p      int
	}
	at := map[key]Position{}
	stream := map[string]string{}
	for _, p := range pos {
		at[key{p.Reader, p.Partition}] = p
		stream[p.Reader] = p.Stream
	}
	for _, r := range t.Readers {
		if _, seen := stream[r]; !seen {
			// A sink's reader that has no consumer at all: the sink may
			// agree now and change later; it has not processed the run.
			behind = append(behind, Behind{Reader: r, Partition: -1, NoConsumer: true})
			readers = append(readers, r)
		}
	}
	for r := range stream {
		readers = append(readers, r)
	}
	sort.Strings(readers)
	parts := make([]int, 0, len(t.Clicks))
	for p := range t.Clicks {
		parts = append(parts, p)
	}
	sort.Ints(parts)
	for _, r := range readers {
		if stream[r] != "CLICKS" {
			p, ok := at[key{r, -1}]
			if ok && t.Fraud > 0 && p.AckFloor < t.Fraud && p.Backlog > 0 {
				behind = append(behind, Behind{Reader: r, Partition: -1, AckFloor: p.AckFloor, Target: t.Fraud, Backlog: p.Backlog})
			}
			continue
		}
		for _, part := range parts {
			target := t.Clicks[part]
			p, ok := at[key{r, part}]
			switch {
			case !ok:
				behind = append(behind, Behind{Reader: r, Partition: part, Target: target, NoConsumer: true})
			case p.AckFloor < target && p.Backlog > 0:
				behind = append(behind, Behind{Reader: r, Partition: part, AckFloor: p.AckFloor, Target: target, Backlog: p.Backlog})
			}
		}
	}
	return readers, behind
}

// backlogs sums each reader's backlog over its partitions.
func backlogs(pos []Position) map[string]uint64 {
	out := map[string]uint64{}
	for _, p := range pos {
		out[p.Reader] += p.Backlog
	}
	return out
}

func readersRow(readers []string, behind []Behind, backlog map[string]uint64, catchUp time.Duration, err error) Result {
	if err != nil {
		return Result{Sink: SinkReaders, Status: Fail, Note: "positions unknown: " + err.Error()}
	}
	if len(readers) == 0 {
		// No reader deployed and no checked sink's reader expected:
		// nothing was judged, which is not a pass.
		return skipped(SinkReaders, "no reader deployed: nothing to check")
	}
	r := Result{Sink: SinkReaders, Expected: uint64(len(readers))}
	late := map[string]bool{}
	var notes []string
	for _, b := range behind {
		late[b.Reader] = true
		notes = append(notes, b.String())
	}
	r.Missing = uint64(len(late))
	r.Got = r.Expected - r.Missing
	switch {
	case len(behind) > 0:
		what := "partitions behind the run's last event"
		if len(notes) == 1 {
			what = "partition behind the run's last event"
		}
		r.Note = limitList(what, notes)
	case catchUp >= 0:
		// Not the catch-up time after the load (the runner's own watcher
		// measures that): the first check comes after the log is read.
		r.Note = fmt.Sprintf("every reader had processed the run's last event %s into the verification", catchUp.Round(time.Millisecond))
		if other := total(backlog); other > 0 {
			r.Note += fmt.Sprintf(" (other traffic: backlog %s)", describe(backlog))
		}
	}
	r.judge()
	return r
}
