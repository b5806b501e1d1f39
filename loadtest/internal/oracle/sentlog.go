package oracle

import (
	"maps"

	"github.com/snipdev/snip/loadtest/internal/truth"
	"github.com/snipdev/snip/loadtest/internal/workload"
)

// SentLog follows, by ID, which of a run's sent clicks CLICKS holds, by the
// oracle's rule for the log (a click of the run's links naming a sent
// sequence, valid or not: an invalid click is stored where readers park it,
// so it is accounted for, as the oracle's log read accounts for it, and
// waiting longer would not change that; the oracle's log row fails it),
// and where the run's clicks are in it. A count of the clicks stored cannot
// tell that every sent click is in: a copy stored twice, or a click whose
// request timed out and was recorded late, makes up the count while a sent
// click still waits in the redirect's outbox. It needs one bit per click.
type SentLog struct {
	tr    *truth.Truth
	tag   workload.Tag
	links int
	found []uint64 // bit seq: a click naming seq was read, valid or not
	sent  uint64   // sent clicks found
	last  map[int]uint64
}

// NewSentLog returns a SentLog for the run tr describes.
func NewSentLog(tr *truth.Truth) (*SentLog, error) {
	if err := tr.Validate(); err != nil {
		return nil, err
	}
	tag, _ := tr.RunTag()
	gen, err := workload.New(tr.Spec)
	if err != nil {
		return nil, err
	}
	return &SentLog{tr: tr, tag: tag, links: gen.NumLinks(), found: make([]uint64, (tr.Attempts+63)/64), last: map[int]uint64{}}, nil
}

// Add notes clicks read from the log, in stream order.
func (l *SentLog) Add(clicks []LogClick) {
	for i := range clicks {
		c := &clicks[i]
		if _, ours := linkOf(l.tag, l.links, c.Code); !ours {
			continue
		}
		// Every click on the run's links is the readers' to process.
		l.last[c.Partition] = max(l.last[c.Partition], c.StreamSeq)
		seq, ok := seqOf(l.tr, l.tag, c)
		if !ok {
			continue
		}
		w, bit := seq/64, uint64(1)<<(seq%64)
		if l.found[w]&bit != 0 {
			continue // a copy
		}
		l.found[w] |= bit
		if l.tr.Outcome(seq) == truth.Sent {
			l.sent++
		}
	}
}

// Complete reports whether every sent click of the run has been read.
func (l *SentLog) Complete() bool { return l.sent == l.tr.SentCount() }

// Last is, per CLICKS partition, the highest stream sequence of a click on
// the run's links read so far: once Complete, at or past every sent click.
func (l *SentLog) Last() map[int]uint64 { return maps.Clone(l.last) }
